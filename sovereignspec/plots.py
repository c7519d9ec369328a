"""Figures. matplotlib is imported here only, so the core and the operator never need it."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from sovereignspec.core.regimes import POLICIES, RegimeRow
from sovereignspec.errors import ConfigError

if TYPE_CHECKING:
    from sovereignspec.core.specs import ProfileSet
    from sovereignspec.sim.metrics import RunResult
    from sovereignspec.sim.scenario import Scenario


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
    loads: tuple[float, ...] = (0.25, 0.5, 1.0, 1.5),
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
    written = []

    # Load 1.0 is the run already made.
    sweep = {
        x: results if x == 1.0 else run_all(scaled(scenario, x), profiles, policies, world=world)
        for x in loads
    }
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name in results:
        ax.plot(loads, [sweep[load][name].speedup for load in loads], marker="o", label=name)
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=0.8)
    ax.set_xlabel("load (× the scenario's arrival rates)")
    ax.set_ylabel("decode speed-up vs never")
    ax.set_title(f"{scenario.name}: speed-up against load")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / f"{scenario.name}-speedup-vs-load.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    written.append(str(path))

    tenants = [t.tenant for t in next(iter(results.values())).tenants]
    fig, ax = plt.subplots(figsize=(8, 4.2))
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
    fig.tight_layout()
    path = out / f"{scenario.name}-p99-tpot.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    written.append(str(path))

    oracle = results.get("oracle")
    fig, ax = plt.subplots(figsize=(7, 4.2))
    names = list(results)
    values = [results[n].goodput_tokens_per_s / oracle.goodput_tokens_per_s if oracle else 0.0 for n in names]
    ax.barh(names, values, color=["tab:green" if n == "sovereignspec" else "tab:gray" for n in names])
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("goodput / oracle's goodput")
    ax.set_title(f"{scenario.name}: goodput against the oracle")
    fig.tight_layout()
    path = out / f"{scenario.name}-goodput-vs-oracle.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    written.append(str(path))
    return written
