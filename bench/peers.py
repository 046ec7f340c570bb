"""Phalanx side by side with its upstream peers, on one real kube-apiserver, in one run.

The peers: Kueue v0.17.0 with Topology Aware Scheduling (admitting; kube-scheduler binds),
kube-scheduler v1.37.2 with its own gang scheduling (the Workload API's PodGroups, gate
``GenericWorkload``) and topology-aware workload scheduling (alpha gate
``TopologyAwareWorkloadScheduling``, one required level), and plain kube-scheduler (no gangs).
``bench/peers_backends.py`` (Kueue: ``bench/peers_kueue.py``) says how each is run and configured.

One control plane: etcd and kwok from ``tools/kube``, kube-apiserver v1.37.2 from
``tools/peers`` with both gates and ``scheduling.k8s.io/v1beta1`` on. ``--nodes`` kwok nodes of
8 GPUs (and 8 RDMA NICs' worth of ``aliyun.com/rdma``), labelled into HyperNodes, leaf switches
and network-pods (``phalanx.io/hypernode``, ``…/leaf-switch``, ``…/network-pod``; by default 2,
8 and 16 nodes, so the default 128 nodes make 8 network-pods); the same labels are Kueue's Topology levels
and kube-scheduler's topology key. One scheduler at a time owns the nodes (kwok has no kubelet
to refuse an overcommit): for every scenario × scheduler the scheduler is started, the pods are
created by 8 threads, a pod watch records each binding, and the phase ends when every pod is
bound, when nothing new was bound for ``--quiet-s`` after the last create, or at ``--cap-s``;
then what a pending gang's pods say is read, the pods are deleted and the scheduler stopped.
The figures (``phalanx_bench.peers``) come only from create times and the watch.

A scenario is a small declarative ``Scenario`` (``phalanx_bench.peers_scenarios``; parts: gang
size, share of the cluster's GPUs, RDMA, team; creation order; waves). ``two-teams`` needs
queues with quota: Kueue runs it with two ClusterQueues in a cohort, Phalanx with two Queues
under one parent; kube-scheduler prints why it cannot. What this bench shares with
``bench/scale.py`` (kwok stages, threads, progress lines, matplotlib) is ``bench/kwokbench.py``.

    make peers && .venv/bin/python bench/peers.py                 # every scenario and scheduler
    .venv/bin/python bench/peers.py --scenarios jobset7 --schedulers kueue,kube-gang
    .venv/bin/python bench/peers.py --json peers.json --plot docs/img/peers.png
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "kube"))
sys.path.insert(0, str(REPO / "bench"))

from kubeharness import ControlPlane, fake_gpu_node  # noqa: E402

from kube_baseline import BindWatch  # noqa: E402
from kwokbench import api_counts, in_threads, kwok_stages, kwok_took_in, pyplot_or_exit, say  # noqa: E402
from peers_backends import Backend, Gang, KubeGang, KubePlain, Phalanx, Terminator, base_pod  # noqa: E402
from peers_kueue import Kueue  # noqa: E402
from phalanx_bench.peers import Layout, Member, gang_metrics, pct  # noqa: E402
from phalanx_bench.peers_scenarios import SCENARIOS, Scenario  # noqa: E402
from procstat import cpu_seconds  # noqa: E402

PEERS_BUILD = REPO / "tools" / "peers" / "build.sh"
BACKENDS: dict[str, type[Backend]] = {b.name: b for b in (Phalanx, Kueue, KubeGang, KubePlain)}


# -- the control plane --------------------------------------------------------------------------
def build_dir(script: Path, what: str) -> Path:
    """Build (or reuse) the cached tools and return their directory; progress on stderr."""
    say(f"{what}: bash {script.relative_to(REPO)} (cached after the first build; a cold build takes long)")
    out = subprocess.run(["bash", str(script)], stdout=subprocess.PIPE, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{script.relative_to(REPO)} failed (rc {out.returncode}); see its output above")
    return Path(out.stdout.strip().splitlines()[-1])


GATES = "GenericWorkload=true,TopologyAwareWorkloadScheduling=true"


def start_plane(peers_bin: Path, work: Path, layout: Layout) -> ControlPlane:
    bins = build_dir(REPO / "tools" / "kube" / "build.sh", "etcd and kwok")
    plane = ControlPlane(bins=bins, workdir=Path(tempfile.mkdtemp(prefix="peers-kube-", dir=str(work))),
                         kwok_config=kwok_stages(work, "peers"), kwok_lease_s=600, kwok_cidr="10.0.0.0/16",
                         bin_overrides={"kube-apiserver": peers_bin / "kube-apiserver"},
                         apiserver_args=(f"--feature-gates={GATES}", "--runtime-config=scheduling.k8s.io/v1beta1=true"))
    plane.start()
    api = plane.api
    version = api.get("/version")["gitVersion"]

    def node(i: int) -> None:
        obj = fake_gpu_node(layout.name(i), labels={"lj_runtimekit_enable": "true", **layout.labels(i)})
        for k in ("capacity", "allocatable"):
            obj["status"][k]["aliyun.com/rdma"] = str(layout.gpus_per_node)
        api.create_node(obj)

    before = api_counts(api)
    in_threads(node, range(layout.nodes))
    kwok_took_in(api, layout.nodes, before)
    say(f"control plane up: kube-apiserver {version} with {GATES}, {layout.nodes} kwok nodes")
    return plane


# -- one phase ----------------------------------------------------------------------------------
def run_phase(plane: ControlPlane, backend: Backend, scenario: Scenario, layout: Layout, args) -> dict:
    api = plane.api
    ns = f"{scenario.name}-{backend.name}"
    api.create_namespace(ns)
    waves = scenario.members(layout, args.seed)
    members = [m for w in waves for m in w]
    gangs = {m.gang: Gang(m.gang, m.size) for m in members if m.gang}
    label = f"{scenario.name} / {backend.label}"
    began = time.monotonic()
    backend.start(ns)
    say(f"  [{label}] {backend.label} ready ({time.monotonic() - began:.0f} s); {len(members)} pods, {len(gangs)} gangs")
    created: dict[str, float] = {}
    try:
        backend.prepare(ns, list(gangs.values()), dict(scenario.quotas))
        watch = BindWatch(plane, ns)
        terminator = Terminator(plane, ns)
        pids = backend.pids()
        cpu0 = sum(map(cpu_seconds, pids))

        def create(m: Member) -> None:
            pod = backend.dress(base_pod(m.pod, ns, m.rdma), gangs.get(m.gang), m.team)
            created[m.pod] = time.perf_counter()
            api.create_pod(pod)

        started = time.perf_counter()
        for i, wave in enumerate(waves):
            in_threads(create, wave)
            last = wait_settled(watch, members, created, started, args, label, final=i == len(waves) - 1)
        end = time.perf_counter()
        cpu = sum(map(cpu_seconds, pids)) - cpu0
        watch.close()
        terminator.close()
        if watch.error is not None:
            raise RuntimeError(f"{label}: the pod watch broke: {watch.error!r}")
        bound = dict(watch.bound)
        result = {"scenario": scenario.name, "scheduler": backend.name, "label": backend.label,
                  **gang_metrics(layout, members, created, bound, end), "cpu_s": cpu, "phase_s": end - started,
                  "stopped": last}
        result["reasons"] = pending_reasons(api, backend, ns, members, bound)
        if scenario.quotas:
            result["teams"] = team_figures(api, ns, scenario, members, created, bound)
        say(f"  [{label}] {result['bound']}/{len(members)} bound, {result['whole']}/{len(gangs)} gangs whole "
            f"({last}, {end - started:.0f} s)")
        return result
    finally:
        backend.cleanup(ns)
        backend.stop()


def wait_settled(watch: BindWatch, members: list[Member], created: dict, started: float, args, label: str,
                 final: bool) -> str:
    """Until every created pod is bound, nothing new bound for ``--quiet-s`` (a wave that is
    not the last: 5 s), or ``--cap-s`` since the phase began. Progress every 10 s."""
    quiet = args.quiet_s if final else min(args.quiet_s, 5.0)
    last_count, last_change, last_report = -1, time.perf_counter(), time.perf_counter()
    while True:
        now = time.perf_counter()
        n = len(watch.bound)
        if n != last_count:
            last_count, last_change = n, now
        if watch.error is not None:
            return "watch broke"
        if n >= len(created) and (len(created) == len(members) or not final):
            return "all bound"
        if now - last_change >= quiet:
            return f"nothing bound for {quiet:.0f} s"
        if now - started >= args.cap_s:
            return f"cap {args.cap_s:.0f} s"
        if now - last_report >= 10:
            last_report = now
            gangs: dict[str, list[bool]] = {}
            for m in members:
                if m.gang:
                    gangs.setdefault(m.gang, []).append(m.pod in watch.bound)
            say(f"  [{label}] {now - started:.0f} s: {len(created)} created, {n}/{len(members)} bound, "
                f"{sum(all(v) for v in gangs.values())}/{len(gangs)} gangs whole")
        time.sleep(0.1)


def pending_reasons(api, backend: Backend, ns: str, members: list[Member], bound: dict) -> dict:
    """For the first gang that is not whole (and, failing one, a pending single pod): one member
    that is not bound, and what it is told, verbatim."""
    pending = [m for m in members if m.pod not in bound]
    pick = next((m for m in pending if m.gang), None) or (pending[0] if pending else None)
    if pick is None:
        return {}
    pod = api.get_pod(ns, pick.pod)
    if pod is None:
        return {"gang": pick.gang, "pod": pick.pod, "text": ["(the pod is gone: deleted by the scheduler)"]}
    return {"gang": pick.gang, "pod": pick.pod, "text": backend.reason(ns, pod, pick.gang)}


def team_figures(api, ns: str, scenario: Scenario, members: list[Member], created: dict, bound: dict) -> dict:
    """Per team: GPUs its living pods hold at the end, its gangs whole, the p50 time to a whole
    gang, and its gangs that lost pods (preempted) after they were bound."""
    alive = {p["metadata"]["name"]: p for p in api.get(f"/api/v1/namespaces/{ns}/pods")["items"]
             if not p["metadata"].get("deletionTimestamp")}
    out = {}
    for team, quota in scenario.quotas:
        mine = [m for m in members if m.team == team]
        gangs: dict[str, list[Member]] = {}
        for m in mine:
            gangs.setdefault(m.gang, []).append(m)
        times = [max(bound[m.pod][0] for m in ms) - min(created[m.pod] for m in ms)
                 if all(m.pod in bound for m in ms) else math.inf for ms in gangs.values()]
        out[team] = {"quota_share": quota, "gangs": len(gangs),
                     "gpus_held": sum(1 for m in mine if m.pod in alive and alive[m.pod]["spec"].get("nodeName")),
                     "whole": sum(math.isfinite(t) for t in times), "gang_p50_s": pct(times, 0.5),
                     "preempted_gangs": sum(1 for ms in gangs.values()
                                            if any(m.pod in bound for m in ms) and any(m.pod not in alive for m in ms))}
    return out


# -- output -------------------------------------------------------------------------------------
def secs(v: float) -> str:
    if isinstance(v, float) and math.isnan(v):
        return "-"
    return "never" if math.isinf(v) else (f"{v * 1000:.0f} ms" if v < 1 else f"{v:.1f} s")


SPEED = (("bound", 9), ("gangs whole", 11), ("gang p50", 9), ("gang p99", 9), ("pods/s", 7), ("CPU s", 6))
PLACEMENT = (("tightest tier", 13), ("split netpods", 13), ("partial at end", 14), ("held GPU·s", 10),
             ("peak held", 9), ("longest partial", 15), ("idle GPUs waiting", 17))


def _row(first: str, cells: list[str], spec) -> str:
    return f"  {first:<20}" + "".join(f"  {c:>{w}}" for c, (_, w) in zip(cells, spec, strict=True))


def table(results: list[dict], skipped: list[tuple[str, str, str]], layout: Layout) -> str:
    """Per scenario: a speed table, then a placement-and-holding table, one row per scheduler."""
    out = [f"{layout.nodes} kwok nodes x {layout.gpus_per_node} GPUs ({layout.gpus} GPUs); HyperNode = "
           f"{layout.hypernode} nodes, leaf switch = {layout.leaf}, network-pod = {layout.netpod}"]
    for name, sc in SCENARIOS.items():
        rows = [r for r in results if r["scenario"] == name]
        skips = [s for s in skipped if s[0] == name]
        if not rows and not skips:
            continue
        out += ["", f"{name}: {sc.what}", _row("scheduler", [c for c, _ in SPEED], SPEED)]
        for r in rows:
            out.append(_row(r["label"], [f"{r['bound']}/{r['pods']}", f"{r['whole']}/{r['gangs']}",
                                         secs(r["gang_p50_s"]), secs(r["gang_p99_s"]), f"{r['pods_per_s']:.1f}",
                                         f"{r['cpu_s']:.1f}"], SPEED))
        for _, sched, why in skips:
            out.append(f"  {BACKENDS[sched].label:<20}  {why}")
        if rows:
            out.append(_row("scheduler", [c for c, _ in PLACEMENT], PLACEMENT))
        for r in rows:
            out.append(_row(r["label"], ["-" if math.isnan(r["tightest_pct"]) else f"{r['tightest_pct']:.0f} %",
                                         str(r["split_netpods"]), str(r["partial_at_end"]),
                                         f"{r['held_partial_gpu_s']:.0f}", str(r["held_partial_peak_gpus"]),
                                         secs(r["longest_partial_s"]), str(r["idle_gpus_while_waiting"])], PLACEMENT))
        for r in rows:
            if "teams" in r:
                out += [f"  {r['label']}, team {t}: quota {100 * v['quota_share']:.0f} % of the GPUs, holds "
                        f"{v['gpus_held']} GPUs at the end, {v['whole']}/{v['gangs']} gangs whole, p50 "
                        f"{secs(v['gang_p50_s'])}, {v['preempted_gangs']} gangs preempted"
                        for t, v in r["teams"].items()]
    out += ["", "What a pending gang's pods say (verbatim, at the end of the phase):"]
    for r in results:
        if r["reasons"]:
            what = f"gang {r['reasons']['gang']}" if r["reasons"]["gang"] else "single pod"
            out.append(f"  {r['scenario']} / {r['label']} ({what}, pod {r['reasons']['pod']}):")
            out += [f"      {line}" for line in r["reasons"]["text"]]
    return "\n".join(out)


def plot(results: list[dict], path: str) -> None:
    plt = pyplot_or_exit()
    scen = [s for s in SCENARIOS if any(r["scenario"] == s for r in results)]
    scheds = [b for b in BACKENDS if any(r["scheduler"] == b for r in results)]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / max(1, len(scheds))
    for k, sched in enumerate(scheds):
        by = {r["scenario"]: r for r in results if r["scheduler"] == sched}
        xs = [i + k * width for i in range(len(scen))]
        p50 = [by[s]["gang_p50_s"] if s in by and math.isfinite(by[s]["gang_p50_s"]) else 0 for s in scen]
        tight = [by[s]["tightest_pct"] if s in by and math.isfinite(by[s]["tightest_pct"]) else 0 for s in scen]
        axes[0].bar(xs, p50, width, label=BACKENDS[sched].label)
        axes[1].bar(xs, tight, width, label=BACKENDS[sched].label)
    for ax, ylabel in ((axes[0], "time to the whole gang bound, p50 (s)"),
                       (axes[1], "gangs within their tightest possible tier (%)")):
        ax.set_xticks([i + width * (len(scheds) - 1) / 2 for i in range(len(scen))], scen)
        ax.set_ylabel(ylabel)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Same pods, same kwok cluster, one scheduler at a time (bench/peers.py)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _revive(r: dict) -> dict:
    """A result read back from JSON: its gang sizes are ints again (JSON keys are strings)."""
    r["gang_p50_by_size"] = {int(k): v for k, v in r["gang_p50_by_size"].items()}
    return r


# -- main ---------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="scenarios: " + "; ".join(
        f"{s.name}: {s.what}" for s in SCENARIOS.values()), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=128, help="kwok nodes of 8 GPUs (default %(default)s)")
    p.add_argument("--tiers", default="2,8,16", help="nodes per HyperNode, leaf switch, network-pod (default %(default)s)")
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma list (default: all)")
    p.add_argument("--schedulers", default=",".join(BACKENDS), help="comma list (default: all)")
    p.add_argument("--cap-s", type=float, default=240.0, help="seconds a phase may run (default %(default)s)")
    p.add_argument("--quiet-s", type=float, default=30.0,
                   help="end a phase when nothing was bound for this long (default %(default)s)")
    p.add_argument("--qps", type=int, default=1000, help="client QPS/burst of every scheduler (default %(default)s)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--keep", metavar="DIR", help="work in DIR and keep it (every process's log)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.add_argument("--plot", metavar="PNG", help="also draw the gang p50 and the tightest-tier share per scenario")
    p.add_argument("--from-json", metavar="FILE", help="print (and --plot) a run saved with --json instead of running")
    args = p.parse_args(argv)
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text(), parse_constant=float)
        results = [_revive(r) for r in saved["results"]]
        print(table(results, [tuple(s) for s in saved["skipped"]], Layout(**saved["meta"]["layout"])))
        m = saved["meta"]
        print(f"\n{m['date']}, {m['cpus']} CPUs, {m['minutes']} min, load average at the end "
              f"{', '.join(f'{x:.1f}' for x in m['load_average_end'])}")
        if args.plot:
            plot(results, args.plot)
        return 0
    hn, leaf, netpod = (int(x) for x in args.tiers.split(","))
    layout = Layout(args.nodes, hypernode=hn, leaf=leaf, netpod=netpod)
    scenarios = [SCENARIOS[s] for s in args.scenarios.split(",") if s]
    schedulers = [s for s in args.schedulers.split(",") if s]
    for s in schedulers:
        if s not in BACKENDS:
            p.error(f"unknown scheduler {s!r}; known: {', '.join(BACKENDS)}")
    t0 = time.monotonic()
    peers_bin = build_dir(PEERS_BUILD, "kube-apiserver/kube-scheduler v1.37.2 and Kueue v0.17.0")
    results, skipped = [], []
    with (nullcontext(args.keep) if args.keep else tempfile.TemporaryDirectory(prefix="phalanx-peers-")) as tmp:
        work = Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        if args.keep:
            os.environ["PHALANX_KEEP_KUBE"] = "1"
        plane = start_plane(peers_bin, work, layout)
        try:
            for sc in scenarios:
                for name in schedulers:
                    backend = BACKENDS[name](plane, layout, peers_bin, work, args.qps)
                    if sc.quotas and backend.queues:
                        skipped.append((sc.name, name, backend.queues))
                        continue
                    say(f"{sc.name} / {backend.label} ({time.monotonic() - t0:.0f} s into the run)")
                    try:
                        results.append(run_phase(plane, backend, sc, layout, args))
                    except Exception as e:  # noqa: BLE001 - report it in the table and go on
                        say(f"  FAILED: {e!r}")
                        skipped.append((sc.name, name, f"failed: {e!r}"[:300]))
        finally:
            plane.stop()
    meta = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "minutes": round((time.monotonic() - t0) / 60, 1),
            "load_average_end": os.getloadavg(), "layout": asdict(layout), "args": vars(args)}
    print(table(results, skipped, layout))
    print(f"\n{meta['cpus']} CPUs, {meta['minutes']} min, load average at the end "
          f"{', '.join(f'{x:.1f}' for x in meta['load_average_end'])}")
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "results": results, "skipped": skipped}, indent=1,
                                              default=str))
    if args.plot:
        plot(results, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
