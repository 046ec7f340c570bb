"""``phalanx sim``: waits computed by hand on tiny clusters, the queue and fairness rules of the
services in virtual time, the packing bench's figures, the workload format, determinism."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from engine_builders import node, pod

from phalanx_bench import engine_replay
from phalanx_bench.sharepack import PodRequest
from phalanx_cli.main import main as cli
from phalanx_engine.decide import default_profile
from phalanx_input import Invalid
from phalanx_proto.queues import GPU_UNITS, QueueSpec
from phalanx_rules.queues import QueueTree
from phalanx_sim import trace
from phalanx_sim.loop import Simulation
from phalanx_sim.model import SimConfig, SimGang, parse_duration
from phalanx_sim.report import document
from phalanx_sim.workload import read_workload

REPO = Path(__file__).resolve().parents[2]
NO_TREE = QueueTree.of(())
GATE_OFF = SimConfig(starve_after_s=0, sample_s=10)


def gang(name: str, gpus: int, *, at: float, runs: float | None, members: int = 1, queue: str = "") -> SimGang:
    specs = tuple(msgspec.structs.replace(pod(f"{name}-{i}").gpus(gpus).spec(), queue=queue) for i in range(members))
    return SimGang(gang_id=f"default/{name}", members=specs, arrival_s=at, duration_s=runs)


def run(nodes, gangs, tree=NO_TREE, config=GATE_OFF) -> Simulation:
    return Simulation([n.view() for n in nodes], gangs, tree, config).run()


def starts(sim: Simulation) -> dict[str, float | None]:
    return {g.removeprefix("default/"): o.start for g, o in sim.outcomes.items()}


def test_waits_on_one_eight_gpu_node_are_the_ones_computed_by_hand():
    # a: 8 GPUs 0..100. b (4) and c (4) wait for a, and start when it ends (woken by the
    # release, in arrival order); d (8) waits for both to end: c at 130 frees only 4, b at 150.
    gangs = [gang("a", 8, at=0, runs=100), gang("b", 4, at=10, runs=50), gang("c", 4, at=20, runs=30),
             gang("d", 8, at=30, runs=10)]
    sim = run([node("n").gpus(8)], gangs)
    assert starts(sim) == {"a": 0, "b": 100, "c": 100, "d": 150}
    assert {g: o.end for g, o in sim.outcomes.items()} == {
        "default/a": 100, "default/b": 150, "default/c": 130, "default/d": 160}
    assert [s.allocated for s in sim.samples if s.t in (50, 110, 140, 160)] == [8, 8, 4, 8]


def test_a_gang_behind_a_starving_head_may_not_take_the_heads_node():
    # Gate on: at 100, b has waited 90 s > 60 s and is the head; its reserve is node n, so c
    # (behind it) may not use n and starts only on a later retry, after b.
    gangs = [gang("a", 8, at=0, runs=100), gang("b", 4, at=10, runs=50), gang("c", 4, at=20, runs=30)]
    sim = run([node("n").gpus(8)], gangs, config=SimConfig(starve_after_s=60, sample_s=10))
    got = starts(sim)
    assert got["b"] == 100 and got["c"] > 100
    gate_off = starts(run([node("n").gpus(8)], gangs))
    assert gate_off == {"a": 0, "b": 100, "c": 100}


def test_a_queue_at_its_limit_waits_with_gpus_free():
    tree = QueueTree.of([QueueSpec(name="team", limit=4 * GPU_UNITS)])
    gangs = [gang("x", 4, at=0, runs=50, queue="team"), gang("y", 4, at=0, runs=50, queue="team")]
    sim = run([node("n").gpus(8)], gangs, tree)
    assert starts(sim) == {"x": 0, "y": 50}
    assert [s.queues["team"] for s in sim.samples if s.t in (10, 60)] == [(4.0, 4.0), (4.0, 4.0)]


def test_a_gang_placed_across_a_looser_tier_than_on_an_empty_cluster_counts_as_split():
    nodes = [node("a1").gpus(8).tiers(hypernode="h1", netpod="p"), node("a2").gpus(8).tiers(hypernode="h1", netpod="p"),
             node("b1").gpus(8).tiers(hypernode="h2", netpod="p")]
    sim = run(nodes, [gang("x", 8, at=0, runs=None), gang("g", 8, at=1, runs=None, members=2)])
    g = sim.outcomes["default/g"]
    assert (g.start, g.tier, g.domain, g.split) == (1, "netpod", "p", True)


def test_the_pending_gangs_say_why_and_what_would_start_them():
    sim = run([node("n").gpus(8)], [gang("a", 8, at=0, runs=None), gang("b", 2, at=5, runs=None)])
    (p,) = document(sim, gangs=None, pending_limit=5, decisions=100)["pending"]
    assert (p["gang"], p["reason"]) == ("default/b", "0/1 nodes are available: 1 insufficient free GPUs.")
    assert p["whatif"]["answers"][0]["text"] == "would start if 2 GPUs free on node n (held by gang default/a)"


def test_a_run_stops_when_only_retries_are_left():
    sim = run([node("n").gpus(8)], [gang("big", 9, at=0, runs=10), gang("a", 1, at=3, runs=10)])
    assert (sim.now, starts(sim)) == (13, {"big": None, "a": 3})


# --- the packing bench, through the simulator -----------------------------------------------------

NODES = (("t4-0", 32000, 65536, 4, "T4"), ("t4-1", 32000, 65536, 4, "T4"), ("v-0", 64000, 131072, 8, "V100"))
PODS = (PodRequest(4000, 8192, 1000, 1), PodRequest(8000, 16384, 1000, 2), PodRequest(2000, 4096, 500, 1),
        PodRequest(16000, 32768, 1000, 4), PodRequest(1000, 2048, 0, 0), PodRequest(6000, 8192, 300, 1))


@pytest.mark.parametrize("seed", [42, 43, 44])
def test_a_packing_run_gives_the_packing_benchs_figures(seed):
    order, seq = trace.packing_sequence(NODES, PODS, seed)
    ranked = sorted(range(len(NODES)), key=order.__getitem__)
    sums, dropped, _ = engine_replay.replay(NODES, PODS, order, seq, default_profile())
    gangs = trace.packing_gangs(PODS, seq)
    sim = Simulation(trace.snapshot(NODES, ranked).nodes, gangs, NO_TREE, GATE_OFF).run()
    started = {g: o.start for g, o in sim.outcomes.items() if o.start is not None}
    assert trace.packing_figures(gangs, started, capacity_gpus=16) == {
        "alloc_100": trace.allocation_at(sums, 100), "alloc_130": trace.allocation_at(sums, 130)}
    assert len(gangs) - len(started) == dropped


# --- the workload format --------------------------------------------------------------------------

JOBSET = """
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata:
  name: train
  annotations: {sim.phalanx.io/arrival: 5m, sim.phalanx.io/duration: 2h, sim.phalanx.io/repeat: "2",
                sim.phalanx.io/every: 1h}
