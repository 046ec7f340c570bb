"""The placement service's request→Placed latency against cluster size, beside the engine's
own decision time on the same cluster (so no engine figure is read as the service's).

For each N: a fresh real nats-server and one ``phalanx run placement`` process; N synthetic
8 x V100 nodes (``phalanx_localstack.synthetic``: HyperNodes of 8, leaf switches of 64,
network-pods of 512) whose topology reports and heartbeats are written straight into KV
(``phx-topology``, ``phx-heartbeat``) and heartbeats rewritten every 10 s, below placement's
15 s staleness bound; no node agent runs, so none of their CPU is measured. Then one
``PlacementRequested`` at a time, each a fresh one-GPU gang, published on
``phx.gang.placement.<gang>``; its latency runs from the publish to the ``Placed`` (or
``PlacementFailed``) that a core subscription, opened before, sees on ``phx.gang.coord.<gang>``.
Placed pods keep their GPUs, so the ledger fills as a busy cluster's would. Beside it: the
engine alone deciding the same request on the same nodes in this process — ``engine``:
``place_snapshot``, the cluster state built for each decision (what placement did before its
cache); ``kept``: ``decide`` on one cluster kept and booked into, as placement's cache does.
Also printed: placement's CPU seconds per request (``/proc/<pid>/stat``) and its peak RSS.

    .venv/bin/python bench/placement_latency.py                              # 10, 100, 1,000, 5,000 nodes
    .venv/bin/python bench/placement_latency.py --nodes 1000 --requests 50 --json
    .venv/bin/python bench/placement_latency.py --baseline before.json --save after.json --plot latency.png
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import anyio
import msgspec

from phalanx_bus import Bus
from phalanx_engine.decide import Cluster, decide, default_profile, place_snapshot
from phalanx_engine.snapshot import Decision, NodeView, Snapshot
from phalanx_localstack.natsserver import NatsServer
from phalanx_localstack.synthetic import synthetic_cluster
from phalanx_proto import subjects as S
from phalanx_proto.events import (
    MemberSpec,
    NodeHeartbeat,
    NodeTopologyReported,
    PlaceRequested,
    PodRef,
    encoder,
    gang_decoder,
)
from phalanx_proto.state import GangState, members_digest
from phalanx_topology.tiers import tiers_from_labels
from phalanx_topology_discovery.service import topology_from_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from procstat import cpu_seconds, memory_mib, pct  # noqa: E402

BEAT_EVERY_S = 10.0


def reports(n: int) -> list[NodeTopologyReported]:
    return [NodeTopologyReported(
        node=node.name, topology=topology_from_file(node.topology_file, node.name, gpu_model=node.gpu_model,
                                                   gpu_memory_mib=node.gpu_memory_mib),
        tiers=tiers_from_labels(node.name, node.labels), enabled=True) for node in synthetic_cluster(f"{n}x8v100").nodes]


async def put_all(bus: Bus, bucket: str, items: list[tuple[str, bytes]]) -> None:
    kv = await bus.kv(bucket)
    limiter = anyio.CapacityLimiter(64)

    async def one(key: str, value: bytes) -> None:
        async with limiter:
            await kv.put(key, value)

    async with anyio.create_task_group() as tg:
        for key, value in items:
            tg.start_soon(one, key, value)


async def beats(bus: Bus, names: list[str]) -> None:
    now = time.time()
    await put_all(bus, S.KV_HEARTBEAT, [(S.token(n), encoder.encode(NodeHeartbeat(node=n, at=now))) for n in names])


def request(k: int) -> GangState:
    """A one-GPU gang at attempt 1, placing, as gang-coordinator records it."""
    pod = PodRef(namespace="bench", name=f"p{k}", uid=f"uid-{k}")
    return GangState(gang_id=f"bench/p{k}", phase="placing", attempt=1, members=(MemberSpec(pod=pod, gpus=1),))


PLACED = ("Placed", "Reserved")
"""The reply that says the gang is reserved."""
SERVICE_PROFILE = default_profile(require_node_state=False)
"""The profile the placement service runs while node agents do not report ``NodeKubeState``
(``--node-state optional`` of the placement service): the synthetic nodes have none."""


def kept_cluster_ms(reps: list[NodeTopologyReported], count: int = 200) -> list[float]:
    """The engine deciding the same one-GPU requests on one cluster built once, each decision
    booked into it (``Cluster.assume``) before the next, as the placement service's cache does."""
    cluster = Cluster.from_snapshot(Snapshot(nodes=tuple(NodeView(name=r.node, topology=r.topology, tiers=r.tiers)
                                                         for r in reps)))
    out = []
    for k in range(min(count, 4 * len(reps))):  # at most half the GPUs: it must not fill up
        started = time.perf_counter()
        got = decide(cluster, request(k).members, SERVICE_PROFILE)
        out.append((time.perf_counter() - started) * 1000)
        assert isinstance(got, Decision)
        cluster.assume(got.assignments)
    return out


