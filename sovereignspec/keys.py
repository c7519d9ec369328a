"""The annotation keys a decision is handed in: written by the operator (`operator/border/annotations.py`,
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
# What each engine is handed is named by its launcher (sovereignspec/engines/*_launch.py).