spec:
  replicatedJobs:
  - name: worker
    replicas: 2
    template:
      spec:
        parallelism: 3
        template:
          metadata:
            labels: {aliyun.com/min-member: "3", scheduling.phalanx.io/queue: team}
          spec:
            schedulerName: phalanx
            containers:
            - name: c
              image: x
              resources: {limits: {nvidia.com/gpu: "2"}}
---
apiVersion: v1
kind: Pod
metadata: {name: solo, namespace: lab}
spec:
  schedulerName: phalanx
  priority: 7
  containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: "1"}}}]
"""


def test_a_jobset_is_one_gang_of_all_its_pods_with_the_annotated_times(tmp_path):
    f = tmp_path / "w.yaml"
    f.write_text(JOBSET)
    tree = QueueTree.of([QueueSpec(name="team")])
    got = [(g.gang_id, len(g.members), g.queue, g.units // GPU_UNITS, g.arrival_s, g.duration_s, g.priority, g.refused)
           for g in read_workload([str(f)], tree, {})]
    assert got == [("lab/solo", 1, "default", 1, 0.0, None, 7, ""),
                   ("default/JobSet:train-r0", 6, "team", 12, 300.0, 7200.0, 0, ""),
                   ("default/JobSet:train-r1", 6, "team", 12, 3900.0, 7200.0, 0, "")]


def test_the_items_of_a_list_keep_their_own_times(tmp_path):
    f = tmp_path / "w.yaml"
    f.write_text("""
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Pod
  metadata: {name: early, annotations: {sim.phalanx.io/arrival: 10s, sim.phalanx.io/duration: 1m}}
  spec: {schedulerName: phalanx, containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: "1"}}}]}
