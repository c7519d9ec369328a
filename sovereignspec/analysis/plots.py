"""Figures. matplotlib is imported here only, so the core and the operator never need it."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sovereignspec.analysis.regimes import POLICIES, RegimeRow
from sovereignspec.errors import ConfigError

if TYPE_CHECKING:
    from sovereignspec.core.roofline import Roofline
    from sovereignspec.core.specs import ProfileSet
    from sovereignspec.sim.scenario import Scenario
    from sovereignspec.sim.summary import RunResult


def plot_regimes(rows: list[RegimeRow], path: str) -> None:
    """Speed-up against headroom per policy, one panel per (mix, α) of the first GPU/model/drafter.

    Homogeneous panels show the row's speed-up (everyone's, since all are alike); mixed panels show
    the GPU's aggregate speed-up, the objective the policies are compared on there."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - the plot extra is not installed
        raise ConfigError("--plot needs matplotlib: pip install 'sovereignspec[plot]'") from exc
    first = rows[0]
    chosen = [r for r in rows if (r.gpu, r.model, r.drafter) == (first.gpu, first.model, first.drafter)]
    panels: dict[tuple[str, float], list[RegimeRow]] = defaultdict(list)
    for r in chosen:
        panels[(r.mix, r.alpha)].append(r)
    mixes = sorted({k[0] for k in panels})
    alphas = sorted({k[1] for k in panels})
    fig, axes = plt.subplots(
        len(mixes), len(alphas), figsize=(3.6 * len(alphas), 3.2 * len(mixes)), squeeze=False
    )
    for (mix, alpha), panel in panels.items():
        ax = axes[mixes.index(mix)][alphas.index(alpha)]
        for policy in POLICIES:
            pts = sorted(
                (r.headroom, r.speedup if mix == "homogeneous" else r.aggregate_speedup)
                for r in panel
                if r.policy == policy
            )
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=policy)
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
        ax.invert_xaxis()
        ax.set_title(f"{mix}, α={alpha:g}", fontsize=9)
        ax.set_xlabel("headroom (1 = idle, 0 = saturated)", fontsize=8)
        ax.set_ylabel("speed-up vs plain" if mix == "homogeneous" else "aggregate speed-up", fontsize=8)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(
        f"{first.gpu} · {first.model} · {first.drafter}: speed-up against headroom per policy", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_simulation(
    scenario: Scenario,
    profiles: ProfileSet,
    results: dict[str, RunResult],
    directory: str,
    policies: list[str] | None = None,
    loads: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5),
    world: str = "measured",
) -> list[str]:
    """Speed-up against load per policy (a load sweep), P99 TPOT per tenant, goodput vs the oracle."""
    import matplotlib

    matplotlib.use("Agg")
    from pathlib import Path

    import matplotlib.pyplot as plt

    from sovereignspec.sim.run import run_all
    from sovereignspec.sim.scenario import scaled

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    # Load 1.0 is the run already made.
    sweep = {
        x: results if x == 1.0 else run_all(scaled(scenario, x), profiles, policies, world=world)
        for x in loads
    }
    written = []
    figures: list[tuple[str, Callable[[Any], None], tuple[float, float]]] = [
        ("speedup-vs-load", lambda ax: _speedup_vs_load(ax, scenario, results, sweep, loads), (7, 4.2)),
        ("p99-tpot", lambda ax: _p99_per_tenant(ax, scenario, results), (8, 4.2)),
        ("goodput-vs-oracle", lambda ax: _goodput_vs_oracle(ax, scenario, results), (7, 4.2)),
    ]
    for suffix, draw, size in figures:
        fig, ax = plt.subplots(figsize=size)
        draw(ax)
        fig.tight_layout()
        path = out / f"{scenario.name}-{suffix}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(str(path))
    return written


def _speedup_vs_load(
    ax: Any,
    scenario: Scenario,
    results: dict[str, RunResult],
    sweep: dict[float, dict[str, RunResult]],
    loads: tuple[float, ...],
) -> None:
    for name in results:
        ax.plot(loads, [sweep[load][name].speedup for load in loads], marker="o", label=name)
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=0.8)
    ax.set_xlabel("load (× the scenario's arrival rates)")
    ax.set_ylabel("decode speed-up vs never")
    ax.set_title(f"{scenario.name}: speed-up against load")
    ax.legend(fontsize=7)


def _p99_per_tenant(ax: Any, scenario: Scenario, results: dict[str, RunResult]) -> None:
    tenants = [t.tenant for t in next(iter(results.values())).tenants]
    width = 0.8 / len(results)
    for i, (name, r) in enumerate(results.items()):
        ax.bar(
            [j + i * width for j in range(len(tenants))],
            [t.tpot_p99_ms for t in r.tenants],
            width,
            label=name,
        )
    for j, t in enumerate(scenario.tenants):
        ax.hlines(t.tpot_slo_ms, j - width / 2, j + 0.8, colors="black", linestyles="--", linewidth=0.8)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(tenants))], tenants)
    ax.set_ylabel("P99 TPOT (ms); dashes: SLO")
    ax.set_title(f"{scenario.name}: P99 time per output token per tenant")
    ax.legend(fontsize=6, ncol=3)


