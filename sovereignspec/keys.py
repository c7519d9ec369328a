"""The annotation keys a decision is handed in: written by the operator (`operator/annotations.py`,
the engine modules) and read inside the engine's container by `sovereignspec launch`, which runs
with the standard library only. `launch --install` writes this module's definitions into the one
file it installs, so both sides read the same names from here.

Definitions only: no imports, nothing but string constants.
"""

PREFIX = "sovereignspec.io/"
MODE = "mode"  # speculative | plain
BUDGET = "draft-budget"  # γ at the declared batch
GPU_TYPE = "gpu-type"
DECIDED_AT = "decided-at"
# What each engine is handed (the engine modules in sovereignspec/engines/ write them).
VLLM_CONFIG = "vllm-speculative-config"  # vLLM's --speculative-config JSON
VLLM_PER_BATCH = "num_speculative_tokens_per_batch_size"  # its per-batch table's field
SGLANG_ARGS = "sglang-args"  # SGLang's --speculative-* flags
SGLANG_ADAPTIVE = "sglang-adaptive-config"  # the file behind --speculative-adaptive-config
