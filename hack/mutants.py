"""`make mutants`: mutation testing of the decision path with a fixed list of operators.

Each mutant changes one thing in one module (a comparison, its operands' order, an arithmetic or
boolean operator, a min/max, a numeric constant, a boolean literal, a returned value), is written
into a private copy of the tree, and the unit tests that guard the decision path run against it
(`-x`: the first failure kills it). Outcomes are counted apart: killed (a test failed), survived
(every test passed), timed out (a test ran past its limit: the mutant loops or crawls) and errors
(the tests could not run: an import or collection error, pytest's exit codes 2-5). The score is
killed / (killed + survived); timeouts and errors are shown beside it, never counted as kills. A
mutant that no test kills is listed with its line, so that it is either killed by a new test or
explained (docs/mutants.md). Deterministic: the same sources give the same mutants in the same order.

    python hack/mutants.py [--jobs 2] [--only PATH:LINE ...] [FILES ...]
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FILES = [
    "sovereignspec/core/optimiser.py",
    "sovereignspec/core/speedup.py",
    "sovereignspec/core/roofline.py",
    "sovereignspec/core/placement.py",
    # What the Placer was until it was split by concern: the same code, mutated as before.
    "sovereignspec/core/cluster.py",
    "sovereignspec/core/spreading.py",
    "sovereignspec/core/reasons.py",
    "sovereignspec/core/running.py",
    # What placement.py held until the house's second pass (issue 44): the GPU's choice and the
    # draft budget's request, mutated as before.
    "sovereignspec/core/choosing.py",
    "sovereignspec/core/budget.py",
    # Decides whenever few GPUs are stale; the sovereignty filter; the operator's whole decision.
    "sovereignspec/core/scalar.py",
    "sovereignspec/core/sovereignty.py",
    "sovereignspec/operator/decision/plan.py",
]
# Fast and sharp first: `-x` stops at the first failure, so most mutants die in seconds.
TESTS = [
    "tests/unit/test_sovereignty.py",  # first: the filter's own table, 1 s, kills its mutants at once
    "tests/unit/test_budget.py",  # the draft budget handed to engines, 1 s
    "tests/unit/test_choosing.py",  # which GPU among the admissible, over hand-made figures, 1 s
    # operator/decision/plan.py's own: messages and borders, node constraints, pod sets, the decision
    # record, the tick's limit, transport errors, the informer's view (1-3 s each)
    "tests/unit/test_borders.py",
    "tests/unit/test_node_constraints.py",
    "tests/unit/test_pod_sets.py",
    "tests/unit/test_record.py",
    "tests/unit/test_tick_limit.py",
    "tests/unit/test_transport_errors.py",
    "tests/unit/test_informer.py",
    "tests/unit/test_published.py",
    "tests/unit/test_roofline.py",
    "tests/unit/test_placement.py",
    "tests/unit/test_groups.py",
    "tests/unit/test_ridge.py",
    "tests/unit/test_engine_contract.py",
    "tests/unit/test_calibration.py",
    "tests/unit/test_aging.py",
    "tests/unit/test_operator_decisions.py",
    "tests/unit/test_dispatch.py",
    "tests/unit/test_regimes.py",
    "tests/unit/test_laws.py",
]  # test_decision_properties.py (sovereignty over generated clusters, 40 s) is left to `make test`
TIMEOUT_S = 600  # the whole run of the test files against one mutant
TEST_TIMEOUT_S = 120  # one test (the slowest unmutated one takes a few seconds)

_COMPARE = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In,
}  # fmt: skip
_BINARY = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.Pow: ast.Mult,
           ast.FloorDiv: ast.Div, ast.Mod: ast.FloorDiv}  # fmt: skip
_BOOL = {ast.And: ast.Or, ast.Or: ast.And}
_SWAP_CALLS = {"min": "max", "max": "min", "minimum": "maximum", "maximum": "minimum"}
_ORDERED = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)  # comparisons whose operands' order matters
OUTCOMES = ("killed", "survived", "timeout", "error")


@dataclass(frozen=True)
class Mutant:
    path: str
    line: int
    what: str  # e.g. "< → <=" or "0.05 → 1.05"
    index: int  # which of the module's mutation sites, in walk order


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of docstring constants (never mutated)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _annotations(tree: ast.AST) -> set[int]:
    """ids of every node inside a type annotation (types are not behaviour)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        parts: list[ast.AST | None] = []
        if isinstance(node, (ast.AnnAssign, ast.arg)):
            parts.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            parts.append(node.returns)
        for part in parts:
            if part is not None:
                out.update(id(n) for n in ast.walk(part))
    return out


