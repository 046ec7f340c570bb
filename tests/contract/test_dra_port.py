"""The DRA half of ``ClusterPort`` (resource.k8s.io/v1), one suite on both adapters (style rule 10).

* ``sim``: ``KvCluster`` on a real nats-server with auth and TLS. The objects are loaded by the
  admin (as ``phalanx up`` would); gang-coordinator's reads and binder's writes each go through a
  connection with that service's own credentials, so the bus table's grants are exercised too.
* ``kube``: ``KubeCluster`` on the session's real kube-apiserver; objects are created by an admin
  through the harness's REST client, as a user's ``kubectl`` would.

Claims and pods live in a namespace of the test's own; DeviceClasses and ResourceSlices are
cluster-wide, so their names are unique and the assertions look only at the test's own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec
import pytest
from kubeharness import KubeApi, gpu_pod, unique

from phalanx_kube.port import ClaimConflict, ClaimGone, ClaimRef, ObjectEvent
from phalanx_kubeobjects import dra
from phalanx_proto import dra as D
from phalanx_proto.events import PodRef
from phalanx_proto.scheduling import NodeSelectorRequirement, NodeSelectorTerm

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]
RESOURCE = "/apis/resource.k8s.io/v1"


@dataclass
class Dra:
    """A cluster under test: ``reader`` is gang-coordinator's view, ``writer`` binder's; ``user``
    creates and deletes objects the way their owners do."""

    name: str
    namespace: str
    reader: Any
    writer: Any
    user: Any
    cleanup: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    suffix: str = field(default_factory=lambda: unique("x").removeprefix("x-"))

    def scoped(self, name: str) -> str:
        """A cluster-wide object's name, unique to this test."""
        return f"{name}-{self.suffix}"

    def ref(self, name: str, uid: str = "") -> ClaimRef:
        return ClaimRef(namespace=self.namespace, name=name, uid=uid)


class KubeUser:
    def __init__(self, api: KubeApi) -> None:
        self.api = api

    async def _do(self, fn, *args):
        return await anyio.to_thread.run_sync(fn, *args)

    async def device_class(self, obj: dict) -> dict:
        return await self._do(self.api.apply, obj)

    async def resource_slice(self, obj: dict) -> dict:
        return await self._do(self.api.apply, obj)

    async def delete_slice(self, name: str) -> None:
        await self._do(self.api.delete, f"{RESOURCE}/resourceslices/{name}")

    async def delete_class(self, name: str) -> None:
        await self._do(self.api.delete, f"{RESOURCE}/deviceclasses/{name}")

    async def claim(self, obj: dict) -> dict:
        return await self._do(self.api.post, f"{RESOURCE}/namespaces/{obj['metadata']['namespace']}/resourceclaims", obj)

    async def delete_claim(self, namespace: str, name: str) -> None:
        await self._do(lambda: self.api.request("DELETE", f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{name}",
                                                ok=(404,)))

    async def pod(self, obj: dict) -> dict:
        return await self._do(self.api.create_pod, obj)


class SimUser:
    def __init__(self, sim) -> None:
        self.sim = sim

    async def device_class(self, obj: dict) -> dict:
        return await self.sim.apply_device_class(obj)

    async def resource_slice(self, obj: dict) -> dict:
        return await self.sim.apply_resource_slice(obj)

    async def delete_slice(self, name: str) -> None:
        await self.sim.delete_resource_slice(name)

    async def delete_class(self, name: str) -> None:
        await self.sim.delete_device_class(name)

    async def claim(self, obj: dict) -> dict:
        return await self.sim.apply_resource_claim(obj)

    async def delete_claim(self, namespace: str, name: str) -> None:
        await self.sim.delete_resource_claim(ClaimRef(namespace=namespace, name=name))

    async def pod(self, obj: dict) -> dict:
        return (await self.sim.apply_pod(obj)).raw


