"""topology-discovery as a real process: reports through JetStream, advertises resources, and a
node whose agent stops becomes unavailable after the heartbeat bound, with that reason."""

from __future__ import annotations

import anyio
import msgspec
import pytest

from hostile import scrape
from phalanx_localstack.inputs import SIMULATED_ALLOCATABLE
from phalanx_localstack.stack import ClusterFile, Stack
from phalanx_proto import subjects as S
from phalanx_proto.events import NodeTopologyReported
from phalanx_proto.scheduling import NodeKubeState
from stackutil import CLUSTER, bound_pods, connect, gang_states, gpu_pod, seed_nodes, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.anyio]



@pytest.fixture
def stack(tmp_path):
    s = Stack(ClusterFile.load(CLUSTER), workdir=str(tmp_path / "stack"),
              service_args={"topology-discovery": ["--heartbeat-s", "0.5"],
                            "placement": ["--heartbeat-stale-s", "2"]})
    s.start_nats()
    yield s
    s.stop()


async def test_both_nodes_report_their_topology_and_resources_through_the_bus(stack):
    bus, sim = await connect(stack)
    try:
        await seed_nodes(stack, sim)
        await anyio.to_thread.run_sync(stack.start_services)
        kv = await bus.kv(S.KV_TOPOLOGY)
        reports = {}
        for name in ("v100-a", "v100-b"):
            rep = msgspec.json.decode((await kv.get(name)).value, type=NodeTopologyReported)
            reports[name] = rep
        a = reports["v100-a"]
        assert (a.enabled, a.tiers.hypernode, len(a.topology.gpus), [n.name for n in a.topology.nics]) == (
            True, "hn-1", 8, ["mlx5_0"])
        assert a.topology.relation("GPU0", "GPU3") == "NV2"
        assert {g.model for g in a.topology.gpus} == {"Tesla V100-SXM2-16GB"}

        async def advertised():
            node = await sim.get_node("v100-b")
            return node.capacity if node and "nvidia.com/gpu" in node.capacity else None

        capacity = await wait_until(advertised, 15)
        assert capacity == {**SIMULATED_ALLOCATABLE, "nvidia.com/gpu": "8", "aliyun.com/gpu-core": "800",
                            "aliyun.com/gpu-memory": "128"}
    finally:
        await bus.close()


async def test_a_node_whose_discovery_stops_becomes_unavailable_with_that_reason(stack):
    bus, sim = await connect(stack)
    try:
        await seed_nodes(stack, sim)
        await anyio.to_thread.run_sync(stack.start_services)
        await sim.apply_pod(gpu_pod("fill-a", 8))
        await wait_until(lambda: bound_pods(sim), 30)
        assert (await bound_pods(sim))["default/fill-a"][0] == "v100-a"
        await anyio.to_thread.run_sync(stack.kill, "topology-discovery@v100-b")

        async def stale():  # placement's cache, read when /metrics is (--heartbeat-stale-s 2)
            m = await anyio.to_thread.run_sync(scrape, stack, "placement")
            return m.get('phalanx_placement_nodes{state="stale"}') == 1.0

        await wait_until(stale, 30, what="placement to hold v100-b stale")
        await sim.apply_pod(gpu_pod("needs-b", 4))

        async def pending():
            s = (await gang_states(bus)).get("default/needs-b")
            return s if s is not None and s.phase == "backoff" else None

        state = await wait_until(pending, 30)
        assert state.reason == ("0/2 nodes are available: 1 insufficient free GPUs, "
                                "1 topology heartbeat stale; would start if 4 GPUs free on node v100-a "
                                "(held by gang default/fill-a)")  # the stale node is no answer (docs/whatif.md)
        await anyio.to_thread.run_sync(stack.restart, "topology-discovery@v100-b")

        async def placed():
            b = await bound_pods(sim)
            return b if "default/needs-b" in b else None

        bound = await wait_until(placed, 60)
        assert bound["default/needs-b"] == ("v100-b", (0, 1, 2, 3))
    finally:
        await bus.close()


async def test_placement_checks_the_node_state_the_agents_report_and_refuses_what_kube_scheduler_would(stack):
    bus, sim = await connect(stack)
    try:
        await seed_nodes(stack, sim)
        await anyio.to_thread.run_sync(stack.start_services)
        kv = await bus.kv(S.KV_NODE_STATE)

        async def reported():
            return all([await kv.get(n) for n in ("v100-a", "v100-b")])

        await wait_until(reported, 30)
        cordoned = stack.cluster.node_objects()[0]
        cordoned["spec"] = {"unschedulable": True}
        await sim.apply_node(cordoned)

        async def cordon_reported():
            e = await kv.get("v100-a")
            return msgspec.json.decode(e.value, type=NodeKubeState).unschedulable

        await wait_until(cordon_reported, 30)
        hungry = gpu_pod("hungry", 1)
        hungry["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "200"}
        await sim.apply_pod(hungry)
        await sim.apply_pod(gpu_pod("fits", 8))

        async def outcome():
            s = (await gang_states(bus)).get("default/hungry")
            b = await bound_pods(sim)
            return (s.reason, b["default/fits"][0]) if s is not None and s.phase == "backoff" and b else None

        reason, node = await wait_until(outcome, 30)
        # The what-if line after "; " depends on whether "fits" held v100-b's GPUs when "hungry"
        # was decided (tests/integration/test_whatif_reasons.py checks those lines).
        # It fits no node set of the cluster (a cordon, a CPU request no node has): decided once,
        # it waits for the cluster to change, so its reason is its first attempt's.
        assert (reason.split("; ")[0].removesuffix("."), node) == (
            "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) were unschedulable", "v100-b")
        # A pod only the cordoned node could take waits for the cluster to change (minutes on its
        # timer); uncordoning the node is such a change: it is tried again and bound at once.
        pinned = gpu_pod("pinned", 1)
        pinned["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "v100-a"}
        await sim.apply_pod(pinned)

        async def waiting():
            s = (await gang_states(bus)).get("default/pinned")
            return s if s is not None and s.phase == "backoff" else None

        before = await wait_until(waiting, 30)
        assert (before.waits_for, before.attempt) == ("cluster", 1)
        assert before.backoff_until - before.updated_at > 200
        cordoned["spec"] = {}
        await sim.apply_node(cordoned)

        async def pinned_bound():
            return (await bound_pods(sim)).get("default/pinned")

        assert (await wait_until(pinned_bound, 30))[0] == "v100-a"
    finally:
        await bus.close()