def _sites(tree: ast.AST) -> Iterator[tuple[ast.AST, str]]:
    """(node, description) for every mutation site, in a fixed walk order."""
    skip = _docstrings(tree) | _annotations(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Compare):
            for op in node.ops:
                if type(op) in _COMPARE:
                    yield node, f"{_sym(op)} → {_sym(_COMPARE[type(op)]())}"
        elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            yield node, f"{_sym(node.op)} → {_sym(_BINARY[type(node.op)]())}"
        elif isinstance(node, ast.AugAssign) and type(node.op) in _BINARY:
            yield node, f"{_sym(node.op)}= → {_sym(_BINARY[type(node.op)]())}="
        elif isinstance(node, ast.BoolOp):
            yield node, f"{_sym(node.op)} → {_sym(_BOOL[type(node.op)]())}"
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            yield node, "not x → x"
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name in _SWAP_CALLS:
                yield node, f"{name} → {_SWAP_CALLS[name]}"
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, (int, float))
            and not isinstance(node.value, bool)
        ):
            yield node, f"{node.value!r} → {_bumped(node.value)!r}"
        elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
            yield node, f"{node.value!r} → {not node.value!r}"
        elif isinstance(node, ast.Return) and node.value is not None and not _is_none(node.value):
            yield node, "return x → return None"
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], _ORDERED):
            yield node, "a ? b → b ? a"


def _is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def outcome(rc: int, output: str) -> str:
    """What one mutant's test run says: pytest's exit code 0 (every test passed: survived), 1 (a
    test failed: killed, unless the failure is pytest-timeout's), our own time limit (-1), or an
    exit code of 2-5 (interrupted, internal error, usage, no tests: the tests never judged it)."""
    if rc == -1 or (rc == 1 and "+ Timeout +" in output):
        return "timeout"
    if rc == 0:
        return "survived"
    if rc == 1:
        return "killed"
    return "error"


def _bumped(value: float) -> float:
    if value == 0:
        return 1 if isinstance(value, int) else 1.0
    return value + 1 if isinstance(value, int) else value * 2.0


def _sym(op: ast.AST) -> str:
    return {
        ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=",
        ast.Is: "is", ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in", ast.Add: "+",
        ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Pow: "**", ast.FloorDiv: "//", ast.Mod: "%",
        ast.And: "and", ast.Or: "or",
    }[type(op)]  # fmt: skip


def _apply(node: ast.AST, what: str, position: int) -> None:
    if isinstance(node, ast.Compare) and what == "a ? b → b ? a":
        node.left, node.comparators[0] = node.comparators[0], node.left
    elif isinstance(node, ast.Return):
        node.value = ast.Constant(None)
    elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
        node.value = not node.value
    elif isinstance(node, ast.Compare):
        ops = [i for i, op in enumerate(node.ops) if type(op) in _COMPARE]
        i = ops[position]
        node.ops[i] = _COMPARE[type(node.ops[i])]()
    elif isinstance(node, (ast.BinOp, ast.AugAssign)):
        node.op = _BINARY[type(node.op)]()
    elif isinstance(node, ast.BoolOp):
        node.op = _BOOL[type(node.op)]()
    elif isinstance(node, ast.UnaryOp):
        node.op = ast.UAdd()  # `+x`: x's truth value, as `not` would have negated it
    elif isinstance(node, ast.Call):
        if isinstance(node.func, ast.Attribute):
            node.func.attr = _SWAP_CALLS[node.func.attr]
        else:
            assert isinstance(node.func, ast.Name)
            node.func.id = _SWAP_CALLS[node.func.id]
    elif isinstance(node, ast.Constant):
        assert isinstance(node.value, (int, float))
        node.value = _bumped(node.value)


def mutants(path: str, source: str) -> list[Mutant]:
    tree = ast.parse(source)
    return [Mutant(path, getattr(n, "lineno", 0), what, i) for i, (n, what) in enumerate(_sites(tree))]


def mutated_source(m: Mutant, source: str) -> str:
    """`source` (the module as the run found it: later edits to the tree do not leak in) with `m`."""
    tree = ast.parse(source)
    sites = list(_sites(tree))
    node, what = sites[m.index]
    # A Compare with several operators yields one site per operator: which one is this?
    position = sum(1 for n, w in sites[: m.index] if n is node and w != "a ? b → b ? a")
    _apply(node, what, position)
    return ast.unparse(tree)


