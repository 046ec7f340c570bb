"""The pure pieces of the preemption wiring (docs/preemption.md, "Wiring"): who may preempt
(members agree on priority; ``Never`` waits), which running gangs are candidates, the
nominations placement writes and drops, the reasons, the ledger's rule for nominations, and
binder's checks of an eviction command against the ledger (a forged command evicts nothing).
"""

from __future__ import annotations

import anyio
import msgspec
import pytest

from phalanx_binder.evictions import Evictions
from phalanx_engine.preempt import Plan, Victim
from phalanx_engine.snapshot import Decision
from phalanx_kube.port import EvictionBlocked
from phalanx_placement import preempting
from phalanx_proto import subjects as S
from phalanx_proto.events import Assignment, EvictionRefused, EvictPods, MemberSpec, PodRef
from phalanx_proto.kvrules import ledger_problem
from phalanx_proto.queues import GPU_UNITS
from phalanx_proto.state import Allocation, GangState, NodeLedger, Nomination, alloc_key
from phalanx_rules.preemption import preemptor_of

pytestmark = pytest.mark.anyio

NOW = 1_000.0


def ref(name: str) -> PodRef:
    return PodRef(namespace="ns", name=name, uid=f"uid-{name}")


def member(name: str, gpus: int = 4, priority: int = 0, policy: str = "") -> MemberSpec:
    return MemberSpec(pod=ref(name), gpus=gpus, priority=priority, preemption_policy=policy)


def alloc(gang: str, pod: str, node: str, *gpus: int, attempt: int = 1) -> Allocation:
    return Allocation(gang_id=gang, attempt=attempt, assignment=Assignment(pod=ref(pod), node=node, gpus=gpus))


def nomination(gang: str, pod: str, node: str, *gpus: int, victims=None, attempt: int = 1,
               expires_at: float = NOW + 60) -> Nomination:
    return Nomination(gang_id=gang, attempt=attempt, assignment=Assignment(pod=ref(pod), node=node, gpus=gpus),
                      victims=victims if victims is not None else {"ns/low": "priority"}, expires_at=expires_at)


def ledger(node: str, *allocs: Allocation, noms: tuple[Nomination, ...] = ()) -> NodeLedger:
    return NodeLedger(node=node, allocations={alloc_key(a.assignment.pod): a for a in allocs},
                      nominations={alloc_key(n.assignment.pod): n for n in noms})


# -- who preempts --------------------------------------------------------------------------------

def test_members_that_agree_preempt_with_their_priority_and_queue():
    p = preemptor_of("ns/hi", (member("a", priority=7), member("b", priority=7)), "team-a")
    assert (p.gang_id, p.priority, p.queue, p.preemption_policy) == ("ns/hi", 7, "team-a", "PreemptLowerPriority")


def test_members_that_disagree_on_priority_are_refused_with_the_priorities_named():
    assert preemptor_of("ns/hi", (member("a", priority=7), member("b", priority=3)), "default") == (
        "its members disagree on spec.priority (3, 7): a gang preempts only when all its pods have one priority "
        "(one PriorityClass)")


def test_one_member_with_preemption_policy_never_makes_the_gang_wait():
    p = preemptor_of("ns/hi", (member("a", priority=7), member("b", priority=7, policy="Never")), "default")
    assert p.preemption_policy == "Never"


# -- candidates ------------------------------------------------------------------------------------

def records(**phases_and_priorities) -> dict[str, GangState]:
    return {f"ns/{g}": GangState(gang_id=f"ns/{g}", phase=ph, priority=prio, attempt_started_at=50.0,
                                 members=(member(f"{g}-0", priority=prio),))
            for g, (ph, prio) in phases_and_priorities.items()}


