"""The simulator's node fleet against a real nats-server: the per-node agents' reports, beats
and MIG answers for many nodes from one process, and a pod bound end to end through it."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import msgspec
import pytest
import yaml

from phalanx_bus import Bus
from phalanx_kube.kvcluster import KvCluster
from phalanx_localstack.stack import ClusterFile, Stack
from phalanx_localstack.synthetic import synthetic_cluster, tier_labels
from phalanx_node_fleet.fleet import Config, run
from phalanx_proto import subjects as S
from phalanx_proto.events import (
    MigDestroyed,
    MigDestroyRequested,
    MigFailed,
    MigPrepareRequested,
    MigReady,
    NodeHeartbeat,
    NodeTopologyReported,
    PodRef,
    node_decoder,
)
from phalanx_proto.kubeapi import ASSIGNMENT_ANNOTATION
from phalanx_proto.scheduling import (
    HostPort,
    LabelSelectorRequirement,
    NodeKubeState,
    PodAffinityTerm,
    RunningPod,
)
from phalanx_topology.tiers import tiers_from_labels
from phalanx_topology_discovery.kubestate import NodeStateReporter
from phalanx_topology_discovery.service import topology_from_file
from stackutil import connect, gpu_pod, ref, seed_nodes, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

ROOT = Path(__file__).resolve().parents[2]
MIG_CLUSTER = ROOT / "examples" / "clusters" / "mig-a100.yaml"
POD = PodRef(namespace="default", name="p", uid="u-1")


@pytest.fixture
async def bus(nats_private):
    b = await Bus.connect(nats_private.url, service="test")
    await b.declare()
    yield b
    await b.close()


async def fleet_of(bus: Bus, cluster: ClusterFile, tg, tmp_path, **config):
    sim = await KvCluster.open(bus)
    for node in cluster.node_objects():
        await sim.apply_node(node)
    path = str(cluster.dump(tmp_path / "fleet-cluster.yaml"))
    with anyio.fail_after(120):
        fleet = await tg.start(lambda task_status: run(bus, sim, Config(cluster_file=path, **config),
                                                       task_status=task_status))
    return fleet, sim


async def test_every_node_of_a_fleet_is_reported_as_its_own_agent_would_and_beats_under_its_own_key(bus, tmp_path):
    cluster = synthetic_cluster("200x8v100")
    async with anyio.create_task_group() as tg:
        fleet, sim = await fleet_of(bus, cluster, tg, tmp_path, heartbeat_s=0.5, label_refresh_s=0.5)
        topo = {e.key: msgspec.json.decode(e.value, type=NodeTopologyReported)
                for e in await (await bus.kv(S.KV_TOPOLOGY)).items()}
        n = cluster.nodes[37]
        assert len(topo) == 200
        assert topo[n.name] == NodeTopologyReported(
            node=n.name, topology=topology_from_file(n.topology_file, n.name, gpu_model=n.gpu_model,
                                                     gpu_memory_mib=n.gpu_memory_mib),
            tiers=tiers_from_labels(n.name, tier_labels(37)), enabled=True)
        assert (await sim.get_node(n.name)).capacity["aliyun.com/gpu-core"] == "800"

        beats = await (await bus.kv(S.KV_HEARTBEAT)).items()
        first = {e.key: msgspec.json.decode(e.value, type=NodeHeartbeat).at for e in beats}
        assert sorted(first) == sorted(n.name for n in cluster.nodes)

        async def all_beat_again():
            now = {e.key: msgspec.json.decode(e.value, type=NodeHeartbeat).at
                   for e in await (await bus.kv(S.KV_HEARTBEAT)).items()}
            return all(now[k] > first[k] for k in first) or None

        await wait_until(all_beat_again, 30)

        moved = {**cluster.node_objects()[37], "metadata": {"name": n.name, "labels": {
            **tier_labels(37), "phalanx.io/hypernode": "hn-moved"}}}
        await sim.apply_node(moved)

        async def re_reported():
            e = await (await bus.kv(S.KV_TOPOLOGY)).get(n.name)
            return msgspec.json.decode(e.value, type=NodeTopologyReported).tiers.hypernode == "hn-moved" or None

        await wait_until(re_reported, 30)

        states = {e.key: msgspec.json.decode(e.value, type=NodeKubeState)
                  for e in await (await bus.kv(S.KV_NODE_STATE)).items()}
        assert sorted(states) == sorted(n.name for n in cluster.nodes)
        keep_apart = {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "web"}}}]}
        foreign = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}},
                   "spec": {"schedulerName": "default-scheduler", "nodeName": n.name, "containers": [
                       {"name": "c", "image": "x", "resources": {"requests": {"cpu": "3"}},
                        "ports": [{"containerPort": 80, "hostPort": 8080}]}],
                            "affinity": {"podAntiAffinity": keep_apart}}}
        await sim.apply_pod(foreign)

        async def state_of_n():
            e = await (await bus.kv(S.KV_NODE_STATE)).get(n.name)
            got = msgspec.json.decode(e.value, type=NodeKubeState)
            return got if got.pods else None

        got = await wait_until(state_of_n, 30)
        assert (got.requested, got.pods, got.host_ports, got.ready, got.allocatable["cpu"], got.running) == (
            {"cpu": 3000}, 1, (HostPort(port=8080),), "True", 96000,
            (RunningPod(namespace="default", labels={"app": "web"}, anti_affinity=(PodAffinityTerm(
                topology_key="kubernetes.io/hostname",
                selector=(LabelSelectorRequirement(key="app", operator="In", values=("web",)),)),)),))
        tg.cancel_scope.cancel()


async def test_a_phalanx_pod_that_goes_is_reported_gone_at_once_not_at_the_next_round(bus, tmp_path):
    """Placement frees a reservation only once the node's report no longer lists the pod; a
    preemptor waits for exactly that. The fleet's rounds are an hour apart here: the departure
    is reported from the watch of Phalanx's pods alone."""
    cluster = synthetic_cluster("4x8v100")
    n = cluster.nodes[1].name
    async with anyio.create_task_group() as tg:
        ours = {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": "placed", "namespace": "default", "annotations": {ASSIGNMENT_ANNOTATION: "{}"}},
            "spec": {"schedulerName": "phalanx", "nodeName": n, "containers": [{"name": "c", "image": "x"}]}}
        sim = await KvCluster.open(bus)
        await sim.apply_pod(ours)
        placed = await sim.get_pod(PodRef(namespace="default", name="placed"))
        fleet, sim = await fleet_of(bus, cluster, tg, tmp_path, state_refresh_s=3600.0, label_refresh_s=3600.0)

        async def listed() -> tuple[str, ...]:
            e = await (await bus.kv(S.KV_NODE_STATE)).get(S.token(n))
            return msgspec.json.decode(e.value, type=NodeKubeState).phalanx_pods

        assert await listed() == (f"default/placed/{placed.uid}",)
        await anyio.sleep(0.5)  # the fleet's watch of Phalanx's pods has listed
        await sim.delete_pod(placed.ref)

        async def gone():
            return (await listed()) == () or None

        with anyio.fail_after(10):
            await wait_until(gone, 10, what="the departure reported")
        tg.cancel_scope.cancel()


