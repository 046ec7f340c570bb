"""One contract suite for ``ClusterPort``, run on both adapters (style rule 10).

* ``sim``: ``KvCluster`` on a real nats-server; pods and nodes are created with its loaders
  (``apply_pod``/``apply_node``), as ``phalanx up`` does.
* ``kube``: ``KubeCluster`` on the real kube-apiserver of the session; pods and nodes are created
  by an admin through the harness's own REST client, as a user's ``kubectl`` would.

Each test gets its own namespace (and node names of its own), so the backends' shared state
never leaks between tests.
"""

from __future__ import annotations

from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import anyio
import msgspec
import pytest
from kubeharness import KubeApi, gpu_pod, unique

from phalanx_kube.port import (
    BindConflict,
    EvictionBlocked,
    KubeEvent,
    Lease,
    LeaseConflict,
    Node,
    NotOurs,
    Pod,
    PodGone,
)
from phalanx_proto.events import PodRef
from phalanx_proto.kubeapi import DISRUPTION_BUDGET_ANNOTATION

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


@dataclass
class Backend:
    """A cluster under test plus a way to create objects in it the way its users do."""

    name: str
    cluster: Any
    namespace: str
    _create_pod: Any
    _create_node: Any
    _create_queue: Any = None
    _create_namespace: Any = None
    _create_budget: Any = None

    async def pod(self, name: str, *, scheduler: str = "phalanx", annotations: dict | None = None,
                  labels: dict | None = None, node: str = "") -> PodRef:
        obj = gpu_pod(name, self.namespace, 1, scheduler=scheduler, labels=labels)
        if node:
            obj["spec"]["nodeName"] = node  # created bound, as by another scheduler
        elif scheduler == "default-scheduler":
            # kube-scheduler may run in this session (tests/kube starts it when it runs first) and
            # would bind the pod to a kwok node mid-test: no node has this label.
            obj["spec"]["nodeSelector"] = {"phalanx.io/contract-test": "never-bound"}
        if annotations:
            obj["metadata"]["annotations"] = annotations
        uid = await self._create_pod(obj)
        return PodRef(namespace=self.namespace, name=name, uid=uid)

    async def node(self, name: str, *, labels: dict[str, str], capacity: dict[str, str]) -> None:
        await self._create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
                                 "status": {"capacity": dict(capacity), "allocatable": dict(capacity)}})

    async def guarded_pod(self, name: str) -> PodRef:
        """A pod whose PodDisruptionBudget allows no eviction now (the simulator: the annotation
        that stands for one; the API server: a PDB with minAvailable 1 selecting it)."""
        if self._create_budget is None:
            return await self.pod(name, annotations={DISRUPTION_BUDGET_ANNOTATION: "0"})
        ref = await self.pod(name, labels={"guarded": name}, node="node-guarded")
        await self._create_budget({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                                   "metadata": {"name": name, "namespace": self.namespace},
                                   "spec": {"minAvailable": 1, "selector": {"matchLabels": {"guarded": name}}}})
        return ref

    def ref(self, name: str, uid: str = "") -> PodRef:
        return PodRef(namespace=self.namespace, name=name, uid=uid)

    async def queue(self, name: str, spec: dict) -> None:
        await self._create_queue({"apiVersion": "scheduling.phalanx.io/v1alpha1", "kind": "Queue",
                                  "metadata": {"name": name}, "spec": spec})

    async def labelled_namespace(self, name: str, labels: dict[str, str]) -> None:
        await self._create_namespace(name, labels)

    async def relabel_namespace(self, name: str, labels: dict[str, str]) -> None:
        """Replace the namespace's labels (``kubectl label --overwrite`` of each, the others removed)."""
        await self._create_namespace(name, labels, replace=True)


