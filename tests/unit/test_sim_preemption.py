"""Preemption in ``phalanx sim`` (``phalanx_sim.preemption``): the services' planner, asked for a
gang the engine could not place, on the simulation's running gangs; victims go whole, at once,
and run again from the beginning once placed again. Times computed by hand on one or two
8-GPU nodes, whole values compared."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import msgspec
import pytest
from engine_builders import node, pod

from phalanx_proto.queues import GPU_UNITS, QueueSpec
from phalanx_rules.queues import QueueTree
from phalanx_sim import preemption
from phalanx_sim.loop import Simulation
from phalanx_sim.model import SimConfig, SimGang
from phalanx_sim.report import document, text
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


PARENT = QueueTree.of([QueueSpec(name="org", quota=8 * GPU_UNITS),
                       QueueSpec(name="team", parent="org", quota=8 * GPU_UNITS)])


@pytest.mark.parametrize(("gangs", "tree", "expected"), [
    pytest.param(
        [gang("org-job", 8, at=0, runs=100, queue="org"), gang("team-job", 8, at=10, runs=20, queue="team")],
        PARENT,
        # team (below its quota) reclaims from its parent queue's own gang: the planner checks
        # no quota on the queues the units stay within (org holds them before and after)
        {"org-job": (30, 130, 1, 80.0), "team-job": (10, 30, 0, 0.0)},
        id="a child queue below its quota reclaims the GPUs of a gang of its parent queue"),
    pytest.param(
        [gang("team-job", 8, at=0, runs=100, queue="team"), gang("org-job", 8, at=10, runs=20, queue="org")],
        PARENT,
        # org holds its quota already (team's gang counts against it): no reclaim, it waits
        {"team-job": (0, 100, 0, 0.0), "org-job": (100, 120, 0, 0.0)},
        id="a parent queue at its quota through its child does not reclaim from the child"),
])
def test_reclaim_along_a_queue_chain(gangs, tree, expected):
    assert outcome(run(gangs, tree)) == expected


def test_a_victim_of_two_members_goes_whole_and_its_gpus_are_free_for_the_preemptor_at_once():
    gangs = [gang("lo", 4, at=0, runs=100, priority=1, members=2), gang("mid", 4, at=0, runs=100, priority=5,
                                                                        members=2),
             gang("hi", 8, at=10, runs=20, priority=10)]
    sim = run(gangs, nodes=2)
    # 10 s x 8 GPUs of lo's first run are lost; lo starts again, whole, when hi ends
    assert outcome(sim) == {"lo": (30, 130, 1, 80.0), "mid": (0, 100, 0, 0.0), "hi": (10, 30, 0, 0.0)}
    # samples before each instant's events: at 20 mid's 8 and hi's 8 GPUs are held, no member of lo
    assert [(s.t, s.allocated, s.running, s.pending) for s in sim.samples[:5]] == [
        (0, 0.0, 0, 0), (10, 16.0, 2, 0), (20, 16.0, 2, 1), (30, 16.0, 2, 1), (40, 16.0, 2, 0)]


def _random_workload(seed: int) -> list[SimGang]:
    rnd = random.Random(seed)
    out = []
    for i in range(12):
        policy = "Never" if rnd.random() < 0.15 else ""
        out.append(gang(f"g{i}", rnd.choice((1, 2, 4, 8)), at=float(rnd.randrange(0, 120, 5)),
                        runs=float(rnd.randrange(20, 200, 10)), priority=rnd.choice((0, 1, 5, 10)),
                        members=rnd.choice((1, 1, 2)), queue=rnd.choice(("org", "a", "b", "c")), policy=policy))
    return out


RANDOM_TREE = QueueTree.of([
    QueueSpec(name="org", quota=20 * GPU_UNITS), QueueSpec(name="a", parent="org", quota=4 * GPU_UNITS),
    QueueSpec(name="b", parent="org", quota=8 * GPU_UNITS, limit=12 * GPU_UNITS, within_queue="Never"),
    QueueSpec(name="c", quota=4 * GPU_UNITS, reclaim="Never")])


@pytest.mark.parametrize("seed", range(80))
def test_the_cheap_check_before_planning_never_skips_a_plan_the_planner_would_make(seed, monkeypatch):
    """The rulebook's ``preemption.may_preempt`` (the simulator's ``worth_planning``) only saves
    the planner's work: every run agrees with one that asks the planner at every refusal (both
    decide every retry, so only the check differs)."""
    gangs, config = _random_workload(seed), SimConfig(starve_after_s=0, sample_s=10, exact=True)
    checked = run(gangs, RANDOM_TREE, config, nodes=3)
    monkeypatch.setattr(preemption, "worth_planning", lambda sim, s: sim.config.preemption)
    asked = run(gangs, RANDOM_TREE, config, nodes=3)
    assert (outcome(checked), checked.preemptions) == (outcome(asked), asked.preemptions)


def test_the_report_counts_plans_victims_and_lost_work_and_two_runs_agree():
    gangs = [*FULL, gang("hi", 4, at=10, runs=20, priority=10)]
    docs = [document(run(gangs), gangs=None, pending_limit=5, decisions=0) for _ in range(2)]
    assert docs[0] == docs[1]
    assert docs[0]["summary"]["preemption"] == {"on": True, "plans": 1, "gangs_evicted": 1, "gpus_evicted": 4.0,
                                                "gpu_s_lost": 40.0}
    assert {r["gang"]: (r["start_s"], r["wait_s"], r["preempted"], r["gpu_s_lost"]) for r in docs[0]["gangs"]} == {
        "default/lo": (30, 30, 1, 40.0), "default/mid": (0, 0, 0, 0.0), "default/hi": (10, 0, 0, 0.0)}
    lines = text(docs[0], gangs=None).splitlines()
    assert [ln for ln in lines if ln.startswith("preemption:")] == [
        "preemption: 1 plans, 1 gangs evicted (4 GPUs), 0.01 GPU-hours of work lost"]
    table = lines[lines.index("every gang:") + 1:]
    assert [ln.split()[-2:] for ln in table] == [["TRIES", "PREEMPTED"], ["7", "1"], ["1", "0"], ["1", "0"]]


def test_with_preemption_off_the_report_says_so_and_two_runs_agree():
    gangs = [*FULL, gang("hi", 4, at=10, runs=20, priority=10)]
    docs = [document(run(gangs, config=OFF), gangs=None, pending_limit=5, decisions=0) for _ in range(2)]
    assert docs[0] == docs[1]
    assert docs[0]["summary"]["preemption"] == {"on": False, "plans": 0, "gangs_evicted": 0, "gpus_evicted": 0.0,
                                                "gpu_s_lost": 0.0}
    assert [ln for ln in text(docs[0], gangs=None).splitlines() if ln.startswith("preemption")] == ["preemption: off"]


URGENT = """
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: urgent}
value: 100
preemptionPolicy: Never
---
"""
BATCH_DEFAULT = """
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: batch}
value: 3
globalDefault: true
---
"""


def _pod(name: str, spec: str = "", *, times: tuple[str, str] | None = None, gpus: int = 1) -> str:
    """A pod's YAML: ``spec`` lines added to its spec, ``times`` its (arrival, duration)."""
    notes = f"annotations: {{sim.phalanx.io/arrival: {times[0]}, sim.phalanx.io/duration: {times[1]}}}, " if times else ""
    return f"""apiVersion: v1
kind: Pod
metadata: {{{notes}name: {name}}}
spec:
  schedulerName: phalanx
  {spec}
  containers: [{{name: c, image: x, resources: {{limits: {{nvidia.com/gpu: "{gpus}"}}}}}}]
"""


