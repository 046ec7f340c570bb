"""The gang saga's transitions, as pure functions: state (+ event, + now) in, new state out.

Called by gang-coordinator (its driver, intake and compensator, inside ``store.GangStore``'s
compare-and-set loop) and by ``phalanx sim``, whose gangs change only through these; no I/O, no
clock (``now`` is passed in), so every rule is unit-tested table-driven
(tests/unit/test_saga_transitions.py). Each function returns the new ``GangState``, or ``None``
for "no change" — which is what a redelivered command, a duplicate reply, a reply for an old
attempt or a pod event seen twice must produce. The side effects that follow a transition are
data too (gang-coordinator's ``effects.py``), carried out by its ``driver.SagaDriver``.

    waiting ──complete──▶ placing ──Reserved (a MIG slice)──▶ preparing ──all MigReady──▶ binding
    placing (Reserved, no MIG, ``binds_without_write``: the binds go out, no write)
        ──every member in BindsDone──▶ scheduled
    placing/binding ──some members in BindsDone──▶ binding ──the rest──▶ scheduled
    placing ──PlacementFailed──▶ backoff                     (nothing was reserved)
    placing ──Preempting (GPUs nominated, victims evicted)──▶ preempting ──Reserved (the
        nomination turned into the reservation when the victims' last GPUs were freed)──▶
        binds out, as from placing; preempting ──PlacementFailed (nomination given up)──▶ backoff
    preparing/binding: MigFailed, a failure in BindsDone, deadline; placing: deadline
        ──▶ rolling_back ──compensations done──▶ backoff ──backoff over──▶ placing
    waiting/backoff ──the gate or its queues hold it (``held_back``)──▶ the same phase, held
    backoff ──what it waits for happened (``woken``)──▶ backoff, due now

Compensations run in the reverse order of the steps: ``unbind`` (delete bound members),
``claims`` (take them out of their ResourceClaims, clear what Phalanx allocated), ``mig``
(destroy the attempt's MIG instances), ``release`` (the reservation).
"""

from __future__ import annotations

from collections.abc import Collection

import msgspec

from phalanx_kubeobjects.gangs import jobset_size, merge_part
from phalanx_proto.events import (
    Assignment,
    BindsDone,
    GangDeadline,
    MemberSpec,
    MigFailed,
    MigReady,
    Phase,
    PlacementFailed,
    PodRef,
    Preempting,
    Reserved,
    WhatIf,
)
from phalanx_proto.kubeapi import QUEUE_LABEL
from phalanx_proto.queues import DEFAULT_QUEUE
from phalanx_proto.state import (  # noqa: F401 - attempt_members, members_digest: part of the saga's vocabulary
    MAX_GANG_MEMBERS,
    GangPart,
    GangState,
    Running,
    attempt_members,
    members_digest,
)
from phalanx_proto.vocab import IDLE, OPEN, PLACING, RUNNING  # noqa: F401 - PLACING: the saga's vocabulary
from phalanx_rules import repair as repairs
from phalanx_rules.fairness import UNSCHEDULABLE_RETRY_S, backoff_delay, retry_delay, waits_for

COMPENSATIONS = ("unbind", "claims", "mig", "release")
"""Reverse order of the steps reserve → prepare MIG → write the claims → bind."""


replace = msgspec.structs.replace