def test_candidates_leave_out_the_preemptor_gangs_rolling_back_gangs_promised_to_another_and_refused_ones():
    ledgers = [ledger("a", alloc("ns/low", "low-0", "a", 0), alloc("ns/hi", "hi-0", "a", 1),
                      alloc("ns/going", "going-0", "a", 2), alloc("ns/promised", "promised-0", "a", 3),
                      alloc("ns/refused", "refused-0", "a", 4), alloc("ns/other", "other-0", "a", 5),
                      noms=(nomination("ns/rival", "rival-0", "a", 3, victims={"ns/promised": "priority"}),))]
    recs = records(low=("scheduled", 2), hi=("placing", 9), going=("rolling_back", 0), promised=("scheduled", 0),
                   refused=("scheduled", 0), other=("scheduled", 4))
    got = preempting.candidates(ledgers, recs.get, "ns/hi", NOW, refused=("ns/refused",))
    assert [(g.gang_id, g.priority, g.started_at) for g in got] == [("ns/low", 2, 50.0), ("ns/other", 4, 50.0)]


def test_a_gang_whose_pods_are_all_gone_is_no_candidate_while_its_reservations_wait_for_the_agents():
    # Its record is the tombstone (no members, priority 0): its pods were deleted, and the
    # reservations stay until the nodes' agents report the pods gone. Evicting it frees nothing
    # that is not freed anyway, and its priority is no longer its pods' (found on the real API
    # server: a deleted priority-100 gang was planned as a priority-0 victim of a priority-1 one).
    ledgers = [ledger("a", alloc("ns/deleted", "deleted-0", "a", 0, 1), alloc("ns/low", "low-0", "a", 2, 3))]
    recs = {**records(low=("scheduled", 2)), "ns/deleted": GangState(gang_id="ns/deleted", attempt=3)}
    got = preempting.candidates(ledgers, recs.get, "ns/hi", NOW)
    assert [(g.gang_id, g.priority) for g in got] == [("ns/low", 2)]


def test_an_expired_nomination_promises_nothing():
    ledgers = [ledger("a", alloc("ns/promised", "promised-0", "a", 3),
                      noms=(nomination("ns/rival", "rival-0", "a", 3, victims={"ns/promised": "priority"},
                                       expires_at=NOW - 1),))]
    assert [g.gang_id for g in preempting.candidates(ledgers, lambda g: None, "ns/hi", NOW)] == ["ns/promised"]


# -- nominations ---------------------------------------------------------------------------------------

def plan_on(node: str, *gpus: int) -> Plan:
    return Plan(victims=(Victim(gang_id="ns/low", queue="default", priority=1, rule="priority", units=4 * GPU_UNITS,
                                pods=(ref("low-0"),)),),
                placement=Decision(assignments=(Assignment(pod=ref("hi-0"), node=node, gpus=gpus),)),
                units=4 * GPU_UNITS)


def test_a_plan_is_nominated_beside_the_reservations_and_an_earlier_nomination_elsewhere_is_dropped():
    led = {"a": ledger("a", alloc("ns/low", "low-0", "a", 0, 1, 2, 3)),
           "b": ledger("b", noms=(nomination("ns/hi", "hi-0", "b", 0, 1, 2, 3),
                                  nomination("ns/old", "old-0", "b", 4, expires_at=NOW - 1)))}
    p = preemptor_of("ns/hi", (member("hi-0", priority=9),), "team-a")
    writes = preempting.nominate(led.get, S.token, {"b"}, "ns/hi", 3, plan_on("a", 0, 1, 2, 3), p,
                                 expires_at=NOW + 120, now=NOW)
    assert writes == {
        "a": ledger("a", alloc("ns/low", "low-0", "a", 0, 1, 2, 3), noms=(Nomination(
            gang_id="ns/hi", attempt=3, assignment=Assignment(pod=ref("hi-0"), node="a", gpus=(0, 1, 2, 3)),
            victims={"ns/low": "priority"}, queue="team-a", priority=9, expires_at=NOW + 120),)),
        "b": ledger("b"),
    }
    assert all(ledger_problem(S.token(k), v) == "" for k, v in writes.items())


def test_without_nominations_drops_the_gangs_and_the_expired_ones_and_keeps_the_rest():
    keep = nomination("ns/other", "other-0", "a", 5)
    led = ledger("a", alloc("ns/low", "low-0", "a", 0), noms=(
        nomination("ns/hi", "hi-0", "a", 1), nomination("ns/old", "old-0", "a", 2, expires_at=NOW), keep))
    assert preempting.without_nominations(led, "ns/hi", NOW) == ledger("a", alloc("ns/low", "low-0", "a", 0),
                                                                       noms=(keep,))
    assert preempting.without_nominations(ledger("a", noms=(keep,)), "ns/hi", NOW) == ledger("a", noms=(keep,))


