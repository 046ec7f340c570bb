"""The saga's pure transitions (libs/phalanx_rules/saga.py), table-driven."""

from __future__ import annotations

import msgspec
import pytest

from phalanx_proto.events import (
    BindFailure,
    BindsDone,
    GangDeadline,
    MemberSpec,
    MigFailed,
    MigReady,
    PlacementFailed,
    PodRef,
    Preempting,
    Reserved,
    uid_digest,
)
from phalanx_proto.state import GangPart, GangState, Running
from phalanx_proto.whatif import Answer, Holder, WhatIf
from phalanx_rules import fairness, saga

G = "default/JobSet:train"
P1, P2 = PodRef(namespace="default", name="w-0", uid="u0"), PodRef(namespace="default", name="w-1", uid="u1")
MEMBERS = (MemberSpec(pod=P1, gpus=1), MemberSpec(pod=P2, gpus=1))
BO = dict(base_s=1.0, max_s=60.0)
WHATIF = WhatIf(answers=(
    Answer(probe="queue-limit", text="needs 1 more GPUs of headroom under queue q's limit 4", starts=False),
    Answer(probe="wait", text="would start if 2 GPUs free on node n1 (held by gang a/x)", gpus=2,
           holders=(Holder(gang_id="a/x", gpus=2),))))
NOT_ALONE = WhatIf(answers=WHATIF.answers[:1])
replace = msgspec.structs.replace


def gang(phase="waiting", attempt=0, **kw) -> GangState:
    """Builder: a two-member gang in ``phase``."""
    return GangState(gang_id=G, phase=phase, attempt=attempt, min_member=2, members=MEMBERS, **kw)


DIGEST = saga.members_digest(gang())
STRANGER = PodRef(namespace="default", name="w-0", uid="u-other")
"""A pod with a member's name but another uid (a recreated pod, or a forged one)."""
PLACING = gang("placing", 2)
BINDING = gang("binding", 2)
HALF_BOUND = gang("binding", 2, bound=(P1,))
PREPARING = gang("preparing", 2)
ROLLING = gang("rolling_back", 2, reason="deadline")
RESERVED = Reserved(gang_id=G, attempt=2, members_digest=DIGEST)
NOMINATED = Preempting(gang_id=G, attempt=2, members_digest=DIGEST, reason="preempting a/lo to free 2 GPUs on n1",
                       nodes=("n1",))
PREEMPTING = gang("preempting", 2, reason=NOMINATED.reason, reserve_nodes=("n1",), waits_for="gpus")
MIG_READY = MigReady(node="a100", gang_id=G, attempt=2, pod=P1, instance_uuid="MIG-1")


def binds(attempt=2, bound=(), failed=()):
    return BindsDone(gang_id=G, attempt=attempt, bound=bound, failed=tuple(BindFailure(pod=p, reason=r) for p, r in failed))


