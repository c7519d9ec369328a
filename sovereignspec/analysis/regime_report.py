"""Human tables and JSON documents for the regime analysis."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict
from typing import Any

from sovereignspec.analysis.regimes import POLICIES, RegimeRow, RegimeSettings


def _settings_dict(settings: RegimeSettings) -> dict[str, Any]:
    data = asdict(settings)
    data["neighbours"] = [asdict(n) for n in settings.neighbours]
    return data


def regimes_json(rows: list[RegimeRow], settings: RegimeSettings) -> dict[str, Any]:
    return {"settings": _settings_dict(settings), "rows": [asdict(r) for r in rows]}


def _describe(settings: RegimeSettings) -> list[str]:
    neighbours = "; ".join(
        f"{n.name} (drafter {n.drafter or 'none'}, α {n.alpha}, {n.share:.0%} of the load, "
        f"SLO plain TPOT +{n.slack:.0%})"
        for n in settings.neighbours
    )
    return [
        f"Regime analysis — context {settings.context:g} tokens; the row's workload runs "
        f"{settings.seqs:g} sequences with a TPOT SLO of plain +{settings.row_slack:.0%}; "
        f"γ_max {settings.gamma_max}; self-benefit margin {settings.margin:.0%}.",
        "homogeneous: one shared engine, every sequence like the row's (one γ for all).",
        f"mixed: the row plus {neighbours}.",
        f"sovereignspec observes α as declared (error {settings.alpha_error:+.2f}) and headroom as "
        f"telemetry reports it (error {settings.headroom_error:+.2f}), judged "
        f"{settings.headroom_uncertainty:.2f} worse; the oracle knows both.",
        "Cells: the row workload's speed-up vs all-plain at the same load, its γ, and !N when N "
        "neighbours are pushed past their SLO. agg = the GPU's token-weighted aggregate speed-up.",
    ]


def regimes_table(rows: list[RegimeRow], settings: RegimeSettings) -> str:
    policies = [p for p in POLICIES if any(r.policy == p for r in rows)]
    by_point: dict[tuple[Any, ...], dict[str, RegimeRow]] = defaultdict(dict)
    for r in rows:
        by_point[(r.gpu, r.model, r.drafter, r.mix, r.alpha, r.headroom)][r.policy] = r
    lines = _describe(settings)
    short = {"sovereignspec-no-externality": "sov-no-ext", "sovereignspec": "sovspec"}
    header = f"{'h':>4} " + " ".join(f"{short.get(p, p):>13}" for p in policies) + f" {'agg sov/orc':>12}"
    group = None
    for key, cells in by_point.items():
        if key[:5] != group:
            group = key[:5]
            gpu, model, drafter, mix, alpha = group
            lines += ["", f"{gpu} · {model} · {drafter} · {mix} · α={alpha:g}", header]
        parts = [f"{key[5]:>4.2f}"]
        for p in policies:
            r = cells[p]
            flag = f"!{r.slo_violations}" if r.slo_violations else ""
            parts.append(f"{r.speedup:>6.2f}×γ{r.gamma:<2}{flag:>3}".rjust(13))
        agg = (
            f"{cells['sovereignspec'].aggregate_speedup:.2f}/{cells['oracle'].aggregate_speedup:.2f}"
            if {
                "sovereignspec",
                "oracle",
            }
            <= cells.keys()
            else ""
        )
        parts.append(f"{agg:>12}")
        lines.append(" ".join(parts))
    lines += ["", summary(rows, policies)]
    return "\n".join(lines)


def summary(rows: list[RegimeRow], policies: list[str]) -> str:
    """Per policy: mean aggregate speed-up, its worst case, SLO violations, and the share of points
    where it reaches 97 % of the oracle's aggregate."""
    by_point: dict[tuple[Any, ...], dict[str, RegimeRow]] = defaultdict(dict)
    for r in rows:
        by_point[(r.gpu, r.model, r.drafter, r.mix, r.alpha, r.headroom)][r.policy] = r
    lines = [f"{'policy':<30} {'mean agg':>9} {'min agg':>8} {'SLO violations':>15} {'≥97% of oracle':>15}"]
    for p in policies:
        cells = [c[p] for c in by_point.values() if p in c]
        mean = sum(c.aggregate_speedup for c in cells) / len(cells)
        worst = min(c.aggregate_speedup for c in cells)
        violations = sum(c.slo_violations for c in cells)
        near = [c for c in by_point.values() if p in c and "oracle" in c]
        share = (
            sum(c[p].aggregate_speedup >= 0.97 * c["oracle"].aggregate_speedup for c in near) / len(near)
            if near
            else 0.0
        )
        lines.append(f"{p:<30} {mean:>9.3f} {worst:>8.3f} {violations:>15d} {share:>15.1%}")
    return "\n".join(lines)