def test_a_nomination_under_another_pods_key_or_for_another_node_breaks_the_ledgers_rule():
    n = nomination("ns/hi", "hi-0", "b", 0)
    assert "does not name its pod" in ledger_problem("a", NodeLedger(node="a", nominations={alloc_key(ref("hi-0")): n}))
    assert "does not name its pod" in ledger_problem("a", NodeLedger(node="a", nominations={"x": n}))


def test_the_reasons_name_the_victims_their_priority_queue_and_rule_the_gpus_and_the_nodes():
    assert preempting.preempting_reason(plan_on("n3", 0, 1, 2, 3)) == (
        "preempting ns/low (priority 1, queue default, rule priority) to free 4 GPUs on n3")
    assert preempting.waiting_reason([nomination("ns/hi", "hi-0", "n3", 0)], ["ns/low"]) == (
        "waiting for the preempted gang(s) ns/low to release their GPUs (nominated on n3)")


# -- promotion: the nomination becomes the reservation once the victims' GPUs are free ------------------

PREEMPTOR = GangState(gang_id="ns/hi", phase="preempting", attempt=3, members=(member("hi-0", 4), member("hi-1", 4)))


def nominated(node: str, pod: str, *gpus: int, **kw) -> Nomination:
    return nomination("ns/hi", pod, node, *gpus, attempt=3, **kw)


def test_a_nomination_whose_gpus_are_free_on_every_node_becomes_the_preemptors_reservation_and_ends():
    other = nomination("ns/other", "other-0", "b", 7)
    led = {"a": ledger("a", alloc("ns/keep", "keep-0", "a", 4), noms=(nominated("a", "hi-0", 0, 1, 2, 3),)),
           "b": ledger("b", noms=(nominated("b", "hi-1", 0, 1, 2, 3), other))}
    got = preempting.promotion(led.get, {"a", "b"}, PREEMPTOR, NOW, queues=("team-a",))
    assert got == {
        "a": ledger("a", alloc("ns/keep", "keep-0", "a", 4), Allocation(
            gang_id="ns/hi", attempt=3, assignment=Assignment(pod=ref("hi-0"), node="a", gpus=(0, 1, 2, 3)),
            queues=("team-a",))),
        "b": ledger("b", Allocation(gang_id="ns/hi", attempt=3, assignment=Assignment(
            pod=ref("hi-1"), node="b", gpus=(0, 1, 2, 3)), queues=("team-a",)), noms=(other,)),
    }
    assert all(ledger_problem(S.token(k), v) == "" for k, v in got.items())


@pytest.mark.parametrize(("case", "ledgers", "usable"), [
    ("a victim still holds a nominated GPU on one of the nodes (its pod still runs there)",
     {"a": ledger("a", noms=(nominated("a", "hi-0", 0, 1, 2, 3),)),
      "b": ledger("b", alloc("ns/low", "low-0", "b", 3), noms=(nominated("b", "hi-1", 0, 1, 2, 3),))}, True),
    ("a member has no nomination",
     {"a": ledger("a", noms=(nominated("a", "hi-0", 0, 1, 2, 3),))}, True),
    ("the nomination is of another attempt",
     {"a": ledger("a", noms=(nomination("ns/hi", "hi-0", "a", 0, attempt=2),
                             nomination("ns/hi", "hi-1", "a", 1, attempt=2)))}, True),
    ("the nomination expired",
     {"a": ledger("a", noms=(nominated("a", "hi-0", 0, expires_at=NOW), nominated("a", "hi-1", 1, expires_at=NOW)))},
     True),
    ("a nominated node is unavailable now",
     {"a": ledger("a", noms=(nominated("a", "hi-0", 0), nominated("a", "hi-1", 1)))}, False),
])
def test_a_nomination_is_not_promoted_while(case, ledgers, usable):
    assert preempting.promotion(ledgers.get, set(ledgers), PREEMPTOR, NOW, usable=lambda key: usable) is None


# -- binder's checks -------------------------------------------------------------------------------------

