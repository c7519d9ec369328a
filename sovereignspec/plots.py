"""Figures. matplotlib is imported here only, so the core and the operator never need it."""

from __future__ import annotations

from collections import defaultdict

from sovereignspec.core.regimes import POLICIES, RegimeRow
from sovereignspec.errors import ConfigError


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