def _workdir(root: Path, k: int) -> Path:
    work = root / f"w{k}"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in files.decode().split("\0"):
        if name and (REPO / name).is_file():
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, work / name)
    return work


def _run_tests(work: Path, tests: list[str]) -> tuple[str, float]:
    start = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", "not cluster",
             "--timeout", str(TEST_TIMEOUT_S), *tests],
            cwd=work, capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        )  # fmt: skip
        rc, output = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired:
        rc, output = -1, ""  # a mutant that loops forever is caught by the time limit
    return outcome(rc, output), time.monotonic() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", default=FILES)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument(
        "--only", nargs="*", default=None, help="PATH:LINE of the mutants to run (all on that line)"
    )
    parser.add_argument(
        "--survivors-of",
        type=Path,
        default=None,
        help="a previous run's output: run only its survivors again",
    )
    parser.add_argument(
        "--from",
        dest="start",
        type=int,
        default=0,
        help="skip the first N mutants (the order is fixed: a run stopped after N goes on from there)",
    )
    args = parser.parse_args()
    sources = {f: (REPO / f).read_text() for f in args.files}
    todo = [m for f in args.files for m in mutants(f, sources[f])]
    todo = todo[args.start :]
    if args.only:
        todo = [m for m in todo if f"{m.path}:{m.line}" in set(args.only)]
    if args.survivors_of:
        # "  PATH:LINE  WHAT   | source" lines after "survivors"; mutants are matched by (path, line, what).
        text = args.survivors_of.read_text().split("\nsurvivors", 1)[-1]
        alive = {tuple(line.split("|")[0].split(None, 1)) for line in text.splitlines()[1:] if "|" in line}
        todo = [m for m in todo if (f"{m.path}:{m.line}", m.what) in {(a, w.strip()) for a, w in alive}]
    root = Path(tempfile.mkdtemp(prefix="sovereignspec-mutants-"))
    works = [_workdir(root, k) for k in range(args.jobs)]
    state, seconds = _run_tests(works[0], TESTS)
    if state != "survived":
        print(f"mutants: the tests do not pass on the unmutated tree ({state})", file=sys.stderr)
        return 2
    print(f"baseline: the {len(TESTS)} test files pass in {seconds:.0f} s; {len(todo)} mutants", flush=True)

    free = list(works)
    results: dict[Mutant, tuple[str, float]] = {}

    def one(m: Mutant) -> tuple[Mutant, str, float]:
        work = free.pop()
        target = work / m.path
        try:
            target.write_text(mutated_source(m, sources[m.path]))
            state, took = _run_tests(work, TESTS)
        finally:
            target.write_text(sources[m.path])
            free.append(work)
        return m, state, took

    done = 0
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for m, state, took in pool.map(one, todo):
            results[m] = (state, took)
            done += 1
            print(f"[{done}/{len(todo)}] {m.path}:{m.line} {m.what}: {state} ({took:.0f} s)", flush=True)
    shutil.rmtree(root, ignore_errors=True)

    print(report(args.files, todo, {m: r[0] for m, r in results.items()}))
    survivors = [m for m in todo if results[m][0] == "survived"]
    if survivors:
        print("\nsurvivors (see docs/mutants.md):")
        for m in survivors:
            source = sources[m.path].splitlines()[m.line - 1].strip()
            print(f"  {m.path}:{m.line}  {m.what}   | {source}")
    return 0


def report(files: list[str], todo: list[Mutant], states: dict[Mutant, str]) -> str:
    """Per module and in all: each outcome's count, and the score killed / (killed + survived)."""
    lines = ["", "per module: killed / survived / timed out / errors; score = killed / (killed + survived)"]
    rows = [(f, [m for m in todo if m.path == f]) for f in files] + [("all", todo)]
    for name, mine in rows:
        if not mine:
            continue
        count = {o: sum(1 for m in mine if states[m] == o) for o in OUTCOMES}
        judged = count["killed"] + count["survived"]
        score = f"{100 * count['killed'] / judged:.1f} %" if judged else "n/a"
        lines.append(
            f"  {name}: {count['killed']} / {count['survived']} / {count['timeout']} / {count['error']}"
            f" of {len(mine)}; score {score}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
