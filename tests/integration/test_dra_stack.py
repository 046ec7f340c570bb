"""DRA through the whole stack (nats-server with auth and TLS, every service its own process, the
simulated cluster on the bus): pods naming ResourceClaims are placed with their claims allocated
in the same decision, binder writes each claim's allocation and ``reservedFor`` before the
Binding, and the ledger books the GPUs the claims are (docs/dra.md).

Two DGX-1V-shaped nodes (8 V100 in two NVLink quads); their ResourceSlices are the ones NVIDIA's
driver would publish (``phalanx_localstack.draslices``), naming the same GPU UUIDs as the
topology reports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
import yaml

from hostile import cleaned_env, hostile_stack
from phalanx_bus.records import read_all
from phalanx_kube.kvcluster import KvCluster
from phalanx_kube.port import ClaimRef
from phalanx_localstack import draslices
from phalanx_proto import subjects as S
from phalanx_proto.dra import AllocatedDevice, ClaimAllocation
from phalanx_proto.events import PodRef
from phalanx_proto.kubeapi import ASSIGNMENT_ANNOTATION, QUEUE_LABEL
from phalanx_topology import yamlfmt
from phalanx_topology.files import topology_from_file
from stackutil import CLUSTER, audit_ledger, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

COORD = ["--queue-sync-s", "0.3", "--resync-s", "0.5", "--backoff-base-s", "0.5", "--backoff-max-s", "3", "--reconcile-s", "1"]
NODES = ("dra-a", "dra-b")
TOPOLOGY = CLUSTER.parent / "topology" / "dgx1v-like_8xV100-SXM2_mlx5_oneflow.txt"


@pytest.fixture(scope="module")
def cluster_file(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("dra-cluster")
    nodes = []
    for name in NODES:
        topo = draslices.with_identity(topology_from_file(str(TOPOLOGY), name, gpu_model="Tesla V100-SXM2-16GB",
                                                          gpu_memory_mib=16384))
        yamlfmt.dump(topo, work / f"{name}.yaml")
        nodes.append({"name": name, "topology": f"{name}.yaml", "labels": {
            "lj_runtimekit_enable": "true", "phalanx.io/hypernode": "hn-1", "phalanx.io/leaf-switch": "leaf-1",
            "phalanx.io/network-pod": "pod-1"}})
    path = work / "cluster.yaml"
    path.write_text(yaml.safe_dump({"nodes": nodes}))
    return path


@pytest.fixture(scope="module")
def stack(tmp_path_factory, cluster_file):
    yield from hostile_stack(tmp_path_factory.mktemp("dra-stack"), COORD, cluster=cluster_file)


@pytest.fixture
async def env(stack, cluster_file):
    async for e in cleaned_env(stack):
        _, bus, sim = e
        for cls in draslices.device_classes():
            await sim.apply_device_class(cls)
        for name in NODES:
            topo = yamlfmt.load(cluster_file.parent / f"{name}.yaml")
            for s in draslices.gpu_slices(name, topo):
                await sim.apply_resource_slice(s)
        yield e
        # no resourceclaim controller here to deallocate the claims of the deleted pods: drop them
        claims = await bus.kv(S.KV_SIM_RESOURCE_CLAIMS)
        for entry in await claims.items():
            await claims.delete(entry.key)


def gpu_claim(name: str, count: int) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": draslices.GPU_CLASS, "count": count}}]}}}


def claim_pod(name: str, claim: str, *, gang: str = "", size: int = 1, queue: str = "") -> dict:
    labels = {"jobset.sigs.k8s.io/jobset-name": gang, "aliyun.com/min-member": str(size)} if gang else {}
    if queue:
        labels[QUEUE_LABEL] = queue
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", "labels": labels},
            "spec": {"schedulerName": "phalanx", "resourceClaims": [{"name": "gpus", "resourceClaimName": claim}],
                     "containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "gpus"}]}}]}}


async def claim_of(sim: KvCluster, name: str) -> dict:
    (obj,) = [c for c in await sim.list_resource_claims("default") if c["metadata"]["name"] == name]
    return obj


def devices(claim: dict) -> list[str]:
    return sorted(r["device"] for r in (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {})
                  .get("results", []))


def quad(devs: list[str]) -> bool:
    return {int(d.split("-")[1]) for d in devs} in ({0, 1, 2, 3}, {4, 5, 6, 7})


async def bound(sim: KvCluster, *names: str) -> dict[str, tuple[str, list[int]]] | None:
    pods = {p.name: p for p in await sim.list_pods()}
    if not all(n in pods and pods[n].node_name for n in names):
        return None
    return {n: (pods[n].node_name, json.loads(pods[n].annotations[ASSIGNMENT_ANNOTATION])["gpus"]) for n in names}


async def test_a_pod_with_a_four_gpu_claim_gets_an_nvlink_quad_written_to_its_claim_before_it_is_bound(env):
    stack, bus, sim = env
    await sim.apply_resource_claim(gpu_claim("quad", 4))
    await sim.apply_pod(claim_pod("solo", "quad"))
    got = await wait_until(lambda: bound(sim, "solo"), 30, what="the pod bound")
    node, gpus = got["solo"]
    claim = await claim_of(sim, "quad")
    assert quad(devices(claim)), devices(claim)
    assert sorted(int(d.split("-")[1]) for d in devices(claim)) == gpus
    assert [r["name"] for r in claim["status"]["reservedFor"]] == ["solo"]
    assert claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [node]
    assert "resource.kubernetes.io/delete-protection" in claim["metadata"]["finalizers"]
    assert (await audit_ledger(bus))["default/solo"] == 1
    # phalanx explain, as the read-only identity, shows the claim and its devices
    done = await anyio.to_thread.run_sync(lambda: subprocess.run(
        [sys.executable, "-m", "phalanx_cli.main", "explain", "default/solo", "--json", "--nats", stack.url],
        capture_output=True, text=True, timeout=60, env={**os.environ, **stack.identity_env(S.READER)}))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["claims"] == [
        {"name": "gpus", "claim": "quad", "state": "allocated", "detail": "", "reserved_for": ["pods/solo"],
         "devices": [{"request": r["request"], "device": f"{r['driver']}/{r['pool']}/{r['device']}"}
                     for r in claim["status"]["allocation"]["devices"]["results"]]}]


async def test_a_gang_of_two_needing_halves_of_one_node_gets_both_quads_with_no_device_twice(env):
    _, bus, sim = env
    for i in range(2):
        await sim.apply_resource_claim(gpu_claim(f"half-{i}", 4))
    # occupy one node wholly through the device plugin, so both halves must share the other
    await sim.apply_pod({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plugin-8", "namespace": "default"},
                         "spec": {"schedulerName": "phalanx", "containers": [
                             {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}})
    plugin = await wait_until(lambda: bound(sim, "plugin-8"), 30, what="the device-plugin pod bound")
    for i in range(2):
        await sim.apply_pod(claim_pod(f"half-{i}", f"half-{i}", gang="halves", size=2))
    got = await wait_until(lambda: bound(sim, "half-0", "half-1"), 30, what="both halves bound")
    assert got["half-0"][0] == got["half-1"][0] != plugin["plugin-8"][0]
    claims = [devices(await claim_of(sim, f"half-{i}")) for i in range(2)]
    assert all(quad(c) for c in claims) and not set(claims[0]) & set(claims[1]), claims
    await audit_ledger(bus)  # raises if a GPU is booked twice


async def test_a_claim_another_scheduler_allocated_keeps_its_devices(env):
    _, bus, sim = env
    taken = await sim.apply_resource_claim(gpu_claim("taken-by-other", 13))
    held = ClaimAllocation(devices=tuple(
        AllocatedDevice(request="gpu", driver=draslices.GPU_DRIVER, pool=node, device=f"gpu-{i}")
        for node in NODES for i in range(7) if (node, i) != ("dra-b", 6)))
    # as kube-scheduler's PreBind would write it for a pod of its own
    await sim.reserve_claim(ClaimRef(namespace="default", name="taken-by-other", uid=taken["metadata"]["uid"]),
                            PodRef(namespace="default", name="theirs", uid="uid-theirs"), held)

    async def seen() -> bool:  # the other scheduler's allocation is on the bus before ours starts
        pools, _ = await read_all(await bus.kv(S.KV_DRA))
        return sum(len(r.value.in_use) for r in pools) == 13

    await wait_until(seen, 10, what="phx-dra shows the claim's devices")
    await sim.apply_resource_claim(gpu_claim("two", 2))
    await sim.apply_pod(claim_pod("needs-two", "two"))
    got = await wait_until(lambda: bound(sim, "needs-two"), 30, what="the pod bound")
    assert got["needs-two"] == ("dra-b", [6, 7])


async def test_the_gpus_a_claim_gets_count_against_its_queues_limit(env):
    _, _, sim = env
    await sim.apply_queue({"apiVersion": "scheduling.phalanx.io/v1alpha1", "kind": "Queue",
                           "metadata": {"name": "capped"},
                           "spec": {"resources": {"nvidia.com/gpu": {"quota": 4, "limit": 4}}}})
    await anyio.sleep(1.0)  # gang-coordinator has read it (--queue-sync-s 0.3)
    for name, count in (("first", 4), ("second", 2)):
        await sim.apply_resource_claim(gpu_claim(name, count))
    await sim.apply_pod(claim_pod("first", "first", queue="capped"))
    await wait_until(lambda: bound(sim, "first"), 30, what="the first pod bound")
    await sim.apply_pod(claim_pod("second", "second", queue="capped"))

    async def told() -> str:
        events = [e.message for e in await sim.list_events(PodRef(namespace="default", name="second"))
                  if e.reason == "FailedScheduling"]
        return next((m for m in events if "limit" in m), "")

    why = await wait_until(told, 30, what="the second pod told why it waits")
    assert "capped" in why, why
    assert await bound(sim, "second") is None
