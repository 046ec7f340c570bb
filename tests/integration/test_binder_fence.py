"""binder on a real nats-server and the simulated cluster: binds in parallel from mirrors of
phx-ledger and phx-topology (no entry read per bind), one fence write per node for a gang's
pods, nothing bound before the fence lists it, the annotation's digest in the fence, and the
entries released as soon as their pods start, end or go."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager

import anyio
import msgspec
import pytest

from phalanx_binder.service import Config
from phalanx_binder.service import run as run_binder
from phalanx_bus import Bus
from phalanx_bus.kv import Kv
from phalanx_kube import fence as F
from phalanx_kube.kvcluster import KV_PODS, KvCluster, pod_key
from phalanx_proto import subjects as S
from phalanx_proto.events import Assignment, BindPods, NodeTopologyReported, PodRef, encoder
from phalanx_proto.kubeapi import ASSIGNMENT_ANNOTATION, assignment_digest
from phalanx_proto.state import Allocation, NodeLedger, alloc_key
from phalanx_proto.topology import Gpu, NodeTopology
from stackutil import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.anyio]
NS = "phalanx-system"
FENCED, PLAIN = "dp-node", "kwok-node"


class Watched(KvCluster):
    """The simulated cluster, noting every lease write and what each Binding found in the fence."""

    writes: list[tuple[str, str]]
    fenced_at_bind: dict[str, bool]

    async def create_lease(self, lease):
        self.writes.append(("create", lease.name))
        return await super().create_lease(lease)

    async def update_lease(self, lease):
        self.writes.append(("update", lease.name))
        return await super().update_lease(lease)

    async def delete_lease(self, namespace, name, *, resource_version=""):
        self.writes.append(("delete", name))
        return await super().delete_lease(namespace, name, resource_version=resource_version)

    async def bind(self, ref, node, annotations=None):
        lease = await self.get_lease(NS, F.lease_name(node))
        self.fenced_at_bind[ref.name] = lease is not None and F.read(lease, node, 0).entry(ref.uid) is not None
        return await super().bind(ref, node, annotations)


async def report(bus: Bus, node: str, *, device_plugin: bool) -> None:
    names = [f"GPU{i}" for i in range(8)]
    topo = NodeTopology(node=node, gpus=tuple(Gpu(index=i, name=f"GPU{i}", model="A100", memory_mib=40960)
                                              for i in range(8)),
                        relations={a: {b: "NV12" for b in names if b != a} for a in names})
    kv = await bus.kv(S.KV_TOPOLOGY)
    await kv.put(S.token(node), encoder.encode(NodeTopologyReported(node=node, topology=topo,
                                                                   device_plugin=device_plugin)))


async def reserve(bus: Bus, gang: str, attempt: int, assignments: list[Assignment]) -> None:
    kv = await bus.kv(S.KV_LEDGER)
    for node in {a.node for a in assignments}:
        current = await kv.get(S.token(node))
        led = msgspec.json.decode(current.value, type=NodeLedger) if current else NodeLedger(node=node)
        allocs = dict(led.allocations) | {alloc_key(a.pod): Allocation(gang_id=gang, attempt=attempt, assignment=a)
                                          for a in assignments if a.node == node}
        await kv.put(S.token(node), encoder.encode(NodeLedger(node=node, allocations=allocs)))


@asynccontextmanager
async def binder(nats_private, monkeypatch, before=None):
    """(bus, cluster, entry reads of phx-ledger/phx-topology) with binder running in-process,
    started after ``await before(bus, cluster)``."""
    reads: list[str] = []
    get = Kv.get

    async def counting_get(self, key):
        if self.bucket in (S.KV_LEDGER, S.KV_TOPOLOGY):
            reads.append(f"{self.bucket}/{key}")
        return await get(self, key)

    monkeypatch.setattr(Kv, "get", counting_get)
    bus = await Bus.connect(nats_private.url, service="test")
    await bus.declare()
    base = await KvCluster.open(bus)
    cluster = Watched(bus, base._pods, base._nodes, base._events, base._leases)
    cluster.writes, cluster.fenced_at_bind = [], {}
    await report(bus, FENCED, device_plugin=True)
    await report(bus, PLAIN, device_plugin=False)
    if before is not None:
        await before(bus, cluster)
    reads.clear()  # the test's own writes read the ledger
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(lambda task_status: run_binder(bus, cluster, Config(parallelism=8, fence_namespace=NS,
                                                                                 instance="binder-test"),
                                                          task_status=task_status))
            yield bus, cluster, reads
            tg.cancel_scope.cancel()
    finally:
        await bus.close()


async def gang(bus: Bus, cluster: KvCluster, name: str, nodes: list[str]) -> list[Assignment]:
    """Pods of one gang, placed one GPU each on ``nodes``, reserved, and their binds published."""
    out = []
    for i, node in enumerate(nodes):
        pod = await cluster.apply_pod({"metadata": {"name": f"{name}-{i}", "namespace": "default"},
                                       "spec": {"schedulerName": "phalanx", "containers": [{"name": "c"}]}})
        out.append(Assignment(pod=pod.ref, node=node, gpus=(i,)))
    await reserve(bus, f"default/{name}", 1, out)  # just before the command: the mirror may lag
    await bus.publish(S.binder_subject(f"default/{name}"), BindPods(gang_id=f"default/{name}", attempt=1,
                                                                    pods=tuple(a.pod for a in out)))
    return out


async def bound(cluster: KvCluster, assignments: list[Assignment]) -> None:
    async def done():
        for a in assignments:
            p = await cluster.get_pod(a.pod)
            if p is None or p.node_name != a.node:
                return False
        return True
    await wait_until(done, 30, what="every pod bound")


async def fence_of(cluster: KvCluster, node: str) -> dict[str, str]:
    lease = await cluster.get_lease(NS, F.lease_name(node))
    return {} if lease is None else {e.name: e.digest for e in F.read(lease, node, 0).pods}


async def test_a_gangs_binds_share_one_fence_write_per_node_and_nothing_is_bound_before_it(nats_private, monkeypatch):
    placed: list[Assignment] = []

    async def published(bus, cluster):  # the coordinator publishes a gang's binds together
        placed.extend(await gang(bus, cluster, "g", [FENCED] * 4 + [PLAIN] * 2))

    async with binder(nats_private, monkeypatch, published) as (bus, cluster, reads):
        await bound(cluster, placed)
        pods = {a.pod.name: await cluster.get_pod(a.pod) for a in placed}
        assert all(p.annotations[ASSIGNMENT_ANNOTATION] == encoder.encode(a).decode()
                   for a, p in zip(placed, pods.values(), strict=True))
        assert await fence_of(cluster, FENCED) == {
            a.pod.name: assignment_digest(pods[a.pod.name].annotations[ASSIGNMENT_ANNOTATION]) for a in placed[:4]}
        assert cluster.writes == [("create", F.lease_name(FENCED))]  # one write for the gang; none for kwok-node
        assert cluster.fenced_at_bind == {f"g-{i}": i < 4 for i in range(6)}
        assert reads == []  # the checks read the mirrors, never an entry


async def test_fence_entries_go_as_soon_as_their_pods_start_end_or_are_deleted(nats_private, monkeypatch):
    async with binder(nats_private, monkeypatch) as (bus, cluster, _):
        placed = await gang(bus, cluster, "r", [FENCED] * 4)
        await bound(cluster, placed)
        pods = await cluster._pods.get(pod_key("default", "r-0"))
        obj = json.loads(pods.value)
        obj["status"]["containerStatuses"] = [{"name": "c", "ready": False}]  # as the kubelet reports
        await cluster._pods.update(pods.key, json.dumps(obj).encode(), last=pods.revision)
        failed = await cluster._pods.get(pod_key("default", "r-1"))
        obj = json.loads(failed.value)
        obj["status"]["phase"] = "Failed"  # as the kubelet's admission rejects
        await cluster._pods.update(failed.key, json.dumps(obj).encode(), last=failed.revision)
        await (await bus.kv(KV_PODS)).delete(pod_key("default", "r-2"))

        async def only_r3():
            return await fence_of(cluster, FENCED) == {"r-3": assignment_digest(encoder.encode(placed[3]).decode())}
        await wait_until(only_r3, 30, what="r-0, r-1 and r-2 released")
        await (await bus.kv(KV_PODS)).delete(pod_key("default", "r-3"))

        async def gone():
            return await cluster.get_lease(NS, F.lease_name(FENCED)) is None
        await wait_until(gone, 30, what="the empty fence deleted")


async def test_a_redelivered_bind_of_a_bound_pod_that_has_not_started_writes_its_entry_again(nats_private, monkeypatch):
    async with binder(nats_private, monkeypatch) as (bus, cluster, _):
        placed = await gang(bus, cluster, "d", [FENCED])
        await bound(cluster, placed)
        lease = await cluster.get_lease(NS, F.lease_name(FENCED))
        await cluster.delete_lease(NS, lease.name)  # the entry lapsed (or binder died before the Binding)
        await bus.publish(S.binder_subject("default/d"), BindPods(gang_id="default/d", attempt=1,
                                                                  pods=(placed[0].pod,)), msg_id="redelivered")

        async def fenced_again():
            return await fence_of(cluster, FENCED) == {"d-0": assignment_digest(encoder.encode(placed[0]).decode())}
        await wait_until(fenced_again, 30, what="the entry written again")


async def test_a_bind_to_a_pod_that_edited_its_annotation_puts_back_what_the_ledger_holds(nats_private, monkeypatch):
    async with binder(nats_private, monkeypatch) as (bus, cluster, _):
        pod = await cluster.apply_pod({"metadata": {"name": "e-0", "namespace": "default", "annotations": {
            ASSIGNMENT_ANNOTATION: '{"pod":{"namespace":"default","name":"e-0"},"node":"dp-node","gpus":[0,1,2,3]}'}},
            "spec": {"schedulerName": "phalanx", "containers": [{"name": "c"}]}})
        a = Assignment(pod=pod.ref, node=FENCED, gpus=(5,))
        await reserve(bus, "default/e", 1, [a])
        await bus.publish(S.binder_subject("default/e"), BindPods(gang_id="default/e", attempt=1, pods=(a.pod,)))
        await bound(cluster, [a])
        text = (await cluster.get_pod(PodRef(namespace="default", name="e-0"))).annotations[ASSIGNMENT_ANNOTATION]
        assert (text, await fence_of(cluster, FENCED)) == (encoder.encode(a).decode(), {"e-0": assignment_digest(text)})
