"""The node agent's Kubernetes-state report on the real kube-apiserver (the DaemonSet path):
topology-discovery's ``NodeStateReporter`` follows its kwok Node and the pods bound to it
through ``KubeCluster.watch_node`` with the ServiceAccount of deploy/k8s/rbac.yaml, and writes
``NodeKubeState`` to ``phx-node-state`` (TLS, its own per-node bus identity) as they change."""

from __future__ import annotations

from pathlib import Path

import anyio
import msgspec
import pytest
import yaml
from kubeharness import fake_gpu_node, unique

from phalanx_bus import Bus
from phalanx_bus.bus import BusAuth
from phalanx_kube.kube import KubeCluster
from phalanx_proto import subjects as S
from phalanx_proto.kubeapi import ASSIGNMENT_ANNOTATION
from phalanx_proto.scheduling import HostPort, NodeKubeState, RunningPod, Taint
from phalanx_topology_discovery.kubestate import NodeStateReporter

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

RBAC = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "rbac.yaml"
ALLOCATABLE = {"cpu": 64000, "memory": 512 << 30, "nvidia.com/gpu": 8, "pods": 110}


def bound_pod(name: str, ns: str, node: str, *, cpu: str, port: int = 0, phalanx: bool = False) -> dict:
    meta = {"name": name, "namespace": ns}
    if phalanx:
        meta["annotations"] = {ASSIGNMENT_ANNOTATION: "{}"}
    ports = [{"containerPort": port, "hostPort": port}] if port else []
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeName": node, "schedulerName": "phalanx" if phalanx else "default-scheduler",
                     "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "c", "image": "x", "ports": ports,
                                     "resources": {"requests": {"cpu": cpu}}}]}}


async def test_the_agent_reports_its_node_and_the_pods_phalanx_did_not_place_as_they_change(
        kube, kube_api, kube_ns, nats_server, bus_secrets):
    kube_api.create_namespace("phalanx-system")
    for obj in yaml.safe_load_all(RBAC.read_text()):
        kube_api.apply(obj)
    name = unique("state")
    kube_api.create_node(fake_gpu_node(name))
    token = kube.service_account_token("phalanx-system", "phalanx-topology-discovery")
    cluster = await KubeCluster.open(str(kube.kubeconfig_for("sa-topology-discovery", token)))
    admin = await Bus.connect(nats_server.url, service="test")
    await admin.declare()
    agent_bus = await Bus.connect(nats_server.url, service="topology-discovery",
                                  auth=BusAuth.from_env(bus_secrets.env(S.TOPOLOGY_DISCOVERY, (name,))))
    kv = await admin.kv(S.KV_NODE_STATE)

    async def state_becomes(expected: NodeKubeState) -> None:
        last = None
        with anyio.move_on_after(30):
            while True:
                e = await kv.get(S.token(name))
                last = msgspec.json.decode(e.value, type=NodeKubeState) if e is not None else None
                if last == expected:
                    return
                await anyio.sleep(0.2)
        assert last == expected

    reporter = NodeStateReporter(agent_bus, name)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: reporter.follow(cluster, debounce_s=0.2))
            labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "type": "kwok"}
            idle = NodeKubeState(allocatable=ALLOCATABLE, labels=labels, ready="True")
            await state_becomes(idle)

            kube_api.create_pod(bound_pod("web", kube_ns, name, cpu="1500m", port=8080))
            ours = kube_api.create_pod(bound_pod("ours", kube_ns, name, cpu="7", phalanx=True))
            # Phalanx's own pod is not in what others request (the ledger accounts for it), but it
            # is listed as running there (placement never frees a reservation under it). The other
            # pod is in ``running`` for pod (anti-)affinity: its namespace and (no) labels.
            busy = msgspec.structs.replace(idle, requested={"cpu": 1500}, pods=1, host_ports=(HostPort(port=8080),),
                                           phalanx_pods=(f"{kube_ns}/ours/{ours['metadata']['uid']}",),
                                           running=(RunningPod(namespace=kube_ns),))
            await state_becomes(busy)

            kube_api.patch(f"/api/v1/nodes/{name}", {"spec": {"unschedulable": True, "taints": [
                {"key": "dedicated", "value": "infra", "effect": "NoSchedule"}]}})
            await state_becomes(msgspec.structs.replace(
                busy, unschedulable=True, taints=(Taint(key="dedicated", value="infra", effect="NoSchedule"),)))

            kube_api.delete(f"/api/v1/namespaces/{kube_ns}/pods/web")
            kube_api.delete(f"/api/v1/namespaces/{kube_ns}/pods/ours")  # other stacks' reconcilers see it
            kube_api.delete(f"/api/v1/nodes/{name}")
            with anyio.fail_after(30):
                while await kv.get(S.token(name)) is not None:
                    await anyio.sleep(0.2)
            tg.cancel_scope.cancel()
    finally:
        await cluster.close()
        await agent_bus.close()
        await admin.close()