def add_member(s: GangState | None, spec: MemberSpec, *, gang_id: str, min_member: int | None,
               timeout_s: float, priority: int, now: float, part: GangPart | None = None,
               jobs: int = 0, max_member: int = 0) -> GangState | None:
    """Record a pod as a member (a recreated pod, same name new uid, replaces the old one).

    ``min_member`` is what the pod says about the whole gang (None: nothing); a JobSet pod says
    its ``part`` and the JobSet's ``jobs`` instead, and the gang's size is
    ``phalanx_kubeobjects.gangs.jobset_size`` of the parts seen. An entry without members (a
    tombstone of a gang whose pods all went) is taken up again, attempt counter and all.
    ``max_member``: an elastic gang's largest size, as the pod says it (0: not elastic; the
    latest pod saying one is believed, never below the gang's min-member).

    Not while an attempt runs or rolls back: an attempt's members stay the members it was
    started with, so every command and reply of the attempt is about the same pods. A pod that
    arrives meanwhile is admitted by a later resync, once the gang waits again or is scheduled."""
    if s is None or not s.members:
        s = GangState(gang_id=gang_id, min_member=min_member or 1, created_at=now, attempt=s.attempt if s else 0,
                      min_member_declared=min_member is not None, home=s.home if s else ())
    if spec in s.members or s.phase in OPEN:
        return None
    members = tuple(m for m in s.members if m.pod.name != spec.pod.name or m.pod.namespace != spec.pod.namespace)
    members += (spec,)
    parts = merge_part(s.parts, part) if part is not None else s.parts
    jobs = max(s.jobs, jobs)
    if min_member is None and parts and not (s.min_member_declared and not s.parts):
        size = jobset_size(parts, jobs)
        declared, target = size.declared, size.members if size.declared else len(members)
    else:
        declared = s.min_member_declared or min_member is not None
        target = max(min_member or 0, s.min_member if s.min_member_declared else 0) if declared else len(members)
    least = min(MAX_GANG_MEMBERS, max(1, target))
    most = max(least, min(MAX_GANG_MEMBERS, max_member or s.max_member)) if (max_member or s.max_member) else 0
    return replace(s, members=members, min_member=least, min_member_declared=declared, max_member=most,
                   timeout_s=max(s.timeout_s, timeout_s), priority=max(s.priority, priority), last_member_at=now,
                   parts=parts, jobs=jobs)


MAX_HOME_NODES = 1000


def drop_member(s: GangState | None, pod: PodRef, node: str = "") -> GangState | None:
    """A member pod is gone (deleted, or recreated with a new uid). ``node``: where its
    reservation put it; that node is kept in ``home`` (where the gang ran), so a gang whose
    pods are all recreated (a JobSet restart, a repair's restart) is placed back there first —
    also when they go while the attempt that bound them is not yet recorded as bound."""
    if s is None or not any(m.pod == pod for m in s.members):
        return None
    home = s.home
    if node and node not in home and len(home) < MAX_HOME_NODES:
        home += (node,)
    after = replace(s, home=home, members=tuple(m for m in s.members if m.pod != pod),
                    bound=tuple(b for b in s.bound if b != pod),
                    running=tuple(r for r in s.running if r.pod != pod),
                    min_member=s.min_member if s.min_member_declared else max(1, len(s.members) - 1))
    if after.repair is not None and after.phase in ("scheduled", "backoff") and not repairs.held_members(after):
        # Nothing of the gang runs any more (restarted whole, by its repair or its controller):
        # no repair is left to make; the gang waits to be complete again and is placed whole,
        # back where it ran first (``home``).
        after = replace(after, phase="waiting", repair=None, running=(), bound=(), failures=0, backoff_until=0.0)
    return after


def late_members(s: GangState) -> bool:
    """A scheduled gang has members no attempt has bound yet (they arrived after it started,
    or replace a deleted member): they join by an attempt of their own, the others stay. An
    elastic gang holding its ``max_member`` has none: the pods past it wait."""
    done = repairs.held_members(s)
    if s.phase != "scheduled" or not any(m.pod not in done for m in s.members):
        return False
    return not s.max_member or sum(1 for m in s.members if m.pod in done) < s.max_member


def waiting_members(s: GangState) -> tuple[PodRef, ...]:
    """The members no attempt has bound and kept: those a pending reason is for (an elastic
    gang's next attempt places only some of them; the others wait for the same reason)."""
    done = repairs.held_members(s)
    return tuple(m.pod for m in s.members if m.pod not in done)


def tombstone(s: GangState | None) -> GangState | None:
    """The entry of a gang whose pods are all gone: no members, nothing held, its attempt
    counter kept (``add_member`` takes it up again)."""
    if s is None or s.members:
        return None
    return GangState(gang_id=s.gang_id, attempt=s.attempt, created_at=s.created_at, min_member=1, home=s.home)