@pytest.fixture(params=["sim", "kube"])
async def cluster(request) -> Any:
    ns = unique("dra")
    if request.param == "sim":
        from phalanx_bus import Bus, BusAuth
        from phalanx_kube.kvcluster import KvCluster
        from phalanx_proto import subjects as S

        url, secrets = request.getfixturevalue("nats_server").url, request.getfixturevalue("bus_secrets")
        admin = await Bus.connect(url, service="contract-admin")
        coordinator = await Bus.connect(url, service="contract-coordinator",
                                        auth=BusAuth.from_env(secrets.env(S.GANG_COORDINATOR)))
        binder = await Bus.connect(url, service="contract-binder", auth=BusAuth.from_env(secrets.env(S.BINDER)))
        try:
            sim = await KvCluster.open(admin)
            for bucket in (S.KV_SIM_DEVICE_CLASSES, S.KV_SIM_RESOURCE_SLICES, S.KV_SIM_RESOURCE_CLAIMS):
                await sim._dra_kv(bucket)  # declared by the admin, as `phalanx up` does
            c = Dra("sim", ns, await KvCluster.open(coordinator), await KvCluster.open(binder), SimUser(sim))
            yield c
        finally:
            for bus in (binder, coordinator, admin):
                await bus.close()
    else:
        from phalanx_kube.kube import KubeCluster

        plane, api = request.getfixturevalue("kube"), request.getfixturevalue("kube_api")
        api.create_namespace(ns)
        kube = await KubeCluster.open(str(plane.kubeconfig))
        c = Dra("kube", ns, kube, kube, KubeUser(api))
        try:
            yield c
        finally:
            for undo in c.cleanup:
                await undo()
            for pod in [p for p in await kube.list_pods() if p.namespace == ns]:
                await kube.delete_pod(pod.ref)  # no pod of ours left for the e2e tier's scheduler
            await kube.close()


# -- builders --------------------------------------------------------------------------------------
def device_class(name: str) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.example.com'"}}],
                     "extendedResourceName": f"example.com/{name}"}}


def resource_slice(name: str, node: str, generation: int = 1, devices: int = 2) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": "gpu.example.com", "pool": {"name": node, "generation": generation,
                                                           "resourceSliceCount": 1},
                     "nodeName": node, "devices": [{"name": f"gpu-{i}", "attributes": {"index": {"int": i}},
                                                    "capacity": {"memory": {"value": "80Gi"}}}
                                                   for i in range(devices)]}}


def claim_obj(ns: str, name: str, cls: str = "gpu.example.com", count: int = 2) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": ns},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": cls, "count": count}}]}}}


def allocation(node: str, *devices: int) -> D.ClaimAllocation:
    return D.ClaimAllocation(
        devices=tuple(D.AllocatedDevice(request="gpu", driver="gpu.example.com", pool=node, device=f"gpu-{i}")
                      for i in devices),
        node_selector=(NodeSelectorTerm(match_fields=(NodeSelectorRequirement(
            key="metadata.name", operator="In", values=(node,)),)),))


async def new_claim(c: Dra, name: str) -> ClaimRef:
    obj = await c.user.claim(claim_obj(c.namespace, name))
    return c.ref(name, obj["metadata"]["uid"])


async def new_pod(c: Dra, name: str) -> PodRef:
    obj = await c.user.pod(gpu_pod(name, c.namespace, 1))
    return PodRef(namespace=c.namespace, name=name, uid=obj["metadata"]["uid"])


def uids(obj: dict) -> list[str]:
    return [r["uid"] for r in (obj.get("status") or {}).get("reservedFor") or []]


# -- reads (gang-coordinator) ----------------------------------------------------------------------
async def test_classes_slices_and_claims_are_listed_and_watched_as_added_then_none_then_every_change(cluster):
    c = cluster
    cls, sl = c.scoped("gpu"), c.scoped("node-a-gpu")
    c.cleanup += [lambda: c.user.delete_slice(sl), lambda: c.user.delete_class(cls)]
    await c.user.device_class(device_class(cls))
    await c.user.resource_slice(resource_slice(sl, "node-a"))
    first = await new_claim(c, "first")

    assert dra.device_class([o for o in await c.reader.list_device_classes() if o["metadata"]["name"] == cls][0]) \
        == D.DeviceClassRef(name=cls, selectors=("device.driver == 'gpu.example.com'",),
                            extended_resource_name=f"example.com/{cls}")
    (listed,) = [o for o in await c.reader.list_resource_slices() if o["metadata"]["name"] == sl]
    assert dra.resource_slice(listed)[:2] == ("gpu.example.com", "node-a")
    assert [o["metadata"]["name"] for o in await c.reader.list_resource_claims(c.namespace)] == ["first"]
    assert first.key in [dra.claim_key(o) for o in await c.reader.list_resource_claims()]

    async def until(events, predicate) -> list:
        seen = []
        with anyio.fail_after(20):
            async for ev in events:
                if ev is not None and ev.name not in (cls, sl, "first", "second"):
                    continue
                seen.append(None if ev is None else (ev.type, ev.name))
                if predicate(ev):
                    return seen
        raise AssertionError("watch ended")

    async with (aclosing(c.reader.watch_device_classes()) as classes,
                aclosing(c.reader.watch_resource_slices()) as slices,
                aclosing(c.reader.watch_resource_claims()) as claims):
        assert (await until(classes, lambda ev: ev is None))[-2:] == [("ADDED", cls), None]
        assert (await until(slices, lambda ev: ev is None))[-2:] == [("ADDED", sl), None]
        assert (await until(claims, lambda ev: ev is None))[-2:] == [("ADDED", "first"), None]

        await c.user.resource_slice(resource_slice(sl, "node-a", generation=2, devices=3))
        seen = await until(slices, lambda ev: isinstance(ev, ObjectEvent) and ev.name == sl)
        assert seen == [("MODIFIED", sl)]
        await c.user.delete_slice(sl)
        assert await until(slices, lambda ev: isinstance(ev, ObjectEvent)) == [("DELETED", sl)]

        await new_claim(c, "second")
        assert await until(claims, lambda ev: isinstance(ev, ObjectEvent) and ev.name == "second") == [
            ("ADDED", "second")]
        await c.writer.reserve_claim(first, await new_pod(c, "p"), allocation("node-a", 0, 1))
        seen = await until(claims, lambda ev: isinstance(ev, ObjectEvent) and ev.name == "first" and uids(ev.obj))
        assert seen[-1] == ("MODIFIED", "first")


