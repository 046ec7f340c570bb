"""The fairness gate and order rules gang-coordinator and the simulator run
(libs/phalanx_rules/fairness.py), table-driven."""

from __future__ import annotations

import msgspec
import pytest

from phalanx_proto.state import GangState
from phalanx_rules import fairness
from phalanx_rules.fairness import Gate

HELD = "held back behind default/big, first in queue and waiting too long (fairness)"


def q(name, created, priority=0, phase="backoff", fits_empty=True, reserve=()):
    return GangState(gang_id=f"default/{name}", phase=phase, attempt=1, created_at=created, priority=priority,
                     fits_empty_cluster=fits_empty, reserve_nodes=reserve)


STRICT = [
    ("a gang behind a head that waited too long is held back", q("small", 50), [q("big", 0)], 100.0,
     Gate(hold=HELD, head="default/big")),
    ("a gang behind a head that has not waited long is not held back", q("small", 50), [q("big", 0)], 30.0, Gate()),
    ("the head itself is never held back", q("big", 0), [q("small", 50)], 100.0, Gate()),
    ("a gang of higher priority is never held back", q("urgent", 50, priority=10), [q("big", 0)], 100.0, Gate()),
    ("a scheduled gang is no head", q("small", 50), [q("big", 0, phase="scheduled")], 100.0, Gate()),
    ("a head that could never fit the cluster holds nobody back", q("small", 50), [q("big", 0, fits_empty=False)],
     1000.0, Gate()),
]


@pytest.mark.parametrize(("name", "gang", "others", "now", "expected"), STRICT, ids=[c[0] for c in STRICT])
def test_strict_gate(name, gang, others, now, expected):
    assert fairness.gate(gang, others, now=now, starve_after_s=60.0, mode="strict") == expected


BIG = q("big", 0, reserve=("n1", "n2"))
BACKFILL = [
    ("a gang behind a starving head starts, but not on the nodes kept for the head", q("small", 50), [BIG], 100.0,
     Gate(avoid=("n1", "n2"), head="default/big")),
    ("behind a head that is not starving yet a gang may use every node", q("small", 50), [BIG], 30.0, Gate()),
    ("the starving head itself may use every node", BIG, [q("small", 50)], 100.0, Gate()),
    ("a gang of higher priority may use every node", q("urgent", 50, priority=10), [BIG], 100.0, Gate()),
    ("behind a starving head whose nodes are unknown a gang is held back, as in strict mode", q("small", 50),
     [q("big", 0)], 100.0, Gate(hold=HELD, head="default/big")),
    ("only the first gang in queue order is protected", q("small", 50),
     [BIG, q("second", 10, reserve=("n3",))], 100.0, Gate(avoid=("n1", "n2"), head="default/big")),
]


@pytest.mark.parametrize(("name", "gang", "others", "now", "expected"), BACKFILL, ids=[c[0] for c in BACKFILL])
def test_backfill_gate(name, gang, others, now, expected):
    assert fairness.gate(gang, others, now=now, starve_after_s=60.0, mode="backfill") == expected


def test_strict_mode_holds_back_even_when_the_heads_nodes_are_known():
    assert fairness.gate(q("small", 50), [BIG], now=100.0, starve_after_s=60.0, mode="strict") == Gate(
        hold=HELD, head="default/big")


def test_the_gate_is_off_with_starve_after_zero():
    assert fairness.gate(q("small", 50), [q("big", 0)], now=1e9, starve_after_s=0) == Gate()