def complete(s: GangState, now: float, settle_s: float) -> bool:
    """All min-member pods are present (for an undeclared gang: and it has been quiet)."""
    if len(s.members) < s.min_member:
        return False
    return s.min_member_declared or now - s.last_member_at >= settle_s


def start_attempt(s: GangState | None, *, now: float, settle_s: float, avoid: tuple[str, ...] = (),
                  avoid_for: str = "") -> GangState | None:
    """waiting (complete) or backoff (over) → placing, attempt + 1; or scheduled with late
    members → placing for those alone (the bound members become ``running`` and stay where
    they are). ``avoid``: nodes the attempt may not use, kept for the starving head
    ``avoid_for`` (backfill). A gang being repaired starts its repair attempt only once every
    failed member has its replacement (``repair.ready``), and none while it restarts whole."""
    if s is None:
        return None
    running = tuple(r for r in s.running if any(m.pod == r.pod for m in s.members))
    if s.repair is not None and (s.repair.restart or (s.phase == "scheduled" and not repairs.ready(s))):
        return None
    if s.phase == "scheduled":
        if not late_members(s):
            return None
        running += tuple(Running(pod=p, attempt=s.attempt) for p in s.bound if any(m.pod == p for m in s.members))
    elif s.phase not in IDLE or not complete(s, now, settle_s):
        return None
    if s.phase == "backoff" and now < s.backoff_until:
        return None
    r = s.repair
    if r is not None:
        r = replace(r, attempts=r.attempts + 1)
    return replace(s, phase="placing", attempt=s.attempt + 1, bound=(), rollback_done=(),
                   unbound=(), attempt_started_at=now, avoid_nodes=tuple(avoid), avoid_for=avoid_for if avoid else "",
                   running=running, held_back=False, repair=r)


def held_back(s: GangState | None, reason: str) -> GangState | None:
    """A waiting gang may not start its attempt now (the fairness gate, its members' queues):
    it keeps its phase and says why (``held``). Already held for the same reason: no change."""
    if s is None or s.phase not in IDLE or (s.held_back and s.reason == reason):
        return None
    return replace(s, reason=reason, held_back=True)


def woken(s: GangState | None, now: float) -> GangState | None:
    """What the gang waited for happened (``phalanx_rules.fairness``'s wake-ups): its backoff
    ends now, and the next start tries it."""
    if s is None or s.phase != "backoff" or s.backoff_until <= now:
        return None
    return replace(s, backoff_until=now)


def binds_without_write(s: GangState, held: tuple[Assignment, ...]) -> bool:
    """The ledger holds every member of the attempt (``held``: the attempt's assignments) and
    none on a MIG slice: its binds may go out with no state written (docs/saga.md, "One write
    fewer"); placement's ``Reserved`` says so too, but the ledger is the reservations' home."""
    pods = {a.pod for a in held}
    return bool(held) and not any(a.mig_profile for a in held) and all(
        m.pod in pods for m in attempt_members(s))


def placed(s: GangState | None, ev: Reserved) -> GangState | None:
    """placing → preparing: some reservation of the attempt is a MIG slice, whose instance is
    made before any member is bound. The reply is a reference: the driver has read one
    reservation per attempt member from the ledger before calling this.

    Without MIG there is nothing to prepare and no transition: the driver sends the binds at
    once and the record stays ``placing`` until ``bound`` moves it on — the ledger, the home
    of the reservations, already says the attempt is placed (docs/saga.md, "One write fewer")."""
    if s is None or s.attempt != ev.attempt or s.phase not in PLACING or ev.members_digest != members_digest(s):
        return None
    return replace(s, phase="preparing", whatif=None)


def preempting(s: GangState | None, ev: Preempting) -> GangState | None:
    """placing → preempting: placement nominated the GPUs the victims it evicts will free. The
    attempt stays open — no backoff, no new attempt, woken by no release — until placement
    answers ``Reserved`` (the nomination became the reservation) or ``PlacementFailed`` (it gave
    the nomination up). While preempting, a new reason (victims slow to go) is recorded; the same
    one again changes nothing."""
    if s is None or s.attempt != ev.attempt or s.phase not in PLACING or ev.members_digest != members_digest(s):
        return None
    if s.phase == "preempting" and s.reason == ev.reason:
        return None
    return replace(s, phase="preempting", reason=ev.reason, reserve_nodes=ev.nodes, whatif=None, waits_for="gpus",
                   held_back=False)


