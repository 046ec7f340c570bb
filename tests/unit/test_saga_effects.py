"""The saga's side effects as data (services/phalanx_gang_coordinator/effects.py), table-driven
like the transitions: a transition (or a re-drive, a compensation, a member gone) and what the
ledger holds for the attempt in, the whole tuple of effects out."""

from __future__ import annotations

import msgspec
import pytest

from phalanx_gang_coordinator import effects
from phalanx_gang_coordinator.effects import Compensate, Notify, Publish, ScheduleDeadline
from phalanx_proto import subjects as S
from phalanx_proto.dra import AllocatedDevice, ClaimAllocated, ClaimAllocation
from phalanx_proto.events import (
    Assignment,
    BindPods,
    GangAdmitted,
    GangDeadline,
    GangPending,
    GangScheduled,
    HeldClaims,
    MemberSpec,
    MigDestroyRequested,
    MigPrepareRequested,
    PlaceRequested,
    PodRef,
    ReleaseRequested,
    RollbackStarted,
    UnreserveClaims,
    uid_digest,
)
from phalanx_proto.state import GangState, Running
from phalanx_rules import saga

G = "default/JobSet:train"
P1, P2 = PodRef(namespace="default", name="w-0", uid="u0"), PodRef(namespace="default", name="w-1", uid="u1")
A1, A2 = Assignment(pod=P1, node="n1", gpus=(0,)), Assignment(pod=P2, node="n1", gpus=(1,))
M1 = Assignment(pod=P1, node="a100", gpus=(3,), mig_profile="3g.20gb", mig_start=4)
MEMBERS = (MemberSpec(pod=P1, gpus=1), MemberSpec(pod=P2, gpus=1))
replace = msgspec.structs.replace
NOW, TIMEOUT = 1000.0, 180.0


def gang(phase="waiting", attempt=0, **kw) -> GangState:
    return GangState(gang_id=G, phase=phase, attempt=attempt, min_member=2, **{"members": MEMBERS, **kw})


DIGEST = saga.members_digest(gang())
PLACING = gang("placing", 2, attempt_started_at=900.0)
BINDING = replace(PLACING, phase="binding")
PREPARING = replace(PLACING, phase="preparing")
PREEMPTING = replace(PLACING, phase="preempting", reason="preempting a/lo to free 2 GPUs on n1")
ROLLING = replace(BINDING, phase="rolling_back", reason="not every member was ready within 180 s")
BACKOFF = replace(ROLLING, phase="backoff", failures=1, backoff_until=NOW + 4, rollback_done=saga.COMPENSATIONS)
DEADLINE = ScheduleDeadline(GangDeadline(gang_id=G, attempt=2, members_digest=DIGEST), at=900.0 + TIMEOUT)
REQUEST = Publish(S.placement_subject(G), PlaceRequested(gang_id=G, attempt=2, members_digest=DIGEST))
BIND_ALL = Publish(S.binder_subject(G), BindPods(gang_id=G, attempt=2, pods=(P1, P2)))
BIND2 = Publish(S.binder_subject(G), BindPods(gang_id=G, attempt=2, pods=(P2,)))
HELD = (A1, A2)
CLAIMED = Assignment(pod=P2, node="a100", gpus=(5,), claims=(ClaimAllocated(
    claim="default/c/uc", pod_claim="gpus", allocation=ClaimAllocation(devices=(AllocatedDevice(
        request="gpu", driver="gpu.nvidia.com", pool="a100", device="gpu-5"),)), gpus=(5,)),))
"""What the ledger holds for the attempt (what ``held`` means below, unless a row says)."""


def pending(state, reason):
    return (Publish(S.status_subject(G), GangPending(gang_id=G, attempt=state.attempt, reason=reason),
                    msg_id=effects.pending(state, NOW)[0].msg_id),
            Notify((P1, P2), "FailedScheduling", reason))


