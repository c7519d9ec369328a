"""A discrete-event simulator of multi-tenant LLM serving on heterogeneous GPUs, for comparing
speculation policies on the same arrivals. Pure Python and numpy (no plotting, no Kubernetes):
`scenario` reads a SCENARIO.yaml, `arrivals` makes its requests, `loop` runs them under one
policy (its records in `state`, routing in `routing`, sovereignty in `tenancy`, step costs from
`worlds` and `truth`), `policies` holds SovereignSpec (calling the same core the operator uses),
its baselines and the oracle, each seeing the run through `policies.SimView`; `summary` sums up.

The hot modules (`NATIVE_MODULES`) may also be compiled with mypyc (`make sim-native`, into
build/sim-native/). They are then loaded from there, but only while they were built from exactly
these sources by this interpreter: after an edit, or with SOVEREIGNSPEC_SIM_NATIVE=0, the Python
modules run (SOVEREIGNSPEC_SIM_NATIVE=DIR points at another build). The results are identical.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import warnings
from pathlib import Path

NATIVE_MODULES = ("state", "routing", "arrivals", "tenancy", "loop", "truth", "worlds")
NATIVE_ENV = "SOVEREIGNSPEC_SIM_NATIVE"
_HERE = Path(__file__).resolve().parent


def source_digests() -> dict[str, str]:
    return {m: hashlib.sha256((_HERE / f"{m}.py").read_bytes()).hexdigest() for m in NATIVE_MODULES}


def _native_dir() -> Path | None:
    setting = os.environ.get(NATIVE_ENV, "")
    if setting == "0":
        return None
    root = Path(setting) if setting else _HERE.parents[1] / "build" / "sim-native"
    try:
        manifest = json.loads((root / "sources.json").read_text())
    except (OSError, ValueError):
        if setting:
            warnings.warn(
                f"{NATIVE_ENV}={setting}: no compiled simulator there", RuntimeWarning, stacklevel=2
            )
        return None
    if not isinstance(manifest, dict):  # a mangled manifest is a stale build, not an import error
        manifest = {}
    if manifest.get("python") != sys.implementation.cache_tag or manifest.get("sources") != source_digests():
        warnings.warn(
            f"the compiled simulator in {root} was built from other sources (or another Python): "
            "running the interpreted one; `make sim-native` rebuilds it",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    return root / "lib" / "sovereignspec" / "sim"


_native = _native_dir()
if _native is not None:
    __path__.insert(0, str(_native))  # the compiled modules shadow their sources; nothing else does
NATIVE: str | None = str(_native) if _native is not None else None  # where the compiled modules load from