def placement_failed(s: GangState | None, ev: PlacementFailed, *, now: float, base_s: float,
                     max_s: float, unschedulable_s: float = UNSCHEDULABLE_RETRY_S) -> GangState | None:
    """placing → backoff: nothing was reserved, so there is nothing to compensate. A reply
    naming other pods than the members (another incarnation of the gang) changes nothing.
    The gang keeps what it waits for (``fairness.waits_for``) and is retried when that changes,
    or after ``fairness.retry_delay`` at the latest — or, when placement named the time a
    preemption it needs becomes possible (``retry_at``: its victims' minimum runtime), at that
    time, neither before nor after. From ``preempting`` too: placement gave the nomination up."""
    if s is None or s.attempt != ev.attempt or s.phase not in PLACING:
        return None
    if ev.members and set(ev.members) != {m.pod for m in attempt_members(s)}:
        return None
    failures = s.failures + 1
    delay = retry_delay(replace(s, waits_for=waits_for(ev), fits_empty_cluster=ev.fits_empty_cluster), failures,
                        base_s=base_s, max_s=max_s, unschedulable_s=unschedulable_s)
    reason = failure_reason(ev.summary, s, ev.whatif)
    until = ev.retry_at if ev.retry_at > now else now + delay
    after = replace(s, phase="backoff", failures=failures, backoff_until=until, reason=reason,
                    failure="placement_failed", fits_empty_cluster=ev.fits_empty_cluster,
                    reserve_nodes=ev.reserve_nodes, whatif=ev.whatif, waits_for=waits_for(ev))
    # A repair attempt with no room in its domain: its policy widens, restarts or waits there.
    return repairs.no_room(after, now) if s.repair is not None else after


def failure_reason(summary: str, s: GangState, whatif: WhatIf | None = None) -> str:
    """What a gang's pods say after a failed placement: placement's ``summary``, the nodes its
    attempt left to a starving head (backfill), and the top answer of what would start it."""
    reason = summary
    if s.avoid_nodes:
        reason += f" (backfill behind {s.avoid_for}, first in queue and waiting too long: {', '.join(s.avoid_nodes)})"
    top = whatif.top() if whatif is not None else ""
    if top:  # "... 2 insufficient free GPUs; would start if ..."
        reason = f"{reason.removesuffix('.')}; {top}"
    return reason


def mig_ready(s: GangState | None, ev: MigReady, *, all_ready: bool) -> GangState | None:
    """preparing → binding once every MIG reservation of the attempt has its instance ready
    (``all_ready``: the driver read ``phx-mig``; the instances live there, not here)."""
    if s is None or s.attempt != ev.attempt or s.phase != "preparing" or not all_ready:
        return None
    return replace(s, phase="binding")


def bound(s: GangState | None, attempt: int, pods: tuple[PodRef, ...]) -> GangState | None:
    """binding, or placing/preempting without MIG (its binds went out from there): more members
    bound (the driver checked each against the cluster and the ledger); → scheduled when every
    member of the attempt is, else binding."""
    if s is None or s.attempt != attempt or s.phase not in (*PLACING, "binding"):
        return None
    wanted = {m.pod for m in attempt_members(s)}
    new = tuple(p for p in dict.fromkeys(pods) if p in wanted and p not in s.bound)
    if not new:
        return None
    now_bound = s.bound + new
    done = wanted <= set(now_bound)
    if done:
        s = replace(s, bound=now_bound, phase="scheduled", reason="", whatif=None, home=())
        return repairs.attempt_bound(s)
    return replace(s, bound=now_bound, phase="binding")


def fail(s: GangState | None, attempt: int, reason: str, *, code: str, phases: Collection[Phase] = RUNNING) -> GangState | None:
    """A running attempt failed (MIG, bind, deadline, a member gone): → rolling_back. ``code``
    names the failure (``GangState.failure``)."""
    if s is None or s.attempt != attempt or s.phase not in phases:
        return None
    return replace(s, phase="rolling_back", reason=reason, failure=code, rollback_done=())


