"""Fair share that remembers (libs/phalanx_rules/usage.py and ``queues.fair_shares`` with recent
usage): the half-life decay to exact values, a record advanced at any moments counting every
second once, and the worked example of docs/queues.md — a queue that held the cluster all
night against one that had nothing."""

from __future__ import annotations

import math

import pytest

from phalanx_proto.queues import GPU_UNITS, QueueHistory, QueueSpec
from phalanx_rules import queueorder, usage
from phalanx_rules.queues import QueueTree, fair_shares

G = GPU_UNITS
HOUR = 3600.0


def record(queue: str = "a", *, gpu_s: float = 0.0, at: float = 0.0, gpus: float = 0, half_life: float = HOUR):
    return QueueHistory(queue=queue, gpu_seconds=gpu_s, at=at, held=round(gpus * G), half_life_s=half_life)


@pytest.mark.parametrize(("name", "rec", "now", "expected"), [
    ("nothing held: one half-life halves the usage", record(gpu_s=1000.0), HOUR, 500.0),
    ("nothing held: two half-lives quarter it", record(gpu_s=1000.0), 2 * HOUR, 250.0),
    ("no time passed: the record's own value", record(gpu_s=1000.0, gpus=8), 0.0, 1000.0),
    ("a time before the record counts as the record's", record(gpu_s=1000.0, at=50.0, gpus=8), 10.0, 1000.0),
    ("8 GPUs held for one half-life from nothing: 8·τ·(1 - 1/2)", record(gpus=8), HOUR, 8 * HOUR / math.log(2) / 2),
    ("both at once: 1000 halved plus 4 GPUs for a half-life", record(gpu_s=1000.0, gpus=4), HOUR,
     500.0 + 4 * HOUR / math.log(2) / 2),
])
def test_the_decayed_usage_at_a_time_is_exact(name, rec, now, expected):
    assert usage.usage_at(rec, now) == pytest.approx(expected, rel=1e-12)


def test_a_queue_holding_the_same_gpus_for_ever_has_them_as_its_recent_gpus():
    rec = record(gpus=6, half_life=600.0)
    assert usage.recent_gpus([rec], 100 * 600.0) == {"a": pytest.approx(6.0, rel=1e-12)}
    assert usage.recent_gpus([rec], 600.0) == {"a": pytest.approx(3.0, rel=1e-12)}  # half-way after one half-life


def test_advancing_the_record_at_any_moments_counts_every_second_once():
    """Held 8 GPUs for 1000 s, then 2 for 3000 s, then nothing: the record advanced only when the
    holding changes, or at many more moments (two replicas, a restart), gives the same usage as
    the closed form: each interval integrated once."""
    h = 1800.0
    changes = [(0.0, 8 * G), (1000.0, 2 * G), (4000.0, 0)]
    once = None
    for t, held in changes:
        once = usage.advance(once, "a", t, held, h)
    often = None
    for t in [x * 250.0 for x in range(0, 25)]:
        held = 8 * G if t < 1000 else 2 * G if t < 4000 else 0
        often = usage.advance(often, "a", t, held, h)
    tau = h / math.log(2)
    closed = (8 * tau * (1 - 2 ** (-1000 / h)) * 2 ** (-5000 / h)
              + 2 * tau * (1 - 2 ** (-3000 / h)) * 2 ** (-2000 / h))
    assert usage.usage_at(once, 6000.0) == pytest.approx(closed, rel=1e-12)
    assert usage.usage_at(often, 6000.0) == pytest.approx(closed, rel=1e-12)


def test_a_clock_behind_the_record_never_runs_time_back():
    rec = usage.advance(record(gpu_s=100.0, at=1000.0, gpus=1), "a", 900.0, 3 * G, HOUR)
    assert (rec.at, rec.gpu_seconds, rec.held) == (1000.0, 100.0, 3 * G)


