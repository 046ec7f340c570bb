"""binder alone on a real kube-apiserver: binds per second and the API requests each bind costs,
one command at a time (the baseline) against ``--parallelism`` binds at once, with and without
the per-node fences of docs/delivery.md.

One control plane (etcd + kube-apiserver v1.36.3, no kwok: nothing runs the pods), one
nats-server, and ``phalanx run binder --cluster kube`` as its own process. For each scenario:
``--nodes`` nodes get a topology report (saying whether their agent serves the device plugin),
``--gangs`` gangs of ``--gang-size`` one-GPU pods are created and reserved in ``phx-ledger``
(each gang on one node, as placement would put a small gang), then every gang's ``BindPods`` is
published at once. Timed from the first publish to the last pod named bound in a ``BindsDone``; the request counts
come from the API server's own ``apiserver_request_total`` before and after. The client's rate
limit is off (``--kube-api-qps 0``), so binder, not its token bucket, is measured; run with
``--qps 50`` to see kube-scheduler's default limit instead.

    .venv/bin/python bench/binder_throughput.py                   # 32 gangs x 8 pods on 8 nodes
    .venv/bin/python bench/binder_throughput.py --gangs 64 --json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import anyio

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "kube"))

import kubeharness  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from phalanx_bus import Bus  # noqa: E402
from phalanx_localstack.natsserver import NatsServer  # noqa: E402
from phalanx_proto import subjects as S  # noqa: E402
from phalanx_proto.events import (  # noqa: E402
    Assignment,
    BindPods,
    BindsDone,
    NodeTopologyReported,
    PodRef,
    encoder,
    gang_decoder,
)
from phalanx_proto.state import Allocation, NodeLedger, alloc_key  # noqa: E402
from phalanx_proto.topology import Gpu, NodeTopology  # noqa: E402


def requests_by_kind(api) -> Counter:
    """``apiserver_request_total`` summed by (verb, resource, subresource)."""
    _, text = api.request("GET", "/metrics")  # text, not JSON: the client hands it back as a string
    out: Counter = Counter()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "apiserver_request_total":
                labels = s.labels
                kind = f"{labels.get('verb')} {labels.get('resource')}" + (
                    f"/{labels['subresource']}" if labels.get("subresource") else "")
                out[kind] += int(s.value)
    return out


def pod(name: str, ns: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": {"schedulerName": "phalanx", "containers": [
                {"name": "c", "image": "registry.example/app:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


async def scenario(plane, url: str, args, *, parallelism: int, fenced: bool, tag: str) -> dict:
    api = plane.api
    ns = kubeharness.unique(f"bind-{tag}")
    api.create_namespace(ns)
    nodes = [f"{ns}-n{i}" for i in range(args.nodes)]
    bus = await Bus.connect(url, service="bench")
    await bus.declare()
    topo_kv, ledger_kv = await bus.kv(S.KV_TOPOLOGY), await bus.kv(S.KV_LEDGER)
    per_node = -(-args.gangs // args.nodes)  # gangs per node, each on GPUs of its own
    for n in nodes:
        names = [f"GPU{i}" for i in range(args.gang_size * per_node)]
        topo = NodeTopology(node=n, gpus=tuple(Gpu(index=i, name=name, model="A100", memory_mib=40960)
                                               for i, name in enumerate(names)),
                            relations={a: {b: "SYS" for b in names if b != a} for a in names})
        await topo_kv.put(S.token(n), encoder.encode(NodeTopologyReported(node=n, topology=topo, device_plugin=fenced)))
    commands: list[BindPods] = []
    pods: list[PodRef] = []
    ledgers: dict[str, dict] = {n: {} for n in nodes}
    for g in range(args.gangs):
        node = nodes[g % len(nodes)]
        gang = f"{ns}/g{g}"
        members = []
        for k in range(args.gang_size):
            obj = await anyio.to_thread.run_sync(api.create_pod, pod(f"g{g}-{k}", ns))
            a = Assignment(pod=PodRef(namespace=ns, name=obj["metadata"]["name"], uid=obj["metadata"]["uid"]),
                           node=node, gpus=(g // len(nodes) * args.gang_size + k,))
            ledgers[node][alloc_key(a.pod)] = Allocation(gang_id=gang, attempt=1, assignment=a)
            members.append(a.pod)
        commands.append(BindPods(gang_id=gang, attempt=1, pods=tuple(members)))
        pods += members
    for n, allocs in ledgers.items():
        await ledger_kv.put(S.token(n), encoder.encode(NodeLedger(node=n, allocations=allocs)))

    work = tempfile.mkdtemp(prefix="phalanx-bench-binder-")
    log = open(Path(work) / "binder.log", "wb")  # noqa: SIM115 - handed to the child
    proc = await anyio.open_process(
        [sys.executable, "-m", "phalanx_cli.main", "run", "binder", "--nats", url, "--cluster", "kube",
         "--kubeconfig", str(plane.kubeconfig), "--kube-api-qps", str(args.qps), "--kube-api-burst", str(args.burst),
         "--parallelism", str(parallelism), "--fence-namespace", ns, "--ready-file", str(Path(work) / "ready")],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        with anyio.fail_after(120):
            while not (Path(work) / "ready").exists():
                if proc.returncode is not None:
                    raise RuntimeError(f"binder exited: {(Path(work) / 'binder.log').read_text()[-2000:]}")
                await anyio.sleep(0.1)
        done: dict[str, float] = {}
        finished = anyio.Event()

        async def on_reply(msg) -> None:
            ev = gang_decoder.decode(msg.data)
            if isinstance(ev, BindsDone):
                for ref in ev.bound:
                    if ref.namespace == ns:
                        done.setdefault(ref.name, time.monotonic())
                if len(done) == len(pods):
                    finished.set()

        sub = await bus.nc.subscribe("phx.gang.coord.>", cb=on_reply)
        before = await anyio.to_thread.run_sync(requests_by_kind, api)
        sent: dict[str, float] = {}
        start = time.monotonic()
        for c in commands:
            for ref in c.pods:
                sent[ref.name] = time.monotonic()
            await bus.publish(S.binder_subject(c.gang_id), c)
        with anyio.fail_after(120 + len(pods)):
            await finished.wait()
        elapsed = max(done.values()) - start
        after = await anyio.to_thread.run_sync(requests_by_kind, api)
        await sub.unsubscribe()
    except TimeoutError:
        raise RuntimeError(f"{len(done)} of {len(pods)} bound; binder's log is {work}/binder.log") from None
    finally:
        proc.terminate()
        with anyio.move_on_after(10, shield=True):
            await proc.wait()
        log.close()
        await bus.close()
    lat = sorted(done[p] - sent[p] for p in done)
    per_pod = {k: (after[k] - before[k]) / len(pods) for k in after if after[k] - before[k] > 0
               and any(r in k for r in ("pods", "leases", "events"))}
    return {"scenario": tag, "parallelism": parallelism, "fenced": fenced, "pods": len(pods),
            "pods_per_s": len(pods) / elapsed, "p50_ms": lat[len(lat) // 2] * 1000,
            "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000, "requests_per_pod": per_pod}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--gangs", type=int, default=32)
    p.add_argument("--gang-size", type=int, default=8)
    p.add_argument("--parallelism", type=int, default=16)
    p.add_argument("--qps", default="0", help="binder's --kube-api-qps (0: no client-side limit)")
    p.add_argument("--burst", default="100")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    plane = kubeharness.start_control_plane(with_kwok=False)
    nats = NatsServer()
    nats.start()
    try:
        async def run_all() -> list[dict]:
            out = []
            for tag, par, fenced in (("one-at-a-time", 1, False), ("parallel", args.parallelism, False),
                                     ("parallel-fenced", args.parallelism, True)):
                out.append(await scenario(plane, nats.url, args, parallelism=par, fenced=fenced, tag=tag))
                print(f"  {tag}: {out[-1]['pods_per_s']:.1f} pods/s", file=sys.stderr)
            return out
        results = anyio.run(run_all)
    finally:
        nats.close()
        plane.stop()
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"binder alone, {args.gangs} gangs x {args.gang_size} one-GPU pods on {args.nodes} nodes, "
          f"kube-apiserver v1.36.3, --kube-api-qps {args.qps}")
    print(f"{'scenario':<18}{'parallel':>9}{'fenced':>8}{'pods/s':>9}{'p50 ms':>9}{'p99 ms':>9}  API requests per pod")
    for r in results:
        reqs = ", ".join(f"{k} {v:.2f}" for k, v in sorted(r["requests_per_pod"].items()))
        print(f"{r['scenario']:<18}{r['parallelism']:>9}{str(r['fenced']):>8}{r['pods_per_s']:>9.1f}"
              f"{r['p50_ms']:>9.0f}{r['p99_ms']:>9.0f}  {reqs}")
    base = results[0]["pods_per_s"]
    print("speed-up over one at a time: " + ", ".join(f"{r['scenario']} {r['pods_per_s'] / base:.2f}x"
                                                      for r in results[1:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
