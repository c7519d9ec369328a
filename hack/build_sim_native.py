"""Compile the simulator's hot modules with mypyc, outside the source tree.

    python hack/build_sim_native.py [OUT]        # default: build/sim-native

Writes OUT/lib/sovereignspec/sim/*.so and OUT/sources.json (each compiled source's SHA-256 and
the interpreter's tag). `sovereignspec.sim` loads these only while both still match, so an edit to
a source falls back to the interpreted module instead of running stale code. Results are the
same either way (tests/unit/test_sim_native.py compares them); the compiled engine is 1.5-2.5x
faster (`make bench-sim` prints both).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sovereignspec.sim import NATIVE_MODULES, source_digests  # noqa: E402

# The project's own mypy settings, minus what only concerns other packages: mypyc type-checks the
# compiled modules and what they import, and stops at any error.
MYPY_INI = """[mypy]
python_version = 3.11
plugins = pydantic.mypy
ignore_missing_imports = True
check_untyped_defs = True
"""


def build(out: Path) -> None:
    from mypyc.build import mypycify
    from setuptools import setup

    out = out.resolve()
    lib = out / "lib"
    if lib.exists():
        shutil.rmtree(lib)
    (out / "sources.json").unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="sim-native-") as tmp:
        ini = Path(tmp) / "mypy.ini"
        ini.write_text(MYPY_INI)
        sources = [f"sovereignspec/sim/{m}.py" for m in NATIVE_MODULES]
        # mypyc names modules by their paths, so it runs from the repository root; `separate`
        # gives each module its own library beside it (no top-level shared one to put on sys.path).
        modules = mypycify(
            ["--config-file", str(ini), *sources],
            opt_level="3",
            separate=True,
            target_dir=str(Path(tmp) / "c"),
        )
        setup(
            name="sovereignspec-sim-native",
            packages=[],
            ext_modules=modules,
            script_args=["build_ext", "--build-lib", str(lib), "--build-temp", str(Path(tmp) / "obj")],
        )
    manifest = {"python": sys.implementation.cache_tag, "sources": source_digests()}
    (out / "sources.json").write_text(json.dumps(manifest, indent=2) + "\n")
    built = sorted(p.name for p in (lib / "sovereignspec" / "sim").glob("*.so"))
    print(f"compiled {', '.join(NATIVE_MODULES)} into {lib} ({len(built)} libraries)")


if __name__ == "__main__":
    import os

    os.chdir(ROOT)
    build(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "build" / "sim-native")
