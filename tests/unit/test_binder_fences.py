"""binder's fence writer (group commits per node) and its pod watch (releases, the bind cache),
against the in-memory cluster port with the real fence code."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest
from dpkit import MemCluster

from phalanx_binder.fences import NodeFences
from phalanx_binder.pods import PodWatch
from phalanx_kube import fence as F
from phalanx_kube.port import Lease, PodEvent, pod_from_dict
from phalanx_proto.events import PodRef
from phalanx_proto.kubeapi import FenceEntry, assignment_digest

pytestmark = pytest.mark.anyio
NS = "phalanx-system"
NOW = 1000.0


class CountingCluster(MemCluster):
    """Counts lease requests; ``hold`` makes writes wait until it is set."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.hold: anyio.Event | None = None
        self.fail: Exception | None = None

    async def _gate(self, what: str) -> None:
        self.calls.append(what)
        if self.hold is not None:
            await self.hold.wait()
        if self.fail is not None:
            raise self.fail

    async def get_lease(self, namespace, name):
        self.calls.append("get")
        return await super().get_lease(namespace, name)

    async def create_lease(self, lease):
        await self._gate("create")
        return await super().create_lease(lease)

    async def update_lease(self, lease):
        await self._gate("update")
        return await super().update_lease(lease)

    async def delete_lease(self, namespace, name, *, resource_version=""):
        await self._gate("delete")
        return await super().delete_lease(namespace, name, resource_version=resource_version)


def entry(uid: str) -> FenceEntry:
    return FenceEntry(uid=uid, namespace="default", name=f"pod-{uid}", digest=assignment_digest(uid), expires=NOW + 300)


async def listed(cluster: MemCluster, node: str) -> list[str]:
    lease = await cluster.get_lease(NS, F.lease_name(node))
    return [] if lease is None else [e.uid for e in F.read(lease, node, NOW).pods]


async def bind(fences: NodeFences, node: str, uid: str, steps: int = 3, order: list | None = None) -> None:
    """A bind as binder runs one: on its way at once, a few awaits (checks, annotation), then the fence."""
    with fences.coming(node) as ticket:
        for _ in range(steps):
            await anyio.lowlevel.checkpoint()
        await fences.fence(ticket, entry(uid))
        if order is not None:
            order.append(uid)


async def test_a_gangs_pods_on_one_node_go_in_one_write_and_each_node_gets_its_own():
    cluster = CountingCluster()
    async with anyio.create_task_group() as tg:
        fences = NodeFences(tg, cluster, namespace=NS, holder="b0", clock=lambda: NOW)
        with anyio.fail_after(10):
            async with anyio.create_task_group() as binds:
                for i, node in enumerate(["n1"] * 4 + ["n2"] * 2):
                    binds.start_soon(bind, fences, node, f"u{i}", 1 + i)
    assert sorted(cluster.calls) == ["create", "create", "get", "get"]  # one write per node (and a first read)
    assert (await listed(cluster, "n1"), await listed(cluster, "n2")) == (["u0", "u1", "u2", "u3"], ["u4", "u5"])
    assert (fences.fenced("n1"), fences.fenced("n2")) == (frozenset({"u0", "u1", "u2", "u3"}), frozenset({"u4", "u5"}))


async def test_binds_that_arrive_during_a_write_share_the_next_one_and_wait_for_it():
    cluster = CountingCluster()
    cluster.hold = anyio.Event()
    order: list[str] = []
    async with anyio.create_task_group() as tg:
        fences = NodeFences(tg, cluster, namespace=NS, holder="b0", clock=lambda: NOW)
        with anyio.fail_after(10):
            async with anyio.create_task_group() as binds:
                binds.start_soon(bind, fences, "n1", "first", 0, order)
                while cluster.calls != ["get", "create"]:
                    await anyio.sleep(0.01)
                for uid in ("a", "b", "c"):
                    binds.start_soon(bind, fences, "n1", uid, 2, order)
                await anyio.sleep(0.05)
                assert order == []  # nobody is bound before a write lists it
                cluster.hold.set()
    assert cluster.calls == ["get", "create", "update"]  # the second write goes on the version the first wrote
    assert (order[0], sorted(order[1:]), await listed(cluster, "n1")) == ("first", ["a", "b", "c"],
                                                                          ["first", "a", "b", "c"])


