"""The side effects of the saga, as data: which commands, status events, pod notices and
compensations follow a transition, a re-drive, a compensation step or a member's deletion.

Pure (no I/O, no clock: ``now`` is passed in) and table-tested like the transitions
(tests/unit/test_saga_effects.py). ``driver.SagaDriver.execute`` carries the effects out, in
order; the idempotency key of every command is its message id, so carrying the same effects
out twice (a redelivery, a crash before the ack, a re-drive) stores each command once.

    entered(before, after, held)   the effects of one transition (before → after)
    announce(state)                an attempt taking a while: its deadline and GangAdmitted
    redrive(state, held)           what a running state waits for, again (same message ids)
    binds(state)                   the attempt's bind command (straight from placing or preempting
                                   without MIG)
    compensation(state, step, held) one compensation's effects (``unbind`` is carried out by
                                   the compensator itself, it needs the cluster)
    member_gone(state, pod, held)  give back what one deleted member held

``held`` is what the ledger holds for the attempt (its assignments, in member order): the
ledger is their one home, so the driver reads it from its mirror and passes it in.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import msgspec

from phalanx_proto import subjects as S
from phalanx_proto.events import (
    Assignment,
    BindPods,
    GangAdmitted,
    GangDeadline,
    GangPending,
    GangScheduled,
    HeldClaims,
    MigDestroyRequested,
    MigPrepareRequested,
    PlaceRequested,
    PodRef,
    ReleaseRequested,
    RollbackStarted,
    UnreserveClaims,
)
from phalanx_proto.state import GangState
from phalanx_rules import saga


@dataclass(frozen=True, slots=True)
class Publish:
    """Publish ``event`` on ``subject`` (message id: the event's key unless ``msg_id``)."""

    subject: str
    event: msgspec.Struct
    msg_id: str | None = None


@dataclass(frozen=True, slots=True)
class ScheduleDeadline:
    """Store the attempt's deadline as a JetStream scheduled message, firing at ``at``."""

    event: GangDeadline
    at: float


@dataclass(frozen=True, slots=True)
class Notify:
    """A Warning event ``reason: message`` on each pod, and with ``condition`` also
    ``PodScheduled=False`` with the message."""

    pods: tuple[PodRef, ...]
    reason: str
    message: str
    condition: bool = True
    normal: bool = False
    """A Normal event (news), not a Warning."""


@dataclass(frozen=True, slots=True)
class ReportGroup:
    """The gang's ``PodGroupScheduled`` condition on its Workload API PodGroup
    (``podgroups.PodGroupBook.report``: nothing for a gang that has none)."""

    gang_id: str
    scheduled: bool
    message: str


@dataclass(frozen=True, slots=True)
class Compensate:
    """Run the compensations of the attempt not yet done (``compensate.Compensator``)."""

    gang_id: str
    attempt: int


Effect = Publish | ScheduleDeadline | Notify | ReportGroup | Compensate
Held = tuple[Assignment, ...]


def _deadline(s: GangState, timeout_s: float) -> ScheduleDeadline:
    return ScheduleDeadline(GangDeadline(gang_id=s.gang_id, attempt=s.attempt, members_digest=saga.members_digest(s)),
                            at=s.attempt_started_at + timeout_s)


def _placement(s: GangState) -> Publish:
    return Publish(S.placement_subject(s.gang_id), PlaceRequested(
        gang_id=s.gang_id, attempt=s.attempt, members_digest=saga.members_digest(s)))


def _mig_prepares(s: GangState, held: Held) -> tuple[Effect, ...]:
    return tuple(Publish(S.mig_subject(a.node), MigPrepareRequested(
        node=a.node, gang_id=s.gang_id, attempt=s.attempt, pod=a.pod, gpu=a.gpus[0] if a.gpus else 0,
        profile=a.mig_profile, start=max(0, a.mig_start))) for a in held if a.mig_profile and not a.mig_instance_uuid)


def binds(s: GangState) -> tuple[Effect, ...]:
    """One command for every member of the attempt not bound yet (binder reads each one's
    assignment from the ledger): after the MIG instances are ready, or straight from ``placing``
    when the attempt's reservations hold no MIG slice."""
    done = set(s.bound)
    pods = tuple(m.pod for m in saga.attempt_members(s) if m.pod not in done)
    return (Publish(S.binder_subject(s.gang_id), BindPods(gang_id=s.gang_id, attempt=s.attempt, pods=pods)),) \
        if pods else ()


def pending(s: GangState, now: float) -> tuple[Effect, ...]:
    """Tell subscribers and the pods why the gang waits (``saga.pending_reason``)."""
    reason = saga.pending_reason(s, now)
    msg_id = (f"gang.pending:{s.gang_id}:{s.attempt}:{saga.members_digest(s)}:{s.failures}:"
              f"{zlib.crc32(reason.encode())}")
    return (Publish(S.status_subject(s.gang_id), GangPending(gang_id=s.gang_id, attempt=max(1, s.attempt),
                                                             reason=reason), msg_id=msg_id),
            Notify(saga.waiting_members(s), "FailedScheduling", reason),
            *_group(s, scheduled=False, message=reason))


def _group(s: GangState, *, scheduled: bool, message: str) -> tuple[Effect, ...]:
    """A gang named by a PodGroup reports to it (the gang id's kind says; the book knows the object)."""
    return (ReportGroup(s.gang_id, scheduled, message),) if "/PodGroup:" in s.gang_id else ()


def announce(s: GangState, *, timeout_s: float) -> tuple[Effect, ...]:
    """An attempt that is taking a while: its deadline (a scheduled message) and ``GangAdmitted``."""
    return (_deadline(s, timeout_s),
            Publish(S.status_subject(s.gang_id), GangAdmitted(
                gang_id=s.gang_id, attempt=s.attempt, members=tuple(m.pod for m in s.members), min_member=s.min_member)))


def entered(before: GangState | None, after: GangState, *, now: float, timeout_s: float,
            held: Held = (), announce_now: bool = True) -> tuple[Effect, ...]:
    """The effects of the transition ``before → after`` (``timeout_s``: the attempt's deadline;
    ``held``: the attempt's assignments as the ledger holds them; ``announce_now``: a new attempt
    schedules its deadline and publishes ``GangAdmitted`` at once — else the driver does so once
    it has run ``announce_after_s``, and a quicker attempt never does)."""
    was = before.phase if before is not None and before.attempt == after.attempt else None
    match after.phase:
        case "placing" if was != "placing":
            return (*(announce(after, timeout_s=timeout_s) if announce_now else ()), _placement(after))
        case "preempting" if was == "placing":
            # The attempt stays open while its victims go: its deadline is armed now, and its
            # pods are told once why they wait.
            return (*announce(after, timeout_s=timeout_s), *pending(after, now))
        case "preempting" if was == "preempting":
            return pending(after, now)
        case "preparing" if was in saga.PLACING:
            return _mig_prepares(after, held)
        case "binding" if was == "preparing":
            return binds(after)
        case "scheduled" if was in (*saga.PLACING, "binding"):
            done = (Publish(S.status_subject(after.gang_id), GangScheduled(
                gang_id=after.gang_id, attempt=after.attempt, assignments=tuple(held))),
                *_group(after, scheduled=True, message=f"{len(after.members) - len(saga.waiting_members(after))} pods of gang "
                                                         f"{after.gang_id} placed (min-member {after.min_member})"))
            if before is not None and before.repair is not None and after.repair is None:
                done += (repaired_notice(before, after, held, now),)
            return done
        case "rolling_back" if was in saga.RUNNING:
            return (Publish(S.status_subject(after.gang_id), RollbackStarted(
                gang_id=after.gang_id, attempt=after.attempt, reason=after.reason,
                members_digest=saga.members_digest(after))),
                    Compensate(after.gang_id, after.attempt))
        case "backoff" if was in (*saga.PLACING, "rolling_back"):
            return pending(after, now)
    return ()


def repaired_notice(before: GangState, after: GangState, held: Held, now: float) -> Notify:
    """``GangRepaired`` on every member: where the replacements went, in which domain, how long
    the repair took since its first failure."""
    r = before.repair
    assert r is not None
    d = r.domain()
    where = f"{d.tier} {d.domain}" if d is not None else "the cluster"
    placed = ", ".join(f"{a.pod.name} on {a.node}" for a in held[:5]) + (" …" if len(held) > 5 else "")
    lost = ", ".join(sorted({f.node for f in r.failed}))
    msg = (f"gang {after.gang_id} repaired inside {where} after losing {len(r.failed)} member(s) on {lost}: "
           f"{placed}; {now - r.started_at:.1f}s from the first failure; the other members kept their GPUs")
    return Notify(tuple(m.pod for m in after.members), "GangRepaired", msg, condition=False, normal=True)


def redrive(s: GangState, *, timeout_s: float, held: Held = ()) -> tuple[Effect, ...]:
    """What a state waits for, published again (the same message ids: a command still in the
    stream's duplicate window is stored once). The deadline is re-scheduled too, at the same
    time, so a crash between the state write and its scheduling loses nothing."""
    match s.phase:
        case "placing":
            return (_deadline(s, timeout_s), _placement(s), *(binds(s) if saga.binds_without_write(s, held) else ()))
        case "preempting":
            # placement watches the nomination (re-sends the eviction, promotes it, gives it up);
            # what is re-driven here is the binds of a promotion whose Reserved was lost.
            return (_deadline(s, timeout_s), *(binds(s) if saga.binds_without_write(s, held) else ()))
        case "preparing":
            return (_deadline(s, timeout_s), *_mig_prepares(s, held))
        case "binding":
            return (_deadline(s, timeout_s), *binds(s))
        case "rolling_back":
            return (Compensate(s.gang_id, s.attempt),)
    return ()


def _mig_destroy(s: GangState, a: Assignment, attempt: int | None = None) -> Publish:
    """Destroy what the node's mig-manager recorded for this pod and attempt (by owner: the
    instance's uuid is the node's record, not ours)."""
    return Publish(S.mig_subject(a.node), MigDestroyRequested(
        node=a.node, gang_id=s.gang_id, attempt=s.attempt if attempt is None else attempt, pod=a.pod,
        gpu=a.gpus[0] if a.gpus else 0))


def compensation(s: GangState, step: str, held: Held = ()) -> tuple[Effect, ...]:
    """The commands of compensation ``step`` (``claims``, ``mig`` or ``release``; ``unbind`` has
    none: it is the compensator's deletion of bound members). The release names the attempt's pods — its
    assignments, or its members when nothing was placed — exactly (contract C1)."""
    match step:
        case "claims":
            held_claims = tuple(HeldClaims(pod=a.pod, claims=a.claims) for a in held if a.claims)
            if held_claims:
                return (Publish(S.binder_subject(s.gang_id), UnreserveClaims(
                    gang_id=s.gang_id, attempt=s.attempt, held=held_claims)),)
        case "mig":
            return tuple(_mig_destroy(s, a) for a in held if a.mig_profile)
        case "release":
            pods = tuple(dict.fromkeys((*(a.pod for a in held), *(m.pod for m in saga.attempt_members(s)))))
            if pods:
                return (Publish(S.placement_subject(s.gang_id), ReleaseRequested(
                    gang_id=s.gang_id, attempt=s.attempt, reason=s.reason, pods=pods)),)
    return ()


def member_gone(before: GangState, pod: PodRef, held: Assignment | None = None) -> tuple[Effect, ...]:
    """Give back what a deleted member held (``held``: its reservation, as the ledger has it):
    its MIG instance first (so the slot is never rebooked while an instance sits in it), then
    its reservation of the attempt that made it."""
    if before.attempt < 1:
        return ()
    attempt = next((r.attempt for r in before.running if r.pod == pod), before.attempt)
    destroys = (_mig_destroy(before, held, attempt),) if held is not None and held.mig_profile else ()
    return (*destroys, Publish(S.placement_subject(before.gang_id), ReleaseRequested(
        gang_id=before.gang_id, attempt=attempt, reason="pod deleted", pods=(pod,))))