ENTERED = [
    ("a new attempt schedules its deadline, announces itself and asks placement",
     replace(PLACING, phase="backoff", attempt=1), PLACING, (),
     (DEADLINE, Publish(S.status_subject(G), GangAdmitted(gang_id=G, attempt=2, members=(P1, P2), min_member=2)),
      REQUEST)),
    ("a new attempt announced later (announce_after_s) only asks placement",
     replace(PLACING, phase="backoff", attempt=1), PLACING, "later", (REQUEST,)),
    ("a backfill attempt's request is the same reference: the nodes to avoid are in its record",
     replace(PLACING, phase="backoff", attempt=1), replace(PLACING, avoid_nodes=("n2",), avoid_for="default/big"), (),
     (DEADLINE, Publish(S.status_subject(G), GangAdmitted(gang_id=G, attempt=2, members=(P1, P2), min_member=2)),
      REQUEST)),
    ("part of the members bound while placing (binds out without MIG) publishes nothing",
     PLACING, replace(BINDING, bound=(P1,)), HELD, ()),
    ("every member bound while placing announces the gang scheduled",
     PLACING, replace(PLACING, phase="scheduled", bound=(P1, P2)), HELD,
     (Publish(S.status_subject(G), GangScheduled(gang_id=G, attempt=2, assignments=(A1, A2))),)),
    ("placed with MIG asks the node for the instance only",
     PLACING, PREPARING, (M1, A2), (Publish(S.mig_subject("a100"), MigPrepareRequested(
         node="a100", gang_id=G, attempt=2, pod=P1, gpu=3, profile="3g.20gb", start=4)),)),
    ("the last MigReady asks binder for every member (binder reads the instance from phx-mig)",
     PREPARING, BINDING, (replace(M1, mig_instance_uuid="MIG-1"), A2), (BIND_ALL,)),
    ("one more member bound publishes nothing", BINDING, replace(BINDING, bound=(P1,)), HELD, ()),
    ("the last member bound announces the gang scheduled, with where the ledger holds its members",
     replace(BINDING, bound=(P1,)), replace(BINDING, phase="scheduled", bound=(P1, P2)), HELD,
     (Publish(S.status_subject(G), GangScheduled(gang_id=G, attempt=2, assignments=(A1, A2))),)),
    ("a failed attempt announces the rollback and compensates", BINDING, ROLLING, HELD,
     (Publish(S.status_subject(G), RollbackStarted(gang_id=G, attempt=2, reason=ROLLING.reason, members_digest=DIGEST)),
      Compensate(G, 2))),
    ("the end of the rollback tells the pods why and when the next try is", ROLLING, BACKOFF, (),
     pending(BACKOFF, f"{ROLLING.reason} (attempt 2); next try in 4s")),
    ("a placement failure tells the pods the reason",
     PLACING, replace(PLACING, phase="backoff", failures=1, reason="0/2 nodes are available.", backoff_until=NOW + 1),
     (), pending(replace(PLACING, phase="backoff", failures=1, reason="0/2 nodes are available.",
                         backoff_until=NOW + 1), "0/2 nodes are available. (attempt 2); next try in 1s")),
    ("a compensation recorded mid-rollback publishes nothing", ROLLING, replace(ROLLING, rollback_done=("unbind",)),
     HELD, ()),
    ("a nomination arms the deadline at once and tells the pods once why they wait (no retry time: none is due)",
     PLACING, PREEMPTING, "later",
     (DEADLINE, Publish(S.status_subject(G), GangAdmitted(gang_id=G, attempt=2, members=(P1, P2), min_member=2)),
      *pending(PREEMPTING, "preempting a/lo to free 2 GPUs on n1 (attempt 2)"))),
    ("a new reason while preempting tells the pods again",
     PREEMPTING, replace(PREEMPTING, reason="waiting for a/lo"), (),
     pending(replace(PREEMPTING, reason="waiting for a/lo"), "waiting for a/lo (attempt 2)")),
    ("every member of a promoted nomination bound announces the gang scheduled",
     PREEMPTING, replace(PREEMPTING, phase="scheduled", bound=(P1, P2)), HELD,
     (Publish(S.status_subject(G), GangScheduled(gang_id=G, attempt=2, assignments=(A1, A2))),)),
    ("a nomination given up tells the pods the reason and the retry",
     PREEMPTING, replace(PREEMPTING, phase="backoff", failures=1, reason="nomination ended", backoff_until=NOW + 1),
     (), pending(replace(PREEMPTING, phase="backoff", failures=1, reason="nomination ended", backoff_until=NOW + 1),
                 "nomination ended (attempt 2); next try in 1s")),
    ("a member added while waiting publishes nothing", gang(members=MEMBERS[:1]), gang(), (), ()),
]


@pytest.mark.parametrize(("name", "before", "after", "held", "expected"), ENTERED, ids=[c[0] for c in ENTERED])
def test_entered(name, before, after, held, expected):
    now = held != "later"
    assert effects.entered(before, after, now=NOW, timeout_s=TIMEOUT, held=held if now else (),
                           announce_now=now) == expected


def test_an_attempt_taking_a_while_is_announced_with_its_deadline():
    assert effects.announce(PLACING, timeout_s=TIMEOUT) == (
        DEADLINE, Publish(S.status_subject(G), GangAdmitted(gang_id=G, attempt=2, members=(P1, P2), min_member=2)))


def test_a_reservation_without_mig_asks_binder_for_every_member_in_one_command():
    assert effects.binds(PLACING) == (BIND_ALL,)
    assert effects.binds(replace(BINDING, bound=(P1,))) == (BIND2,)


