"""Device IDs, the fence and what a container gets: the plugin's pure parts."""

from __future__ import annotations

import msgspec
import pytest
from dpkit import MIG_UUID, NODE, UUIDS, assignment, node_topology, pod, rdma_sysfs

from phalanx_deviceplugin import delivery as dv
from phalanx_deviceplugin.devices import DeviceTable
from phalanx_kube import fence as F
from phalanx_kube.port import Lease
from phalanx_proto.kubeapi import FENCE_ANNOTATION, Fence, FenceEntry, assignment_digest, encode_fence

TABLE = DeviceTable(node_topology())
A = UUIDS[0]


# -- device IDs ------------------------------------------------------------------------------------
def test_every_resource_of_the_seed_is_advertised_with_ids_naming_their_device():
    counts = {r: len(TABLE.devices[r]) for r in TABLE.resources}
    assert counts == {"nvidia.com/gpu": 3, "aliyun.com/gpu-core": 300, "aliyun.com/gpu-memory": 160,
                      "aliyun.com/gpu-memory-mib": 1280, "aliyun.com/gpu-slice": 7, "aliyun.com/rdma": 8}
    assert [d.id for d in TABLE.devices["nvidia.com/gpu"]] == list(UUIDS[:3])  # GPU3 is in MIG mode
    assert (TABLE.target("aliyun.com/gpu-core", f"{A}-core-42"), TABLE.target("aliyun.com/gpu-slice", f"{UUIDS[3]}-slice-6"),
            TABLE.target("aliyun.com/rdma", "mlx5_1-rdma-3")) == (f"gpu:{A}", f"gpu:{UUIDS[3]}", "nic:mlx5_1")
    assert max(len(d.id) for ds in TABLE.devices.values() for d in ds) <= 63
    assert TABLE.devices["nvidia.com/gpu"][2].numa == 1


@pytest.mark.parametrize(("resource", "fields", "available", "size", "want"), [
    pytest.param("nvidia.com/gpu", {"gpu_uuids": (UUIDS[2], UUIDS[1])}, list(UUIDS[:3]), 2, [UUIDS[2], UUIDS[1]],
                 id="whole GPUs steer to the assignment's GPUs"),
    pytest.param("aliyun.com/gpu-core", {"gpus": (0, 1), "core_pct": 30},
                 [f"{u}-core-{k}" for u in UUIDS[:3] for k in range(3)], 4,
                 [f"{A}-core-0", f"{UUIDS[1]}-core-0", f"{A}-core-1", f"{UUIDS[1]}-core-1"],
                 id="a share's units come round-robin from its GPUs"),
    pytest.param("aliyun.com/rdma", {"nics": ("mlx5_1",)}, ["mlx5_0-rdma-0", "mlx5_1-rdma-0"], 1, ["mlx5_1-rdma-0"],
                 id="rdma steers to the chosen NIC"),
    pytest.param("nvidia.com/gpu", {"gpu_uuids": (UUIDS[2],)}, [UUIDS[0]], 1, [],
                 id="nothing when the chosen GPU is not available (Allocate then refuses)"),
])
def test_preferred_allocation(resource, fields, available, size, want):
    a = assignment(pod("p", {}), **fields)
    assert TABLE.prefer(resource, a, available, [], size) == want


@pytest.mark.parametrize(("resource", "ids", "want"), [
    pytest.param("nvidia.com/gpu", [UUIDS[1]], "", id="the assignment's GPU passes"),
    pytest.param("nvidia.com/gpu", [UUIDS[2]], f"nvidia.com/gpu: the kubelet chose devices on {UUIDS[2]}, "
                 f"the assignment is {UUIDS[0]}, {UUIDS[1]}", id="another GPU is named"),
    pytest.param("nvidia.com/gpu", ["GPU-forged"], "nvidia.com/gpu: device IDs ['GPU-forged'] are not advertised "
                 "on this node", id="an unknown ID is named"),
    pytest.param("aliyun.com/rdma", ["mlx5_0-rdma-0"], "the assignment gives no device for aliyun.com/rdma",
                 id="rdma without NICs in the assignment"),
])
def test_check_names_what_does_not_match(resource, ids, want):
    assert TABLE.check(resource, assignment(pod("p", {}), gpu_uuids=UUIDS[:2]), ids) == want


# -- the fence -------------------------------------------------------------------------------------
def lease(fence_json: str, *, renewed: float = 100.0, duration: int = 600) -> Lease:
    return Lease(namespace="phalanx-system", name=F.lease_name(NODE), holder="binder-0", duration_s=duration,
                 renewed=renewed, annotations={FENCE_ANNOTATION: fence_json})