async def test_a_bind_that_never_arrives_holds_the_write_up_for_the_linger_time_only():
    cluster = CountingCluster()
    async with anyio.create_task_group() as tg:
        fences = NodeFences(tg, cluster, namespace=NS, holder="b0", clock=lambda: NOW, linger_s=0.2)
        with fences.coming("n1"), anyio.fail_after(10):  # e.g. stuck on a slow read
            await bind(fences, "n1", "u1")
    assert await listed(cluster, "n1") == ["u1"]


async def test_releases_drop_listed_pods_write_nothing_for_others_and_delete_an_empty_fence():
    cluster = CountingCluster()
    async with anyio.create_task_group() as tg:
        fences = NodeFences(tg, cluster, namespace=NS, holder="b0", clock=lambda: NOW)
        with anyio.fail_after(10):
            for uid in ("u1", "u2"):
                await bind(fences, "n1", uid)
            fences.release("n1", {"stranger"})  # not listed: nothing queued
            fences.release("n1", {"u1"})
            while await listed(cluster, "n1") != ["u2"]:
                await anyio.sleep(0.01)
            fences.release("n1", {"u2"})
            while fences.fenced("n1") != frozenset():
                await anyio.sleep(0.01)
    assert await cluster.get_lease(NS, F.lease_name("n1")) is None
    assert [c for c in cluster.calls if c != "get"] == ["create", "update", "update", "delete"]


async def test_a_writer_that_is_not_alone_reads_only_after_a_conflict():
    cluster = CountingCluster()
    async with anyio.create_task_group() as tg:
        mine = NodeFences(tg, cluster, namespace=NS, holder="b0", clock=lambda: NOW)
        other = NodeFences(tg, cluster, namespace=NS, holder="b1", clock=lambda: NOW)
        with anyio.fail_after(10):
            await bind(mine, "n1", "u1")
            await bind(other, "n1", "u2")  # the other replica reads once, then writes
            await bind(mine, "n1", "u3")  # mine writes on a stale version: conflict, read, write
            await bind(mine, "n1", "u4")  # and on the version it wrote: one request
    assert cluster.calls == ["get", "create", "get", "update", "update", "get", "update", "update"]
    assert await listed(cluster, "n1") == ["u1", "u2", "u3", "u4"]


async def test_a_failed_write_fails_every_bind_it_carried_and_the_next_write_reads_again():
    cluster = CountingCluster()
    async with anyio.create_task_group() as tg:
        fences = NodeFences(tg, cluster, namespace=NS, holder="b0", clock=lambda: NOW)
        await bind(fences, "n1", "u1")
        cluster.fail = RuntimeError("apiserver unreachable")
        errors: list[str] = []

        async def failing(uid: str) -> None:
            try:
                await bind(fences, "n1", uid)
            except RuntimeError as e:
                errors.append(f"{uid}: {e}")

        with anyio.fail_after(10):
            async with anyio.create_task_group() as binds:
                binds.start_soon(failing, "u2")
                binds.start_soon(failing, "u3")
        cluster.fail = None
        await bind(fences, "n1", "u4")
    assert sorted(errors) == ["u2: apiserver unreachable", "u3: apiserver unreachable"]
    assert cluster.calls[-2:] == ["get", "update"]
    assert await listed(cluster, "n1") == ["u1", "u4"]


def watched(name: str, *, node: str = "n1", phase: str = "Pending", started: bool = False,
            deleting: bool = False, uid: str = "") -> dict:
    obj = {"metadata": {"namespace": "default", "name": name, "uid": uid or f"uid-{name}"},
           "spec": {"schedulerName": "phalanx", "nodeName": node}, "status": {"phase": phase}}
    if started:
        obj["status"]["containerStatuses"] = [{"name": "c0", "ready": False}]
    if deleting:
        obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return obj