async def test_a_claim_is_read_alone_and_none_when_absent(cluster):
    ref = await new_claim(cluster, "alone")
    got = await cluster.reader.get_resource_claim(ref)
    assert dra.claim_key(got) == ref.key and got["metadata"]["resourceVersion"]
    assert await cluster.reader.get_resource_claim(cluster.ref("absent")) is None


# -- reserve (binder, before the Binding) ----------------------------------------------------------
async def test_reserving_writes_the_finalizer_the_allocation_and_the_pod_and_doing_it_again_changes_nothing(cluster):
    c = cluster
    ref, pod = await new_claim(c, "train"), await new_pod(c, "trainer")
    written = await c.writer.reserve_claim(ref, pod, allocation("node-a", 0, 1))
    got = await c.reader.get_resource_claim(ref)
    assert got["metadata"]["resourceVersion"] == written["metadata"]["resourceVersion"]
    assert D.FINALIZER in got["metadata"]["finalizers"]
    assert dra.allocation_of(got) == allocation("node-a", 0, 1)
    assert got["status"]["reservedFor"] == [{"resource": "pods", "name": "trainer", "uid": pod.uid}]
    again = await c.writer.reserve_claim(ref, pod, allocation("node-a", 0, 1))
    assert again["metadata"]["resourceVersion"] == written["metadata"]["resourceVersion"]


async def test_another_pod_joins_an_allocated_claim_and_a_different_allocation_is_refused(cluster):
    c = cluster
    ref, first, second = await new_claim(c, "shared"), await new_pod(c, "first"), await new_pod(c, "second")
    await c.writer.reserve_claim(ref, first, allocation("node-a", 0, 1))
    with pytest.raises(ClaimConflict, match="got allocated elsewhere in the meantime"):
        await c.writer.reserve_claim(ref, second, allocation("node-b", 0, 1))
    await c.writer.reserve_claim(ref, second, None)  # allocated already: the pod only joins
    got = await c.reader.get_resource_claim(ref)
    assert (uids(got), dra.allocation_of(got)) == ([first.uid, second.uid], allocation("node-a", 0, 1))


async def test_a_claim_gone_recreated_unallocated_or_being_deleted_is_refused(cluster):
    c = cluster
    pod = await new_pod(c, "p")
    with pytest.raises(ClaimGone):
        await c.writer.reserve_claim(c.ref("absent"), pod, allocation("node-a", 0))
    ref = await new_claim(c, "plain")
    with pytest.raises(ClaimGone):
        await c.writer.reserve_claim(c.ref("plain", "00000000-0000-0000-0000-000000000000"), pod,
                                     allocation("node-a", 0))
    with pytest.raises(ClaimConflict, match="is not allocated"):
        await c.writer.reserve_claim(ref, pod, None)
    other = await new_pod(c, "other")
    await c.writer.reserve_claim(ref, other, allocation("node-a", 0))  # the finalizer keeps it while deleting
    await c.user.delete_claim(c.namespace, "plain")
    with pytest.raises(ClaimConflict, match="is being deleted"):
        await c.writer.reserve_claim(ref, pod, None)
    assert uids(await c.reader.get_resource_claim(ref)) == [other.uid]


async def test_two_pods_reserved_at_once_both_land(cluster):
    c = cluster
    ref = await new_claim(c, "busy")
    pods = [await new_pod(c, f"p{i}") for i in range(4)]
    async with anyio.create_task_group() as tg:
        for pod in pods:
            tg.start_soon(c.writer.reserve_claim, ref, pod, allocation("node-a", 0))
    assert sorted(uids(await c.reader.get_resource_claim(ref))) == sorted(p.uid for p in pods)