JOBSET_URGENT = """apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata: {name: train}
spec:
  replicatedJobs:
  - name: w
    replicas: 1
    template:
      spec:
        parallelism: 2
        template:
          spec:
            schedulerName: phalanx
            priorityClassName: urgent
            containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: "1"}}}]
"""


@pytest.mark.parametrize(("workload", "expected"), [
    pytest.param(URGENT + _pod("p", "priorityClassName: urgent"), [("default/p", 100, ((100, "Never"),))],
                 id="a PriorityClass in the workload gives the pods naming it its value and preemptionPolicy"),
    pytest.param(URGENT + JOBSET_URGENT, [("default/JobSet:train", 100, ((100, "Never"), (100, "Never")))],
                 id="a JobSet's pod template naming a PriorityClass gives every member its value"),
    pytest.param(URGENT + _pod("p", "priorityClassName: urgent\n  preemptionPolicy: PreemptLowerPriority"),
                 [("default/p", 100, ((100, "PreemptLowerPriority"),))],
                 id="a pod's own preemptionPolicy is kept over its class's"),
    pytest.param(BATCH_DEFAULT + _pod("p") + "---\n" + _pod("q", "priority: 7"),
                 [("default/p", 3, ((3, ""),)), ("default/q", 7, ((7, ""),))],
                 id="a pod naming no class gets the globalDefault class's value and a pod's own priority is kept"),
    pytest.param(_pod("p", "priorityClassName: system-cluster-critical") + "---\n" + _pod("q"),
                 [("default/p", 2_000_000_000, ((2_000_000_000, ""),)), ("default/q", 0, ((0, ""),))],
                 id="the built-in system classes need no object and without a default class priority is 0"),
])
def test_workload_pods_get_their_priority_as_the_api_servers_priority_admission_gives_it(tmp_path, workload,
                                                                                        expected):
    f = tmp_path / "w.yaml"
    f.write_text(workload)
    got = [(g.gang_id, g.priority, tuple((m.priority, m.preemption_policy) for m in g.members))
           for g in read_workload([str(f)], NO_TREE, {})]
    assert got == expected