@pytest.mark.parametrize(("kind", "obj", "released"), [
    pytest.param("ADDED", watched("p"), [], id="bound and waiting for the kubelet: kept"),
    pytest.param("MODIFIED", watched("p", started=True), [("n1", {"uid-p"})], id="started: released"),
    pytest.param("MODIFIED", watched("p", phase="Failed"), [("n1", {"uid-p"})],
                 id="rejected by the kubelet (terminal): released"),
    pytest.param("MODIFIED", watched("p", phase="Succeeded"), [("n1", {"uid-p"})], id="succeeded: released"),
    pytest.param("MODIFIED", watched("p", deleting=True), [("n1", {"uid-p"})], id="being deleted: released"),
    pytest.param("DELETED", watched("p"), [("n1", {"uid-p"})], id="deleted before admission: released"),
    pytest.param("DELETED", watched("p", node=""), [], id="deleted unbound: no fence to touch"),
    pytest.param("MODIFIED", watched("p", node="kwok-1", started=True), [],
                 id="a node without the device plugin keeps no fence"),
])
def test_the_pod_watch_releases_a_fence_entry_as_soon_as_the_pod_needs_it_no_more(kind, obj, released):
    calls: list[tuple[str, set[str]]] = []
    watch = PodWatch(MemCluster(), fenced=lambda node: node == "n1", release=lambda n, uids: calls.append((n, uids)))
    watch.apply(PodEvent(type=kind, pod=pod_from_dict(obj)))
    assert calls == released


def test_the_bind_cache_answers_only_for_the_uid_it_knows():
    watch = PodWatch(MemCluster(), fenced=lambda node: True, release=lambda n, uids: None)
    watch.apply(PodEvent(type="ADDED", pod=pod_from_dict(watched("p", uid="u1"))))
    assert [getattr(watch.get(PodRef(namespace="default", name="p", uid=u)), "uid", None) for u in ("u1", "u2", "")] == [
        "u1", None, "u1"]
    watch.apply(PodEvent(type="DELETED", pod=pod_from_dict(watched("p", uid="u0"))))  # an older pod's delete
    assert watch.get(PodRef(namespace="default", name="p", uid="u1")) is not None
    watch.apply(PodEvent(type="DELETED", pod=pod_from_dict(watched("p", uid="u1"))))
    assert watch.get(PodRef(namespace="default", name="p", uid="u1")) is None


async def test_a_release_after_every_entry_lapsed_deletes_the_lease():
    cluster = CountingCluster()
    now = [NOW]
    async with anyio.create_task_group() as tg:
        fences = NodeFences(tg, cluster, namespace=NS, holder="b0", clock=lambda: now[0])
        await bind(fences, "n1", "u1")
        now[0] += F.LEASE_DURATION_S / 2 + 1
        lease: Lease = await cluster.get_lease(NS, F.lease_name("n1"))
        fences.release("n1", {"u1", "gone"})  # u1 lapsed (300 s): the write prunes it and deletes the lease
        with anyio.fail_after(10):
            while fences.fenced("n1") != frozenset():
                await anyio.sleep(0.01)
    assert lease.renewed == NOW and await cluster.get_lease(NS, F.lease_name("n1")) is None


@pytest.mark.parametrize(("argv", "error"), [
    pytest.param(["--parallelism", "0"], "'0' must be a whole number from 1 to 1024", id="no parallelism"),
    pytest.param(["--parallelism", "1e3"], "'1e3' must be a whole number from 1 to 1024", id="not digits"),
    pytest.param(["--fence-namespace", "Phalanx_System"], "'Phalanx_System' is not a namespace name",
                 id="a namespace the API server would refuse"),
])
def test_binders_flags_refuse_values_it_could_not_work_with(argv, error, capsys):
    import argparse

    from phalanx_binder import entry

    p = argparse.ArgumentParser()
    entry.add_arguments(p)
    with pytest.raises(SystemExit) as e:
        p.parse_args(argv)
    assert e.value.code == 2 and error in capsys.readouterr().err
    assert vars(p.parse_args([]))["parallelism"] == 16