class Book:
    """What ``Evictions`` reads of ``LedgerBook``, over fixed ledgers."""

    def __init__(self, *ledgers: NodeLedger) -> None:
        self.all = ledgers
        self.caught_up = 0

    def nominations(self, gang_id: str, attempt: int, now: float) -> list[Nomination]:
        return [n for led in self.all for n in led.nominations.values()
                if n.gang_id == gang_id and n.attempt == attempt and n.active(now)]

    def gang_pods(self, gang_id: str) -> list[PodRef]:
        return sorted((a.assignment.pod for led in self.all for a in led.allocations.values() if a.gang_id == gang_id),
                      key=alloc_key)

    async def catch_up(self) -> None:
        self.caught_up += 1


class Cluster:
    def __init__(self, blocked: frozenset[str] = frozenset(), budgets: frozenset[str] = frozenset()) -> None:
        self.blocked = blocked
        self.budgets = blocked | budgets
        """The pods a PodDisruptionBudget selects (those it refuses among them)."""
        self.evicted: list[str] = []
        self.tried: list[str] = []
        self.events: list[tuple[str, str]] = []

    async def budgeted(self, refs) -> set[PodRef]:
        return {r for r in refs if r.name in self.budgets}

    async def evict_pod(self, ref: PodRef, *, dry_run: bool = False) -> bool:
        self.tried.append(ref.name)
        if ref.name in self.blocked:
            raise EvictionBlocked(f"evicting {ref}: Cannot evict pod as it would violate the pod's disruption budget.")
        if not dry_run:
            self.evicted.append(ref.name)
        return True

    async def record_event(self, ref: PodRef, *, reason: str, message: str, type: str = "Normal") -> None:
        self.events.append((ref.name, reason))


class Bus:
    def __init__(self) -> None:
        self.sent: list[tuple[str, object]] = []

    async def publish(self, subject: str, event) -> None:
        self.sent.append((subject, event))


def world(**victims_of_nomination) -> tuple[Book, Cluster, Bus]:
    led = ledger("a", alloc("ns/low", "low-0", "a", 0, 1), alloc("ns/low", "low-1", "a", 2, 3),
                 alloc("ns/keep", "keep-0", "a", 4, 5),
                 noms=(nomination("ns/hi", "hi-0", "a", 0, 1, 2, 3, victims=victims_of_nomination or None),))
    return Book(led), Cluster(), Bus()


@pytest.mark.parametrize("forged", [
    pytest.param(EvictPods(gang_id="ns/thief", attempt=1, victims=("ns/keep",)), id="no nomination of that gang"),
    pytest.param(EvictPods(gang_id="ns/hi", attempt=2, victims=("ns/low",)), id="another attempt's"),
    pytest.param(EvictPods(gang_id="ns/hi", attempt=1, victims=("ns/keep",)), id="a victim the nomination does not name"),
    pytest.param(EvictPods(gang_id="ns/hi", attempt=1, victims=("ns/low", "ns/keep")), id="one victim too many"),
    pytest.param(EvictPods(gang_id="ns/hi", attempt=1), id="no victim"),
])
async def test_a_forged_eviction_evicts_nothing_and_sends_nothing(forged):
    book, cluster, bus = world()
    await Evictions(bus, cluster, book, clock=lambda: NOW).evict(forged)
    assert (cluster.tried, cluster.events, bus.sent, book.caught_up) == ([], [], [], 1)


async def test_an_expired_nomination_evicts_nothing():
    book, cluster, bus = world()
    await Evictions(bus, cluster, book, clock=lambda: NOW + 61).evict(
        EvictPods(gang_id="ns/hi", attempt=1, victims=("ns/low",)))
    assert cluster.tried == []


async def test_every_pod_the_ledger_holds_for_the_named_victim_is_evicted_once_and_then_told_why():
    # No disruption budget selects them: nothing can refuse their eviction, so no dry run.
    book, cluster, bus = world()
    await Evictions(bus, cluster, book, clock=lambda: NOW).evict(
        EvictPods(gang_id="ns/hi", attempt=1, victims=("ns/low",)))
    assert cluster.tried == ["low-0", "low-1"]
    assert cluster.evicted == ["low-0", "low-1"]
    assert cluster.events == [("low-0", "Preempted"), ("low-1", "Preempted")]
    assert bus.sent == []