def engine_ms(reps: list[NodeTopologyReported], count: int = 200) -> list[float]:
    """The engine deciding the same one-GPU requests on the same nodes, after 5 warm-up decisions."""
    snap = Snapshot(nodes=tuple(NodeView(name=r.node, topology=r.topology, tiers=r.tiers) for r in reps))
    for k in range(5):
        place_snapshot(snap, request(k).members, SERVICE_PROFILE)
    out = []
    for k in range(count):
        started = time.perf_counter()
        assert isinstance(place_snapshot(snap, request(k).members, SERVICE_PROFILE), Decision)
        out.append((time.perf_counter() - started) * 1000)
    return out


async def measure(n: int, requests: int, cap_s: float, workdir: Path, extra: tuple[str, ...] = ()) -> dict:
    reps = reports(n)
    names = [r.node for r in reps]
    server = NatsServer(store_dir=str(workdir / f"nats-{n}"))
    os.makedirs(server.store_dir, exist_ok=True)
    server.start()
    proc = None
    try:
        bus = await Bus.connect(server.url, service="bench")
        await bus.declare()
        await put_all(bus, S.KV_TOPOLOGY, [(S.token(r.node), encoder.encode(r)) for r in reps])
        await beats(bus, names)
        ready = workdir / f"placement-{n}.ready"
        with open(workdir / f"placement-{n}.log", "ab") as log:  # noqa: ASYNC230 - once per size
            proc = await anyio.open_process([sys.executable, "-m", "phalanx_cli.main", "run", "placement", "--nats",
                                             server.url, "--ready-file", str(ready), *extra], stdout=log, stderr=log)
        with anyio.fail_after(120):
            while not ready.exists():
                if proc.returncode is not None:
                    raise RuntimeError(f"placement exited with {proc.returncode}; see {workdir}")
                await anyio.sleep(0.1)
        latencies, outcomes = [], {"placed": 0, "failed": 0}
        async with anyio.create_task_group() as tg:
            async def refresh() -> None:
                while True:
                    await anyio.sleep(BEAT_EVERY_S)
                    await beats(bus, names)

            tg.start_soon(refresh)
            for k in range(2):  # warm-up, not counted
                await one_request(bus, request(10_000_000 + k))
            await anyio.sleep(1.0)  # one-off start-up work (the decision log's first base) done
            for k in range(2, 4):  # and the consumer awake again after the pause
                await one_request(bus, request(10_000_000 + k))
            cpu0, started = cpu_seconds(proc.pid), time.monotonic()
            for k in range(requests):
                if time.monotonic() - started > cap_s:
                    break
                ms, placed = await one_request(bus, request(k))
                latencies.append(ms)
                outcomes["placed" if placed else "failed"] += 1
                if (k + 1) % 10 == 0:
                    print(f"  {n:>5} nodes: {k + 1} requests, p50 so far {pct(latencies, 0.5):.1f} ms",
                          file=sys.stderr, flush=True)
            cpu = cpu_seconds(proc.pid) - cpu0
            rss, peak = memory_mib(proc.pid)
            tg.cancel_scope.cancel()
        await bus.close()
    finally:
        if proc is not None and proc.returncode is None:
            proc.terminate()
            with anyio.move_on_after(10, shield=True):
                await proc.wait()
        server.close()
    eng, kept = engine_ms(reps), kept_cluster_ms(reps)
    return {"nodes": n, "requests": len(latencies), **outcomes,
            "p50_ms": pct(latencies, 0.5), "p99_ms": pct(latencies, 0.99), "max_ms": max(latencies),
            "engine_p50_ms": pct(eng, 0.5), "engine_p99_ms": pct(eng, 0.99), "kept_p50_ms": pct(kept, 0.5),
            "cpu_ms_per_request": 1000 * cpu / max(1, len(latencies)), "rss_mib": rss, "peak_rss_mib": peak}


async def one_request(bus: Bus, record: GangState) -> tuple[float, bool]:
    """Record the gang as gang-coordinator would (attempt placing, these members), publish
    the request and wait for its reply: (milliseconds, placed?). Only the publish→reply time
    counts."""
    record = msgspec.structs.replace(record, created_at=time.time())
    ev = PlaceRequested(gang_id=record.gang_id, attempt=record.attempt, members_digest=members_digest(record))
    await (await bus.kv(S.KV_GANGS)).put(S.gang_key(ev.gang_id), encoder.encode(record))
    sub = await bus.nc.subscribe("phx.gang.coord.>")  # placement's answers, alone or batched
    try:
        await bus.nc.flush()
        started = time.perf_counter()
        await bus.publish(S.placement_subject(ev.gang_id), ev)
        with anyio.fail_after(600):
            async for msg in sub.messages:
                decoded = gang_decoder.decode(msg.data)
                for reply in (c.event for c in decoded.events) if hasattr(decoded, "events") else (decoded,):
                    if (reply.gang_id == ev.gang_id and reply.attempt == ev.attempt
                            and type(reply).__name__ in (*PLACED, "PlacementFailed")):
                        return (time.perf_counter() - started) * 1000, type(reply).__name__ in PLACED
    finally:
        await sub.unsubscribe()
    raise RuntimeError("subscription ended")