def _goodput_vs_oracle(ax: Any, scenario: Scenario, results: dict[str, RunResult]) -> None:
    oracle = results.get("oracle")
    names = list(results)
    values = [results[n].goodput_tokens_per_s / oracle.goodput_tokens_per_s if oracle else 0.0 for n in names]
    ax.barh(names, values, color=["tab:green" if n == "sovereignspec" else "tab:gray" for n in names])
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("goodput / oracle's goodput")
    ax.set_title(f"{scenario.name}: goodput against the oracle")


def plot_calibration(profiles: ProfileSet, path: str) -> None:
    """The calibrated model against the data it answers to: the H100 step time against the
    SpecDecode-Bench vLLM fit (batch 1-64, plain and γ = 4 verification, 1K and 4K context), and
    MagicDec's measured T_V/T_AR on A100 against the model's, row by row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sovereignspec.core.roofline import roofline_for

    fig, (left, right, world) = plt.subplots(1, 3, figsize=(16, 4.4))
    roof = roofline_for(profiles.gpus["H100-SXM"], profiles.models["llama-3.1-8b"])
    _against_fit(left, roof)
    _against_magicdec(right, profiles)
    _against_world(world, roof, profiles)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _against_fit(left: Any, roof: Roofline) -> None:
    from sovereignspec.sim import truth

    batches = [1, 2, 4, 8, 16, 24, 32, 48, 64]
    for ctx, q, style in ((1024, 1, "o-"), (1024, 5, "s-"), (4096, 1, "^-"), (4096, 5, "d-")):
        fit = [
            1e3
            * (b * ctx * truth.FIT_C_KV + b * q * truth.FIT_C_QUERY + truth.FIT_C_FIXED + truth.FIT_OVERHEAD)
            for b in batches
        ]
        model = [1e3 * float(roof.step_time(b * q, b, ctx)) for b in batches]
        line = left.plot(batches, fit, style, markersize=4, label=f"vLLM fit, ctx {ctx}, {q} query tok/seq")[
            0
        ]
        left.plot(batches, model, ":", color=line.get_color(), linewidth=2)
    left.set_xlabel("batch (sequences)")
    left.set_ylabel("step time, ms")
    left.set_title("H100, Llama-3.1-8B: profile (dotted) vs vLLM fit", fontsize=10)
    left.legend(fontsize=7)


def _against_magicdec(right: Any, profiles: ProfileSet) -> None:
    import csv

    from sovereignspec.core.roofline import roofline_for
    from sovereignspec.profiles import default_profile_dir

    with (default_profile_dir() / "measurements" / "magicdec_a100_table3.csv").open() as f:
        rows = [r for r in csv.reader(f) if r and not r[0].startswith("#")]
    measured, predicted, colours = [], [], []
    for r in rows:
        model_name = "llama-3.1-8b" if "3.1" in r[1] else "llama-2-7b-32k"
        a100 = roofline_for(profiles.gpus["A100-80G-SXM"], profiles.models[model_name], 8)
        context, seqs = float(r[5]), float(r[6])
        measured.append(float(r[9]) / float(r[11]))
        predicted.append(float(a100.step_time(3 * seqs, seqs, context) / a100.step_time(seqs, seqs, context)))
        colours.append("tab:blue" if model_name == "llama-3.1-8b" else "tab:orange")
    right.scatter(measured, predicted, c=colours, s=14)
    lo, hi = min(measured + predicted) - 0.02, max(measured + predicted) + 0.02
    right.plot([lo, hi], [lo, hi], color="grey", linewidth=0.8)
    right.fill_between([lo, hi], [lo - 0.1, hi - 0.1], [lo + 0.1, hi + 0.1], color="grey", alpha=0.15)
    right.set_xlabel("measured T_V/T_AR (γ = 2)")
    right.set_ylabel("profile T_V/T_AR")
    right.set_title("A100 TP8, MagicDec rows (band ±0.10)", fontsize=10)


def _against_world(world: Any, roof: Roofline, profiles: ProfileSet) -> None:
    """Where no calibration data reaches: the profile against the simulator's measured world."""
    from sovereignspec.sim import truth

    h100 = truth.measured_gpu(profiles.gpus["H100-SXM"], profiles.models["llama-3.1-8b"])
    wide = [1, 8, 16, 32, 64, 96, 128, 192, 256]
    for q, style in ((1, "o-"), (5, "s-")):
        measured_world = [1e3 * h100.step(b * q, b, 1024) for b in wide]
        line = world.plot(
            wide, measured_world, style, markersize=4, label=f"measured world, {q} query tok/seq"
        )[0]
        profile = [1e3 * float(roof.step_time(b * q, b, 1024)) for b in wide]
        world.plot(wide, profile, ":", color=line.get_color(), linewidth=2)
    world.axvline(64, color="grey", linestyle="--", linewidth=0.8)
    world.set_xlabel("batch (sequences), context 1024")
    world.set_ylabel("step time, ms")
    world.set_title("H100: profile (dotted) vs the simulator's world", fontsize=10)
    world.legend(fontsize=7)