def test_two_global_default_priority_classes_are_refused_as_the_api_server_refuses_the_second(tmp_path):
    from phalanx_input import Invalid

    f = tmp_path / "w.yaml"
    f.write_text(BATCH_DEFAULT + BATCH_DEFAULT.replace("name: batch", "name: other") + _pod("p"))
    with pytest.raises(Invalid, match="globalDefault.*PriorityClass batch .* is the default already"):
        read_workload([str(f)], NO_TREE, {})


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


# --- the command ----------------------------------------------------------------------------------

LOW = """
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: low}
value: 1
---
"""
COMMAND_WORKLOAD = (LOW + URGENT.replace("preemptionPolicy: Never\n", "")
                    + "---\n".join(_pod(n, "priorityClassName: low", times=("0s", "100s"), gpus=4) for n in "ab")
                    + "---\n" + _pod("hi", "priorityClassName: urgent", times=("10s", "20s"), gpus=8))


@pytest.mark.parametrize(("flags", "preemption", "gangs"), [
    pytest.param([], {"on": True, "plans": 1, "gangs_evicted": 2, "gpus_evicted": 8.0, "gpu_s_lost": 80.0},
                 {"default/a": (30, 1, 40.0), "default/b": (30, 1, 40.0), "default/hi": (10, 0, 0.0)},
                 id="phalanx sim preempts by default and reports it in its json"),
    pytest.param(["--no-preemption"],
                 {"on": False, "plans": 0, "gangs_evicted": 0, "gpus_evicted": 0.0, "gpu_s_lost": 0.0},
                 {"default/a": (0, 0, 0.0), "default/b": (0, 0, 0.0), "default/hi": (100, 0, 0.0)},
                 id="with --no-preemption the high-priority gang waits"),
])
def test_the_command_reads_priority_classes_and_preempts_unless_told_not_to(tmp_path, capsys, flags, preemption,
                                                                            gangs):
    from phalanx_cli.main import main as cli

    f = tmp_path / "w.yaml"
    f.write_text(COMMAND_WORKLOAD)
    assert cli(["sim", "--synthetic", "1x8v100", "--workload", str(f), "--quiet", "--json", *flags]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary"]["preemption"] == preemption
    assert {r["gang"]: (r["start_s"], r["preempted"], r["gpu_s_lost"]) for r in doc["gangs"]} == gangs


def test_a_run_that_preempts_prints_the_same_whatever_the_hash_seed(tmp_path):
    f = tmp_path / "w.yaml"
    f.write_text(COMMAND_WORKLOAD)
    outs = [subprocess.run([sys.executable, "-m", "phalanx_cli.main", "sim", "--synthetic", "1x8v100", "--workload",
                            str(f), "--quiet", "--json"], capture_output=True, text=True, timeout=120, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")]
    assert outs[0] == outs[1]
    assert json.loads(outs[0])["summary"]["preemption"]["plans"] == 1