CASES = [
    # (name, transition, state, expected)
    ("a complete waiting gang starts attempt 1",
     lambda s: saga.start_attempt(s, now=10.0, settle_s=2), gang(),
     gang("placing", 1, attempt_started_at=10.0)),
    ("an incomplete gang does not start",
     lambda s: saga.start_attempt(s, now=10.0, settle_s=2), replace(gang(), members=MEMBERS[:1]), None),
    ("a gang in backoff does not start before its backoff is over",
     lambda s: saga.start_attempt(s, now=10.0, settle_s=2), gang("backoff", 1, backoff_until=11.0), None),
    ("a gang in backoff starts the next attempt afterwards",
     lambda s: saga.start_attempt(s, now=12.0, settle_s=2), gang("backoff", 1, backoff_until=11.0, reason="x"),
     gang("placing", 2, backoff_until=11.0, reason="x", attempt_started_at=12.0)),
    ("a redelivered start command while placing changes nothing",
     lambda s: saga.start_attempt(s, now=12.0, settle_s=2), PLACING, None),
    ("an undeclared gang waits until it has been quiet for the settle time",
     lambda s: saga.start_attempt(s, now=11.0, settle_s=2), gang(min_member_declared=False, last_member_at=10.0),
     None),
    ("Reserved with a MIG slice among the reservations moves to preparing",
     lambda s: saga.placed(s, RESERVED), PLACING, PREPARING),
    ("a duplicate Reserved changes nothing",
     lambda s: saga.placed(s, RESERVED), PREPARING, None),
    ("Reserved for an old attempt changes nothing",
     lambda s: saga.placed(s, replace(RESERVED, attempt=1)), PLACING, None),
    ("without MIG the binds go out while placing: every member bound schedules the gang",
     lambda s: saga.bound(s, 2, (P1, P2)), PLACING, gang("scheduled", 2, bound=(P1, P2))),
    ("without MIG, part of the members bound while placing moves the gang to binding with them",
     lambda s: saga.bound(s, 2, (P1,)), PLACING, HALF_BOUND),
    ("members bound for an old attempt while placing change nothing",
     lambda s: saga.bound(s, 1, (P1, P2)), PLACING, None),
    ("a gang bound while preparing its MIG instances changes nothing (binds wait for them)",
     lambda s: saga.bound(s, 2, (P1, P2)), PREPARING, None),
    ("a gang scheduled straight from placing forgets the answers of the attempt before",
     lambda s: saga.bound(s, 2, (P1, P2)), replace(PLACING, whatif=WHATIF), gang("scheduled", 2, bound=(P1, P2))),
    ("PlacementFailed goes to backoff with the reason and a retry time",
     lambda s: saga.placement_failed(s, PlacementFailed(gang_id=G, attempt=2, summary="0/2 nodes"), now=100.0, **BO),
     PLACING, gang("backoff", 2, failures=1, reason="0/2 nodes", failure="placement_failed", waits_for="gpus",
                   backoff_until=100.0 + saga.backoff_delay(1, gang_id=G, **BO))),
    ("a gang that fits no node set of the cluster waits for the cluster to change, and on the timer 5 minutes",
     lambda s: saga.placement_failed(s, PlacementFailed(gang_id=G, attempt=2, summary="0/2 nodes",
                                                        fits_empty_cluster=False), now=100.0, **BO),
     PLACING, gang("backoff", 2, failures=1, reason="0/2 nodes", failure="placement_failed", waits_for="cluster",
                   fits_empty_cluster=False,
                   backoff_until=100.0 + fairness.retry_delay(replace(PLACING, waits_for="cluster"), 1, **BO))),
    ("a gang refused at its queue's limit waits for its queue, on the exponential timer",
     lambda s: saga.placement_failed(s, PlacementFailed(gang_id=G, attempt=2, summary="at its limit",
                                                        fits_empty_cluster=False, waits_for="queue"), now=100.0, **BO),
     PLACING, gang("backoff", 2, failures=1, reason="at its limit", failure="placement_failed", waits_for="queue",
                   fits_empty_cluster=False, backoff_until=100.0 + saga.backoff_delay(1, gang_id=G, **BO))),
    ("PlacementFailed for an old attempt changes nothing",
     lambda s: saga.placement_failed(s, PlacementFailed(gang_id=G, attempt=1), now=1.0, **BO), PLACING, None),
    # Preemption keeps its attempt open (docs/preemption.md): it waits in preempting, not backoff.
    ("a nomination keeps the attempt open, waiting for its victims with the reason",
     lambda s: saga.preempting(s, NOMINATED), replace(PLACING, whatif=WHATIF), PREEMPTING),
    ("a new reason while preempting is recorded",
     lambda s: saga.preempting(s, replace(NOMINATED, reason="waiting for a/lo")), PREEMPTING,
     replace(PREEMPTING, reason="waiting for a/lo")),
    ("the same Preempting again changes nothing",
     lambda s: saga.preempting(s, NOMINATED), PREEMPTING, None),
    ("a Preempting for an old attempt changes nothing",
     lambda s: saga.preempting(s, replace(NOMINATED, attempt=1)), PLACING, None),
    ("a Preempting for other members changes nothing",
     lambda s: saga.preempting(s, replace(NOMINATED, members_digest=uid_digest([STRANGER, P2]))), PLACING, None),
    ("a Preempting once the attempt was rolled back changes nothing",
     lambda s: saga.preempting(s, NOMINATED), ROLLING, None),
    ("the nomination given up sends the preempting attempt to backoff",
     lambda s: saga.placement_failed(s, PlacementFailed(gang_id=G, attempt=2, summary="nomination ended"),
                                     now=100.0, **BO),
     PREEMPTING, replace(PREEMPTING, phase="backoff", failures=1, reason="nomination ended",
                         failure="placement_failed", reserve_nodes=(),
                         backoff_until=100.0 + saga.backoff_delay(1, gang_id=G, **BO))),
    ("a promoted nomination's binds went out from preempting: every member bound schedules the gang",
     lambda s: saga.bound(s, 2, (P1, P2)), PREEMPTING, replace(PREEMPTING, phase="scheduled", bound=(P1, P2),
                                                              reason="")),
    ("a failed bind of a promoted nomination rolls the attempt back",
     lambda s: saga.bind_failed(s, binds(failed=((P2, "gone"),))), PREEMPTING,
     replace(PREEMPTING, phase="rolling_back", failure="bind_failed", reason="bind of default/w-1 failed: gone")),
    ("the deadline of a preempting attempt rolls it back (its release ends the nomination)",
     lambda s: saga.deadline(s, GangDeadline(gang_id=G, attempt=2, members_digest=DIGEST)), PREEMPTING,
     replace(PREEMPTING, phase="rolling_back", failure="deadline", reason="not every member was ready within the gang timeout")),
    ("a promoted nomination with a MIG slice moves to preparing",
     lambda s: saga.placed(s, RESERVED), PREEMPTING, replace(PREEMPTING, phase="preparing")),
    ("the MigReady after which every instance is recorded ready moves to binding",
     lambda s: saga.mig_ready(s, MIG_READY, all_ready=True), PREPARING, BINDING),
    ("a MigReady while other instances are not ready yet changes nothing",
     lambda s: saga.mig_ready(s, MIG_READY, all_ready=False), PREPARING, None),
    ("a duplicate MigReady changes nothing",
     lambda s: saga.mig_ready(s, MIG_READY, all_ready=True), BINDING, None),
    ("MigFailed rolls back with its reason",
     lambda s: saga.mig_failed(s, MigFailed(node="a100", gang_id=G, attempt=2, pod=P1, reason="no slot")),
     PREPARING, replace(PREPARING, phase="rolling_back", failure="mig_failed",
                        reason="MIG instance for default/w-0 on a100 failed: no slot")),
    ("MigFailed for an old attempt changes nothing",
     lambda s: saga.mig_failed(s, MigFailed(node="a100", gang_id=G, attempt=1, pod=P1, reason="x")),
     PREPARING, None),
    ("a member bound is recorded",
     lambda s: saga.bound(s, 2, (P1,)), BINDING, HALF_BOUND),
    ("the last member bound schedules the gang",
     lambda s: saga.bound(s, 2, (P2,)), HALF_BOUND, gang("scheduled", 2, bound=(P1, P2))),
    ("every member bound at once schedules the gang in one step",
     lambda s: saga.bound(s, 2, (P2, P1)), BINDING, gang("scheduled", 2, bound=(P2, P1))),
    ("a member reported bound twice changes nothing",
     lambda s: saga.bound(s, 2, (P1,)), HALF_BOUND, None),
    ("members bound for an old attempt change nothing",
     lambda s: saga.bound(s, 1, (P2,)), HALF_BOUND, None),
    ("a failure in BindsDone rolls back, naming the pod",
     lambda s: saga.bind_failed(s, binds(failed=((P2, "gone"),))), HALF_BOUND,
     replace(HALF_BOUND, phase="rolling_back", failure="bind_failed", reason="bind of default/w-1 failed: gone")),
    ("a failed bind while placing (the binds went out without MIG) rolls back",
     lambda s: saga.bind_failed(s, binds(failed=((P2, "gone"),))), PLACING,
     replace(PLACING, phase="rolling_back", failure="bind_failed", reason="bind of default/w-1 failed: gone")),
    ("a failed bind while preparing MIG instances changes nothing (no bind was asked for)",
     lambda s: saga.bind_failed(s, binds(failed=((P2, "gone"),))), PREPARING, None),
    ("the deadline of the running attempt rolls it back",
     lambda s: saga.deadline(s, GangDeadline(gang_id=G, attempt=2, members_digest=DIGEST)), replace(HALF_BOUND, timeout_s=30.0),
     replace(HALF_BOUND, timeout_s=30.0, phase="rolling_back", failure="deadline",
             reason="not every member was ready within 30 s")),
    ("the deadline of an old attempt is ignored",
     lambda s: saga.deadline(s, GangDeadline(gang_id=G, attempt=1, members_digest=DIGEST)), PLACING, None),
    ("the deadline of a scheduled gang is ignored",
     lambda s: saga.deadline(s, GangDeadline(gang_id=G, attempt=2, members_digest=DIGEST)),
     gang("scheduled", 2, bound=(P1, P2)), None),
    ("a deadline delivered twice changes nothing the second time",
     lambda s: saga.deadline(s, GangDeadline(gang_id=G, attempt=2, members_digest=DIGEST)), ROLLING, None),
    ("a compensation is recorded as done",
     lambda s: saga.compensated(s, 2, "unbind", now=5.0, **BO, unbound=(P1,)), replace(ROLLING, bound=(P1,)),
     replace(ROLLING, rollback_done=("unbind",), unbound=(P1,))),
    ("a compensation recorded twice changes nothing",
     lambda s: saga.compensated(s, 2, "unbind", now=5.0, **BO), replace(ROLLING, rollback_done=("unbind",)), None),
    ("the last compensation moves to backoff",
     lambda s: saga.compensated(s, 2, "release", now=5.0, **BO), replace(ROLLING, rollback_done=("unbind", "claims", "mig")),
     replace(ROLLING, phase="backoff", rollback_done=saga.COMPENSATIONS, failures=1,
             backoff_until=5.0 + saga.backoff_delay(1, gang_id=G, **BO))),
    ("a compensation for an old attempt changes nothing",
     lambda s: saga.compensated(s, 1, "unbind", now=5.0, **BO), ROLLING, None),
    ("a pod event seen twice changes nothing",
     lambda s: saga.add_member(s, MEMBERS[0], gang_id=G, min_member=2, timeout_s=0, priority=0, now=1.0), gang(),
     None),
    ("a recreated pod (new uid) replaces the old member",
     lambda s: saga.add_member(s, MemberSpec(pod=replace(P1, uid="u9"), gpus=1), gang_id=G, min_member=2,
                               timeout_s=0, priority=0, now=1.0), gang(),
     replace(gang(), members=(MEMBERS[1], MemberSpec(pod=replace(P1, uid="u9"), gpus=1)), last_member_at=1.0)),
    ("a deleted member is dropped",
     lambda s: saga.drop_member(s, P2), HALF_BOUND, replace(HALF_BOUND, members=MEMBERS[:1])),
    ("a deleted bound member is dropped from the bound ones too",
     lambda s: saga.drop_member(s, P1), HALF_BOUND, replace(HALF_BOUND, members=MEMBERS[1:], bound=())),
    ("deleting a pod that is not a member changes nothing",
     lambda s: saga.drop_member(s, PodRef(namespace="default", name="x")), HALF_BOUND, None),
    # Replies are checked against the record: only the attempt's own members, by uid.
    ("a Reserved for other members (a digest that is not the attempt's) changes nothing",
     lambda s: saga.placed(s, replace(RESERVED, members_digest=uid_digest([P1]))), PLACING, None),
    ("a Reserved for a pod with a member's name but another uid changes nothing",
     lambda s: saga.placed(s, replace(RESERVED, members_digest=uid_digest([STRANGER, P2]))), PLACING, None),
    ("a PlacementFailed naming other pods (another incarnation of the gang) changes nothing",
     lambda s: saga.placement_failed(s, PlacementFailed(gang_id=G, attempt=2, members=(STRANGER, P2)), now=1.0, **BO),
     PLACING, None),
    ("a failure for a pod that is not a member of the attempt changes nothing",
     lambda s: saga.bind_failed(s, binds(failed=((STRANGER, "x"),))), HALF_BOUND, None),
    ("a pod reported bound that is not a member of the attempt changes nothing",
     lambda s: saga.bound(s, 2, (STRANGER,)), BINDING, None),
    ("a MigFailed for a pod that is not a member of the attempt changes nothing",
     lambda s: saga.mig_failed(s, MigFailed(node="a100", gang_id=G, attempt=2, pod=STRANGER, reason="x")),
     PREPARING, None),
    ("the deadline of another incarnation of the gang (other members) is ignored",
     lambda s: saga.deadline(s, GangDeadline(gang_id=G, attempt=2, members_digest="0" * 16)), BINDING, None),
    ("a deadline without the members' digest is ignored",
     lambda s: saga.deadline(s, GangDeadline(gang_id=G, attempt=2)), BINDING, None),
    ("an attempt started behind a starving head records the nodes it must leave alone",
     lambda s: saga.start_attempt(s, now=10.0, settle_s=2, avoid=("n1",), avoid_for="default/big"), gang(),
     gang("placing", 1, attempt_started_at=10.0, avoid_nodes=("n1",), avoid_for="default/big")),
    ("a failed backfill attempt says which nodes were kept for whom, and records where it would go itself",
     lambda s: saga.placement_failed(s, PlacementFailed(gang_id=G, attempt=2, summary="0/1 nodes are available.",
                                                        reserve_nodes=("n1",)), now=100.0, **BO),
     replace(PLACING, avoid_nodes=("n1", "n2"), avoid_for="default/big"),
     replace(PLACING, phase="backoff", failures=1, failure="placement_failed", reserve_nodes=("n1",),
             avoid_nodes=("n1", "n2"), avoid_for="default/big", waits_for="gpus",
             reason="0/1 nodes are available. (backfill behind default/big, first in queue and waiting too long: "
                    "n1, n2)", backoff_until=100.0 + saga.backoff_delay(1, gang_id=G, **BO))),
    ("a failed placement carrying what-if answers keeps them and appends the top one to the reason",
     lambda s: saga.placement_failed(s, PlacementFailed(gang_id=G, attempt=2, summary="0/2 nodes", whatif=WHATIF),
                                     now=100.0, **BO),
     PLACING, gang("backoff", 2, failures=1, failure="placement_failed", whatif=WHATIF, waits_for="gpus",
                   reason="0/2 nodes; would start if 2 GPUs free on node n1 (held by gang a/x)",
                   backoff_until=100.0 + saga.backoff_delay(1, gang_id=G, **BO))),
    ("answers none of which starts the gang alone are kept, and the reason is left as it is",
     lambda s: saga.placement_failed(s, PlacementFailed(gang_id=G, attempt=2, summary="0/2 nodes", whatif=NOT_ALONE),
                                     now=100.0, **BO),
     PLACING, gang("backoff", 2, failures=1, failure="placement_failed", whatif=NOT_ALONE, reason="0/2 nodes",
                   waits_for="gpus",
                   backoff_until=100.0 + saga.backoff_delay(1, gang_id=G, **BO))),
    ("a waiting gang the gate holds back keeps its phase and says why",
     lambda s: saga.held_back(s, "held back behind default/big"), gang("backoff", 1, backoff_until=5.0),
     gang("backoff", 1, backoff_until=5.0, reason="held back behind default/big", held_back=True)),
    ("a gang held back for the same reason again changes nothing",
     lambda s: saga.held_back(s, "held back behind default/big"),
     gang("waiting", reason="held back behind default/big", held_back=True), None),
    ("a running attempt is never held back", lambda s: saga.held_back(s, "held"), PLACING, None),
    ("a gang backing off whose wait is over by a release is due now",
     lambda s: saga.woken(s, 50.0), gang("backoff", 1, backoff_until=80.0), gang("backoff", 1, backoff_until=50.0)),
    ("a gang whose backoff is over already is not woken again",
     lambda s: saga.woken(s, 50.0), gang("backoff", 1, backoff_until=40.0), None),
    ("a placing gang is not woken", lambda s: saga.woken(s, 50.0), PLACING, None),
    ("a placement forgets the answers of the attempt before",
     lambda s: saga.placed(s, RESERVED), replace(PLACING, whatif=WHATIF), PREPARING),
    ("a pod that arrives while an attempt runs is not added to it",
     lambda s: saga.add_member(s, MemberSpec(pod=PodRef(namespace="default", name="w-2", uid="u2"), gpus=1),
                               gang_id=G, min_member=2, timeout_s=0, priority=0, now=1.0), BINDING, None),
]

