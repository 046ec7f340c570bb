"""Trace-replay packing benchmark: GPU allocation ratio of TDM GPU-share placement policies.

Replays the Alibaba GPU-sharing trace (openb, ``alibaba-gpu-v2023``) the way the FGD paper
(Weng et al., USENIX ATC'23) and its simulator do, see ``docs/packing.md`` and
``../shared/fixtures/traces/REPLAY.md``:

* cluster: the 1213 nodes of ``openb_node_list_gpu_node.csv`` (6212 GPUs);
* workload per seed: the 8152 pods of ``openb_pod_list_default.csv`` in a seeded random order,
  then pods drawn uniformly with replacement from the list and appended until the next one
  would take the summed GPU request past 130 % of capacity; nothing leaves, each pod is tried
  once and dropped if it fits nowhere;
* ties between equal scores go to the node first in a random node order drawn once per seed;
* metric: allocated GPU milli / capacity, averaged over the arrivals whose arrived GPU demand
  rounds to 100 % of capacity (and 130 %), median over the seeds.

Usage (from the repository root)::

    nice -n 10 .venv/bin/python bench/packing.py                 # 10 seeds x 4 policies
    .venv/bin/python bench/packing.py --seeds 1 --quick          # smoke run
    .venv/bin/python bench/packing.py --json out.json --plot out.png

Pure Python (standard library); ``--plot`` draws with matplotlib through ``phalanx_bench.plotting``
(the ``plot`` extra, which ``make install`` installs).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

from phalanx_bench import engine_replay
from phalanx_bench.plotting import PlotUnavailable, Series, line_plot
from phalanx_bench.sharecluster import ShareCluster
from phalanx_bench.sharepack import PodRequest, ShareNode, TargetMix
from phalanx_bench.sharepolicies import POLICIES, PhalanxPack, make_policy
from phalanx_engine.decide import default_profile
from phalanx_sim import trace as sim_trace

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TRACE_DIR = REPO.parent / "shared" / "fixtures" / "traces" / "alibaba-gpu-v2023"
NODE_FILE, POD_FILE = sim_trace.NODE_FILE, sim_trace.POD_FILE
FIRST_SEED = 42
TUNE_RATIO = sim_trace.TUNE_RATIO
ENGINE_POLICIES = ("engine", "engine-mix")
ALL_POLICIES = (*POLICIES, *ENGINE_POLICIES)
LABELS = {"random": "Random fit", "bestfit": "Best fit", "fgd": "FGD", "phalanx": "Phalanx",
          "engine": "Engine", "engine-mix": "Engine + mix"}
PUBLISHED = {"random": 86.25, "bestfit": 92.91, "fgd": 95.23}  # paper's simulator, alloc % @ 100 %


@dataclass(frozen=True)
class Trace:
    nodes: tuple[tuple[str, int, int, int, str | None], ...]  # name, cpu, memory, gpus, model
    pods: tuple[PodRequest, ...]


def load_trace(trace_dir: Path, pod_file: str = POD_FILE) -> Trace:
    nodes, pods = sim_trace.read_trace(trace_dir, pod_file)
    return Trace(nodes, tuple(PodRequest(p.cpu_milli, p.memory_mib, p.gpu_milli, p.gpu_count, p.models) for p in pods))


def workload(trace: Trace, seed: int) -> tuple[list[int], list[int]]:
    """(node order, pod sequence as indices into trace.pods) for one seed
    (``phalanx_sim.trace.packing_sequence``, which ``phalanx sim --trace-mode packing`` replays
    too): ``order[k]`` is the tie-break rank of node k (lower wins); the pod sequence is the
    whole list shuffled, then uniform draws appended until the next draw would take the summed
    GPU request past TUNE_RATIO x capacity."""
    return sim_trace.packing_sequence(trace.nodes, trace.pods, seed)


def replay(trace: Trace, mix: TargetMix, policy_name: str, seed: int, stop_at: float | None = None,
           phalanx_options: dict | None = None) -> dict:
    """One replay; returns the headline figures and the allocation curve (per 1 % arrived)."""
    if policy_name in ENGINE_POLICIES:
        return replay_engine(trace, policy_name, seed, stop_at)
    t0 = time.perf_counter()
    order, seq = workload(trace, seed)
    ranked = sorted(range(len(trace.nodes)), key=order.__getitem__)
    nodes = [ShareNode.empty(*trace.nodes[k]) for k in ranked]
    if policy_name == "phalanx" and phalanx_options:
        policy = PhalanxPack(mix, **phalanx_options)
    else:
        policy = make_policy(policy_name, mix, seed=f"{seed}-gpu")
    cluster = ShareCluster(nodes, policy, rng=random.Random(f"{seed}-node"))
    cap = cluster.gpu_capacity
    arrived = 0
    sums: dict[int, list[float]] = {}
    failed = 0
    for i in seq:
        pod = trace.pods[i]
        arrived += pod.total_gpu_milli
        if cluster.schedule(pod) is None:
            failed += 1
        pct = round(arrived * 100 / cap)
        acc = sums.get(pct)
        if acc is None:
            sums[pct] = [cluster.gpu_allocated / cap, 1.0]
        else:
            acc[0] += cluster.gpu_allocated / cap
            acc[1] += 1
        if stop_at is not None and arrived * 100 / cap >= stop_at:
            break
    return _result(policy_name, seed, sums, len(seq), failed, time.perf_counter() - t0)


def _result(policy_name: str, seed: int, sums: dict[int, list[float]], pods: int, failed: int,
            seconds: float) -> dict:
    curve = {p: 100 * s / c for p, (s, c) in sorted(sums.items())}
    at = sim_trace.allocation_at
    return {"policy": policy_name, "seed": seed, "alloc_100": at(sums, 100), "alloc_130": at(sums, 130),
            "pods": pods, "failed": failed, "seconds": seconds, "curve": curve}


def replay_engine(trace: Trace, policy_name: str, seed: int, stop_at: float | None) -> dict:
    """The same workload through the placement engine: ``engine`` is the placement service's
    profile (stranding score without a mix), ``engine-mix`` the same with FGD's mix from the
    trace's pod list."""
    order, seq = workload(trace, seed)
    mix = engine_replay.mix_of(trace.pods) if policy_name == "engine-mix" else None
    profile = default_profile(mix=mix)
    sums, failed, seconds = engine_replay.replay(trace.nodes, trace.pods, order, seq, profile, stop_at)
    return _result(policy_name, seed, sums, len(seq), failed, seconds)


