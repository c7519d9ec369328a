"""Tiny random-weight checkpoints for a real vLLM on CPU, built at test time (no model hub here).

Run with the engine's own Python (hack/engine-env.sh): `python tiny_models.py OUT_DIR`. Writes
  OUT/target     a 3-layer Llama (EAGLE-3 needs >= 3 target layers) with a word-level tokenizer
  OUT/identical  the same weights: a draft that always agrees (alpha 1.0 under greedy sampling)
  OUT/perturbed  the same weights plus seeded relative noise: a draft that sometimes disagrees
  OUT/eagle3     an EAGLE-3 head over the target (one mid layer, fc over 3 aux hidden states)
and prints one JSON line describing them. Everything is seeded: the same files every run.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

VOCAB = 512
HIDDEN = 128
HEADS = 4
LAYERS = 3
NOISE = 0.03  # relative; ~0.7-0.8 acceptance per position on these shapes (real-engine.md)
AUX_LAYERS = [0, 1, 2]


def tokenizer() -> PreTrainedTokenizerFast:
    words = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(VOCAB - 3)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def config(layers: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=layers,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )


def save(model: LlamaForCausalLM, tok: PreTrainedTokenizerFast, out: Path) -> None:
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)


def eagle3_head(out: Path, tok: PreTrainedTokenizerFast) -> None:
    gen = torch.Generator().manual_seed(3)

    def w(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * 0.02).contiguous()

    tensors = {
        "fc.weight": w(HIDDEN, HIDDEN * len(AUX_LAYERS)),
        "midlayer.self_attn.q_proj.weight": w(HIDDEN, 2 * HIDDEN),
        "midlayer.self_attn.k_proj.weight": w(HIDDEN, 2 * HIDDEN),
        "midlayer.self_attn.v_proj.weight": w(HIDDEN, 2 * HIDDEN),
        "midlayer.self_attn.o_proj.weight": w(HIDDEN, HIDDEN),
        "midlayer.mlp.gate_proj.weight": w(2 * HIDDEN, HIDDEN),
        "midlayer.mlp.up_proj.weight": w(2 * HIDDEN, HIDDEN),
        "midlayer.mlp.down_proj.weight": w(HIDDEN, 2 * HIDDEN),
        "midlayer.input_layernorm.weight": torch.ones(HIDDEN),
        "midlayer.hidden_norm.weight": torch.ones(HIDDEN),
        "midlayer.post_attention_layernorm.weight": torch.ones(HIDDEN),
        "norm.weight": torch.ones(HIDDEN),
        "lm_head.weight": w(VOCAB, HIDDEN),
    }
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    doc = config(1).to_dict()
    doc.update(
        architectures=["LlamaForCausalLMEagle3"],
        draft_vocab_size=VOCAB,
        eagle_config={"eagle_aux_hidden_state_layer_ids": AUX_LAYERS, "use_aux_hidden_state": True},
    )
    (out / "config.json").write_text(json.dumps(doc, indent=1))
    tok.save_pretrained(out)


def main(out: Path) -> None:
    torch.manual_seed(0)
    tok = tokenizer()
    target = LlamaForCausalLM(config(LAYERS)).eval()
    for name in ("target", "identical", "perturbed", "eagle3"):
        shutil.rmtree(out / name, ignore_errors=True)
    save(target, tok, out / "target")
    save(target, tok, out / "identical")
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in target.parameters():
            p.mul_(1 + NOISE * torch.randn(p.shape, generator=gen))
    save(target, tok, out / "perturbed")
    eagle3_head(out / "eagle3", tok)
    print(json.dumps({"vocab": VOCAB, "hidden": HIDDEN, "layers": LAYERS, "noise": NOISE, "dir": str(out)}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
