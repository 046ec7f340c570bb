"""A simulation that starts from a running cluster (``phalanx sim --from-live``): the live
reservations hold their GPUs to the end of the run, charge their queues, do not count against
a gang's fit on the empty cluster, and are named by their gang in what-if answers."""

from __future__ import annotations

import msgspec
from engine_builders import node, pod

from phalanx_engine.whatif import Running
from phalanx_proto.events import PodRef
from phalanx_proto.queues import GPU_UNITS, QueueSpec
from phalanx_rules.queues import QueueTree
from phalanx_sim.loop import Simulation
from phalanx_sim.model import SimConfig, SimGang
from phalanx_sim.report import document

LIVE = PodRef(namespace="bg", name="busy-n-0")  # the builder's name for the first busy() reservation


def test_live_reservations_hold_to_the_end_charge_their_queue_and_are_named_in_the_answers():
    tree = QueueTree.of([QueueSpec(name="team", quota=16 * GPU_UNITS)])
    wants = (msgspec.structs.replace(pod("w-0").gpus(4).spec(), queue="team"),)
    small = (msgspec.structs.replace(pod("s-0").gpus(2).spec(), queue="team"),)
    sim = Simulation([node("n").gpus(8).busy(0, 1, 2, 3, 4, 5).view()],
                     [SimGang(gang_id="default/s", members=small, duration_s=10),
                      SimGang(gang_id="default/w", members=wants, arrival_s=5, duration_s=10)], tree,
                     SimConfig(starve_after_s=0, sample_s=10, horizon_s=100), held={"team": 6 * GPU_UNITS},
                     live={LIVE: Running(gang_id="bg/live-job", queue="team")}).run()
    assert (sim.outcomes["default/s"].start, sim.outcomes["default/w"].start) == (0.0, None)
    assert sim.held == {"team": 6 * GPU_UNITS}  # s came and went; the live 6 GPUs stay
    assert sim.pending["team"]["default/w"].fits_empty_cluster  # the empty cluster has no live reservations
    (waiting,) = document(sim, gangs=None, pending_limit=5, decisions=200)["pending"]
    assert waiting["reason"] == "0/1 nodes are available: 1 insufficient free GPUs."
    wait = waiting["whatif"]["answers"][0]
    assert (wait["probe"], wait["text"]) == (
        "wait", "would start if 2 GPUs free on node n (held by gang bg/live-job)")
