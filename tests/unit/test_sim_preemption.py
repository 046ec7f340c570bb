"""Preemption in ``phalanx sim`` (``phalanx_sim.preemption``): the services' planner, asked for a
gang the engine could not place, on the simulation's running gangs; victims go whole, at once,
and run again from the beginning once placed again. Times computed by hand on one or two
8-GPU nodes, whole values compared."""

from __future__ import annotations

import msgspec
import pytest
from engine_builders import node, pod

from phalanx_engine.queues import QueueTree
from phalanx_proto.queues import GPU_UNITS, QueueSpec
from phalanx_sim.loop import Simulation
from phalanx_sim.model import SimConfig, SimGang
from phalanx_sim.report import document
from phalanx_sim.workload import read_workload

NO_TREE = QueueTree.of(())
ON = SimConfig(starve_after_s=0, sample_s=10)
OFF = SimConfig(starve_after_s=0, sample_s=10, preemption=False)


def gang(name: str, gpus: int, *, at: float, runs: float | None, priority: int = 0, members: int = 1,
         queue: str = "", policy: str = "") -> SimGang:
    specs = tuple(msgspec.structs.replace(pod(f"{name}-{i}").gpus(gpus).spec(), queue=queue, priority=priority,
                                          preemption_policy=policy) for i in range(members))
    return SimGang(gang_id=f"default/{name}", members=specs, arrival_s=at, duration_s=runs, priority=priority)


def run(gangs, tree=NO_TREE, config=ON, nodes=1) -> Simulation:
    return Simulation([node(f"n{i}").gpus(8).view() for i in range(nodes)], gangs, tree, config).run()


def outcome(sim: Simulation) -> dict[str, tuple]:
    """gang → (start, end, times preempted, GPU-seconds lost)."""
    return {g.removeprefix("default/"): (o.start, o.end, o.preempted, o.lost_gpu_s) for g, o in sim.outcomes.items()}


FULL = [gang("lo", 4, at=0, runs=100, priority=1), gang("mid", 4, at=0, runs=100, priority=5)]


@pytest.mark.parametrize(("gangs", "tree", "config", "expected"), [
    pytest.param(
        [*FULL, gang("hi", 4, at=10, runs=20, priority=10)], NO_TREE, ON,
        # hi evicts lo (the lowest priority) at 10 and runs to 30; lo, woken by hi's end, runs
        # its whole 100 s again from 30; 10 s x 4 GPUs of its first run are lost
        {"lo": (30, 130, 1, 40.0), "mid": (0, 100, 0, 0.0), "hi": (10, 30, 0, 0.0)},
        id="a higher-priority gang evicts the lowest-priority gang whole and it runs again later"),
    pytest.param(
        [*FULL, gang("hi", 4, at=10, runs=20, priority=10, policy="Never")], NO_TREE, ON,
        {"lo": (0, 100, 0, 0.0), "mid": (0, 100, 0, 0.0), "hi": (100, 120, 0, 0.0)},
        id="a gang whose pods say preemptionPolicy Never waits"),
    pytest.param(
        [*FULL, gang("hi", 4, at=10, runs=20, priority=10)], NO_TREE, OFF,
        {"lo": (0, 100, 0, 0.0), "mid": (0, 100, 0, 0.0), "hi": (100, 120, 0, 0.0)},
        id="with preemption off the gang waits"),
    pytest.param(
        [*FULL, gang("peer", 4, at=10, runs=20, priority=1)], NO_TREE, ON,
        {"lo": (0, 100, 0, 0.0), "mid": (0, 100, 0, 0.0), "peer": (100, 120, 0, 0.0)},
        id="equal priority is never a victim"),
    pytest.param(
        [gang(f"b{i}", 4, at=0, runs=100, queue="b") for i in range(4)] + [gang("a", 8, at=10, runs=20, queue="a")],
        QueueTree.of([QueueSpec(name="a", quota=8 * GPU_UNITS), QueueSpec(name="b", quota=8 * GPU_UNITS)]), ON,
        # team b borrowed both nodes; team a (below its quota) takes back two of b's gangs on one
        # node, whole, down to b's quota and no further
        {"b0": (30, 130, 1, 40.0), "b1": (30, 130, 1, 40.0), "b2": (0, 100, 0, 0.0), "b3": (0, 100, 0, 0.0),
         "a": (10, 30, 0, 0.0)},
        id="a queue below its quota reclaims borrowed GPUs down to the lender's quota"),
    pytest.param(
        [gang("lo", 4, at=0, runs=100, priority=1, queue="a"), gang("hi", 4, at=10, runs=20, priority=10, queue="a")],
        QueueTree.of([QueueSpec(name="a", quota=4 * GPU_UNITS, limit=4 * GPU_UNITS)]), ON,
        # 4 GPUs free, but queue a's limit is 4: hi takes lo's place under the limit
        {"lo": (30, 130, 1, 40.0), "hi": (10, 30, 0, 0.0)},
        id="a gang at its queue's limit preempts a lower-priority gang of its queue to get under it"),
])
def test_preemption_in_virtual_time(gangs, tree, config, expected):
    nodes = 2 if len(gangs) > 3 else 1
    assert outcome(run(gangs, tree, config, nodes=nodes)) == expected


def test_the_report_counts_plans_victims_and_lost_work_and_two_runs_agree():
    gangs = [*FULL, gang("hi", 4, at=10, runs=20, priority=10)]
    docs = [document(run(gangs), gangs=None, pending_limit=5, decisions=0) for _ in range(2)]
    assert docs[0] == docs[1]
    assert docs[0]["summary"]["preemption"] == {"on": True, "plans": 1, "gangs_evicted": 1, "gpu_s_lost": 40.0}
    assert {r["gang"]: r["preempted"] for r in docs[0]["gangs"]} == {
        "default/lo": 1, "default/mid": 0, "default/hi": 0}


def test_priority_classes_in_the_workload_give_pods_their_priority_and_policy(tmp_path):
    f = tmp_path / "w.yaml"
    f.write_text("""
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: urgent}
value: 100
preemptionPolicy: Never
---
apiVersion: v1
kind: Pod
metadata: {name: p}
spec:
  priorityClassName: urgent
  schedulerName: phalanx
  containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: "1"}}}]
""")
    (g,) = read_workload([str(f)], NO_TREE, {})
    assert (g.priority, g.members[0].priority, g.members[0].preemption_policy) == (100, 100, "Never")


def test_a_priority_class_the_workload_does_not_define_is_refused_with_the_field(tmp_path):
    from phalanx_input import Invalid

    f = tmp_path / "w.yaml"
    f.write_text("""
apiVersion: v1
kind: Pod
metadata: {name: p}
spec: {priorityClassName: nowhere, schedulerName: phalanx, containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: "1"}}}]}
""")
    with pytest.raises(Invalid, match="spec.priorityClassName"):
        read_workload([str(f)], NO_TREE, {})