def table(rows: list[dict]) -> str:
    out = [f"{'nodes':>6} {'requests':>9} {'service p50':>12} {'service p99':>12} {'engine p50':>11} "
           f"{'engine p99':>11} {'kept p50':>10} {'service/engine':>15} {'CPU/request':>12} {'peak RSS':>9}",
           "-" * 115]
    for r in rows:
        out.append(f"{r['nodes']:>6} {r['requests']:>9} {r['p50_ms']:>9.1f} ms {r['p99_ms']:>9.1f} ms "
                   f"{r['engine_p50_ms']:>8.3f} ms {r['engine_p99_ms']:>8.3f} ms {r['kept_p50_ms']:>7.3f} ms "
                   f"{r['p50_ms'] / r['engine_p50_ms']:>14.0f}x {r['cpu_ms_per_request']:>9.1f} ms "
                   f"{r['peak_rss_mib']:>5.0f} MiB")
    return "\n".join(out)


def compared(rows: list[dict], before: list[dict]) -> str:
    """This run beside an earlier one (``--baseline``, its ``--json`` output), size by size."""
    old = {r["nodes"]: r for r in before}
    out = [f"{'nodes':>6} {'before p50':>11} {'after p50':>10} {'before p99':>11} {'after p99':>10} "
           f"{'p50 ratio':>10} {'before CPU/req':>15} {'after CPU/req':>14}", "-" * 96]
    for r in rows:
        b = old.get(r["nodes"])
        if b is None:
            out.append(f"{r['nodes']:>6} {'-':>11} {r['p50_ms']:>7.1f} ms {'-':>11} {r['p99_ms']:>7.1f} ms")
            continue
        out.append(f"{r['nodes']:>6} {b['p50_ms']:>8.1f} ms {r['p50_ms']:>7.1f} ms {b['p99_ms']:>8.1f} ms "
                   f"{r['p99_ms']:>7.1f} ms {b['p50_ms'] / r['p50_ms']:>9.0f}x {b['cpu_ms_per_request']:>12.1f} ms "
                   f"{r['cpu_ms_per_request']:>11.1f} ms")
    return "\n".join(out)


def plot(rows: list[dict], before: list[dict], path: str) -> None:
    """request→Placed p50 and p99 against nodes (this run, the baseline), and the engine's p50."""
    from phalanx_bench.plotting import Series, line_plot

    def series(label: str, rs: list[dict], key: str, style: str, color: str) -> Series:
        return Series(label, [r["nodes"] for r in rs], [r[key] for r in rs], style, color, "o")

    lines = [series("service p50", rows, "p50_ms", "-", "tab:blue"), series("service p99", rows, "p99_ms", "--", "tab:blue")]
    if before:
        lines += [series("before p50 (bucket reads per request)", before, "p50_ms", "-", "tab:red"),
                  series("before p99", before, "p99_ms", "--", "tab:red")]
    lines.append(series("engine alone, kept cluster, p50", rows, "kept_p50_ms", ":", "tab:gray"))
    line_plot(path, lines, xlabel="nodes (8 GPUs each)", ylabel="request → Placed (ms)", logx=True, logy=True,
              title="placement service: one-GPU request → Placed")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, action="append", help="cluster size (repeatable; default 10 100 1000 5000)")
    p.add_argument("--requests", type=int, default=30, help="requests per size (default %(default)s)")
    p.add_argument("--cap-s", type=float, default=180.0,
                   help="stop sending requests to one size after this many seconds (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--baseline", metavar="JSON", help="an earlier run's --json output, printed beside this one")
    p.add_argument("--save", metavar="JSON", help="also write this run's rows as JSON")
    p.add_argument("--plot", metavar="PNG", help="draw request→Placed against nodes (with the baseline)")
    p.add_argument("--placement-arg", action="append", default=[], metavar="ARG",
                   help="pass ARG to `phalanx run placement` (repeatable), e.g. --placement-arg=--no-record-decisions")
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="phalanx-bench-") as tmp:
        for n in args.nodes or [10, 100, 1000, 5000]:
            print(f"{n} nodes: seeding KV, starting placement ...", file=sys.stderr, flush=True)
            rows.append(anyio.run(measure, n, args.requests, args.cap_s, Path(tmp), tuple(args.placement_arg)))
    print(json.dumps(rows, indent=2) if args.json else table(rows))
    before = json.loads(Path(args.baseline).read_text()) if args.baseline else []
    if before and not args.json:
        print(f"\nbefore ({args.baseline}) and after, side by side:")
        print(compared(rows, before))
    if args.save:
        Path(args.save).write_text(json.dumps(rows, indent=2))
    if args.plot:
        plot(rows, before, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