_TRACE: Trace | None = None
_MIX: TargetMix | None = None


def _init_worker(trace_dir: str, pod_file: str = POD_FILE) -> None:
    global _TRACE, _MIX
    _TRACE = load_trace(Path(trace_dir), pod_file)
    _MIX = TargetMix.from_requests(_TRACE.pods)


def _run_one(args: tuple[str, int, float | None, dict]) -> dict:
    assert _TRACE is not None and _MIX is not None
    return replay(_TRACE, _MIX, *args)


def _fmt(x: float | None) -> str:
    return "   -  " if x is None else f"{x:6.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=10, help="number of seeds (default 10: 42..51)")
    ap.add_argument("--first-seed", type=int, default=FIRST_SEED, help="first seed (default 42)")
    ap.add_argument("--policies", default=",".join(ALL_POLICIES),
                    help=f"comma-separated, from {', '.join(ALL_POLICIES)} (default all)")
    ap.add_argument("--quick", action="store_true",
                    help="stop each replay once arrived demand passes 100.5 %% (no 130 %% figure)")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    ap.add_argument("--stranding-weight", type=float, default=None,
                    help="Phalanx: weight of the CPU-stranding term (default 1; 0 switches it off)")
    ap.add_argument("--cpu-per-gpu", type=float, default=None,
                    help="Phalanx: CPU milli per GPU milli (default: from the target mix, 10.91)")
    ap.add_argument("--no-tight-share", action="store_true",
                    help="Phalanx: put a share on the GPU with the best node score, not the tightest")
    ap.add_argument("--trace-dir", type=Path, default=DEFAULT_TRACE_DIR)
    ap.add_argument("--pod-list", default=POD_FILE, help=f"pod list CSV in the trace dir (default {POD_FILE})")
    ap.add_argument("--json", metavar="FILE", help="write results as JSON ('-' for stdout)")
    ap.add_argument("--plot", metavar="FILE.png", help="plot unallocated GPU vs arrived demand (PNG)")
    ap.add_argument("--from-json", metavar="FILE", type=Path,
                    help="with --plot: draw the runs of a file written by --json instead of replaying")
    args = ap.parse_args(argv)
    if args.from_json:
        if not args.plot:
            ap.error("--from-json needs --plot")
        return _plot_saved(args.from_json, args.plot)

    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    for p in policies:
        if p not in ALL_POLICIES:
            ap.error(f"unknown policy {p!r}")
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    stop_at = 100.5 if args.quick else None
    log = sys.stderr if args.json == "-" else sys.stdout

    t0 = time.perf_counter()
    _init_worker(str(args.trace_dir), args.pod_list)
    assert _TRACE is not None and _MIX is not None
    gpus = sum(n[3] for n in _TRACE.nodes)
    print(f"trace: {len(_TRACE.nodes)} GPU nodes, {gpus} GPUs, {len(_TRACE.pods)} pods ({args.pod_list}); "
          f"target mix: {len(_MIX)} shapes; seeds {seeds[0]}..{seeds[-1]}; "
          f"policies {', '.join(policies)}; tie-break: fixed random node order per seed", file=log)
    popts: dict = {}
    if args.stranding_weight is not None:
        popts["stranding_weight"] = args.stranding_weight
    if args.cpu_per_gpu is not None:
        popts["cpu_per_gpu"] = args.cpu_per_gpu
    if args.no_tight_share:
        popts["tight_share"] = False
    if popts and "phalanx" in policies:
        print(f"phalanx options: {popts}", file=log)
    jobs = [(p, s, stop_at, popts) for s in seeds for p in policies]
    results: list[dict] = []

    def report(r: dict) -> None:
        results.append(r)
        print(f"  {r['policy']:8s} seed {r['seed']:3d}: alloc@100% {_fmt(r['alloc_100'])} %  "
              f"alloc@130% {_fmt(r['alloc_130'])} %  pods {r['pods']} dropped {r['failed']:5d}  "
              f"{r['seconds']:6.1f} s", file=log, flush=True)

    if args.jobs > 1:
        with get_context("fork").Pool(args.jobs, initializer=_init_worker,
                                      initargs=(str(args.trace_dir), args.pod_list)) as pool:
            for r in pool.imap_unordered(_run_one, jobs):
                report(r)
    else:
        for job in jobs:
            report(_run_one(job))
    wall = time.perf_counter() - t0

    summary = {}
    for p in policies:
        rs = [r for r in results if r["policy"] == p]
        a100 = [r["alloc_100"] for r in rs if r["alloc_100"] is not None]
        a130 = [r["alloc_130"] for r in rs if r["alloc_130"] is not None]
        summary[p] = {
            "median_alloc_100": statistics.median(a100) if a100 else None,
            "median_alloc_130": statistics.median(a130) if a130 else None,
            "min_alloc_100": min(a100) if a100 else None,
            "max_alloc_100": max(a100) if a100 else None,
            "seconds": sum(r["seconds"] for r in rs),
        }

    print(f"\nGPU allocation ratio, median over {len(seeds)} seed(s) ({seeds[0]}..{seeds[-1]})", file=log)
    print(f"{'policy':12s} {'@100% arrived':>14s} {'(min..max)':>16s} {'@130% arrived':>14s} "
          f"{'paper @100%':>12s} {'time':>8s}", file=log)
    for p in policies:
        s = summary[p]
        rng = f"{_fmt(s['min_alloc_100']).strip()}..{_fmt(s['max_alloc_100']).strip()}"
        pub = f"{PUBLISHED[p]:.2f}" if p in PUBLISHED and args.pod_list == POD_FILE else "-"
        print(f"{LABELS[p]:12s} {_fmt(s['median_alloc_100']):>12s} % {rng:>16s} "
              f"{_fmt(s['median_alloc_130']):>12s} % {pub:>12s} {s['seconds']:7.1f}s", file=log)
    print(f"total runtime {wall:.1f} s ({args.jobs} process(es))", file=log)

    if args.json:
        out = {"seeds": seeds, "policies": policies, "quick": args.quick, "runtime_s": wall,
               "phalanx_options": popts,
               "summary": summary,
               "runs": [{k: v for k, v in r.items() if k != "curve"} | {"curve": {str(k): v for k, v in
                        r["curve"].items()}} for r in results]}
        text = json.dumps(out, indent=1)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    if args.plot:
        try:
            _plot(results, policies, args.plot, len(seeds))
        except PlotUnavailable as e:
            print(e, file=sys.stderr)
            return 2
        print(f"plot written to {args.plot}", file=log)
    return 0


