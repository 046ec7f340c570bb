"""Minimum runtime before preemption (``spec.preemption.preemptMinRuntime`` and
``reclaimMinRuntime``, libs/phalanx_rules/preemption.py and the planner): a gang that started
less than its queue's minimum ago is no victim; the planner says from when the preemptor may
preempt (the plan it would make then, its youngest victim's coming of age) and answers that
time; once it has passed, the same gang is the victim. Whole ``Plan``/``NoPlan`` values."""

from __future__ import annotations

import msgspec
import pytest
from test_preempt import World, plan, q, v100, victim, wants

from phalanx_engine.preempt import NoPlan, Plan
from phalanx_proto.queues import GPU_UNITS
from phalanx_rules.preemption import duration_text, min_runtime, when_text
from phalanx_rules.queues import QueueTree

G = GPU_UNITS
T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def mins(spec, preempt: float | None = None, reclaim: float | None = None):
    return msgspec.structs.replace(spec, preempt_min_runtime_s=preempt, reclaim_min_runtime_s=reclaim)


def full(started: float, *, queue: str = "default", priority: int = 0) -> World:
    """One 8-GPU node held by one 8-GPU gang that started at ``started``."""
    return World(v100("a")).gang("lo", ("a", 0, 1, 2, 3, 4, 5, 6, 7), priority=priority, queue=queue,
                                 started=started)


def test_a_young_gang_is_no_victim_and_the_planner_says_from_when_it_is():
    got = plan(full(T0), wants("hi", 8), mins(q("default"), preempt=600.0), now=T0 + 60.0)
    assert isinstance(got, NoPlan)
    assert (got.code, got.retry_at) == ("min-runtime", T0 + 600.0)
    assert got.reason == (
        "not preempting yet: evicting ns/lo would let it start, but ns/lo (queue default, preemptMinRuntime 10m) "
        f"started too recently to be a victim; it may preempt from {when_text(T0 + 600.0)} and is tried again then")
    assert when_text(T0 + 600.0) == "2027-01-15T08:10:00Z"


@pytest.mark.parametrize("now", [T0 + 600.0, T0 + 601.5, T0 + 86400.0])
def test_once_it_has_run_its_minimum_it_is_the_victim(now):
    got = plan(full(T0), wants("hi", 8), mins(q("default"), preempt=600.0), now=now)
    assert isinstance(got, Plan)
    assert got.victims == (victim("lo", "priority", gpus=8),)


def test_priority_and_reclaim_minimums_are_separate():
    """team-b's gang is protected from reclaim for 10 minutes but from priority preemption only
    for one: a team-a gang (below its quota) may not reclaim it after 2 minutes, while a
    team-b gang of higher priority may preempt it."""
    queues = (q("team-a", quota=8), mins(q("team-b"), preempt=60.0, reclaim=600.0))
    world = full(T0, queue="team-b")
    reclaim = plan(world, wants("a-hi", 8, queue="team-a", priority=0), *queues, now=T0 + 120.0)
    assert isinstance(reclaim, NoPlan) and (reclaim.code, reclaim.retry_at) == ("min-runtime", T0 + 600.0)
    assert "reclaimMinRuntime 10m" in reclaim.reason
    within = plan(world, wants("b-hi", 8, queue="team-b", priority=10), *queues, now=T0 + 120.0)
    assert isinstance(within, Plan) and within.victims == (victim("lo", "priority", gpus=8, queue="team-b"),)
    later = plan(world, wants("a-hi", 8, queue="team-a", priority=0), *queues, now=T0 + 600.0)
    assert isinstance(later, Plan) and later.victims == (victim("lo", "reclaim", gpus=8, queue="team-b"),)


def test_an_old_enough_gang_is_taken_before_waiting_for_a_young_one():
    """Two 4-GPU gangs of priority 0 on one node: the young one would be the planner's first
    choice by GPU-seconds lost, but only the old one may go now, and 8 GPUs need both — so
    the preemptor waits for the young one, and the time said is the young one's."""
    world = (World(v100("a")).gang("old", ("a", 0, 1, 2, 3), started=T0 - 3600.0)
             .gang("young", ("a", 4, 5, 6, 7), started=T0))
    got = plan(world, wants("hi", 8), mins(q("default"), preempt=300.0), now=T0 + 10.0)
    assert isinstance(got, NoPlan) and got.retry_at == T0 + 300.0
    assert "ns/young (queue default, preemptMinRuntime 5m)" in got.reason and "ns/old," in got.reason
    half = plan(world, wants("hi", 4), mins(q("default"), preempt=300.0), now=T0 + 10.0)
    assert isinstance(half, Plan) and [v.gang_id for v in half.victims] == ["ns/old"]


def test_a_child_without_the_setting_takes_its_parents_and_an_unknown_start_protects_nothing():
    tree = QueueTree.of((mins(q("org"), reclaim=900.0), q("team-x", parent="org"),
                         mins(q("team-y", parent="org"), reclaim=0.0)))
    assert min_runtime(tree, "team-x", "reclaim") == 900.0
    assert min_runtime(tree, "team-y", "reclaim") == 0.0
    assert min_runtime(tree, "team-x", "priority") == 0.0
    got = plan(full(None), wants("hi", 8), mins(q("default"), preempt=600.0), now=T0)  # type: ignore[arg-type]
    assert isinstance(got, Plan) and got.victims == (victim("lo", "priority", gpus=8),)


def test_no_plan_even_were_the_young_gangs_of_age_says_the_plain_reason():
    """A young gang that could not help anyway (the preemptor needs 16 GPUs of one node of 8)
    changes nothing in the reason: it is the engine's, and no time is promised."""
    got = plan(full(T0), wants("hi", 16), mins(q("default"), preempt=600.0), now=T0 + 1.0)
    assert isinstance(got, NoPlan) and got.code == "does-not-fit" and got.retry_at is None


@pytest.mark.parametrize(("seconds", "text"), [(600.0, "10m"), (90.0, "1m30s"), (5400.0, "1h30m"), (1.5, "1.5s"),
                                                (0.0, "0s")])
def test_durations_are_said_as_a_queue_writes_them(seconds, text):
    assert duration_text(seconds) == text