def member_deleted(s: GangState | None, attempt: int, pod: PodRef) -> GangState | None:
    return fail(s, attempt, f"member {pod} was deleted", code="member_deleted")


def _in_attempt(s: GangState | None, pod: PodRef) -> bool:
    return s is not None and any(m.pod == pod for m in attempt_members(s))


def mig_failed(s: GangState | None, ev: MigFailed) -> GangState | None:
    """A MIG instance of one of the attempt's members failed: roll back."""
    if not _in_attempt(s, ev.pod):
        return None
    return fail(s, ev.attempt, f"MIG instance for {ev.pod} on {ev.node} failed: {ev.reason}", code="mig_failed",
                phases=frozenset({"preparing"}))  # a 1-tuple would infer as tuple[str] to mypy


def bind_failed(s: GangState | None, ev: BindsDone) -> GangState | None:
    """binder could not bind one of the attempt's members: roll back (the first failure names it).
    While ``binding``, or ``placing``/``preempting`` when the binds went out from there (no MIG)."""
    failure = next((f for f in ev.failed if _in_attempt(s, f.pod)), None)
    if failure is None:
        return None
    return fail(s, ev.attempt, f"bind of {failure.pod} failed: {failure.reason}", code="bind_failed",
                phases=(*PLACING, "binding"))


def deadline(s: GangState | None, ev: GangDeadline) -> GangState | None:
    """The deadline of the current, unfinished attempt of these members: give it up. Old
    attempt, or another incarnation of the gang (other members): ignored."""
    if s is None or ev.members_digest != members_digest(s):
        return None
    timeout = f"{s.timeout_s:g} s" if s.timeout_s else "the gang timeout"
    return fail(s, ev.attempt, f"not every member was ready within {timeout}", code="deadline")


def compensated(s: GangState | None, attempt: int, step: str, *, now: float, base_s: float,
                max_s: float, unbound: tuple[PodRef, ...] = ()) -> GangState | None:
    """Record that compensation ``step`` of ``attempt`` ran; after the last, → backoff."""
    if s is None or s.attempt != attempt or s.phase != "rolling_back" or step in s.rollback_done:
        return None
    done = s.rollback_done + (step,)
    s = replace(s, rollback_done=done, unbound=s.unbound + tuple(p for p in unbound if p not in s.unbound))
    if step == "unbind":
        s = replace(s, bound=())
    if all(c in done for c in COMPENSATIONS):
        failures = s.failures + 1
        delay = backoff_delay(failures, base_s=base_s, max_s=max_s, gang_id=s.gang_id)
        s = replace(s, phase="backoff", failures=failures, backoff_until=now + delay)
    return s


def next_compensation(s: GangState) -> str | None:
    """The next compensation to run (reverse order of the steps), or None when all ran."""
    return next((c for c in COMPENSATIONS if c not in s.rollback_done), None)


def pending_reason(s: GangState, now: float) -> str:
    """What the pods say while the gang waits: attempt count and last failure."""
    if s.held_back:
        return s.reason if s.attempt == 0 else f"{s.reason} (attempt {s.attempt} was the last)"
    if s.phase == "waiting" or s.attempt == 0:
        have, need = len(s.members), s.min_member
        return f"gang incomplete: {have}/{need} members present" if have < need else "gang waiting to start"
    if s.phase == "preempting":
        return f"{s.reason} (attempt {s.attempt})"
    retry = max(0.0, s.backoff_until - now)
    return f"{s.reason} (attempt {s.attempt}); next try in {retry:.0f}s"


def queue_conflict(s: GangState) -> str:
    """Why the gang cannot start for its queue: its members name different queues ("" when not)."""
    named = sorted({m.queue or DEFAULT_QUEUE for m in s.members})
    if len(named) < 2:
        return ""
    return (f"the gang's members name different queues ({', '.join(named)}): a gang is placed within one queue; "
            f"label every pod with the same {QUEUE_LABEL}")