def _plot_saved(saved: Path, path: str) -> int:
    """``--plot`` from the runs a ``--json`` file holds (the curves of an earlier replay)."""
    data = json.loads(saved.read_text())
    runs = [r | {"curve": {int(k): v for k, v in r["curve"].items()}} for r in data["runs"]]
    try:
        _plot(runs, data["policies"], path, len(data["seeds"]))
    except PlotUnavailable as e:
        print(e, file=sys.stderr)
        return 2
    print(f"plot of {saved} written to {path}")
    return 0


def _plot(results: list[dict], policies: list[str], path: str, seeds: int) -> None:
    """Unallocated GPU (median over the seeds) against arrived demand, 75..130 %."""
    series = []
    for p in policies:
        curves = [r["curve"] for r in results if r["policy"] == p]
        xs = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
        xs = [x for x in xs if x >= 75]
        series.append(Series(LABELS[p], xs, [100 - statistics.median(c[x] for c in curves) for x in xs]))
    series.append(Series("ideal", [75, 100], [25, 0], style=":", color="grey"))
    line_plot(path, series, xlabel="arrived GPU demand (% of capacity)", ylabel="unallocated GPU (%)",
              title=f"GPU-share packing, Alibaba openb trace (median of {seeds} seed(s))", ylim=(0, 25))


if __name__ == "__main__":
    raise SystemExit(main())
