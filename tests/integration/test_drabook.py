"""gang-coordinator's DRA book on a real nats-server (auth and TLS), over the simulated cluster:
the pools it writes to KV ``phx-dra`` with gang-coordinator's own credentials, the claims it
resolves for a pod, and when it wakes waiting gangs.
"""

from __future__ import annotations

import anyio
import pytest

from phalanx_bus import Bus, BusAuth
from phalanx_bus.records import read_all
from phalanx_gang_coordinator.changes import Signal
from phalanx_gang_coordinator.drabook import DraBook, Waiting
from phalanx_kube.kvcluster import KvCluster
from phalanx_kube.port import Pod
from phalanx_kubeobjects.violations import Violation
from phalanx_proto import dra as D
from phalanx_proto import subjects as S

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

GPU_CLASS = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"},
             "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}}


def gpu_slice(name: str, node: str, devices: int, *, count: int = 1) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": "gpu.nvidia.com", "pool": {"name": node, "generation": 1, "resourceSliceCount": count},
                     "nodeName": node,
                     "devices": [{"name": f"{name}-gpu-{i}", "attributes": {"uuid": {"string": f"GPU-{name}-{i}"}}}
                                 for i in range(devices)]}}


def claim(name: str, *, allocated: tuple[str, ...] = (), node: str = "node-a", owner: str = "") -> dict:
    obj = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
           "metadata": {"name": name, "namespace": "team"},
           "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                                         "count": 2}}]}}}
    if owner:
        obj["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": owner,
                                               "controller": True}]
    if allocated:
        obj["status"] = {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": node, "device": d} for d in allocated]}}}
    return obj


def pod(claims: list[dict], statuses: list[dict] | None = None, uid: str = "pod-uid") -> Pod:
    raw = {"metadata": {"name": "p", "namespace": "team", "uid": uid},
           "spec": {"schedulerName": "phalanx", "resourceClaims": claims,
                    "containers": [{"name": "c", "image": "x"}]},
           "status": {"resourceClaimStatuses": statuses} if statuses is not None else {}}
    return Pod(namespace="team", name="p", uid=uid, scheduler_name="phalanx", raw=raw)


@pytest.fixture
async def world(nats_server, bus_secrets):
    admin = await Bus.connect(nats_server.url, service="drabook-admin")
    await admin.declare()
    coordinator = await Bus.connect(nats_server.url, service="drabook-coordinator",
                                    auth=BusAuth.from_env(bus_secrets.env(S.GANG_COORDINATOR)))
    try:
        user = await KvCluster.open(admin)
        kv = await admin.kv(S.KV_DRA)
        for r in (await read_all(kv))[0]:
            await kv.delete(r.key)
        signal = Signal()
        book = DraBook(coordinator, await KvCluster.open(coordinator), changed=signal, flush_s=0.01)
        async with anyio.create_task_group() as tg:
            await user.apply_device_class(GPU_CLASS)
            await tg.start(book.run)
            yield user, book, signal, admin
            tg.cancel_scope.cancel()
    finally:
        for bus in (coordinator, admin):
            await bus.close()


async def pools(bus: Bus) -> dict[str, D.DraPool]:
    records, bad = await read_all(await bus.kv(S.KV_DRA))
    assert not bad
    return {f"{r.value.driver}/{r.value.pool}": r.value for r in records}


async def eventually(bus: Bus, predicate, what: str) -> dict[str, D.DraPool]:
    with anyio.fail_after(10):
        while not predicate(got := await pools(bus)):
            await anyio.sleep(0.05)
    return got


async def test_a_pool_holds_its_slices_and_the_devices_any_claim_holds_and_leaves_when_both_are_gone(world):
    user, book, _, admin = world
    await user.apply_resource_slice(gpu_slice("a-0", "node-a", 2, count=2))
    await user.apply_resource_slice(gpu_slice("a-1", "node-a", 1, count=2))
    await user.apply_resource_claim(claim("taken", allocated=("a-0-gpu-1",)))
    got = await eventually(admin, lambda p: "gpu.nvidia.com/node-a" in p and p["gpu.nvidia.com/node-a"].in_use,
                           "the pool with its holder")
    value = got["gpu.nvidia.com/node-a"]
    assert [s.name for s in value.slices] == ["a-0", "a-1"]
    assert [(u.device, u.claim.split("/")[:2]) for u in value.in_use] == [("a-0-gpu-1", ["team", "taken"])]

    (obj,) = [c for c in await user.list_resource_claims("team") if c["metadata"]["name"] == "taken"]
    await _delete_claim(user, obj)
    await eventually(admin, lambda p: not p["gpu.nvidia.com/node-a"].in_use, "the holder gone")
    await user.delete_resource_slice("a-0")
    await user.delete_resource_slice("a-1")
    await eventually(admin, lambda p: "gpu.nvidia.com/node-a" not in p, "the pool gone")


async def _delete_claim(user: KvCluster, obj: dict) -> None:
    from phalanx_kube.port import ClaimRef

    meta = obj["metadata"]
    await user.delete_resource_claim(ClaimRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"]))


async def test_a_slice_that_does_not_read_leaves_its_devices_out_and_the_pool_says_why(world):
    user, _, _, admin = world
    bad = gpu_slice("b-0", "node-b", 1)
    bad["spec"]["devices"][0]["attributes"]["uuid"] = {"string": "x", "int": 3}
    await user.apply_resource_slice(bad)
    await user.apply_resource_slice(gpu_slice("b-1", "node-b", 1))
    got = await eventually(admin, lambda p: "gpu.nvidia.com/node-b" in p and p["gpu.nvidia.com/node-b"].problem,
                           "the pool with its problem")
    value = got["gpu.nvidia.com/node-b"]
    assert [s.name for s in value.slices] == ["b-1"]
    assert value.problem.startswith("slice b-0: ") and "uuid" in value.problem


async def test_a_pod_is_given_its_claims_with_their_classes_or_told_why_it_waits_or_cannot_be_admitted(world):
    user, book, _, _ = world
    await user.apply_resource_claim(claim("mine"))
    await user.apply_resource_claim(claim("made-for-another", owner="someone-else"))
    with anyio.fail_after(10):
        while ("team", "made-for-another") not in book.claims or "gpu.nvidia.com" not in book.classes:
            await anyio.sleep(0.02)

    got = await book.resolve(pod([{"name": "gpus", "resourceClaimName": "mine"}]))
    assert isinstance(got, tuple) and [c.name for c in got] == ["gpus"]
    (request,) = got[0].claim.requests
    assert request.exactly.device_class == D.DeviceClassRef(
        name="gpu.nvidia.com", selectors=("device.driver == 'gpu.nvidia.com'",))
    assert request.exactly.count == 2

    assert await book.resolve(pod([{"name": "gpus", "resourceClaimTemplateName": "t"}])) == Waiting(
        'pod "team/p": ResourceClaim not created yet')
    assert await book.resolve(pod([{"name": "gpus", "resourceClaimName": "nowhere"}])) == Waiting(
        'pod "team/p": ResourceClaim team/nowhere does not exist yet')
    refused = await book.resolve(pod([{"name": "gpus", "resourceClaimTemplateName": "t"}],
                                     [{"name": "gpus", "resourceClaimName": "made-for-another"}]))
    assert isinstance(refused, Violation) and "(Pod is not owner)" in str(refused)
    # a claim the watch has not shown yet is read from the store before the pod is told to wait
    await user.apply_resource_claim(claim("just-now"))
    late = await book.resolve(pod([{"name": "gpus", "resourceClaimName": "just-now"}]))
    assert isinstance(late, tuple) and late[0].claim.name == "just-now"


async def test_waiting_gangs_are_woken_when_devices_come_or_a_holder_lets_go_not_when_a_claim_takes_some(world):
    user, _, signal, admin = world
    await user.apply_resource_slice(gpu_slice("c-0", "node-c", 2))
    await eventually(admin, lambda p: "gpu.nvidia.com/node-c" in p, "the pool")
    fired = signal.fired
    await user.apply_resource_claim(claim("grab", allocated=("c-0-gpu-0",), node="node-c"))
    await eventually(admin, lambda p: p["gpu.nvidia.com/node-c"].in_use, "the holder")
    assert signal.fired == fired, "a device taken frees nothing"
    (obj,) = [c for c in await user.list_resource_claims("team") if c["metadata"]["name"] == "grab"]
    await _delete_claim(user, obj)
    await eventually(admin, lambda p: not p["gpu.nvidia.com/node-c"].in_use, "the holder gone")
    assert signal.fired > fired
    fired = signal.fired
    await user.apply_resource_slice(gpu_slice("c-0", "node-c", 3))
    await eventually(admin, lambda p: len(p["gpu.nvidia.com/node-c"].slices[0].devices) == 3, "more devices")
    assert signal.fired > fired


async def test_a_pod_asking_an_extended_resource_a_class_serves_carries_the_claim_phalanx_would_make(world):
    user, book, _, _ = world
    await user.apply_device_class({**GPU_CLASS, "metadata": {"name": "gpu-ext"},
                                   "spec": {**GPU_CLASS["spec"], "extendedResourceName": "example.com/gpu"}})
    with anyio.fail_after(10):
        while "example.com/gpu" not in book.extended:
            await anyio.sleep(0.02)
    p = pod([])
    p.raw["spec"].pop("resourceClaims")
    p.raw["spec"]["containers"][0]["resources"] = {"limits": {"example.com/gpu": "2"}}
    assert book.concerns(p)
    (got,) = await book.resolve(p)
    assert (got.claim.extended, got.claim.uid, [(r.resource, r.count, r.request) for r in got.claim.extended_requests]) \
        == (True, "extended:pod-uid", [("example.com/gpu", 2, "container-0-request-0")])
    assert got.claim.requests[0].exactly.device_class.name == "gpu-ext"
    p.raw["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "2"}}
    assert not book.concerns(p)