async def test_only_a_pod_a_disruption_budget_selects_is_tried_as_a_dry_run_first():
    book, _, bus = world()
    cluster = Cluster(budgets=frozenset({"low-1"}))
    await Evictions(bus, cluster, book, clock=lambda: NOW).evict(
        EvictPods(gang_id="ns/hi", attempt=1, victims=("ns/low",)))
    assert cluster.tried == ["low-1", "low-0", "low-1"]
    assert cluster.evicted == ["low-0", "low-1"]
    assert bus.sent == []


async def test_a_disruption_budget_refusing_one_pod_evicts_none_and_tells_placement_and_the_preemptor():
    book, _, bus = world()
    cluster = Cluster(blocked=frozenset({"low-1"}))
    with anyio.fail_after(5):
        await Evictions(bus, cluster, book, clock=lambda: NOW).evict(
            EvictPods(gang_id="ns/hi", attempt=1, victims=("ns/low",)))
    assert cluster.evicted == []
    assert cluster.events == [("hi-0", "PreemptionBlocked")]
    [(subject, refused)] = bus.sent
    assert subject == S.eviction_refused_subject("ns/hi")
    assert msgspec.structs.replace(refused, reason="") == EvictionRefused(gang_id="ns/hi", attempt=1,
                                                                          victims=("ns/low",))
    assert "disruption budget" in refused.reason


class SlowCluster(Cluster):
    """Every request takes a moment, as on a real API server; counts the requests in flight."""

    def __init__(self, blocked_late: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.blocked_late = blocked_late
        self.in_flight = self.most = 0

    async def evict_pod(self, ref: PodRef, *, dry_run: bool = False) -> bool:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            if not dry_run and ref.name in self.blocked_late:
                raise EvictionBlocked(f"evicting {ref}: the budget changed since the dry run")
            await anyio.sleep(0.01)
            return await super().evict_pod(ref, dry_run=dry_run)
        finally:
            self.in_flight -= 1


def wide_world(pods: int) -> Book:
    """One victim gang of ``pods`` one-GPU pods over ``pods // 8`` nodes, all nominated for ns/hi."""
    ledgers = [ledger(f"n{k}", *(alloc("ns/low", f"low-{k * 8 + g}", f"n{k}", g) for g in range(8)),
                      noms=(nomination("ns/hi", f"hi-{k}", f"n{k}", *range(8)),)) for k in range(pods // 8)]
    return Book(*ledgers)


async def test_a_victim_of_many_pods_is_evicted_many_at_a_time_not_one_by_one():
    # The kwok benchmark (docs/preemption.md, Measured): one request at a time, ~100 ms each on
    # the API server, a preemptor whose victims held 50 pods waited 5 s for its evictions.
    from phalanx_binder.evictions import EVICT_PODS_AT_ONCE

    cluster = SlowCluster()
    with anyio.fail_after(5):
        await Evictions(Bus(), cluster, wide_world(64), clock=lambda: NOW).evict(
            EvictPods(gang_id="ns/hi", attempt=1, victims=("ns/low",)))
    assert sorted(cluster.evicted) == sorted(f"low-{i}" for i in range(64))
    assert len(cluster.events) == 64
    assert cluster.most == EVICT_PODS_AT_ONCE


async def test_a_budget_that_changes_after_the_dry_run_stops_further_evictions_and_is_reported_once():
    cluster = SlowCluster(blocked_late=frozenset({"low-20"}))
    bus = Bus()
    with anyio.fail_after(5):
        await Evictions(bus, cluster, wide_world(64), clock=lambda: NOW).evict(
            EvictPods(gang_id="ns/hi", attempt=1, victims=("ns/low",)))
    assert 0 < len(cluster.evicted) < 64  # those under way beside it finish; none starts after it
    assert "low-20" not in cluster.evicted and "low-63" not in cluster.evicted
    [(subject, refused)] = bus.sent
    assert (subject, refused.victims) == (S.eviction_refused_subject("ns/hi"), ("ns/low",))
    assert "changed since the dry run" in refused.reason
