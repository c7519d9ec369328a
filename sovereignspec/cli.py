"""`sovereignspec`: the command line. Parses, validates, calls the core, prints.

Bad input (unknown names, α outside [0, 1], γ outside 0..32, negative SLOs) is reported as one line
naming the argument and the accepted values, with exit code 2 and no traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TypeAlias

from sovereignspec.arguments import Parser, bounded_float, bounded_int, float_list, id_range, int_list
from sovereignspec.auditing import add_bucket_arguments
from sovereignspec.core.defaults import GAMMA_LIMIT, GAMMA_MAX, HEADROOM_UNCERTAINTY, SELF_BENEFIT_MARGIN
from sovereignspec.errors import ConfigError
from sovereignspec.heap import keep_heap_pad
from sovereignspec.profiles import load_profiles, resolve_name

# The subcommands' parsers (argparse keeps the type of `add_subparsers` private).
Subparsers: TypeAlias = "argparse._SubParsersAction[Parser]"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="sovereignspec", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--profiles", help="profiles directory (default: the shipped profiles)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for add in (
        _regimes_parser,
        _predict_parser,
        _calibrate_parser,
        _profile_parser,
        _simulate_parser,
        _passthrough_parsers,
        _operator_parser,
        _audit_parser,
    ):
        add(sub)
    return parser


def _regimes_parser(sub: Subparsers) -> None:
    """The regime analysis."""
    reg = sub.add_parser("regimes", help="the regime analysis: speed-up against headroom, per policy")
    reg.add_argument("--format", choices=("table", "json"), default="table")
    reg.add_argument("--plot", metavar="FILE.png", help="draw speed-up against headroom per policy")
    reg.add_argument("--gpu", action="append", help="only this GPU (repeatable)")
    reg.add_argument("--model", action="append", help="only this target model (repeatable)")
    reg.add_argument("--drafter", action="append", help="only this drafter (repeatable)")
    reg.add_argument("--mix", action="append", choices=("homogeneous", "mixed"))
    reg.add_argument("--alphas", type=float_list("--alphas", 0.0, 1.0), help="acceptance rates, e.g. 0.6,0.8")
    reg.add_argument("--headrooms", type=float_list("--headrooms", 0.0, 1.0), help="headrooms, e.g. 1,0.5,0")
    reg.add_argument("--context", type=bounded_int("--context", 1, None), default=256)
    reg.add_argument(
        "--batch", type=bounded_int("--batch", 1, None), default=8, help="the row workload's sequences"
    )
    reg.add_argument("--gamma-max", type=bounded_int("--gamma-max", 0, GAMMA_LIMIT), default=GAMMA_MAX)
    reg.add_argument("--margin", type=bounded_float("--margin", 0.0, 1.0), default=SELF_BENEFIT_MARGIN)
    reg.add_argument("--headroom-error", type=bounded_float("--headroom-error", -1.0, 1.0), default=0.05)
    reg.add_argument(
        "--headroom-uncertainty",
        type=bounded_float("--headroom-uncertainty", 0.0, 1.0),
        default=HEADROOM_UNCERTAINTY,
    )
    reg.add_argument("--alpha-error", type=bounded_float("--alpha-error", -1.0, 1.0), default=0.0)
    reg.add_argument(
        "--slo-slack",
        type=bounded_float("--slo-slack", 0.0, None),
        default=0.5,
        help="the row workload's TPOT SLO as slack over its plain TPOT",
    )


def _predict_parser(sub: Subparsers) -> None:
    """One point of the model."""
    pre = sub.add_parser("predict", help="the model's prediction for one point, with every term")
    pre.add_argument("--gpu", required=True)
    pre.add_argument("--model", required=True)
    pre.add_argument("--drafter", required=True)
    pre.add_argument("--batch", type=bounded_int("--batch", 1, None), required=True)
    pre.add_argument("--context", type=bounded_int("--context", 1, None), required=True)
    pre.add_argument("--alpha", type=bounded_float("--alpha", 0.0, 1.0), required=True)
    pre.add_argument("--gamma", type=bounded_int("--gamma", 0, GAMMA_LIMIT), required=True)
    pre.add_argument("--gamma-max", type=bounded_int("--gamma-max", 0, GAMMA_LIMIT), default=8)
    pre.add_argument("--format", choices=("table", "json"), default="table")


def _calibrate_parser(sub: Subparsers) -> None:
    """Fitting a profile."""
    cal = sub.add_parser("calibrate", help="fit a GPU profile's coefficients to measured step times")
    cal.add_argument(
        "measurements",
        nargs="+",
        help="CSVs: batch,context,query_tokens,step_ms[,draft_ms][,model][,part,params_billion,layers,tp]",
    )
    cal.add_argument(
        "--held-out",
        action="append",
        default=[],
        metavar="CSV",
        help="measurements not fitted, to report the fit's error on (repeatable)",
    )
    cal.add_argument("--gpu", required=True, help="the GPU profile to fit (its datasheet figures stay)")
    cal.add_argument("--model", required=True, help="the target model the steps were measured with")
    cal.add_argument("--tp", type=bounded_int("--tp", 1, 16), help="tensor parallelism measured")
    cal.add_argument(
        "--step-overhead-ms",
        type=bounded_float("--step-overhead-ms", 0.0, None),
        help="at TP > 1: hold the per-step overhead at this value; the rest of the fixed cost is all-reduces",
    )
    cal.add_argument("--out", help="write the fitted profile here (default: print it)")


def _profile_parser(sub: Subparsers) -> None:
    """Measuring an engine."""
    prof = sub.add_parser("profile", help="measure a running engine's step times into a calibrate CSV")
    prof.add_argument(
        "--url", required=True, help="the engine's OpenAI-compatible API, e.g. http://my-engine:8000"
    )
    prof.add_argument("--model", required=True, help="the profile's name of the served target model")
    prof.add_argument("--served-model", help="the engine's model id (default: the first in /v1/models)")
    prof.add_argument(
        "--concurrency",
        type=int_list("--concurrency", 1, 4096),
        default=(1, 2, 4, 8, 16, 32, 64),
        help="simultaneous requests per point (comma-separated)",
    )
    prof.add_argument(
        "--prompt-tokens",
        type=int_list("--prompt-tokens", 1, 1_000_000),
        default=(256, 1024, 4096),
        help="prompt lengths per point (comma-separated)",
    )
    prof.add_argument("--output-tokens", type=bounded_int("--output-tokens", 4, 100_000), default=64)
    prof.add_argument(
        "--prompt-ids",
        type=id_range,
        default=None,
        metavar="LOW:HIGH",
        help="token ids the prompts are drawn from, [LOW, HIGH) (default 1000:20000: inside every "
        "Llama-family vocabulary; a smaller vocabulary needs its own)",
    )
    prof.add_argument(
        "--repeats", type=bounded_int("--repeats", 1, 100), default=3, help="runs per point (median kept)"
    )
    prof.add_argument(
        "--max-seconds", type=bounded_float("--max-seconds", 1.0, None), default=900.0, help="time budget"
    )
    prof.add_argument(
        "--timeout", type=bounded_float("--timeout", 0.1, None), default=120.0, help="per request, s"
    )
    prof.add_argument("--out", help="write the CSV here (default: print it)")


def _simulate_parser(sub: Subparsers) -> None:
    """The simulator."""
    sim = sub.add_parser("simulate", help="simulate a multi-tenant cluster under every policy")
    sim.add_argument("scenario", help="a SCENARIO.yaml, or the name of a shipped one")
    sim.add_argument("--policy", action="append", help="only this policy (repeatable; never is always run)")
    sim.add_argument("--seed", type=bounded_int("--seed", 0, None), help="override the scenario's seed")
    sim.add_argument("--duration", type=bounded_float("--duration", 1.0, 86400.0), help="override duration_s")
    sim.add_argument("--format", choices=("table", "json"), default="table")
    sim.add_argument(
        "--learning",
        action="store_true",
        help="also run SovereignSpec from profiles 30%% off, without (sovereignspec-off30) and after "
        "learning from a plain pilot run (sovereignspec-learned), as the operator learns its GPUs",
    )
    sim.add_argument("--plot", metavar="DIR", help="write PNG figures (runs a load sweep too)")
    sim.add_argument(
        "--world",
        choices=("measured", "profile"),
        default="measured",
        help="step times from measured data (default) or from the profiles the policies decide with",
    )
    sim.add_argument("--check", action="store_true", help="verify sovereignty after every event")


def _passthrough_parsers(sub: Subparsers) -> None:
    """Launch and agent parse their own arguments (standard library only in an engine image)."""
    sub.add_parser(
        "launch",
        help="serving container entrypoint: the decision's engine arguments, then exec the engine "
        "(sovereignspec launch --help)",
        add_help=False,
    )
    sub.add_parser(
        "agent",
        help="node agent: GPU telemetry from NVML for Prometheus (sovereignspec agent --help)",
        add_help=False,
    )


def _operator_parser(sub: Subparsers) -> None:
    """The controller."""
    op = sub.add_parser("operator", help="run the Kueue AdmissionCheck controller (kopf)")
    op.add_argument(
        "--kubeconfig", help="kubeconfig file (default: in-cluster, then $KUBECONFIG / ~/.kube/config)"
    )
    op.add_argument(
        "--role",
        choices=("worker", "dispatcher"),
        default="worker",
        help="worker: place on nodes (a cluster that runs the work); dispatcher: nominate MultiKueue "
        "worker clusters (the manager cluster)",
    )
    op.add_argument(
        "--controller-name",
        help="AdmissionCheck controllerName (default: sovereignspec.io/speculation for the worker role, "
        "sovereignspec.io/dispatcher for the dispatcher)",
    )
    op.add_argument(
        "--field-manager",
        help="server-side apply field manager (default: sovereignspec-controller, sovereignspec-dispatcher)",
    )
    op.add_argument(
        "--nominate",
        type=bounded_int("--nominate", 1, 20),
        default=1,
        help="dispatcher role: worker clusters nominated per workload, best first (default 1)",
    )
    op.add_argument("--bind", default="0.0.0.0", help="address for the metrics and liveness endpoints")
    op.add_argument("--metrics-port", type=bounded_int("--metrics-port", 0, 65535), default=8080)
    op.add_argument(
        "--metrics-secure",
        action="store_true",
        help="serve metrics over HTTPS to bearer tokens RBAC allows `get /metrics` (TokenReview, "
        "SubjectAccessReview), as controller-runtime's secure metrics",
    )
    op.add_argument(
        "--metrics-cert-dir", help="tls.crt and tls.key for --metrics-secure (default: self-signed)"
    )
    op.add_argument("--liveness-port", type=bounded_int("--liveness-port", 0, 65535), default=8081)
    op.add_argument("--write-workers", type=bounded_int("--write-workers", 1, 64), default=8)
    op.add_argument(
        "--tick-limit",
        type=bounded_int("--tick-limit", 1, 100000),
        default=500,
        help="workloads placed (dispatcher: nominated) per tick and policy, the first in tick order; the "
        "rest in the next tick at once, so "
        "that a backlog (a new leader's first tick) does not hold back every decision (default 500)",
    )
    learn = op.add_argument_group("online calibration (LearnedProfiles, from the engines' metrics)")
    learn.add_argument(
        "--learn-refit-seconds",
        type=bounded_float("--learn-refit-seconds", 1, 86400),
        default=60.0,
        help="seconds between a profile's refits; each takes the engines' readings once (default 60)",
    )
    learn.add_argument(
        "--learn-window-seconds",
        type=bounded_float("--learn-window-seconds", 60, 7 * 86400),
        default=3600.0,
        help="readings older than this leave the fit (default 3600)",
    )
    op.add_argument(
        "--audit-required",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="write a placement only once its record is persisted; while the record cannot be "
        "written the placement waits (Retry, with the reason). --no-audit-required decides on and "
        "writes the backlog when the store returns (default: required)",
    )
    add_bucket_arguments(op)
    op.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")
    elect = op.add_argument_group("leader election (several replicas: only the Lease's holder decides)")
    elect.add_argument("--leader-elect", action="store_true", help="compete for a coordination.k8s.io Lease")
    elect.add_argument(
        "--leader-election-namespace", help="the Lease's namespace (default: $POD_NAMESPACE, then the Pod's)"
    )
    elect.add_argument("--leader-election-id", help="the Lease's name (default: the field manager)")
    for flag, low, default, what in (
        ("--lease-duration", 1.0, 15.0, "a standby waits on an unrenewed Lease before taking it"),
        ("--renew-deadline", 0.5, 10.0, "the leader keeps deciding without a renewal"),
        ("--retry-period", 0.1, 2.0, "between tries to take or renew the Lease"),
    ):
        elect.add_argument(
            flag,
            type=bounded_float(flag, low, 3600),
            default=default,
            help=f"seconds {what} (default {default:g})",
        )


def _operator(args: argparse.Namespace) -> int:
    from sovereignspec.operator.roles.process import run

    return run(args)


def _simulate(args: argparse.Namespace) -> int:
    from sovereignspec.sim import policies as sim_policies
    from sovereignspec.sim import report
    from sovereignspec.sim.run import run_all
    from sovereignspec.sim.scenario import load
    from sovereignspec.sim.worlds import model_error

    scenario = load(args.scenario)
    updates = {}
    if args.seed is not None:
        updates["seed"] = args.seed
    if args.duration is not None:
        updates["duration_s"] = args.duration
    if updates:
        scenario = scenario.model_copy(update=updates)
    known = {**sim_policies.POLICIES, **sim_policies.LEARNING}
    for name in args.policy or []:
        if name not in known:
            raise ConfigError(f"--policy: got {name!r}; accepted: {', '.join(known)}")
    names = args.policy
    if args.learning:
        names = [
            *(args.policy or sim_policies.POLICIES),
            *(n for n in sim_policies.LEARNING if n not in (args.policy or [])),
        ]
    profiles = load_profiles(args.profiles)
    try:
        results = run_all(scenario, profiles, names, check=args.check, world=args.world)
        model = profiles.models[scenario.tenants[0].model]
        errors = (
            {g.gpu: model_error(profiles.gpus[g.gpu], model) for g in scenario.cluster}
            if args.world == "measured"
            else {}
        )
    except (KeyError, ValueError) as exc:
        raise ConfigError(f"scenario {scenario.name}: {exc}") from exc
    if args.plot:
        from sovereignspec.analysis.plots import plot_simulation

        written = plot_simulation(scenario, profiles, results, args.plot, names, world=args.world)
    if args.format == "json":
        print(json.dumps(report.to_json(scenario, results, args.world, errors), indent=1))
    else:
        print(report.table(scenario, results, args.world, errors))
        if args.plot:
            print("\nfigures: " + ", ".join(written))
    return 0


def _regimes(args: argparse.Namespace) -> int:
    from sovereignspec.analysis.regime_report import regimes_json, regimes_table
    from sovereignspec.analysis.regimes import RegimeSettings, analyse

    profiles = load_profiles(args.profiles)
    gpus = [resolve_name("GPU", g, profiles.gpus) for g in args.gpu or []]
    models = [resolve_name("model", m, profiles.models) for m in args.model or []]
    drafters = [resolve_name("drafter", d, profiles.drafters) for d in args.drafter or []]
    settings = RegimeSettings(
        context=float(args.context),
        seqs=float(args.batch),
        row_slack=args.slo_slack,
        gamma_max=args.gamma_max,
        margin=args.margin,
        headroom_error=args.headroom_error,
        headroom_uncertainty=args.headroom_uncertainty,
        alpha_error=args.alpha_error,
    )
    if args.alphas:
        settings = replace(settings, alphas=args.alphas)
    if args.headrooms:
        settings = replace(settings, headrooms=tuple(sorted(args.headrooms, reverse=True)))
    mixes = tuple(args.mix) if args.mix else ("homogeneous", "mixed")
    rows = analyse(profiles, settings, gpus=gpus, models=models, drafters=drafters, mixes=mixes)
    if not rows:
        raise ConfigError("no drafter in the selection drafts for the selected models; nothing to analyse")
    if args.plot:
        from sovereignspec.analysis.plots import plot_regimes

        plot_regimes(rows, args.plot)
    if args.format == "json":
        print(json.dumps(regimes_json(rows, settings), indent=1))
    else:
        print(regimes_table(rows, settings))
        if args.plot:
            print(f"\nplot written to {args.plot}")
    return 0


def _predict(args: argparse.Namespace) -> int:
    from sovereignspec.analysis.predict import predict

    profiles = load_profiles(args.profiles)
    gpu = profiles.gpus[resolve_name("GPU", args.gpu, profiles.gpus)]
    model = profiles.models[resolve_name("model", args.model, profiles.models)]
    drafter = profiles.drafters[resolve_name("drafter", args.drafter, profiles.drafters)]
    try:
        terms = predict(gpu, model, drafter, args.batch, args.context, args.alpha, args.gamma, args.gamma_max)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    if args.format == "json":
        print(json.dumps(terms, indent=1))
    else:
        width = max(len(k) for k in terms)
        for key, value in terms.items():
            shown = f"{value:.4g}" if isinstance(value, float) else str(value)
            print(f"{key:<{width}}  {shown}")
    return 0


def _audit_parser(sub: Subparsers) -> None:
    from sovereignspec.auditing import add_parser

    add_parser(sub)


def _audit(args: argparse.Namespace) -> int:
    from sovereignspec.auditing import command

    return command(args)


def _calibrate(args: argparse.Namespace) -> int:
    from sovereignspec.calibrate import command

    return command(args)


def _profile(args: argparse.Namespace) -> int:
    import datetime
    from pathlib import Path

    from sovereignspec import profiler

    profiles = load_profiles(args.profiles)
    model = resolve_name("model", args.model, profiles.models)
    engine = profiler.Engine.at(args.url, args.timeout)
    if args.prompt_ids is not None:
        engine.prompt_ids = args.prompt_ids
    engine.probe(args.served_model)
    if not engine.has_metrics:
        print(f"profile: {engine.base} has no /metrics: batch taken as the concurrency", file=sys.stderr)
    points = profiler.run(
        engine, args.concurrency, args.prompt_tokens, args.output_tokens, args.max_seconds, args.repeats
    )
    if not points:
        raise ConfigError("profile: no point measured within --max-seconds")
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = profiler.render_csv(points, engine, model, now)
    if args.out:
        Path(args.out).write_text(text)
        print(f"{len(points)} points written to {args.out}", file=sys.stderr)
    else:
        print(text, end="")
    return 0


HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "profile": _profile,
    "calibrate": _calibrate,
    "audit": _audit,
    "regimes": _regimes,
    "predict": _predict,
    "operator": _operator,
    "simulate": _simulate,
}


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["launch"]:  # its own parser: everything after `--` is the engine's
        from sovereignspec.launch import main as launch

        return launch(words[1:])
    if words[:1] == ["agent"]:
        from sovereignspec.agent import main as agent

        return agent(words[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = HANDLERS[args.command]
    keep_heap_pad()  # the operator's, the simulator's and every CLI decision's hot path
    try:
        return handler(args)
    except ConfigError as exc:
        print(f"sovereignspec: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `sovereignspec regimes | head`
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
