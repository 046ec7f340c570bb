"""The open preemption's promotion, placement's side (docs/preemption.md, "The attempt stays
open"), against an in-memory ledger that keeps revisions and refuses a stale compare-and-set as
NATS does:

* the release that frees a victim's last GPU on the nominated GPUs writes the preemptor's
  reservation, and drops its nomination, in **the same batch** (one compare-and-set), then
  answers ``Reserved``; a release that leaves a victim's reservation on a nominated GPU
  promotes nothing;
* a promotion committed whose ``Reserved`` was lost (placement killed between the two) is
  answered again by the nomination pass, after ``RESEND_S`` and not before;
* two replicas promoting the same nomination: one compare-and-set wins, the other builds again
  on the ledger as it is now, finds the reservation there, and writes and answers nothing.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from phalanx_bus import KvConflict, TemporaryError
from phalanx_placement import nominations
from phalanx_placement.cache import ClusterCache
from phalanx_placement.holdings import Holdings
from phalanx_proto.events import Assignment, MemberSpec, PodRef, Released, ReleaseRequested, Reserved
from phalanx_proto.state import Allocation, GangState, NodeLedger, Nomination, alloc_key, members_digest

pytestmark = pytest.mark.anyio

NOW = 1_000.0
HI, LOW = "ns/hi", "ns/low"


def ref(name: str) -> PodRef:
    return PodRef(namespace="ns", name=name, uid=f"uid-{name}")


def alloc(gang: str, pod: str, *gpus: int, attempt: int = 1, queues: tuple[str, ...] = ()) -> Allocation:
    return Allocation(gang_id=gang, attempt=attempt, assignment=Assignment(pod=ref(pod), node="a", gpus=gpus),
                      queues=queues)


NOMINATION = Nomination(gang_id=HI, attempt=3, assignment=Assignment(pod=ref("hi-0"), node="a", gpus=tuple(range(8))),
                        victims={LOW: "priority"}, expires_at=NOW + 60)
PREEMPTOR = GangState(gang_id=HI, phase="preempting", attempt=3, members=(MemberSpec(pod=ref("hi-0"), gpus=8),))
VICTIM = GangState(gang_id=LOW, phase="rolling_back", attempt=1,
                   members=(MemberSpec(pod=ref("low-0"), gpus=4), MemberSpec(pod=ref("low-1"), gpus=4)))
FULL = NodeLedger(node="a", allocations={alloc_key(ref(p)): alloc(LOW, p, *g)
                                         for p, g in (("low-0", (0, 1, 2, 3)), ("low-1", (4, 5, 6, 7)))},
                  nominations={alloc_key(ref("hi-0")): NOMINATION})
PROMOTED = NodeLedger(node="a", allocations={alloc_key(ref("hi-0")): Allocation(
    gang_id=HI, attempt=3, assignment=NOMINATION.assignment, queues=("default",))})


class Kv:
    """The ledger bucket: values and revisions; a batch commits only if every key it writes is
    at the revision its writer last saw."""

    def __init__(self, ledgers: dict[str, NodeLedger]) -> None:
        self.values = dict(ledgers)
        self.revisions = dict.fromkeys(ledgers, 1)
        self.batches: list[dict] = []


class Replica:
    """One placement replica's view of the ledger (its cache) and its ``Commits.rewrite``."""

    def __init__(self, kv: Kv, records: dict[str, GangState]) -> None:
        self.kv, self.records, self.now = kv, records, NOW
        self.ledgers, self.seen = dict(kv.values), dict(kv.revisions)
        self.gangs = SimpleNamespace(catch_up=self._noop)
        self.node_states = None
        self.conflicts = 0
        self.sent: list = []
        self.published: list = []
        queues = SimpleNamespace(chain=lambda members: ("default",), usage_writes=lambda gang, writes: {})
        self.holdings = Holdings(SimpleNamespace(), self, SimpleNamespace(), queues, self._write, self.rewrite,
                                 SimpleNamespace(send=self._send))
        self.pass_ = nominations.Nominations(SimpleNamespace(publish=self._publish), self,
                                             SimpleNamespace(nomination_s=60.0), self.holdings, self.rewrite,
                                             SimpleNamespace(send=self._send))

    async def _noop(self) -> None:
        return None

    async def _send(self, event) -> None:
        self.sent.append(event)

    async def _publish(self, subject, event) -> None:
        self.published.append(event)

    async def _write(self, commit) -> None:
        raise AssertionError("not used here")

    # -- the cache's surface ----------------------------------------------------------------
    @property
    def preempting(self) -> set[str]:
        return {g for g, r in self.records.items() if r.phase == "preempting"}

    def clock(self) -> float:
        return self.now

    def gang(self, gang_id: str) -> GangState | None:
        return self.records.get(gang_id)

    def ledger_of(self, key: str) -> NodeLedger | None:
        return self.ledgers.get(key)

    def gang_keys(self, gang_id: str) -> frozenset[str]:
        return frozenset(k for k, led in self.ledgers.items()
                         if any(a.gang_id == gang_id for a in led.allocations.values())
                         or any(n.gang_id == gang_id for n in led.nominations.values()))

    def usable(self, key: str) -> bool:
        return True

    victim_holds = ClusterCache.victim_holds

    async def catch_up(self) -> None:
        self.ledgers, self.seen = dict(self.kv.values), dict(self.kv.revisions)

    # -- Commits.rewrite, with the compare-and-set ------------------------------------------------
    async def rewrite(self, build, *, what: str, pause_s: float = 0.0) -> bool:
        for _ in range(3):
            writes = build()
            if not writes:
                return False
            try:
                self.commit(writes)
                return True
            except KvConflict:
                self.conflicts += 1
                await self.catch_up()
        raise TemporaryError(what)

    def commit(self, writes: dict) -> None:
        if any(self.kv.revisions.get(k, 0) != self.seen.get(k, 0) for k in writes):
            raise KvConflict("wrong last sequence")
        self.kv.batches.append(dict(writes))
        for k, v in writes.items():
            self.kv.values[k] = v
            self.kv.revisions[k] = self.kv.revisions.get(k, 0) + 1
        self.ledgers.update(writes)
        self.seen.update({k: self.kv.revisions[k] for k in writes})