@pytest.fixture(params=["sim", "kube"])
async def backend(request) -> Any:
    ns = unique("contract")
    if request.param == "sim":
        from phalanx_bus import Bus
        from phalanx_kube.kvcluster import KvCluster

        bus = await Bus.connect(request.getfixturevalue("nats_server").url, service="contract-test")
        sim = await KvCluster.open(bus)

        async def create_pod(obj):
            return (await sim.apply_pod(obj)).uid

        try:
            async def create_namespace(name, labels, replace=False):
                await sim.apply_namespace(name, labels)

            yield Backend("sim", sim, ns, create_pod, sim.apply_node, sim.apply_queue, create_namespace)
        finally:
            await bus.close()
    else:
        from phalanx_kube.kube import KubeCluster

        plane = request.getfixturevalue("kube")
        api: KubeApi = request.getfixturevalue("kube_api")
        api.create_namespace(ns)

        async def create_pod(obj):
            return (await anyio.to_thread.run_sync(api.create_pod, obj))["metadata"]["uid"]

        async def create_node(obj):
            await anyio.to_thread.run_sync(api.create_node, obj)

        async def create_queue(obj):
            await anyio.to_thread.run_sync(lambda: api.post("/apis/scheduling.phalanx.io/v1alpha1/queues", obj))

        async def create_namespace(name, labels, replace=False):
            if replace:
                old = (await anyio.to_thread.run_sync(api.get, f"/api/v1/namespaces/{name}"))["metadata"]["labels"]
                patch = {**{k: None for k in old if not k.startswith("kubernetes.io/")}, **labels}
                await anyio.to_thread.run_sync(lambda: api.patch(f"/api/v1/namespaces/{name}",
                                                                 {"metadata": {"labels": patch}}))
                return
            await anyio.to_thread.run_sync(lambda: api.post("/api/v1/namespaces", {
                "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}))

        async def create_budget(obj):
            # The API server ignores budgets for a pod that is not running (Pending): this one
            # is bound and marked Running, as the kubelet would, before its budget is created.
            name = obj["metadata"]["name"]
            await anyio.to_thread.run_sync(lambda: api.patch(
                f"/api/v1/namespaces/{ns}/pods/{name}/status", {"status": {"phase": "Running"}}))
            await anyio.to_thread.run_sync(lambda: api.post(
                f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets", obj))

        cluster = await KubeCluster.open(str(plane.kubeconfig))
        try:
            yield Backend("kube", cluster, ns, create_pod, create_node, create_queue, create_namespace, create_budget)
        finally:
            # Leave no pod with our scheduler names behind: the e2e tier's gang-coordinator
            # watches the same API server and would schedule them.
            for pod in mine_of(ns, await cluster.list_pods()):
                await cluster.delete_pod(pod.ref)
            await cluster.close()


def mine_of(namespace: str, pods: list[Pod]) -> list[Pod]:
    return [p for p in pods if p.namespace == namespace]


def mine(backend: Backend, pods: list[Pod]) -> list[Pod]:
    return mine_of(backend.namespace, pods)


def scheduled_condition(pod: Pod) -> dict:
    conds = [c for c in (pod.raw.get("status") or {}).get("conditions") or [] if c.get("type") == "PodScheduled"]
    assert len(conds) == 1, pod.raw.get("status")
    return conds[0]


# -- pods ------------------------------------------------------------------------------------------
async def test_list_pods_returns_only_pods_with_our_scheduler_names(backend):
    uid_a = (await backend.pod("a", scheduler="phalanx", labels={"team": "ml"})).uid
    uid_b = (await backend.pod("b", scheduler="lj-runtimekit-scheduler")).uid
    await backend.pod("c", scheduler="default-scheduler")
    await backend.pod("d", scheduler="volcano")

    pods = mine(backend, await backend.cluster.list_pods())

    assert sorted((p.name, p.uid, p.scheduler_name, p.node_name, p.phase, p.deleting, p.labels) for p in pods) == [
        ("a", uid_a, "phalanx", "", "Pending", False, {"team": "ml"}),
        ("b", uid_b, "lj-runtimekit-scheduler", "", "Pending", False, {}),
    ]
    assert all(p.uid for p in pods)
    assert pods[0].raw["spec"]["schedulerName"] in ("phalanx", "lj-runtimekit-scheduler")  # camelCase raw
    assert pods[0].raw["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}


async def test_get_pod_returns_the_pod_and_none_for_a_missing_one(backend):
    ref = await backend.pod("present")
    pod = await backend.cluster.get_pod(ref)
    assert (pod.namespace, pod.name, pod.uid, pod.scheduler_name, pod.ref) == (
        backend.namespace, "present", ref.uid, "phalanx", ref)
    assert await backend.cluster.get_pod(backend.ref("absent")) is None


async def test_watch_yields_listed_pods_as_added_then_none_then_every_change(backend):
    first = await backend.pod("first")
    await backend.pod("not-ours", scheduler="default-scheduler")
    seen: list[tuple[str, str]] = []
    watch = backend.cluster.watch_pods()

    async def until(predicate) -> Any:
        """Consume the watch until ``predicate(event)``; record our namespace's events."""
        with anyio.fail_after(15):
            async for ev in watch:
                if ev is not None and ev.pod.namespace != backend.namespace:
                    continue
                seen.append(("NONE", "") if ev is None else (ev.type, ev.pod.name))
                if predicate(ev):
                    return ev
        raise AssertionError("watch ended")

    try:
        await until(lambda ev: ev is None)
        assert seen[-2:] == [("ADDED", "first"), ("NONE", "")]

        second = await backend.pod("second")
        ev = await until(lambda ev: ev is not None and ev.pod.name == "second")
        assert (ev.type, ev.pod.uid) == ("ADDED", second.uid)

        await backend.cluster.annotate_pod(first, {"phalanx.io/test": "yes"})
        ev = await until(lambda ev: ev is not None and ev.pod.annotations.get("phalanx.io/test") == "yes")
        assert (ev.type, ev.pod.name) == ("MODIFIED", "first")

        await backend.cluster.delete_pod(first)
        ev = await until(lambda ev: ev is not None and ev.type == "DELETED")
        assert (ev.pod.name, ev.pod.uid) == ("first", first.uid)
        assert not any(name == "not-ours" for _, name in seen), seen
    finally:
        await watch.aclose()


async def test_annotate_merges_into_the_existing_annotations(backend):
    ref = await backend.pod("annotated", annotations={"keep": "me"})
    await backend.cluster.annotate_pod(ref, {"phalanx.io/assignment": '{"node":"n1"}'})
    await backend.cluster.annotate_pod(ref, {"other": "x"})
    pod = await backend.cluster.get_pod(ref)
    assert pod.annotations == {"keep": "me", "phalanx.io/assignment": '{"node":"n1"}', "other": "x"}


@pytest.mark.parametrize("ref_of", [
    pytest.param(lambda b, uid: b.ref("never-existed"), id="missing pod"),
    pytest.param(lambda b, uid: b.ref("recreated", uid="00000000-0000-0000-0000-000000000000"), id="other uid"),
])
async def test_annotating_a_pod_that_is_gone_raises_pod_gone(backend, ref_of):
    ref = await backend.pod("recreated")
    with pytest.raises(PodGone):
        await backend.cluster.annotate_pod(ref_of(backend, ref.uid), {"a": "b"})


async def test_bind_sets_the_node_and_binding_again_to_the_same_node_is_success(backend):
    ref = await backend.pod("bound")
    await backend.cluster.bind(ref, "node-1")
    await backend.cluster.bind(ref, "node-1")
    pod = await backend.cluster.get_pod(ref)
    assert pod.node_name == "node-1"
    assert scheduled_condition(pod)["status"] == "True"


async def test_bind_sets_its_annotations_with_the_node_and_again_to_the_same_node_sets_changed_ones(backend):
    ref = await backend.pod("annotated-bind")
    await backend.cluster.bind(ref, "node-1", {"phalanx.io/assignment": "first"})
    pod = await backend.cluster.get_pod(ref)
    assert (pod.node_name, pod.annotations.get("phalanx.io/assignment")) == ("node-1", "first")
    await backend.cluster.bind(ref, "node-1", {"phalanx.io/assignment": "second"})
    pod = await backend.cluster.get_pod(ref)
    assert (pod.node_name, pod.annotations.get("phalanx.io/assignment")) == ("node-1", "second")


async def test_bind_to_another_node_raises_bind_conflict_and_keeps_the_first_binding(backend):
    ref = await backend.pod("taken")
    await backend.cluster.bind(ref, "node-1")
    with pytest.raises(BindConflict, match="already bound to node-1"):
        await backend.cluster.bind(ref, "node-2")
    assert (await backend.cluster.get_pod(ref)).node_name == "node-1"


async def test_bind_of_a_recreated_pod_raises_bind_conflict_and_a_missing_one_pod_gone(backend):
    ref = await backend.pod("recreated")
    with pytest.raises(BindConflict):
        await backend.cluster.bind(backend.ref("recreated", uid="00000000-0000-0000-0000-000000000000"), "node-1")
    assert (await backend.cluster.get_pod(ref)).node_name == ""
    with pytest.raises(PodGone):
        await backend.cluster.bind(backend.ref("never-existed"), "node-1")


async def test_delete_removes_the_pod_and_deleting_again_or_another_uid_is_a_no_op(backend):
    ref = await backend.pod("doomed")
    await backend.cluster.delete_pod(backend.ref("doomed", uid="00000000-0000-0000-0000-000000000000"))
    assert (await backend.cluster.get_pod(ref)) is not None
    await backend.cluster.delete_pod(ref)
    assert await backend.cluster.get_pod(ref) is None
    await backend.cluster.delete_pod(ref)
    await backend.cluster.delete_pod(backend.ref("never-existed"))


async def test_an_eviction_dry_run_keeps_the_pod_the_eviction_removes_it_and_again_or_another_uid_is_false(backend):
    ref = await backend.pod("evicted")
    assert await backend.cluster.evict_pod(backend.ref("evicted", uid="00000000-0000-0000-0000-000000000000")) is False
    assert await backend.cluster.evict_pod(ref, dry_run=True) is True
    assert (await backend.cluster.get_pod(ref)) is not None

    async def gone():
        return await backend.cluster.get_pod(ref) is None

    assert await backend.cluster.evict_pod(ref) is True
    with anyio.fail_after(30):  # the eviction deletes the pod (on a real server, after its grace period)
        while not await gone():
            await anyio.sleep(0.2)
    assert await backend.cluster.evict_pod(ref) is False
    assert await backend.cluster.evict_pod(backend.ref("never-existed")) is False


async def test_an_eviction_its_disruption_budget_forbids_raises_eviction_blocked_and_keeps_the_pod(backend):
    ref = await backend.guarded_pod("guarded")
    for dry_run in (True, False):
        with pytest.raises(EvictionBlocked, match="guarded"):
            await backend.cluster.evict_pod(ref, dry_run=dry_run)
    pod = await backend.cluster.get_pod(ref)
    assert pod is not None and not pod.deleting


async def test_the_pods_a_disruption_budget_selects_are_told_apart_from_the_others(backend):
    # binder dry-runs only their evictions (docs/preemption.md): a pod no budget selects is
    # evicted at once, since nothing can refuse it.
    guarded = await backend.guarded_pod("budgeted")
    free = await backend.pod("unbudgeted", labels={"guarded": "someone-else"})
    assert await backend.cluster.budgeted([guarded, free, backend.ref("never-existed")]) == {guarded}
    assert await backend.cluster.budgeted([free]) == set()


@pytest.mark.parametrize("scheduler", ["default-scheduler", "someone-else"])
async def test_a_pod_of_another_scheduler_is_never_bound_patched_or_deleted(backend, scheduler):
    ref = await backend.pod("not-ours", scheduler=scheduler)
    before = await backend.cluster.get_pod(ref)
    attempts = {
        "bind": lambda r: backend.cluster.bind(r, "node-1"),
        "annotate": lambda r: backend.cluster.annotate_pod(r, {"phalanx.io/assignment": "{}"}),
        "condition": lambda r: backend.cluster.set_scheduled_condition(r, status=False, reason="R", message="m"),
        "delete": lambda r: backend.cluster.delete_pod(r),
        "evict": lambda r: backend.cluster.evict_pod(r),
    }
    refused = {}
    for what, act in attempts.items():
        for r in (ref, backend.ref("not-ours")):  # with and without the uid
            with pytest.raises(NotOurs) as e:
                await act(r)
            refused[what] = scheduler in str(e.value)
    after = await backend.cluster.get_pod(ref)
    assert refused == dict.fromkeys(attempts, True)
    assert (after.uid, after.node_name, after.annotations, after.raw.get("status", {}).get("conditions")) == (
        before.uid, before.node_name, before.annotations, before.raw.get("status", {}).get("conditions"))


# -- events and conditions -------------------------------------------------------------------------
async def test_the_same_event_again_bumps_its_count_and_another_one_is_listed_after_it(backend):
    ref = await backend.pod("eventful")
    c = backend.cluster
    assert await c.list_events(ref) == []
    await c.record_event(ref, reason="FailedScheduling", message="0/2 nodes are available", type="Warning")
    await c.record_event(ref, reason="FailedScheduling", message="0/2 nodes are available", type="Warning")
    await c.record_event(ref, reason="Scheduled", message="Successfully assigned to node-1")
    events = await c.list_events(ref)
    assert [(e.reason, e.message, e.type, e.count) for e in events] == [
        ("FailedScheduling", "0/2 nodes are available", "Warning", 2),
        ("Scheduled", "Successfully assigned to node-1", "Normal", 1),
    ]
    assert all(isinstance(e, KubeEvent) and e.at > 0 for e in events)


async def test_the_scheduled_condition_carries_the_pending_reason(backend):
    ref = await backend.pod("pending")
    c = backend.cluster
    await c.set_scheduled_condition(ref, status=False, reason="Unschedulable", message="0/2 nodes are available")
    await c.set_scheduled_condition(ref, status=False, reason="Unschedulable", message="0/3 nodes are available")
    cond = scheduled_condition(await c.get_pod(ref))
    assert (cond["status"], cond["reason"], cond["message"]) == ("False", "Unschedulable", "0/3 nodes are available")
    with pytest.raises(PodGone):
        await c.set_scheduled_condition(backend.ref("never-existed"), status=False, reason="r", message="m")


# -- nodes -----------------------------------------------------------------------------------------
async def test_nodes_are_listed_and_extended_resources_patched_into_capacity_and_allocatable(backend):
    name = unique("gpu-node")
    labels = {"kubernetes.io/hostname": name, "lj_runtimekit_enable": "true"}
    await backend.node(name, labels=labels, capacity={"cpu": "64", "memory": "512Gi"})
    c = backend.cluster

    got = await c.get_node(name)
    assert got.raw["metadata"]["name"] == name  # the whole object, camelCase
    assert msgspec.structs.replace(got, raw={}) == Node(
        name=name, labels=labels, capacity={"cpu": "64", "memory": "512Gi"}, allocatable={"cpu": "64", "memory": "512Gi"})
    assert name in [n.name for n in await c.list_nodes()]

    await c.patch_node_capacity(name, {"nvidia.com/gpu": "8", "aliyun.com/gpu-core": "800"})
    want = {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8", "aliyun.com/gpu-core": "800"}
    assert msgspec.structs.replace(await c.get_node(name), raw={}) == Node(
        name=name, labels=labels, capacity=want, allocatable=want)

    assert await c.get_node(unique("no-such-node")) is None
    with pytest.raises(KeyError):
        await c.patch_node_capacity(unique("no-such-node"), {"nvidia.com/gpu": "8"})


async def test_a_node_is_watched_with_the_pods_bound_to_it_of_every_scheduler(backend):
    """What the node agent reports from: the node, then again once its pods change."""
    c, name = backend.cluster, unique("watched-node")
    await backend.node(name, labels={"kubernetes.io/hostname": name}, capacity={"cpu": "8"})
    mine_ref = await backend.pod("on-node")
    await backend.pod("elsewhere")
    with anyio.fail_after(60):
        async with aclosing(c.watch_node(name)) as updates:
            first = await anext(updates)
            assert (first.node.name, first.pods) == (name, ())
            await c.bind(mine_ref, name)
            await backend.pod("theirs-on-node", scheduler="default-scheduler", node=name)
            while True:
                update = await anext(updates)
                if len(update.pods) == 2:
                    break
    assert sorted(p.name for p in update.pods) == ["on-node", "theirs-on-node"]
    assert sorted(p.name for p in await c.list_node_pods(name)) == ["on-node", "theirs-on-node"]
    bound = {p.name for p in await c.list_bound_pods() if p.node_name == name}
    assert bound == {"on-node", "theirs-on-node"}


# -- leases (the per-node fences of docs/delivery.md) ----------------------------------------------
async def test_a_lease_is_created_read_renewed_and_released_with_its_version_as_precondition(backend):
    c, ns = backend.cluster, backend.namespace
    assert await c.get_lease(ns, "fence-n1") is None
    want = Lease(namespace=ns, name="fence-n1", holder="binder-0", duration_s=30, acquired=1_700_000_000.25,
                 renewed=1_700_000_000.25, annotations={"phalanx.io/fence": '{"pods":[]}'})
    created = await c.create_lease(want)
    assert created.resource_version
    read = await c.get_lease(ns, "fence-n1")
    assert read == msgspec.structs.replace(want, resource_version=created.resource_version)
    assert (read.expired(1_700_000_030.0), read.expired(1_700_000_030.5)) == (False, True)

    renewed = await c.update_lease(msgspec.structs.replace(read, renewed=1_700_000_010.5,
                                                           annotations={"phalanx.io/fence": '{"pods":["a"]}'}))
    assert renewed.resource_version != created.resource_version
    assert await c.get_lease(ns, "fence-n1") == renewed

    await c.delete_lease(ns, "fence-n1", resource_version=renewed.resource_version)
    assert await c.get_lease(ns, "fence-n1") is None
    await c.delete_lease(ns, "fence-n1")  # absent is success


async def test_a_second_create_or_a_stale_update_or_delete_raises_lease_conflict_and_changes_nothing(backend):
    c, ns = backend.cluster, backend.namespace
    first = await c.create_lease(Lease(namespace=ns, name="fence-n2", holder="binder-0", duration_s=30, renewed=1.0))
    with pytest.raises(LeaseConflict):
        await c.create_lease(Lease(namespace=ns, name="fence-n2", holder="intruder", duration_s=30))
    second = await c.update_lease(msgspec.structs.replace(first, holder="binder-1", renewed=2.0))
    with pytest.raises(LeaseConflict):
        await c.update_lease(msgspec.structs.replace(first, holder="stale-writer"))
    with pytest.raises(LeaseConflict):
        await c.delete_lease(ns, "fence-n2", resource_version=first.resource_version)
    assert await c.get_lease(ns, "fence-n2") == second
    await c.delete_lease(ns, "fence-n2")
    with pytest.raises(LeaseConflict):
        await c.update_lease(second)  # gone


# -- queues ----------------------------------------------------------------------------------------
async def test_queues_are_listed_as_stored_and_their_status_is_written(backend):
    name = unique("queue")
    spec = {"parent": "research", "resources": {"nvidia.com/gpu": {"quota": 8, "limit": 16}},
            "namespaceSelector": {"matchLabels": {"team": "a"}}}
    await backend.queue(name, spec)
    (got,) = [q for q in await backend.cluster.list_queues() if q["metadata"]["name"] == name]
    assert got["spec"]["resources"]["nvidia.com/gpu"] == {"quota": 8, "limit": 16, "overQuotaWeight": 1} \
        if backend.name == "kube" else {"quota": 8, "limit": 16}
    assert (got["spec"]["parent"], got["spec"]["namespaceSelector"]) == (spec["parent"], spec["namespaceSelector"])
    status = {"allocated": 4, "borrowed": 0, "pendingGangs": 1, "pendingGPUs": 2, "fairShare": 8,
              "conditions": [{"type": "Valid", "status": "True", "reason": "Valid", "message": "the queue is usable"}]}
    await backend.cluster.update_queue_status(name, status)
    (after,) = [q for q in await backend.cluster.list_queues() if q["metadata"]["name"] == name]
    assert after["status"] == status
    await backend.cluster.update_queue_status(unique("gone"), status)  # a Queue that is gone: no error


async def test_namespaces_are_listed_with_their_labels(backend):
    name = unique("ns")
    await backend.labelled_namespace(name, {"scheduling.phalanx.io/queue": "team-a", "team": "a"})
    labels = (await backend.cluster.list_namespaces())[name]
    assert {k: v for k, v in labels.items() if not k.startswith("kubernetes.io/")} == {
        "scheduling.phalanx.io/queue": "team-a", "team": "a"}


async def test_a_namespace_is_read_alone_and_followed_by_its_watch_as_its_labels_change(backend):
    name = unique("ns")
    watched: list[dict[str, dict[str, str]]] = []

    async def follow() -> None:
        async for labels in backend.cluster.watch_namespaces():
            watched.append(labels)

    def mine(labels: dict[str, str] | None) -> dict[str, str] | None:
        return None if labels is None else {k: v for k, v in labels.items() if not k.startswith("kubernetes.io/")}

    async with anyio.create_task_group() as tg:
        tg.start_soon(follow)
        await backend.labelled_namespace(name, {"team": "a"})
        assert mine(await backend.cluster.get_namespace(name)) == {"team": "a"}
        with anyio.fail_after(10):
            while not watched or mine(watched[-1].get(name)) != {"team": "a"}:
                await anyio.sleep(0.05)
        await backend.relabel_namespace(name, {"team": "b"})
        with anyio.fail_after(10):
            while mine(watched[-1].get(name)) != {"team": "b"}:
                await anyio.sleep(0.05)
        tg.cancel_scope.cancel()
    missing = unique("never")
    # the simulator's namespaces exist implicitly (no labels); the API server knows none by that name
    assert await backend.cluster.get_namespace(missing) == ({} if backend.name == "sim" else None)