def test_another_half_life_keeps_the_recent_gpus_and_rewrites_the_record():
    rec = record(gpu_s=5000.0, at=0.0, gpus=0, half_life=HOUR)
    before = usage.recent_gpus([rec], 0.0)["a"]
    moved = usage.advance(rec, "a", 0.0, 0, 2 * HOUR)
    assert usage.recent_gpus([moved], 0.0)["a"] == pytest.approx(before, rel=1e-12)
    assert usage.stale(rec, 0, 2 * HOUR) and usage.stale(rec, G, HOUR) and usage.stale(None, 0, HOUR)
    assert not usage.stale(rec, 0, HOUR)


@pytest.mark.parametrize(("name", "hungry", "recent", "norm", "expected"), [
    ("no usage: twice the normalised weights (the plain proportions)", {"a": 1, "b": 3}, {}, 16.0,
     {"a": 0.5, "b": 1.5}),
    ("used exactly its part: its normalised weight", {"a": 1, "b": 1}, {"a": 8.0, "b": 8.0}, 16.0,
     {"a": 0.5, "b": 0.5}),
    ("used all of it: nothing, the other twice its part", {"a": 1, "b": 1}, {"a": 16.0}, 16.0,
     {"a": 0.0, "b": 1.0}),
    ("everyone used more than twice its part: the plain weights", {"a": 1, "b": 1}, {"a": 16.0, "b": 16.0}, 16.0,
     {"a": 1, "b": 1}),
    ("a weight of 0 never borrows", {"a": 0, "b": 1}, {}, 16.0, {"a": 0.0, "b": 2.0}),
])
def test_the_usage_weighted_weights(name, hungry, recent, norm, expected):
    assert usage.weights(hungry, recent, norm) == pytest.approx(expected)


def night_and_day(recent: dict[str, float] | None) -> dict[str, int]:
    """16 GPUs, team-a and team-b with no quota and weight 1, each wanting all 16."""
    tree = QueueTree.of((QueueSpec(name="team-a"), QueueSpec(name="team-b")))
    return fair_shares(tree, {"team-a": 16 * G, "team-b": 16 * G}, 16 * G, recent)


def test_a_team_that_held_the_cluster_all_night_yields_to_one_that_had_nothing():
    """The worked example of docs/queues.md: half-life 2 h; team-a held all 16 GPUs for the 8 h
    of the night, team-b nothing. team-a's recent GPUs are 16·(1 - 2^-4) = 15, so U = 15/16:
    its weight is max(0, 2·1/2 - 15/16) = 1/16 against team-b's 1: of 11,200 units team-b
    gets ⌊11200·16/17⌋ = 10541 and team-a ⌊11200·1/17⌋ = 658 plus the last unit, 659."""
    h = 2 * HOUR
    night = usage.advance(None, "team-a", 0.0, 16 * G, h)
    empty = usage.advance(None, "team-b", 0.0, 0, h)
    recent = usage.recent_gpus([night, empty], 8 * HOUR)
    assert recent == {"team-a": pytest.approx(15.0, rel=1e-12), "team-b": 0.0}
    assert night_and_day(recent) == {"team-a": 659, "team-b": 10541, "default": 0}
    assert night_and_day(None) == {"team-a": 8 * G, "team-b": 8 * G, "default": 0}  # without the memory: halves


def test_a_team_idle_all_night_and_a_team_busy_all_night_swap_as_the_day_goes_on():
    """The same two teams from 8 h on: team-b now holds all 16, team-a nothing. Within one
    half-life team-b's recent GPUs pass team-a's and the order of the shares turns round: the
    two take turns, each yielding to the one that waited."""
    h = 2 * HOUR
    a = usage.advance(usage.advance(None, "team-a", 0.0, 16 * G, h), "team-a", 8 * HOUR, 0, h)
    b = usage.advance(usage.advance(None, "team-b", 0.0, 0, h), "team-b", 8 * HOUR, 16 * G, h)
    morning = night_and_day(usage.recent_gpus([a, b], 8 * HOUR))
    noon = night_and_day(usage.recent_gpus([a, b], 12 * HOUR))
    assert morning["team-b"] > morning["team-a"]
    assert noon["team-a"] > noon["team-b"]


def test_the_quota_is_still_guaranteed_whatever_the_usage():
    tree = QueueTree.of((QueueSpec(name="a", quota=4 * G), QueueSpec(name="b")))
    shares = fair_shares(tree, {"a": 16 * G, "b": 16 * G}, 16 * G, {"a": 16.0, "b": 0.0})
    assert shares == {"a": 4 * G, "b": 12 * G, "default": 0}