def release(*pods: str) -> ReleaseRequested:
    return ReleaseRequested(gang_id=LOW, attempt=1, pods=tuple(ref(p) for p in pods), reason="preempted")


RESERVED = Reserved(gang_id=HI, attempt=3, members_digest=members_digest(PREEMPTOR))


async def test_the_release_that_frees_the_victims_last_gpus_promotes_the_nomination_in_the_same_batch():
    kv = Kv({"a": FULL})
    r = Replica(kv, {HI: PREEMPTOR, LOW: VICTIM})
    await r.holdings.on_release(release("low-0"))
    # low-1 still holds GPUs 4-7 of the nomination: low-0's GPUs are freed, nothing promoted
    assert kv.batches == [{"a": NodeLedger(node="a", allocations={alloc_key(ref("low-1")): FULL.allocations[
        alloc_key(ref("low-1"))]}, nominations=FULL.nominations)}]
    assert r.sent == [Released(gang_id=LOW, attempt=1, pods=(ref("low-0"),))]
    await r.holdings.on_release(release("low-1"))
    # one compare-and-set frees low-1 and writes hi-0's reservation for attempt 3, the nomination gone
    assert kv.batches[1:] == [{"a": PROMOTED}]
    assert r.sent[1:] == [RESERVED, Released(gang_id=LOW, attempt=1, pods=(ref("low-1"),))]


async def test_a_release_promotes_nothing_for_a_preemptor_no_longer_waiting_at_that_attempt():
    kv = Kv({"a": FULL})
    r = Replica(kv, {HI: GangState(gang_id=HI, phase="backoff", attempt=3, members=PREEMPTOR.members),
                     LOW: VICTIM})
    await r.holdings.on_release(release("low-0", "low-1"))
    assert kv.batches == [{"a": NodeLedger(node="a", nominations=FULL.nominations)}]
    assert r.sent == [Released(gang_id=LOW, attempt=1, pods=(ref("low-0"), ref("low-1")))]


async def test_a_promotion_whose_reserved_was_lost_is_answered_again_by_the_nomination_pass():
    # committed by a placement killed before its reply: the ledger holds hi-0, the record still preempting
    r = Replica(Kv({"a": PROMOTED}), {HI: PREEMPTOR})
    await r.pass_.once()
    assert r.sent == []  # a reply may still be on its way
    r.now += nominations.RESEND_S - 0.1
    await r.pass_.once()
    assert r.sent == []
    r.now += 0.1
    await r.pass_.once()
    assert r.sent == [RESERVED]
    assert r.kv.batches == []  # nothing written again


async def test_two_replicas_promoting_the_same_nomination_book_it_once_and_answer_once():
    kv = Kv({"a": NodeLedger(node="a", nominations=FULL.nominations)})  # the victims' GPUs are free
    first, second = Replica(kv, {HI: PREEMPTOR}), Replica(kv, {HI: PREEMPTOR})
    await first.pass_.once()
    # the second built its promotion on the ledger as it was before the first's commit
    await second.pass_.once()
    assert kv.batches == [{"a": PROMOTED}]
    assert kv.values["a"] == PROMOTED
    assert (first.sent, first.conflicts) == ([RESERVED], 0)
    assert (second.sent, second.conflicts) == ([], 1)


async def test_victims_slow_to_go_get_their_eviction_again_and_the_pods_a_new_reason():
    # nominated at NOW (its expiry less --nomination-s)
    r = Replica(Kv({"a": FULL}), {HI: PREEMPTOR, LOW: VICTIM})
    await r.pass_.once()
    assert (r.published, r.sent) == ([], [])
    r.now += nominations.RESEND_S
    await r.pass_.once()
    assert [(e.gang_id, e.attempt, e.victims) for e in r.published] == [(HI, 3, (LOW,))]
    assert [(type(e).__name__, e.reason) for e in r.sent] == [
        ("Preempting", "waiting for the preempted gang(s) ns/low to release their GPUs (nominated on a)")]
    await r.pass_.once()  # not again before another RESEND_S
    assert len(r.published) == 1


async def test_an_attempt_whose_nomination_ended_is_given_up_after_two_passes():
    expired = NodeLedger(node="a", nominations={alloc_key(ref("hi-0")): Nomination(
        gang_id=HI, attempt=3, assignment=NOMINATION.assignment, victims={LOW: "priority"}, expires_at=NOW)})
    r = Replica(Kv({"a": expired}), {HI: PREEMPTOR})
    await r.pass_.once()
    assert r.sent == []  # the ledger's mirror may be a moment behind the record: looked at again
    await r.pass_.once()
    assert [(type(e).__name__, e.attempt, e.members, e.waits_for) for e in r.sent] == [
        ("PlacementFailed", 3, (ref("hi-0"),), "gpus")]
    assert r.kv.values["a"] == NodeLedger(node="a")  # its nomination dropped