REDRIVE = [
    ("a placing gang asks placement again and re-schedules its deadline", PLACING, (), (DEADLINE, REQUEST)),
    ("a placing gang the ledger holds whole without MIG asks binder too (its Reserved may have been taken)",
     PLACING, HELD, (DEADLINE, REQUEST, BIND_ALL)),
    ("a placing gang the ledger holds only in part asks placement alone", PLACING, (A1,), (DEADLINE, REQUEST)),
    ("a placing gang holding a MIG slice asks placement alone (the instance comes first)", PLACING, (M1, A2),
     (DEADLINE, REQUEST)),
    ("a binding gang asks again only for the members not bound yet", replace(BINDING, bound=(P1,)), HELD,
     (DEADLINE, BIND2)),
    ("a gang preparing MIG asks again only for instances not ready", PREPARING,
     (replace(M1, mig_instance_uuid="MIG-1"), replace(A2, mig_profile="1g.5gb", mig_start=0, node="a100")),
     (DEADLINE, Publish(S.mig_subject("a100"), MigPrepareRequested(
         node="a100", gang_id=G, attempt=2, pod=P2, gpu=1, profile="1g.5gb", start=0)))),
    ("a preempting gang re-schedules its deadline and asks placement for nothing (placement watches its nomination)",
     PREEMPTING, (), (DEADLINE,)),
    ("a preempting gang the ledger holds whole (its nomination promoted, the Reserved lost) asks binder",
     PREEMPTING, HELD, (DEADLINE, BIND_ALL)),
    ("a rollback left half-done is continued", ROLLING, HELD, (Compensate(G, 2),)),
    ("a scheduled gang waits for nothing", replace(BINDING, phase="scheduled"), HELD, ()),
    ("a gang in backoff waits for nothing", BACKOFF, (), ()),
]


@pytest.mark.parametrize(("name", "state", "held", "expected"), REDRIVE, ids=[c[0] for c in REDRIVE])
def test_redrive(name, state, held, expected):
    assert effects.redrive(state, timeout_s=TIMEOUT, held=held) == expected


COMPENSATIONS = [
    ("unbind has no command: the compensator deletes bound members itself", ROLLING, "unbind", HELD, ()),
    ("claims sends nothing when no reservation holds a claim", ROLLING, "claims", HELD, ()),
    ("claims asks binder to take each member with claims out of them, with what its reservation holds",
     ROLLING, "claims", (A1, CLAIMED),
     (Publish(S.binder_subject(G), UnreserveClaims(gang_id=G, attempt=2, held=(
         HeldClaims(pod=P2, claims=CLAIMED.claims),))),)),
    ("mig destroys what the node recorded for each MIG member of the attempt (by owner)", ROLLING, "mig",
     (M1, A2), (Publish(S.mig_subject("a100"), MigDestroyRequested(node="a100", gang_id=G, attempt=2, pod=P1, gpu=3)),)),
    ("release names the attempt's reserved pods exactly", ROLLING, "release", HELD,
     (Publish(S.placement_subject(G), ReleaseRequested(gang_id=G, attempt=2, reason=ROLLING.reason, pods=(P1, P2))),)),
    ("release of an attempt rolled back before placement names its members", ROLLING, "release", (),
     (Publish(S.placement_subject(G), ReleaseRequested(gang_id=G, attempt=2, reason=ROLLING.reason, pods=(P1, P2))),)),
    ("release also names a reserved pod that is no longer a member", replace(ROLLING, members=MEMBERS[1:]),
     "release", HELD,
     (Publish(S.placement_subject(G), ReleaseRequested(gang_id=G, attempt=2, reason=ROLLING.reason, pods=(P1, P2))),)),
]


@pytest.mark.parametrize(("name", "state", "step", "held", "expected"), COMPENSATIONS,
                         ids=[c[0] for c in COMPENSATIONS])
def test_compensation(name, state, step, held, expected):
    assert effects.compensation(state, step, held) == expected


def test_a_deleted_member_gives_back_its_mig_instance_then_its_reservation():
    assert effects.member_gone(BINDING, P1, M1) == (
        Publish(S.mig_subject("a100"), MigDestroyRequested(node="a100", gang_id=G, attempt=2, pod=P1, gpu=3)),
        Publish(S.placement_subject(G), ReleaseRequested(gang_id=G, attempt=2, reason="pod deleted", pods=(P1,))))
    assert effects.member_gone(gang(), P1) == ()


def test_a_running_member_deleted_during_a_later_attempt_releases_the_attempt_that_bound_it():
    state = replace(BINDING, attempt=5, running=(Running(pod=P1, attempt=2),))
    assert effects.member_gone(state, P1, A1) == (
        Publish(S.placement_subject(G), ReleaseRequested(gang_id=G, attempt=2, reason="pod deleted", pods=(P1,))),)
    assert effects.member_gone(state, P1, M1) == (
        Publish(S.mig_subject("a100"), MigDestroyRequested(node="a100", gang_id=G, attempt=2, pod=P1, gpu=3)),
        Publish(S.placement_subject(G), ReleaseRequested(gang_id=G, attempt=2, reason="pod deleted", pods=(P1,))))


def test_an_attempt_for_late_members_asks_placement_for_them_alone():
    state = replace(gang(), phase="placing", attempt=3, running=(Running(pod=P1, attempt=2),))
    (placement,) = [e for e in effects.entered(gang(), state, now=0.0, timeout_s=180.0)
                    if isinstance(e, Publish) and isinstance(e.event, PlaceRequested)]
    assert placement.event.members_digest == uid_digest([P2])
