"""``phalanx sim``: what the scheduler would do with a workload on a cluster, in virtual time
(docs/whatif.md). No NATS, no API server; the same input gives the same output.

Input: a cluster (``--cluster-file``, ``--synthetic NxSHAPE`` as ``phalanx up`` takes, or the
trace's own nodes), a workload (YAML files with arrival and duration annotations,
``phalanx_sim.workload``) and/or the Alibaba trace (``--trace``), and queues (``--queues``, as
``phalanx up --queues`` reads). Output: a summary, per-queue figures, per-gang waits and tiers,
the gangs still pending with what would start them; ``--json`` for all of it, ``--plot DIR``
for figures. Progress goes to stderr every few seconds, and the wall time at the end.
``--from-live`` starts from a running cluster instead, read once through the reader identity
(``sim_live``): its nodes, the reservations they hold (held to the end of the run) and, unless
``--queues`` is given, its queues. ``--replay`` decides placement's logged decisions again
(``sim_replay``).

Exit codes: 0 ran; 1 an input was read but is invalid (field and rule named); 2 an input
cannot be read, bad flags, or matplotlib missing for ``--plot``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from phalanx_cli import sim_replay
from phalanx_cli.cmd_run import add_nats
from phalanx_cli.terminal import safe, safe_lines
from phalanx_input import Invalid
from phalanx_rules import fairness as order

TRACE_DIR = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "traces" / "alibaba-gpu-v2023"
TEXT_ROWS, JSON_ROWS = 30, 10_000


def register(sub) -> None:
    p = sub.add_parser("sim", help="what the scheduler would do with a workload, in virtual time (no NATS, no API server; "
                                     "--from-live reads a running cluster once)",
                       description="Run the placement engine, gang-coordinator's order and fairness rules and the "
                                   "queues' fair share over a workload in virtual time, deterministically, and report "
                                   "waits, placement tiers, GPU utilisation, stranded GPUs and queue shares. See "
                                   "docs/whatif.md.")
    where = p.add_argument_group("cluster (one of)")
    nodes = where.add_mutually_exclusive_group()
    nodes.add_argument("--cluster-file", help="nodes to simulate (the format of `phalanx up --cluster-file`)")
    nodes.add_argument("--synthetic", metavar="NxSHAPE", help="N identical nodes with network tiers, e.g. 1000x8v100 "
                                                              "(shapes: 8v100, 8a100, 8a100mig, 8h100)")
    nodes.add_argument("--from-live", action="store_true",
                       help="the running cluster at --nats, read once as the reader identity: its nodes, the "
                            "reservations they hold (kept to the end of the run) and its queues (unless --queues)")
    nodes.add_argument("--trace-cluster", action="store_true",
                       help="the trace's 1213 GPU nodes, tie-break order drawn by --seed (the default with "
                            "--trace-mode packing)")
    live = p.add_argument_group("--from-live")
    add_nats(live)
    live.add_argument("--timeout", type=float, default=30.0,
                      help="seconds for connecting to NATS and every read together (default %(default)s)")
    work = p.add_argument_group("workload")
    work.add_argument("--workload", action="append", default=[], metavar="FILE",
                      help="Pods, Jobs, JobSets, MPIJobs (multi-document YAML; repeatable); annotations "
                           "sim.phalanx.io/arrival, /duration, /repeat, /every (docs/whatif.md)")
    work.add_argument("--default-duration", metavar="D", help="run time of a workload object without "
                                                              "sim.phalanx.io/duration, e.g. 2h (default: until the end)")
    work.add_argument("--trace", nargs="?", const=str(TRACE_DIR), metavar="DIR",
                      help=f"replay the Alibaba GPU trace (default directory {TRACE_DIR})")
    work.add_argument("--trace-pods", default="openb_pod_list_default.csv", help="the trace's pod list (default %(default)s)")
    work.add_argument("--trace-mode", choices=("timed", "packing"), default="timed",
                      help="timed: pods drawn with their lifetimes, Poisson arrivals at --load; packing: "
                           "bench/packing.py's sequence, one a second, nothing leaves (default %(default)s)")
    work.add_argument("--load", type=float, default=0.9, help="timed: offered GPU load, a fraction of the GPUs "
                                                              "(default %(default)s)")
    work.add_argument("--trace-queues", default="", metavar="Q1,Q2@8h",
                      help="timed: put each trace pod in one of these queues, drawn uniformly among those that "
                           "submit at its arrival (Q@D: from virtual time D on; default from the start)")
    work.add_argument("--seed", type=int, default=42, help="seed of the trace's draws (default %(default)s)")
    p.add_argument("--queues", metavar="FILE", help="Queue and Namespace objects (as `phalanx up --queues` reads)")
    run = p.add_argument_group("the run")
    run.add_argument("--duration", metavar="D", help="stop at this virtual time, e.g. 7d (default: when nothing is "
                                                     "left to happen; 7d for a timed trace)")
    run.add_argument("--sample", metavar="D", help="virtual time between samples (default: a 500th of the run, "
                                                   "at least 1s; 60s without --duration)")
    run.add_argument("--starve-after-s", type=float, default=order.STARVE_AFTER_S,
                     help="gang-coordinator's fairness: a queue's head is protected after this wait; 0 off "
                          "(default %(default)s)")
    run.add_argument("--fairness", choices=order.MODES, default=order.MODES[0],
                     help="how a starving head is protected, as gang-coordinator's flag (default %(default)s)")
    run.add_argument("--backoff-base-s", type=float, default=order.BACKOFF_BASE_S,
                     help="first retry delay (default %(default)s)")
    run.add_argument("--backoff-max-s", type=float, default=order.BACKOFF_MAX_S,
                     help="largest retry delay (default %(default)s)")
    run.add_argument("--unschedulable-retry-s", type=float, default=order.UNSCHEDULABLE_RETRY_S,
                     help="a gang that fits no node set is tried again after this long at the latest, as "
                          "gang-coordinator's flag (default %(default)s)")
    run.add_argument("--usage-half-life", metavar="D", help="the queues' recent usage weighs their fair share "
                     "with this half-life, e.g. 2h, as placement's --usage-half-life-s (docs/queues.md); default off")
    run.add_argument("--no-preemption", action="store_true", help="gangs only wait: no gang evicts another "
                     "(the services preempt: docs/preemption.md)")
    run.add_argument("--exact", action="store_true", help="decide every retry, even one nothing could have changed "
                                                          "for (slower; the result should not differ)")
    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print one JSON document (summary, samples, gangs, pending)")
    out.add_argument("--plot", metavar="DIR", help="write utilisation.png, queue_shares.png and waits.png there")
    out.add_argument("--gangs", metavar="N|all", help=f"gangs listed: text, the N longest waits (default all up "
                                                      f"to {TEXT_ROWS}); JSON, the first N (default {JSON_ROWS})")
    out.add_argument("--pending", type=int, default=20, metavar="N",
                     help="pending gangs explained at the end, with what would start them (default %(default)s)")
    out.add_argument("--whatif-decisions", type=int, default=200, metavar="N",
                     help="engine decisions the counterfactual probes may take per pending gang (a budget in "
                          "decisions keeps the output the same on any machine; default %(default)s; 0 none)")
    out.add_argument("--quiet", action="store_true", help="no progress on stderr")
    sim_replay.register_flags(p)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from phalanx_sim import plots, report

    if args.replay:
        return sim_replay.main(args)
    started = time.perf_counter()
    try:
        setup = _inputs(args)
    except OSError as e:
        print(safe(f"phalanx sim: cannot read: {e}"), file=sys.stderr)
        return 2
    except (Invalid, ValueError) as e:
        print(safe(f"phalanx sim: {e}"), file=sys.stderr)
        return 1
    except _Usage as e:
        print(safe(f"phalanx sim: {e}"), file=sys.stderr)
        return 2
    sim = setup["sim"]
    if not args.quiet:
        print(f"phalanx sim: {len(sim.views)} nodes, {sim.capacity // 700} GPUs, {len(sim.outcomes)} gangs; "
              f"running ...", file=sys.stderr, flush=True)
    sim.run()
    rows = _rows(args.gangs, json_out=True) if args.json else None  # text picks the longest waits from all
    doc = report.document(sim, gangs=rows, pending_limit=args.pending, decisions=args.whatif_decisions,
                          extra=setup["extra"](sim))
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print(safe_lines(report.text(doc, gangs=_rows(args.gangs, json_out=False))))
    code = 0
    if args.plot:
        try:
            paths = plots.draw(doc, Path(args.plot), setup["title"])
            print(f"phalanx sim: wrote {', '.join(str(x) for x in paths)}", file=sys.stderr)
        except plots.PlotUnavailable as e:
            print(f"phalanx sim: {e}", file=sys.stderr)
            code = 2
    if not args.quiet:
        print(f"phalanx sim: {clock_text(sim.now)} of virtual time in {time.perf_counter() - started:.1f} s (wall), "
              f"{sim.decisions} engine decisions", file=sys.stderr)
    return code


class _Usage(Exception):
    """Flags that do not go together."""


def clock_text(seconds: float) -> str:
    from phalanx_sim.model import clock

    return clock(seconds)


def _rows(raw: str | None, *, json_out: bool) -> int | None:
    if raw == "all":
        return None
    if raw is None:
        return JSON_ROWS if json_out else TEXT_ROWS
    try:
        return max(0, int(raw))
    except ValueError:
        raise SystemExit(f"phalanx sim: --gangs takes a number or 'all', not {raw!r}") from None


def _inputs(args: argparse.Namespace) -> dict:
    """Cluster, gangs, queues and settings from the flags; the simulation ready to run."""
    from phalanx_kubeobjects.queuespec import queue_from_object
    from phalanx_localstack.inputs import ClusterFile, load_queues
    from phalanx_localstack.stack import StackError
    from phalanx_localstack.synthetic import synthetic_cluster
    from phalanx_rules.queues import QueueTree, tree_problems
    from phalanx_sim import cluster, loop, trace, workload
    from phalanx_sim.model import SimConfig, parse_duration

    if not args.workload and args.trace is None:
        raise _Usage("nothing to run: give --workload FILE and/or --trace [DIR]")
    packing = args.trace is not None and args.trace_mode == "packing"
    queues, namespaces = load_queues(args.queues) if args.queues else ([], [])
    specs = [queue_from_object(q) for q in queues]
    problems = tree_problems(specs)
    if problems:
        name, problem = sorted(problems.items())[0]
        raise Invalid(f"{args.queues}: Queue/{name}", problem)
    tree = QueueTree.of(specs)
    extra = lambda sim: {}  # noqa: E731 - replaced below for a packing run
    title = "phalanx sim"

    live = None
    if args.from_live:
        import anyio

        from phalanx_bus import BusError
        from phalanx_cli.sim_live import read_live

        try:
            live = anyio.run(read_live, args)
        except TimeoutError:
            raise OSError(f"no answer from NATS at {args.nats} within {args.timeout:g}s") from None
        except BusError as e:
            raise OSError(str(e)) from None
        for skipped in live.skipped:
            print(safe(f"phalanx sim: left out {skipped}"), file=sys.stderr)
        if not args.queues:
            tree = QueueTree.of(live.queues)
    trace_nodes = trace_pods = None
    if args.trace is not None:
        trace_nodes, trace_pods = trace.read_trace(Path(args.trace), args.trace_pods)
    if live is not None:
        views = live.views
        title = f"live cluster at {args.nats}"
    elif args.cluster_file:
        views = cluster.views(ClusterFile.load(args.cluster_file))
        title = Path(args.cluster_file).name
    elif args.synthetic:
        try:
            views = cluster.views(synthetic_cluster(args.synthetic))
        except StackError as e:
            raise _Usage(str(e)) from None
        title = f"{args.synthetic}"
    elif args.trace_cluster or packing:
        if trace_nodes is None:
            raise _Usage("--trace-cluster needs --trace")
        order, _ = trace.packing_sequence(trace_nodes, trace_pods, args.seed)
        views = trace.snapshot(trace_nodes, sorted(range(len(trace_nodes)), key=order.__getitem__)).nodes
        title = f"trace cluster ({len(trace_nodes)} nodes)"
    else:
        raise _Usage("which cluster? give --cluster-file F, --synthetic NxSHAPE, --trace-cluster or --from-live")
    capacity = cluster.gpus(views)

    horizon = parse_duration(args.duration) if args.duration else None
    default_duration = parse_duration(args.default_duration) if args.default_duration else None
    gangs = workload.read_workload(args.workload, tree, dict(namespaces), default_duration) if args.workload else []
    if args.trace is not None:
        if packing:
            _, seq = trace.packing_sequence(trace_nodes, trace_pods, args.seed)
            trace_gangs = trace.packing_gangs(trace_pods, seq)
            extra = lambda sim: trace.packing_figures(trace_gangs, {  # noqa: E731
                g: o.start for g, o in sim.outcomes.items() if o.start is not None}, capacity)
            title += f", packing sequence of seed {args.seed}"
        else:
            horizon = horizon if horizon is not None else 7 * 86400.0
            names = tuple(_trace_queue(q) for q in args.trace_queues.split(",") if q)
            for q, _ in names:
                if tree.problem(q):
                    raise Invalid("--trace-queues", tree.problem(q))
            trace_gangs = trace.timed_gangs(trace_pods, seed=args.seed, load=args.load, horizon_s=horizon,
                                            capacity_gpus=capacity, queues=names)
            title += f", trace at load {args.load:g}"
        gangs = gangs + trace_gangs
    sample = (parse_duration(args.sample) if args.sample else
              max(1.0, round(horizon / 500)) if horizon else 60.0)
    config = SimConfig(starve_after_s=args.starve_after_s, fairness=args.fairness, backoff_base_s=args.backoff_base_s,
                       backoff_max_s=args.backoff_max_s, unschedulable_retry_s=args.unschedulable_retry_s,
                       horizon_s=horizon, sample_s=sample, exact=args.exact,
                       preemption=not args.no_preemption,
                       usage_half_life_s=parse_duration(args.usage_half_life) if args.usage_half_life else 0.0)
    progress = None if args.quiet else _progress(horizon, len(gangs))
    sim = loop.Simulation(views, gangs, tree, config, progress=progress, held=live.held if live else None,
                          live=live.holders if live else None)
    return {"sim": sim, "extra": extra, "title": title}


def _trace_queue(text: str) -> tuple[str, float]:
    """``Q`` or ``Q@D``: a queue of the trace's pods and the virtual time it submits from."""
    from phalanx_sim.model import parse_duration

    name, _, start = text.partition("@")
    return name, parse_duration(start) if start else 0.0


def _progress(horizon: float | None, total: int):
    from phalanx_sim.model import clock

    t0 = time.perf_counter()

    def report(sim, t: float) -> None:
        done = f" ({100 * t / horizon:.0f} %)" if horizon else ""
        started = sum(1 for o in sim.outcomes.values() if o.start is not None)
        pending = sum(len(q) for q in sim.pending.values())
        print(f"  t={clock(t)}{done}: {started}/{total} gangs started, {pending} pending, "
              f"{time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)

    return report
