"""What only the real adapter has: resuming a watch after ``410 Gone``, the re-list diff, and a
clear failure without any configuration. (The port's contract itself is tests/contract.)"""

from __future__ import annotations

import time

import anyio
import pytest
from kubeharness import gpu_pod

from phalanx_kube.kube import KubeCluster, pod_from_api
from phalanx_kube.podtable import PodTable
from phalanx_kube.port import PodEvent
from phalanx_kube.ratelimit import KubeClientSettings
from phalanx_kube.reflector import Reflector

pytestmark = pytest.mark.e2e


def obj(name: str, uid: str, rv: str, ns: str = "ns") -> dict:
    return {"metadata": {"namespace": ns, "name": name, "uid": uid, "resourceVersion": rv,
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"schedulerName": "phalanx"}}


def test_a_relist_reports_what_changed_while_the_watch_was_away():
    table = PodTable(pod_from_api)
    table.relisted([obj("same", "u1", "10"), obj("changed", "u2", "11"), obj("gone", "u3", "12"),
                    obj("recreated", "u4", "13")])
    fresh = [obj("same", "u1", "10"), obj("changed", "u2", "20"), obj("recreated", "u5", "21"), obj("new", "u6", "22")]
    events = table.relisted(fresh)
    assert [(e.type, e.pod.name, e.pod.uid) for e in events] == [
        ("DELETED", "gone", "u3"), ("DELETED", "recreated", "u4"),
        ("MODIFIED", "changed", "u2"), ("ADDED", "new", "u6"), ("ADDED", "recreated", "u5"),
    ]
    assert sorted((k, p.uid) for k, p in table.known.items()) == [
        (("ns", "changed"), "u2"), (("ns", "new"), "u6"), (("ns", "recreated"), "u5"), (("ns", "same"), "u1")]


def test_a_pod_recreated_between_two_watch_events_is_reported_deleted_then_added():
    table = PodTable(pod_from_api)
    table.relisted([obj("p", "old", "1")])
    events = table.watched("MODIFIED", pod_from_api(obj("p", "new", "2")))
    assert [(e.type, e.pod.uid) for e in events] == [("DELETED", "old"), ("ADDED", "new")]


@pytest.mark.anyio
async def test_a_watch_answered_with_410_gone_re_lists_and_reports_none_again(kube, kube_api, kube_ns, monkeypatch):
    """A real API server with a fresh watch cache serves even resourceVersion 1, so the expiry is
    injected as the ERROR event the server sends once etcd has compacted the revision."""
    kube_api.create_pod(gpu_pod("listed", kube_ns))
    cluster = await KubeCluster.open(str(kube.kubeconfig))
    real_list, real_stream, lists = Reflector.list, Reflector.watch, []

    async def counted_list(self):
        lists.append(1)
        return await real_list(self)

    async def expired_once(self, rv):
        if len(lists) == 1:
            yield "ERROR", {"kind": "Status", "code": 410, "reason": "Expired",
                            "message": f"too old resource version: {rv}"}
            return
        async for item in real_stream(self, rv):
            yield item

    monkeypatch.setattr(Reflector, "list", counted_list)
    monkeypatch.setattr(Reflector, "watch", expired_once)
    seen: list[str] = []
    watch = cluster.watch_pods()
    try:
        with anyio.fail_after(20):
            async for ev in watch:
                if ev is None:
                    seen.append("NONE")
                    if seen.count("NONE") == 2:
                        kube_api.create_pod(gpu_pod("after", kube_ns))
                elif isinstance(ev, PodEvent) and ev.pod.namespace == kube_ns:
                    seen.append(f"{ev.type} {ev.pod.name}")
                    if ev.pod.name == "after":
                        break
    finally:
        await watch.aclose()
        await cluster.close()
    assert len(lists) == 2, "410 Gone must trigger a second list"
    # nothing changed in between, so the re-list reports nothing; the new watch sees the new pod
    assert seen == ["ADDED listed", "NONE", "NONE", "ADDED after"]


@pytest.mark.anyio
async def test_without_any_configuration_the_command_says_what_to_set(monkeypatch, tmp_path):
    from phalanx_cli.cmd_run import open_cluster

    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(SystemExit, match=r"--cluster kube: cannot load a Kubernetes configuration"):
        await open_cluster("kube", None, kubeconfig=str(tmp_path / "missing"))


@pytest.mark.anyio
async def test_requests_beyond_the_burst_wait_for_the_client_side_rate(kube):
    """qps 5, burst 2: eight concurrent requests need at least (8 - 2) / 5 = 1.2 s, whatever the
    server's speed; the pool is sized to the burst."""
    cluster = await KubeCluster.open(str(kube.kubeconfig), settings=KubeClientSettings(qps=5, burst=2))
    try:
        assert cluster._client.configuration.connection_pool_maxsize == 10
        started = time.monotonic()
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for _ in range(8):
                    tg.start_soon(cluster.list_nodes)
        assert time.monotonic() - started >= 1.2 - 0.05
    finally:
        await cluster.close()