P3 = PodRef(namespace="default", name="w-2", uid="u2")
M3 = MemberSpec(pod=P3, gpus=1)
SCHEDULED = gang("scheduled", 2, bound=(P1, P2))
LATE = replace(SCHEDULED, members=MEMBERS + (M3,))
FOLLOW_UP = replace(LATE, phase="placing", attempt=3, bound=(), attempt_started_at=20.0,
                    running=(Running(pod=P1, attempt=2), Running(pod=P2, attempt=2)))


def add(spec, **kw):
    return lambda s: saga.add_member(s, spec, gang_id=G, timeout_s=0, priority=0, now=1.0, **kw)


def jobset_member(name, rj, jobs, members, total):
    return add(MemberSpec(pod=PodRef(namespace="default", name=name, uid=name), gpus=1), min_member=None,
               part=GangPart(name=rj, jobs=jobs, members=members), jobs=total)


LATE_CASES = [
    ("a pod that arrives after the gang was scheduled is recorded as a late member",
     add(M3, min_member=2), SCHEDULED, replace(LATE, last_member_at=1.0)),
    ("late members of a scheduled gang start an attempt of their own; the bound members become running",
     lambda s: saga.start_attempt(s, now=20.0, settle_s=2), LATE, FOLLOW_UP),
    ("a scheduled gang without late members starts nothing", lambda s: saga.start_attempt(s, now=20.0, settle_s=2),
     SCHEDULED, None),
    ("the follow-up attempt is placed for the late members alone",
     lambda s: saga.placed(s, Reserved(gang_id=G, attempt=3, members_digest=uid_digest([P3]))), FOLLOW_UP,
     replace(FOLLOW_UP, phase="preparing")),
    ("a Reserved of the follow-up that names a running member changes nothing",
     lambda s: saga.placed(s, Reserved(gang_id=G, attempt=3, members_digest=uid_digest([P1, P3]))), FOLLOW_UP, None),
    ("the follow-up is scheduled once its late members are bound",
     lambda s: saga.bound(s, 3, (P3,)), replace(FOLLOW_UP, phase="binding"),
     replace(FOLLOW_UP, phase="scheduled", bound=(P3,))),
    ("the follow-up's deadline names its own members",
     lambda s: saga.deadline(s, GangDeadline(gang_id=G, attempt=3, members_digest=saga.members_digest(FOLLOW_UP))),
     FOLLOW_UP, replace(FOLLOW_UP, phase="rolling_back", reason="not every member was ready within the gang timeout",
                        failure="deadline")),
    ("a backoff after a failed follow-up keeps the running members for the next attempt",
     lambda s: saga.start_attempt(s, now=30.0, settle_s=2), replace(FOLLOW_UP, phase="backoff", backoff_until=25.0),
     replace(FOLLOW_UP, phase="placing", attempt=4, backoff_until=25.0, attempt_started_at=30.0)),
    ("a gang whose pods are all gone leaves a tombstone that keeps its attempt counter",
     saga.tombstone, replace(SCHEDULED, members=(), bound=(), created_at=5.0),
     GangState(gang_id=G, attempt=2, created_at=5.0, min_member=1)),
    ("a gang recreated under a tombstone's id goes on counting its attempts",
     add(M3, min_member=1), GangState(gang_id=G, attempt=2, min_member=1),
     GangState(gang_id=G, attempt=2, min_member=1, members=(M3,), created_at=1.0, last_member_at=1.0)),
    ("a JobSet's first pod makes it wait for every Job: unseen Jobs count one pod each",
     jobset_member("d-0", "driver", 1, 1, 3), None,
     GangState(gang_id=G, min_member=3, created_at=1.0, last_member_at=1.0, jobs=3,
               members=(MemberSpec(pod=PodRef(namespace="default", name="d-0", uid="d-0"), gpus=1),),
               parts=(GangPart(name="driver", jobs=1, members=1),))),
]


