"""LeaderWorkerSet groups on the real LeaderWorkerSet controller (v0.8.0, with its webhooks,
built by tools/lws/build.sh): each group — leader and workers, made by the controller's two
StatefulSets — is one gang of the size the controller writes on its pods, placed whole in its
tightest domain; a group the controller recreates whole (its leader deleted) is placed again
as a whole; with ``exclusive-topology`` the leader first, then its workers on its leaf. (A
deleted worker is replaced alone or with its group, depending on which the controller sees first:
a repair inside the group's domain either way.)

On the shared four-node stack (``stack4``: four kwok nodes of 4 GPUs, each its own leaf); each
group is 4 pods of 1 GPU, one node's worth.
"""

from __future__ import annotations

import anyio
import pytest
from kubecontrollers import LWS_API, delete_workloads, wait_for
from test_controllers_e2e import bound, gpus_used, live

from phalanx_bus import Bus
from phalanx_bus.records import read_all
from phalanx_localstack.stack import Stack
from phalanx_proto import subjects as S

pytestmark = pytest.mark.e2e

NAME = "leaderworkerset.sigs.k8s.io/name"
GROUP = "leaderworkerset.sigs.k8s.io/group-index"
WORKER = "leaderworkerset.sigs.k8s.io/worker-index"


@pytest.fixture(autouse=True)
def _workloads_deleted_after_each_test(kube_api, kube_ns):
    yield
    delete_workloads(kube_api, kube_ns)


def lws(name: str, ns: str, *, replicas: int, size: int, gpus: int, restart: str = "RecreateGroupOnPodRestart") -> dict:
    """A LeaderWorkerSet whose leader and workers share one template of ``gpus`` GPUs."""
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"replicas": replicas, "leaderWorkerTemplate": {
                "size": size, "restartPolicy": restart,
                "workerTemplate": {"spec": {
                    "schedulerName": "phalanx", "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "c", "image": "registry.example/serve:1",
                                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}}}}


async def gangs_of(stack: Stack) -> dict:
    """Gang id → its state, as gang-coordinator recorded it."""
    bus = await Bus.connect(stack.url, service="test")
    try:
        good, _ = await read_all(await bus.kv(S.KV_GANGS))
        return {r.value.gang_id: r.value for r in good if r.value.members}
    finally:
        await bus.close()


def groups(pods: list[dict]) -> dict[str, set[str]]:
    """Group index → the nodes its pods are bound to."""
    out: dict[str, set[str]] = {}
    for p in pods:
        out.setdefault(p["metadata"]["labels"][GROUP], set()).add(p["spec"]["nodeName"])
    return out


def test_each_leaderworkerset_group_is_one_gang_placed_whole_on_its_tightest_domain(stack4, lws_controller, kube_api,
                                                                                   kube_ns):
    kube_api.post(f"{LWS_API}/namespaces/{kube_ns}/leaderworkersets", lws("serve", kube_ns, replicas=2, size=4, gpus=1))
    placed = bound(kube_api, kube_ns, f"{NAME}=serve", 8, stack4)
    where = groups(placed)
    assert sorted(where) == ["0", "1"] and all(len(nodes) == 1 for nodes in where.values()), where
    assert where["0"] != where["1"], where
    used = gpus_used(placed)
    assert len(used) == len(set(used)) == 8
    leaders = [p for p in placed if p["metadata"]["labels"].get(WORKER) == "0"]
    assert len(leaders) == 2  # the leader is a member like its workers
    # one gang per group, of the group's pods (packing alone could also put a group's pods on one node)
    members = {gid: sorted(m.pod.name for m in st.members) for gid, st in anyio.run(gangs_of, stack4).items()}
    by_group = {f"{kube_ns}/LeaderWorkerSet:serve-{g}": sorted(p["metadata"]["name"] for p in placed
                                                               if p["metadata"]["labels"][GROUP] == g) for g in "01"}
    assert {gid: m for gid, m in members.items() if gid.startswith(kube_ns)} == by_group


def test_a_group_recreated_whole_after_its_leader_is_deleted_is_placed_again_whole(stack4, lws_controller, kube_api,
                                                                                   kube_ns):
    """The leader's StatefulSet recreates the leader; the workers' StatefulSet, owned by the old
    leader, goes with it (garbage collector) and the controller makes a new one: every pod of
    the group is new, and the new group is one gang again, placed whole. (``restartPolicy:
    None``: with ``RecreateGroupOnPodRestart`` the controller may delete the new leader once
    more while it is being bound, a second recreation this test does not need.)"""
    kube_api.post(f"{LWS_API}/namespaces/{kube_ns}/leaderworkersets",
                  lws("redo", kube_ns, replicas=1, size=4, gpus=1, restart="None"))
    first = bound(kube_api, kube_ns, f"{NAME}=redo", 4, stack4)
    before = {p["metadata"]["uid"] for p in first}
    leader = next(p for p in first if p["metadata"]["labels"][WORKER] == "0")
    kube_api.request("DELETE", f"/api/v1/namespaces/{kube_ns}/pods/{leader['metadata']['name']}",
                     {"gracePeriodSeconds": 0})

    def recreated() -> list[dict]:
        pods = live(kube_api, kube_ns, f"{NAME}=redo")
        return pods if len(pods) == 4 and not before & {p["metadata"]["uid"] for p in pods} \
            and all(p["spec"].get("nodeName") for p in pods) else []
    try:
        again = wait_for(recreated, 150, "the whole group recreated by the controller and bound again")
    except AssertionError as e:
        raise AssertionError(f"{e}\n" + "\n".join(stack4.tail(n, 30) for n in ("gang-coordinator", "placement"))) from None
    assert len(groups(again)["0"]) == 1, groups(again)
    used = gpus_used(again)
    assert len(used) == len(set(used)) == 4


def test_an_exclusive_group_has_its_leader_placed_first_and_its_workers_follow_on_its_leaf(stack4, lws_controller,
                                                                                          kube_api, kube_ns):
    """``exclusive-topology``: the controller's webhook gives every pod of a group affinity to
    its group and anti-affinity to the others, and the controller creates a group's workers
    only once the leader is scheduled (with a nodeSelector on its leaf). Each group ends whole
    on a leaf of its own."""
    obj = lws("excl", kube_ns, replicas=2, size=3, gpus=1)
    obj["metadata"]["annotations"] = {"leaderworkerset.sigs.k8s.io/exclusive-topology": "phalanx.io/leaf-switch"}
    kube_api.post(f"{LWS_API}/namespaces/{kube_ns}/leaderworkersets", obj)
    placed = bound(kube_api, kube_ns, f"{NAME}=excl", 6, stack4, timeout_s=150)
    where = groups(placed)
    assert sorted(where) == ["0", "1"] and all(len(nodes) == 1 for nodes in where.values()), where
    assert where["0"] != where["1"], where
    used = gpus_used(placed)
    assert len(used) == len(set(used)) == 6