def test_the_cycle_order_turns_when_the_usage_does():
    """The ranks of a cycle (held / fair share): team-a holds 6 GPUs and team-b 9 of 16, both
    wait for more. Without the memory team-a is further below its share (6/8 against 9/8) and
    goes first; after team-a held the whole cluster for a half-life and team-b only lately,
    team-a's share shrinks below 6.4 GPUs and team-b goes first."""
    tree = QueueTree.of((QueueSpec(name="a"), QueueSpec(name="b")))
    held, waiting = {"a": 6 * G, "b": 9 * G}, {"a": G, "b": G}
    _, plain = queueorder.shares_and_ranks(tree, held, waiting, 16 * G)
    assert plain["a"] < plain["b"]
    h = 20.0
    a = usage.advance(usage.advance(None, "a", 0.0, 16 * G, h), "a", 20.0, 6 * G, h)
    b = usage.advance(usage.advance(None, "b", 0.0, 0, h), "b", 20.0, 9 * G, h)
    _, ranks = queueorder.shares_and_ranks(tree, held, waiting, 16 * G, usage.recent_gpus([a, b], 22.0))
    assert ranks["b"] < ranks["a"]


def test_a_nested_level_normalises_by_what_it_divides():
    """Below a parent the usage counts against the parent's share: two children of a parent
    with 8 GPUs of 16, one of which used the parent's 8 lately, the other nothing."""
    tree = QueueTree.of((QueueSpec(name="org", quota=8 * G, limit=8 * G), QueueSpec(name="x", parent="org"),
                         QueueSpec(name="y", parent="org"), QueueSpec(name="other", quota=8 * G)))
    demand = {"x": 8 * G, "y": 8 * G, "other": 8 * G}
    shares = fair_shares(tree, demand, 16 * G, {"org": 8.0, "x": 8.0, "y": 0.0})
    # x: U = 8/8, weight max(0, 1 - 1) = 0; y: 1: y gets the parent's 8
    assert (shares["x"], shares["y"]) == (0, 8 * G)


def test_the_replay_checks_the_recorded_order_with_its_recent_usage():
    """``phalanx sim --replay`` asks the rulebook for the fair shares again on what a cycle's
    order read (``RecordedQueueGate.order``: the queues, units, usage records and time): the
    recorded shares agree; shares forged as if the usage were not there are reported."""
    from phalanx_proto.events import DecisionsRecorded, RecordedDecision, RecordedOrder, RecordedQueueGate
    from phalanx_sim.replay import Replay

    specs = (QueueSpec(name="team-a"), QueueSpec(name="team-b"), QueueSpec(name="default"))
    h = 2 * HOUR
    history = (usage.advance(None, "team-a", 0.0, 16 * G, h), usage.advance(None, "team-b", 0.0, 0, h))
    inputs = dict(specs=specs, held={"team-a": 16 * G}, waiting={"team-a": 16 * G, "team-b": 16 * G},
                  capacity=16 * G, history=history, now=8 * HOUR)
    true, _ = queueorder.shares_and_ranks(QueueTree.of(specs), inputs["held"], inputs["waiting"], 16 * G,
                                          usage.recent_gpus(history, 8 * HOUR))
    plain, _ = queueorder.shares_and_ranks(QueueTree.of(specs), inputs["held"], inputs["waiting"], 16 * G)
    assert true != plain
    replay = Replay()
    for seq, shares in enumerate((true, plain), start=1):
        gate = RecordedQueueGate(order=RecordedOrder(**inputs, shares=shares))
        replay.feed(DecisionsRecorded(replica="r1", seq=seq, base=seq == 1, items=(
            RecordedDecision(gang_id=f"ns/g{seq}", engine=False, queue=gate),)))
    [diff] = replay.differences
    assert diff.gang_id == "ns/g2" and diff.recorded.startswith("fair shares: ") and diff.replayed == "fair shares: default 0, team-a 0.94, team-b 15.06"
    assert replay.replicas["r1"].queue_checks == 2
