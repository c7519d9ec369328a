"""Random-weight checkpoints for `make bench-engine`, built with the engine's own Python (torch,
transformers): `python -P engine_models.py OUT --hidden H --intermediate I --layers L
--draft-layers K --noise X` (-P: this folder's operator.py must not shadow the standard library's).
No model hub is reachable here, and none is needed: the physics of a step (weights streamed, FLOPs
done) is the same whatever the weights say.

  OUT/target      a Llama of L layers whose layers K..L-1 are identities in function: their output
                  projections (attention o_proj, MLP down_proj) are zero, so they add nothing to the
                  residual stream, while their matmuls still run and cost what they cost
  OUT/draft       the target's embeddings, first K layers, final norm and head: under greedy sampling
                  it proposes exactly what the target will say (acceptance 1) at about K/L of its cost
  OUT/perturbed   the draft with seeded relative noise on every weight: it sometimes disagrees

Prints one JSON line: the parameter counts (all, and without embeddings and head) and the shapes.
Everything is seeded: the same files every run.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

VOCAB = 512  # word-level: w<k> is token k + 3


def word_tokenizer() -> PreTrainedTokenizerFast:
    words = ["<unk>", "<s>", "</s>", *(f"w{i}" for i in range(VOCAB - 3))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def llama(layers: int, hidden: int, intermediate: int, heads: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )


def count(model: LlamaForCausalLM) -> tuple[int, int]:
    """(all parameters, those of the decoder layers alone)."""
    total = sum(p.numel() for p in model.parameters())
    layers = sum(p.numel() for p in model.model.layers.parameters())
    return total, layers


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--intermediate", type=int, default=2816)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--draft-layers", type=int, default=1)
    ap.add_argument("--noise", type=float, default=0.05)
    args = ap.parse_args()
    torch.manual_seed(0)
    tok = word_tokenizer()
    shape = (args.hidden, args.intermediate, args.heads)
    target = LlamaForCausalLM(llama(args.layers, *shape)).eval()
    with torch.no_grad():
        for layer in target.model.layers[args.draft_layers :]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    draft = LlamaForCausalLM(llama(args.draft_layers, *shape)).eval()
    own = dict(target.state_dict())
    draft.load_state_dict({k: own[k] for k in draft.state_dict()})
    for name in ("target", "draft", "perturbed"):
        shutil.rmtree(args.out / name, ignore_errors=True)
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(args.out / name, safe_serialization=True)
        tok.save_pretrained(args.out / name)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in draft.parameters():
            p.mul_(1 + args.noise * torch.randn(p.shape, generator=gen))
    draft.save_pretrained(args.out / "perturbed", safe_serialization=True)
    tok.save_pretrained(args.out / "perturbed")
    (t_all, t_layers), (d_all, d_layers) = count(target), count(draft)
    print(json.dumps({
        "vocab": VOCAB, "hidden": args.hidden, "intermediate": args.intermediate, "heads": args.heads,
        "layers": args.layers, "draft_layers": args.draft_layers, "noise": args.noise,
        "target_params": t_all, "target_layer_params": t_layers,
        "draft_params": d_all, "draft_layer_params": d_layers, "dir": str(args.out),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