async def test_a_node_agent_reports_a_departure_without_its_debounce_and_an_arrival_with_it(bus):
    """topology-discovery's ``NodeStateReporter.follow`` on the simulated cluster, with a debounce
    far longer than the test: a Phalanx pod that goes is reported at once; one that comes waits."""
    cluster = synthetic_cluster("1x8v100")
    sim = await KvCluster.open(bus)
    for node in cluster.node_objects():
        await sim.apply_node(node)
    n = cluster.nodes[0].name

    def ours(name: str) -> dict:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": name, "namespace": "default", "annotations": {ASSIGNMENT_ANNOTATION: "{}"}},
            "spec": {"schedulerName": "phalanx", "nodeName": n, "containers": [{"name": "c", "image": "x"}]}}

    await sim.apply_pod(ours("first"))
    first = await sim.get_pod(PodRef(namespace="default", name="first"))

    async def listed() -> tuple[str, ...]:
        e = await (await bus.kv(S.KV_NODE_STATE)).get(S.token(n))
        return msgspec.json.decode(e.value, type=NodeKubeState).phalanx_pods if e is not None else None

    reporter = NodeStateReporter(bus, n)
    async with anyio.create_task_group() as tg:
        await tg.start(lambda task_status: reporter.follow(sim, debounce_s=60.0, task_status=task_status))
        assert await listed() == (f"default/first/{first.uid}",)
        await sim.delete_pod(first.ref)

        async def gone():
            return (await listed()) == () or None

        await wait_until(gone, 10, what="the departure reported")
        await sim.apply_pod(ours("second"))
        await anyio.sleep(3)  # several polls of the simulated node: the arrival waits for the debounce
        assert await listed() == ()
        tg.cancel_scope.cancel()