ENTRY = FenceEntry(uid="u1", namespace="default", name="p1", digest=assignment_digest('{"a":1}'), expires=500.0)
GOOD = encode_fence(Fence(node=NODE, pods=(ENTRY,)))


@pytest.mark.parametrize(("lease_", "problem"), [
    pytest.param(None, "no fence lease phalanx-fence-gpu-node-1", id="no lease"),
    pytest.param(lease(GOOD, renewed=0.0, duration=10), "expired", id="the holder stopped renewing"),
    pytest.param(lease("{not json"), "is not JSON", id="garbage"),
    pytest.param(lease('{"node":"gpu-node-1","pods":[{"uid":"u1"}]}'), "is invalid", id="an entry missing fields"),
    pytest.param(lease(encode_fence(Fence(node="other"))), "is for node 'other'", id="another node's fence"),
])
def test_a_fence_that_cannot_be_used_is_an_error_naming_why(lease_, problem):
    with pytest.raises(F.FenceError, match=problem):
        F.read(lease_, NODE, now=200.0)


@pytest.mark.parametrize(("uid", "ns", "name", "text", "now", "want"), [
    pytest.param("u1", "default", "p1", '{"a":1}', 200.0, "", id="binder's pod and annotation"),
    pytest.param("u2", "default", "p1", '{"a":1}', 200.0, "is not in the node's fence", id="another uid"),
    pytest.param("u1", "default", "p2", '{"a":1}', 200.0, "names default/p1", id="uid reused under another name"),
    pytest.param("u1", "default", "p1", '{"a":2}', 200.0, "differs from what binder wrote", id="edited annotation"),
    pytest.param("u1", "default", "p1", None, 200.0, "has no phalanx.io/assignment", id="annotation removed"),
    pytest.param("u1", "default", "p1", '{"a":1}', 600.0, "expired", id="entry lapsed"),
])
def test_verify_trusts_only_what_binder_recorded(uid, ns, name, text, now, want):
    got = F.verify(F.read(lease(GOOD), NODE, 200.0), uid=uid, namespace=ns, name=name, annotation=text, now=now)
    assert (got == "") if not want else (want in got)


def test_admit_replaces_an_entry_of_the_same_uid_and_release_and_prune_drop_entries():
    old = msgspec.structs.replace(ENTRY, expires=150.0)
    other = FenceEntry(uid="u2", namespace="default", name="p2", digest=ENTRY.digest, expires=120.0)
    fence = Fence(node=NODE, pods=(old, other))
    assert F.admit(fence, [ENTRY], now=130.0).pods == (ENTRY,)  # u2 lapsed, u1 replaced
    assert F.release(Fence(node=NODE, pods=(ENTRY, other)), {"u1"}, now=100.0).pods == (other,)
    assert F.lease_name("n" * 300).startswith(F.LEASE_PREFIX) and len(F.lease_name("n" * 300)) < 64


# -- what the container gets -----------------------------------------------------------------------
MPS_OK = dv.Mps(pipe_dir="/tmp/mps", active_thread_pct=30, pinned_mem_mib=2048)


@pytest.mark.parametrize(("fields", "mps", "running", "level"), [
    pytest.param({"gpus": (0,)}, None, False, "hard", id="whole GPU"),
    pytest.param({"mig_profile": "1g.5gb", "mig_instance_uuid": MIG_UUID}, None, False, "hard", id="MIG"),
    pytest.param({"core_pct": 50, "memory_mib": 4096}, None, False, "advisory", id="TDM without MPS"),
    pytest.param({"core_pct": 50, "memory_mib": 4096}, MPS_OK, False, "advisory", id="MPS configured, not running"),
    pytest.param({"core_pct": 50, "memory_mib": 4096}, MPS_OK, True, "mps", id="MPS defaults tighter than the limits"),
    pytest.param({"core_pct": 20, "memory_mib": 4096}, MPS_OK, True, "advisory", id="MPS default looser than gpu-core"),
    pytest.param({"memory_mib": 1024}, MPS_OK, True, "advisory", id="MPS memory default looser than the request"),
])
def test_the_isolation_level_never_claims_more_than_is_enforced(tmp_path, fields, mps, running, level):
    if mps is not None:
        mps = dv.Mps(pipe_dir=str(tmp_path), active_thread_pct=mps.active_thread_pct, pinned_mem_mib=mps.pinned_mem_mib)
        if running:
            (tmp_path / "control").touch()
    got, why = dv.isolation(assignment(pod("p", {}), **fields), dv.Delivery(mps=mps))
    assert got == level and why