@pytest.mark.parametrize(("name", "transition", "state", "expected"), LATE_CASES, ids=[c[0] for c in LATE_CASES])
def test_late_members_tombstones_and_jobset_sizes(name, transition, state, expected):
    assert transition(state) == expected


def test_a_jobset_gang_is_the_sum_over_its_replicated_jobs_once_every_job_was_seen():
    s = None
    for name, rj, jobs, members in [("d-0", "driver", 1, 1), ("w-0-0", "workers", 2, 2), ("w-1-0", "workers", 2, 2)]:
        s = jobset_member(name, rj, jobs, members, 3)(s)
    assert (s.min_member, s.min_member_declared, len(s.members)) == (5, True, 3)
    assert not saga.complete(s, now=100.0, settle_s=2)


@pytest.mark.parametrize(("name", "transition", "state", "expected"), CASES, ids=[c[0] for c in CASES])
def test_transition(name, transition, state, expected):
    assert transition(state) == expected


def test_compensations_run_in_reverse_order_of_the_steps():
    s = ROLLING
    order = []
    while (step := saga.next_compensation(s)) is not None:
        order.append(step)
        s = saga.compensated(s, 2, step, now=1.0, **BO)
    assert order == ["unbind", "claims", "mig", "release"] and s.phase == "backoff"