- apiVersion: v1
  kind: Pod
  metadata: {name: late, annotations: {sim.phalanx.io/arrival: 2m}}
  spec: {schedulerName: phalanx, containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: "1"}}}]}
""")
    got = [(g.gang_id, g.arrival_s, g.duration_s) for g in read_workload([str(f)], NO_TREE, {})]
    assert got == [("default/early", 10.0, 60.0), ("default/late", 120.0, None)]


def test_a_gang_whose_queue_does_not_exist_is_kept_with_the_reason(tmp_path):
    f = tmp_path / "w.yaml"
    f.write_text(JOBSET)
    (solo, *js) = read_workload([str(f)], NO_TREE, {})
    assert [g.refused for g in js] == ["queue team does not exist"] * 2 and solo.refused == ""


@pytest.mark.parametrize(("annotation", "message"), [
    ("sim.phalanx.io/duration: soon", "'soon': a duration is a number"),
    ("sim.phalanx.io/repeat: '0'", "0: from 1 to 100000"),
])
def test_a_bad_annotation_names_the_field(tmp_path, annotation, message):
    f = tmp_path / "w.yaml"
    f.write_text(f"""apiVersion: v1
kind: Pod
metadata: {{name: p, annotations: {{{annotation}}}}}
spec: {{schedulerName: phalanx, containers: [{{name: c, image: x, resources: {{limits: {{nvidia.com/gpu: "1"}}}}}}]}}
""")
    with pytest.raises(Invalid, match=message):
        read_workload([str(f)], NO_TREE, {})


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("90s", 90), ("30m", 1800), ("1.5h", 5400), ("2d", 172800),
                                               ("1w", 604800), (12, 12)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


# --- the command ----------------------------------------------------------------------------------

DEMO = ["sim", "--cluster-file", str(REPO / "examples/clusters/2x8v100.yaml"), "--workload",
        str(REPO / "examples/workloads/demo.yaml"), "--default-duration", "30m", "--quiet"]


def test_the_same_input_gives_the_same_output_whatever_the_hash_seed():
    outs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, "-m", "phalanx_cli.main", *DEMO, "--json"],
                              capture_output=True, text=True, env=env, timeout=120, check=True)
        outs.append(done.stdout)
    assert outs[0] == outs[1]
    doc = json.loads(outs[0])
    assert [(r["gang"], r["wait_s"], r["tier"]) for r in doc["gangs"]] == [
        ("default/whole-card-demo", 0.0, "node"), ("default/train-4gpu-a", 0.0, "node"), ("default/tdm-demo", 0.0, "node"),
        ("default/JobSet:gang-nccl-test", 0.0, "node"), ("default/JobSet:gang-nccl-test-2", 1800.0, "node"),
        ("default/too-big-9gpu", None, None)]


@pytest.mark.parametrize(("args", "code", "says"), [
    (["sim", "--synthetic", "2x8v100"], 2, "nothing to run"),
    (["sim", "--workload", str(REPO / "examples/workloads/demo.yaml")], 2, "which cluster?"),
    (["sim", "--synthetic", "2x9zz", "--workload", str(REPO / "examples/workloads/demo.yaml")], 2, "unknown shape"),
    (["sim", "--synthetic", "2x8v100", "--workload", "/nonexistent.yaml"], 2, "cannot read"),
    (["sim", "--synthetic", "2x8v100", "--workload", str(REPO / "examples/queues/two-teams.yaml")], 0, ""),
])
def test_the_command_says_what_is_wrong(args, code, says, capsys):
    assert cli([*args, "--quiet"]) == code
    assert says in capsys.readouterr().err


def test_the_command_reads_an_invalid_pod_as_exit_1(tmp_path, capsys):
    f = tmp_path / "w.yaml"
    f.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {schedulerName: phalanx, containers: "
                 "[{name: c, image: x, resources: {limits: {aliyun.com/gpu-core: '0'}}}]}\n")
    assert cli(["sim", "--synthetic", "1x8v100", "--workload", str(f), "--quiet"]) == 1
    assert "gpu-core 0 is not allowed" in capsys.readouterr().err


def test_retries_refused_without_deciding_change_nothing():
    import random

    rng = random.Random(3)
    gangs = [gang(f"g{k}", rng.choice([1, 2, 4, 8]), at=rng.uniform(0, 600), runs=rng.uniform(30, 400),
                  members=rng.choice([1, 1, 1, 2, 3])) for k in range(80)]
    nodes = [node(f"n{i}").gpus(8).tiers(hypernode=f"h{i // 2}", netpod="p") for i in range(4)]
    quick, exact = (run(nodes, gangs, config=SimConfig(starve_after_s=60, sample_s=30, exact=x)) for x in (False, True))
    assert quick.decisions < exact.decisions
    assert [(o.start, o.end, o.tier, o.domain, o.reason) for o in quick.outcomes.values()] == \
        [(o.start, o.end, o.tier, o.domain, o.reason) for o in exact.outcomes.values()]


def test_another_queues_gang_leaves_a_queues_repair_reserve_alone_as_placement_does():
    # Two leaves of two 8-GPU nodes. team-a (quota 16, repairReserve 8 GPUs per leaf) runs a
    # 4-GPU gang on a1; team-b's 8-GPU gang would take a2 by packing (leaf-a is the fuller
    # leaf), but a2 is leaf-a's reserve for team-a's repairs: it goes to leaf-b. team-a's own
    # next gang may use the reserve.
    from phalanx_proto.queues import RepairReserve

    nodes = [node("a1").gpus(8).tiers(leaf="leaf-a"), node("a2").gpus(8).tiers(leaf="leaf-a"),
             node("b1").gpus(8).tiers(leaf="leaf-b"), node("b2").gpus(8).tiers(leaf="leaf-b")]
    tree = QueueTree.of([QueueSpec(name="team-a", quota=16 * GPU_UNITS, repair_reserve=RepairReserve(tier="leaf", gpus=8)),
                         QueueSpec(name="team-b", quota=16 * GPU_UNITS)])
    gangs = [gang("a-run", 4, at=0, runs=None, queue="team-a"), gang("b-new", 8, at=1, runs=None, queue="team-b"),
             gang("a-new", 8, at=2, runs=None, queue="team-a")]
    sim = run(nodes, gangs, tree)
    where = {g.removeprefix("default/"): {a.node for a in asg} for g, asg in sim.running.items()}
    assert where == {"a-run": {"a1"}, "b-new": {"b1"}, "a-new": {"a2"}}
    without = run(nodes, gangs, QueueTree.of([QueueSpec(name="team-a", quota=16 * GPU_UNITS),
                                              QueueSpec(name="team-b", quota=16 * GPU_UNITS)]))
    assert {g.removeprefix("default/"): {a.node for a in asg} for g, asg in without.running.items()}["b-new"] == {"a2"}
