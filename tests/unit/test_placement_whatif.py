"""Placement's use of the counterfactual probes (``phalanx_placement.whatif``): the budget is a
share of placement's time, answers are kept while nothing they depend on changes, and the
holders named come from the ledger and the gang records placement already mirrors."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import msgspec
from engine_builders import node, pod, snapshot

from phalanx_engine.decide import DEFAULT_PROFILE, Cluster
from phalanx_engine.whatif import Running
from phalanx_placement.whatif import Holders, ProbeBudget, Probes
from phalanx_proto.events import Assignment, MemberSpec, PodRef
from phalanx_proto.state import Allocation, GangState, NodeLedger, alloc_key
from phalanx_proto.whatif import Answer, Holder, WhatIf
from phalanx_rules.queues import QueueTree


class Clock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_the_budget_is_a_share_of_the_time_gone_by_and_never_more_than_its_burst():
    clock = Clock()
    b = ProbeBudget(share=0.05, burst_s=0.04, gang_s=0.03, clock=clock)
    assert b.grant() == 0.03  # full at the start, one gang gets gang_s
    b.spend(0.035)
    assert b.grant() == 0.0  # 5 ms left: the next gang goes without probes
    clock.t = 0.2  # 0.2 s later: 0.05 x 0.2 = 0.01 s earned, 15 ms in all: still short of a gang's 30
    assert b.grant() == 0.0
    clock.t = 0.5  # another 15 ms earned
    assert b.grant() == 0.03
    clock.t = 1000.0
    assert b.grant() == 0.03 and b.tokens == 0.04  # a long idle time saves up one burst, no more


def test_a_share_of_zero_turns_the_probes_off():
    assert ProbeBudget(share=0.0, clock=Clock()).grant() == 0.0


# --- the probes on a cache's view -------------------------------------------------------------

HELD = PodRef(namespace="a", name="train-7-0", uid="u7")


def members(n: int, gpus: int) -> tuple[MemberSpec, ...]:
    return tuple(msgspec.structs.replace(pod(f"w{i}").gpus(gpus).spec(), pod=PodRef(namespace="b", name=f"w-{i}"))
                 for i in range(n))


class FakeCache:
    """What ``Probes`` reads of ``ClusterCache``: the views, the ledgers, the gang records."""

    def __init__(self) -> None:
        self.held = Assignment(pod=HELD, node="n1", gpus=(0, 1, 2))
        view = replace(node("n1").gpus(4).view(), allocations=(self.held,))
        self.views = {"n1": view}
        self.cluster = Cluster.from_snapshot(snapshot(node("n1").gpus(4)))
        self.cluster.upsert(view)
        self.generation = 1
        self.queues = SimpleNamespace(revision=1)
        self.usage = SimpleNamespace(revision=1)
        self.records = {"a/train-7": GangState(gang_id="a/train-7", priority=5, attempt_started_at=400.0,
                                               members=(MemberSpec(pod=HELD, gpus=3, queue="team-a"),))}

    def ledger_of(self, key: str) -> NodeLedger | None:
        if key != "n1":
            return None
        return NodeLedger(node="n1", allocations={alloc_key(HELD): Allocation(gang_id="a/train-7", attempt=1,
                                                                              assignment=self.held)})

    def gang(self, gang_id: str):
        return self.records.get(gang_id)


class FakeQueues:
    def tree(self) -> QueueTree:
        return QueueTree.of(())

    def chain(self, members) -> tuple[str, ...]:
        return ()

    def held(self, queue: str) -> int:
        return 0

    def limited_held(self, chain) -> dict[str, int]:
        return {}

    def _replaced(self, gang_id, keep) -> dict[str, int]:
        return {}


def probes(clock: Clock | None = None, **budget) -> tuple[Probes, FakeCache]:
    cache = FakeCache()
    clock = clock or Clock()
    return Probes(cache, FakeQueues(), ProbeBudget(clock=clock, **budget), now=lambda: 1000.0), cache  # type: ignore[arg-type]


def test_holders_are_named_from_the_ledger_and_their_gang_records():
    cache = FakeCache()
    assert dict(Holders(cache)) == {HELD: Running(gang_id="a/train-7", queue="team-a", priority=5, since=400.0)}  # type: ignore[arg-type]


def test_a_gang_that_does_not_fit_is_told_which_gpus_must_free_and_who_holds_them():
    p, cache = probes()
    got = p.answer("b/w", members(1, 2), cache.cluster, DEFAULT_PROFILE, refusal="0/1 nodes")
    assert got is not None and got.answers[0] == Answer(
        probe="wait", text="would start if 1 GPU free on node n1 (held by gang a/train-7)", gpus=1, tier="node",
        domain="n1", holders=(Holder(gang_id="a/train-7", queue="team-a", priority=5, age_s=600.0, gpus=3),))
    assert got.top() == "would start if 1 GPU free on node n1 (held by gang a/train-7)"
    assert all(a.assignments == () for a in got.answers)  # bounded for the wire


def test_answers_are_kept_while_the_gang_its_refusal_and_the_cluster_stand_still():
    p, cache = probes()
    first = p.answer("b/w", members(1, 2), cache.cluster, DEFAULT_PROFILE, refusal="0/1 nodes")
    again = p.answer("b/w", members(1, 2), cache.cluster, DEFAULT_PROFILE, refusal="0/1 nodes")
    assert again is first and (p.runs, p.reused) == (1, 1)
    cache.generation += 1  # a node's view changed: asked again
    p.answer("b/w", members(1, 2), cache.cluster, DEFAULT_PROFILE, refusal="0/1 nodes")
    p.answer("b/w", members(1, 2), cache.cluster, DEFAULT_PROFILE, refusal="another reason")
    assert (p.runs, p.reused) == (3, 1)


def test_with_the_budget_spent_the_probes_are_skipped_and_no_answer_is_sent():
    clock = Clock()
    p, cache = probes(clock, share=0.01, burst_s=0.0)
    assert p.answer("b/w", members(1, 2), cache.cluster, DEFAULT_PROFILE, refusal="0/1 nodes") is None
    assert (p.runs, p.skipped, p.spent_s) == (0, 1, 0.0)


def test_answers_are_what_if_answers_bounded_for_the_wire():
    p, cache = probes()
    got = p.answer("b/w", members(2, 1), cache.cluster, DEFAULT_PROFILE, refusal="0/1 nodes")
    assert isinstance(got, WhatIf) and got == got.bounded()
    assert [(a.probe, a.text) for a in got.answers] == [
        ("wait", "would start if 1 GPU free on node n1 (held by gang a/train-7)"),
        ("fewer", "would start now with 1 of its 2 members")]