def test_a_tdm_share_gets_its_gpu_by_cdi_name_and_its_limits_as_environment():
    a = assignment(pod("p", {}), gpus=(1,), gpu_uuids=(UUIDS[1],), core_pct=50, memory_mib=4096)
    e = dv.gpu_edits(a, [UUIDS[1]], dv.Delivery())
    assert (e.cdi_devices, e.envs, e.devices, e.mounts) == (
        [f"nvidia.com/gpu={UUIDS[1]}"],
        {"NVIDIA_VISIBLE_DEVICES": "void", "PHALANX_ISOLATION": "advisory", "PHALANX_GPU_UUIDS": UUIDS[1],
         "PHALANX_GPU_CORE_PERCENT": "50", "PHALANX_GPU_MEMORY_MIB": "4096"}, [], [])


def test_without_cdi_the_uuids_go_in_nvidia_visible_devices_and_mig_uses_the_instance_uuid():
    mig = assignment(pod("p", {}), gpus=(3,), mig_profile="1g.5gb", mig_instance_uuid=MIG_UUID)
    assert dv.gpu_edits(mig, [UUIDS[3]], dv.Delivery()).cdi_devices == [f"nvidia.com/gpu={MIG_UUID}"]
    e = dv.gpu_edits(assignment(pod("p", {}), gpus=(0, 1)), list(UUIDS[:2]), dv.Delivery(cdi=False))
    assert (e.cdi_devices, e.envs["NVIDIA_VISIBLE_DEVICES"]) == ([], f"{UUIDS[0]},{UUIDS[1]}")


def test_rdma_gets_the_device_nodes_of_the_chosen_nics_only(tmp_path):
    a = assignment(pod("p", {}), gpus=(2,), nics=("mlx5_1",))
    e, problem = dv.rdma_edits(TABLE, a, dv.Delivery(sysfs_root=str(rdma_sysfs(tmp_path))))
    assert problem == ""
    assert e.devices == [("/dev/infiniband/uverbs1", "/dev/infiniband/uverbs1", "rwm"),
                         ("/dev/infiniband/umad1", "/dev/infiniband/umad1", "rwm"),
                         ("/dev/infiniband/rdma_cm", "/dev/infiniband/rdma_cm", "rwm")]
    assert e.envs == {"PHALANX_RDMA_DEVICES": "mlx5_1"}
    _, problem = dv.rdma_edits(TABLE, a, dv.Delivery(sysfs_root=str(tmp_path / "empty")))
    assert "mlx5_1 has no uverbs device node" in problem


async def _fence_of(cluster) -> tuple:
    lease = await cluster.get_lease("phalanx-system", F.lease_name(NODE))
    return () if lease is None else tuple(e.uid for e in F.read(lease, NODE, 150.0).pods)


@pytest.mark.anyio
async def test_binders_fence_writes_batch_replace_release_and_delete_the_lease_when_empty():
    from dpkit import MemCluster

    cluster = MemCluster()
    e = [FenceEntry(uid=f"u{i}", namespace="default", name=f"p{i}", digest=ENTRY.digest, expires=400.0)
         for i in range(3)]
    kw = {"namespace": "phalanx-system", "node": NODE, "holder": "binder-0"}
    await F.fence_pods(cluster, entries=e[:2], now=100.0, **kw)  # a gang's two pods: one write
    await F.fence_pods(cluster, entries=[e[2], msgspec.structs.replace(e[0], digest=assignment_digest("new"))], now=110.0, **kw)
    assert await _fence_of(cluster) == ("u1", "u2", "u0")
    lease = await cluster.get_lease("phalanx-system", F.lease_name(NODE))
    assert (lease.holder, lease.duration_s, lease.acquired, lease.renewed) == ("binder-0", F.LEASE_DURATION_S, 100.0, 110.0)
    await F.release_pods(cluster, uids={"u1", "u9"}, now=120.0, **kw)
    assert await _fence_of(cluster) == ("u2", "u0")
    await F.release_pods(cluster, uids={"u0", "u2"}, now=130.0, **kw)
    assert await cluster.get_lease("phalanx-system", F.lease_name(NODE)) is None
    await F.release_pods(cluster, uids={"u0"}, now=140.0, **kw)  # absent: success
