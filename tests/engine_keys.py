"""Each engine's configuration annotation as the operator writes it (prefix and the key its module
in `sovereignspec.engines` names)."""

from sovereignspec.engines import sglang, vllm
from sovereignspec.operator.border.annotations import PREFIX

OUT_VLLM = PREFIX + vllm.CONFIG
OUT_SGLANG = PREFIX + sglang.ARGS
OUT_SGLANG_ADAPTIVE = PREFIX + sglang.ADAPTIVE