# -- unreserve (the compensation) ------------------------------------------------------------------
async def test_unreserving_removes_the_pod_and_clears_phalanxs_allocation_once_nobody_else_holds_it(cluster):
    c = cluster
    ref, first, second = await new_claim(c, "undo"), await new_pod(c, "first"), await new_pod(c, "second")
    mine = allocation("node-a", 0, 1)
    await c.writer.reserve_claim(ref, first, mine)
    await c.writer.reserve_claim(ref, second, None)
    await c.writer.unreserve_claim(ref, first, mine)
    got = await c.reader.get_resource_claim(ref)
    assert (uids(got), dra.allocation_of(got)) == ([second.uid], mine)  # the second pod still holds it
    await c.writer.unreserve_claim(ref, second, mine)
    got = await c.reader.get_resource_claim(ref)
    assert (uids(got), dra.allocation_of(got), D.FINALIZER in (got["metadata"].get("finalizers") or [])) == (
        [], None, False)
    before = got["metadata"]["resourceVersion"]
    await c.writer.unreserve_claim(ref, second, mine)  # again: nothing to do
    await c.writer.unreserve_claim(c.ref("absent"), second, mine)  # the take never happened
    assert (await c.reader.get_resource_claim(ref))["metadata"]["resourceVersion"] == before


async def test_unreserving_keeps_an_allocation_that_is_not_phalanxs_and_lets_a_deleted_claim_go(cluster):
    c = cluster
    ref, pod = await new_claim(c, "theirs"), await new_pod(c, "p")
    await c.writer.reserve_claim(ref, pod, allocation("node-a", 0))
    await c.writer.unreserve_claim(ref, pod, None)  # joined only: the allocation stays
    got = await c.reader.get_resource_claim(ref)
    assert (uids(got), dra.allocation_of(got)) == ([], allocation("node-a", 0))

    gone, pod2 = await new_claim(c, "deleted"), await new_pod(c, "p2")
    await c.writer.reserve_claim(gone, pod2, allocation("node-a", 1))
    await c.user.delete_claim(c.namespace, "deleted")
    assert (await c.reader.get_resource_claim(gone))["metadata"]["deletionTimestamp"]
    await c.writer.unreserve_claim(gone, pod2, allocation("node-a", 1))
    assert await c.reader.get_resource_claim(gone) is None  # the last finalizer went, and with it the claim


# -- the extended-resource claim -------------------------------------------------------------------
async def test_the_extended_resource_claim_is_created_once_named_in_the_pod_status_and_deleted(cluster):
    c = cluster
    pod = await new_pod(c, "ext")
    requests = (dra.ExtendedRequest(request="container-0-request-0", container="c", index=0,
                                    resource="nvidia.com/gpu", device_class="gpu.example.com", count=1),)
    wanted = dra.extended_claim(pod, requests)
    made = await c.writer.create_resource_claim(wanted)
    again = await c.writer.create_resource_claim(wanted)
    name = made["metadata"]["name"]
    assert name.startswith("ext-extended-resources-") and again["metadata"]["uid"] == made["metadata"]["uid"]
    assert [o["metadata"]["name"] for o in await c.reader.list_resource_claims(c.namespace)] == [name]
    spec = dra.claim_spec(made, {})
    assert [(r.name, r.exactly.count) for r in spec.requests] == [("container-0-request-0", 1)]

    status = dra.extended_claim_status(name, requests)
    await c.writer.set_extended_claim_status(pod, status)
    await c.writer.set_extended_claim_status(pod, status)
    read = (await c.reader.get_pod(pod)).raw
    assert read["status"]["extendedResourceClaimStatus"] == status
    assert dra.extended_claim_name(read) == name
    await c.writer.set_extended_claim_status(pod, None)
    assert "extendedResourceClaimStatus" not in (await c.reader.get_pod(pod)).raw["status"]

    ref = ClaimRef(namespace=c.namespace, name=name, uid=made["metadata"]["uid"])
    await c.writer.delete_resource_claim(msgspec.structs.replace(ref, uid="00000000-0000-0000-0000-000000000000"))
    assert await c.reader.get_resource_claim(ref) is not None  # another uid: not touched
    await c.writer.delete_resource_claim(ref)
    assert await c.reader.get_resource_claim(ref) is None
    await c.writer.delete_resource_claim(ref)  # absent is success


async def test_a_named_claim_that_exists_and_is_another_one_is_refused(cluster):
    c = cluster
    await new_claim(c, "taken")
    with pytest.raises(ClaimConflict, match="exists and is another claim"):
        await c.writer.create_resource_claim(claim_obj(c.namespace, "taken", count=3))
    same = await c.writer.create_resource_claim(claim_obj(c.namespace, "taken"))
    assert same["metadata"]["name"] == "taken"
