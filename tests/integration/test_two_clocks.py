"""One rulebook, two clocks: a queue-and-preemption workload runs through the real stack
(nats-server with auth and TLS, every service its own process, the simulated 2 × 8 V100 cluster)
and through ``phalanx sim`` (virtual time, no bus), and every gang comes out the same — placed on
the same nodes or evicted, the same victims.

team-a (quota 8) borrows the whole cluster with four gangs of two 2-GPU pods, one after another;
then team-b (quota 8) submits two such gangs, one after another, and takes its quota back: each
evicts one team-a gang, chosen by the rulebook's preemption rules and the planner's order. On the
stack the victims' pods are evicted and gone (no controller recreates them); in the simulator a
victim goes back to waiting, as a rolled-back gang whose controller recreates it, and stays
there (team-a is at its quota). The same gangs must be evicted, and the others run where they
ran.
"""

from __future__ import annotations

import json

import anyio
import pytest
import yaml

from hostile import cleaned_env, hostile_stack
from phalanx_localstack.stack import ClusterFile
from phalanx_proto.kubeapi import ASSIGNMENT_ANNOTATION, QUEUE_LABEL, SIM_ARRIVAL
from phalanx_proto.queues import GPU_UNITS, QueueSpec
from phalanx_rules.queues import QueueTree
from phalanx_sim import cluster as sim_cluster
from phalanx_sim import workload
from phalanx_sim.loop import Simulation
from phalanx_sim.model import SimConfig
from stackutil import CLUSTER, gang_pod, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

COORD = ["--queue-sync-s", "0.3", "--resync-s", "0.5", "--backoff-base-s", "0.5", "--backoff-max-s", "3",
         "--reconcile-s", "1"]
WAVES = [("team-a", "a0"), ("team-a", "a1"), ("team-a", "a2"), ("team-a", "a3"), ("team-b", "b0"), ("team-b", "b1")]


def queue(name: str, quota: int) -> dict:
    return {"apiVersion": "scheduling.phalanx.io/v1alpha1", "kind": "Queue", "metadata": {"name": name},
            "spec": {"resources": {"nvidia.com/gpu": {"quota": quota}}}}


def pods(team: str, gang: str, arrival: int) -> list[dict]:
    out = []
    for i in range(2):
        pod = gang_pod(f"{gang}-{i}", 2, gang, 2, priority=1)
        pod["metadata"]["labels"][QUEUE_LABEL] = team
        pod["metadata"]["annotations"] = {SIM_ARRIVAL: f"{arrival}s"}
        out.append(pod)
    return out


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    yield from hostile_stack(tmp_path_factory.mktemp("two-clocks"), COORD)


@pytest.fixture
async def env(stack):
    async for e in cleaned_env(stack):
        _, _, sim = e
        for q in (queue("team-a", 8), queue("team-b", 8)):
            await sim.apply_queue(q)
        await anyio.sleep(1.0)  # gang-coordinator has read them (--queue-sync-s 0.3)
        yield e


def simulated(tmp_path) -> dict[str, object]:
    """Each gang's outcome in ``phalanx sim``: its nodes, or "evicted"."""
    path = tmp_path / "workload.yaml"
    path.write_text(yaml.safe_dump_all([p for i, (team, g) in enumerate(WAVES) for p in pods(team, g, 10 * i)]))
    tree = QueueTree.of((QueueSpec(name="team-a", quota=8 * GPU_UNITS), QueueSpec(name="team-b", quota=8 * GPU_UNITS)))
    gangs = workload.read_workload([str(path)], tree, {})
    run = Simulation(sim_cluster.views(ClusterFile.load(CLUSTER)), gangs, tree,
                     SimConfig(starve_after_s=0, horizon_s=200.0)).run()
    out: dict[str, object] = {}
    for gang_id, o in run.outcomes.items():
        name = gang_id.rsplit(":", 1)[-1]
        out[name] = "evicted" if o.preempted else tuple(sorted({a.node for a in run.running[gang_id]}))
    return out


async def test_a_queue_and_preemption_workload_ends_the_same_on_the_stack_and_in_the_simulator(env, tmp_path):
    _, bus, sim = env
    for i, (team, gang) in enumerate(WAVES):
        for pod in pods(team, gang, 10 * i):
            await sim.apply_pod(pod)

        async def bound(gang=gang):
            placed = [p for p in await sim.list_pods() if p.name.startswith(f"{gang}-") and p.node_name]
            return len(placed) == 2

        await wait_until(bound, 60, what=f"{gang} bound")

    async def settled():
        """Each gang's outcome on the stack once no team-a pod is being evicted: its nodes, or "evicted"."""
        listed = {p.name: p for p in await sim.list_pods()}
        out: dict[str, object] = {}
        for _, gang in WAVES:
            mine = [listed.get(f"{gang}-{i}") for i in range(2)]
            if all(p is None for p in mine):
                out[gang] = "evicted"
            elif all(p is not None and p.node_name for p in mine):
                out[gang] = tuple(sorted({json.loads(p.annotations[ASSIGNMENT_ANNOTATION])["node"] for p in mine}))
            else:
                return None  # half gone: the eviction is under way
        return out if sum(v == "evicted" for v in out.values()) == 2 else None

    on_stack = await wait_until(settled, 60, what="two team-a gangs evicted, the rest running")
    assert on_stack == simulated(tmp_path)