def test_backoff_grows_exponentially_with_bounded_jitter_and_a_cap():
    delays = [saga.backoff_delay(n, base_s=1.0, max_s=8.0, gang_id=G) for n in range(1, 7)]
    for n, d in enumerate(delays, start=1):
        raw = min(8.0, 2 ** (n - 1))
        assert 0.75 * raw <= d <= 1.25 * raw
    assert delays == [saga.backoff_delay(n, base_s=1.0, max_s=8.0, gang_id=G) for n in range(1, 7)]


def test_the_pending_reason_shows_the_attempt_and_the_last_failure():
    s = gang("backoff", 3, failures=3, reason="0/2 nodes are available: 2 insufficient free GPUs.",
             backoff_until=14.0)
    assert saga.pending_reason(s, 10.0) == "0/2 nodes are available: 2 insufficient free GPUs. (attempt 3); next try in 4s"
    assert saga.pending_reason(replace(gang(), members=MEMBERS[:1]), 0) == "gang incomplete: 1/2 members present"


def test_a_hold_is_shown_as_a_hold_by_its_flag_and_never_by_its_text():
    hold = "the gang's members name different queues (a, b): a gang is placed within one queue"
    held = gang("backoff", 2, failures=2, reason=hold, held_back=True, backoff_until=14.0)
    assert saga.pending_reason(held, 10.0) == f"{hold} (attempt 2 was the last)"
    failed = gang("backoff", 2, failures=2, reason="held back by a node: 0/2 nodes are available", backoff_until=14.0)
    assert saga.pending_reason(failed, 10.0) == "held back by a node: 0/2 nodes are available (attempt 2); next try in 4s"
    started = saga.start_attempt(replace(held, backoff_until=0.0), now=20.0, settle_s=2)
    assert started is not None and not started.held_back, "an attempt that starts is no longer held back"


def test_binds_go_out_without_a_write_only_when_the_ledger_holds_every_member_and_no_mig_slice():
    from phalanx_proto.events import Assignment

    a1, a2 = (Assignment(pod=p, node="n", gpus=(i,)) for i, p in enumerate((P1, P2)))
    assert saga.binds_without_write(PLACING, (a1, a2))
    assert not saga.binds_without_write(PLACING, (a1,))  # one member not reserved yet
    assert not saga.binds_without_write(PLACING, (a1, replace(a2, mig_profile="1g.5gb")))  # an instance to make
    assert not saga.binds_without_write(PLACING, ())
