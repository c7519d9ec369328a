"""The engines `sovereignspec launch` can start, one line each (standard library only)."""

from __future__ import annotations

from sovereignspec.engines.sglang_launch import SGLANG  # inline: sovereignspec/engines/sglang_launch.py
from sovereignspec.engines.vllm_launch import VLLM  # inline: sovereignspec/engines/vllm_launch.py
from sovereignspec.launchkit import Launcher  # inline: sovereignspec/launchkit.py

LAUNCHERS: tuple[Launcher, ...] = (SGLANG, VLLM)  # detected in this order: SGLang's commands run Python