def test_each_gang_is_gated_on_its_queues_contenders_as_on_every_other_gang_of_the_queue():
    import random

    from phalanx_proto.events import MemberSpec, PodRef

    rng = random.Random(7)
    phases = ("waiting", "backoff", "placing", "scheduled")
    gangs = []
    for i in range(60):
        queue = rng.choice(("", "a", "b"))
        member = MemberSpec(pod=PodRef(namespace="default", name=f"p{i}", uid=f"u{i}"), gpus=1, queue=queue)
        g = q(f"g{i}", rng.uniform(0, 100), priority=rng.choice((0, 0, 5)), phase=rng.choice(phases),
              fits_empty=rng.random() < 0.8, reserve=("n1",) if rng.random() < 0.5 else ())
        gangs.append(msgspec.structs.replace(g, members=(member,), attempt=rng.choice((0, 1, 2))))
    contenders = fairness.contenders(gangs)
    for g in gangs:
        queue = fairness.queue_of(g)
        every = [o for o in gangs if o.gang_id != g.gang_id and fairness.queue_of(o) == queue]
        few = [o for o in contenders.get(queue, ()) if o.gang_id != g.gang_id]
        for mode in fairness.MODES:
            assert fairness.gate(g, few, now=300.0, starve_after_s=60.0, mode=mode) == \
                fairness.gate(g, every, now=300.0, starve_after_s=60.0, mode=mode), g.gang_id


def test_the_backoff_of_a_gang_refused_for_days_stays_at_its_cap():
    assert 45 <= fairness.backoff_delay(5000, base_s=1, max_s=60, gang_id="default/x") <= 75


def waiting(name: str, waits: str, *, queue: str = "", created: float = 0.0, until: float = 200.0) -> GangState:
    """A gang backing off after a failed placement that waits for ``waits``."""
    from phalanx_proto.events import MemberSpec, PodRef

    member = MemberSpec(pod=PodRef(namespace="default", name=name, uid=name), gpus=1, queue=queue)
    return GangState(gang_id=f"default/{name}", phase="backoff", attempt=1, created_at=created, members=(member,),
                     failure="placement_failed", backoff_until=until, waits_for=waits,
                     fits_empty_cluster=waits != "cluster")


HINTS = [waiting("gpus", "gpus", created=3), waiting("big", "cluster", created=1),
         waiting("at-limit-a", "queue", queue="a", created=2), waiting("at-limit-b", "queue", queue="b", created=4),
         waiting("old", "", created=0),  # a record from before the field: its fits_empty_cluster says
         msgspec.structs.replace(waiting("old-too-big", "cluster", created=0.5), waits_for="")]
WAKES = [
    ("a release wakes the gangs waiting for GPUs and for the queues it gave back to, never those that fit no "
     "node set", dict(freed=("a",)), ["default/old", "default/at-limit-a", "default/gpus"]),
    ("a release whose queues are unknown wakes every gang waiting at a queue", dict(freed=None),
     ["default/old", "default/at-limit-a", "default/gpus", "default/at-limit-b"]),
    ("a release to a parent queue wakes the gangs of its children at their limit",
     dict(freed=("org",), chain=lambda q: (q, "org")),
     ["default/old", "default/at-limit-a", "default/gpus", "default/at-limit-b"]),
    ("the wake-up is bounded", dict(freed=None, limit=2), ["default/old", "default/at-limit-a"]),
]


@pytest.mark.parametrize(("name", "kw", "expected"), WAKES, ids=[c[0] for c in WAKES])
def test_a_release_wakes_only_the_gangs_a_release_can_help(name, kw, expected):
    got = fairness.wake_order(HINTS, now=100.0, below_quota=lambda q: False, **kw)
    assert [s.gang_id for s in got] == expected


def test_a_cluster_change_wakes_the_gangs_that_fit_no_node_set_and_a_queue_change_those_at_their_queue():
    assert [s.gang_id for s in fairness.woken_by_cluster_change(HINTS, now=100.0)] == [
        "default/old-too-big", "default/big"]
    assert [s.gang_id for s in fairness.woken_by_queue_change(HINTS, now=100.0)] == [
        "default/at-limit-a", "default/at-limit-b"]
    assert fairness.woken_by_cluster_change(HINTS, now=300.0) == []  # their timers are over: resync starts them


def test_a_gang_that_fits_no_node_set_is_retried_on_a_five_minute_timer_and_the_others_back_off():
    big, gpus = waiting("big", "cluster"), waiting("gpus", "gpus")
    assert 225.0 <= fairness.retry_delay(big, 1, base_s=1.0, max_s=60.0) <= 375.0
    assert fairness.retry_delay(gpus, 1, base_s=1.0, max_s=60.0) == fairness.backoff_delay(
        1, base_s=1.0, max_s=60.0, gang_id=gpus.gang_id)