async def replies(bus: Bus, n: int) -> list:
    sub = await bus.js.subscribe("phx.node.*.reply", stream=S.STREAM_NODE, ordered_consumer=True)
    out = []
    try:
        with anyio.fail_after(30):
            while len(out) < n:
                out.append(node_decoder.decode((await sub.next_msg(timeout=30)).data))
    finally:
        await sub.unsubscribe()
    return out


async def test_a_fleet_answers_mig_commands_for_its_mig_node_and_for_a_node_without_mig(bus, tmp_path):
    cluster = ClusterFile.load(MIG_CLUSTER)
    async with anyio.create_task_group() as tg:
        fleet, _ = await fleet_of(bus, cluster, tg, tmp_path)
        assert sorted(m.node for m in fleet.mig.values()) == ["a100-mig"]
        prepare = MigPrepareRequested(node="a100-mig", gang_id="default/g", pod=POD, gpu=0, profile="3g.20gb", start=4)
        await bus.publish(S.mig_subject("a100-mig"), prepare)
        await bus.publish(S.mig_subject("v100-a"), msgspec.structs.replace(prepare, node="v100-a"))
        await bus.publish(S.mig_subject("v100-a"), MigDestroyRequested(node="v100-a", gang_id="default/g", pod=POD))
        got = await replies(bus, 3)
        ready = next(r for r in got if isinstance(r, MigReady))
        assert (ready.node, ready.instance_uuid.startswith("MIG-")) == ("a100-mig", True)
        assert [r for r in got if not isinstance(r, MigReady)] == [
            MigFailed(node="v100-a", gang_id="default/g", pod=POD, reason="node v100-a has no MIG-capable GPU"),
            MigDestroyed(node="v100-a", gang_id="default/g", pod=POD)]
        tg.cancel_scope.cancel()


async def test_a_mig_command_for_a_node_outside_the_fleet_is_dead_lettered(bus, tmp_path):
    cluster = ClusterFile.load(MIG_CLUSTER)
    async with anyio.create_task_group() as tg:
        await fleet_of(bus, cluster, tg, tmp_path)
        await bus.publish(S.mig_subject("ghost"), MigDestroyRequested(node="ghost", gang_id="default/g", pod=POD))
        sub = await bus.js.subscribe("phx.dlq.>", stream=S.STREAM_DEAD_LETTER, ordered_consumer=True)
        try:
            msg = await sub.next_msg(timeout=30)
        finally:
            await sub.unsubscribe()
        assert msg.headers["Phalanx-Error"] == "permanent: phx.node.ghost.mig: node 'ghost' is not served by this fleet"
        tg.cancel_scope.cancel()


async def test_pods_are_bound_end_to_end_through_a_stack_whose_nodes_are_one_fleet(tmp_path):
    stack = Stack(ClusterFile.load(MIG_CLUSTER), workdir=str(tmp_path / "stack"), fleet=True)
    assert [name for name, _, _ in stack.plan()] == ["node-fleet", "placement", "binder", "gang-coordinator"]
    stack.start_nats()
    try:
        bus, sim = await connect(stack)
        await seed_nodes(stack, sim)
        await anyio.to_thread.run_sync(stack.start_services)
        await sim.apply_pod(yaml.safe_load((ROOT / "examples" / "pods" / "mig-demo.yaml").read_text()))
        await sim.apply_pod(gpu_pod("whole", 2))

        async def both_bound():
            pods = [await sim.get_pod(ref(n)) for n in ("mig-demo", "whole")]
            return pods if all(p is not None and p.node_name for p in pods) else None

        mig, whole = await wait_until(both_bound, 90)
        a = json.loads(mig.annotations[ASSIGNMENT_ANNOTATION])
        assert (mig.node_name, a["mig_profile"], a["mig_instance_uuid"].startswith("MIG-")) == (
            "a100-mig", "3g.20gb", True)
        assert len(json.loads(whole.annotations[ASSIGNMENT_ANNOTATION])["gpus"]) == 2
        await bus.close()
    finally:
        stack.stop()
