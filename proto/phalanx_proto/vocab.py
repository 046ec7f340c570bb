"""The saga's vocabularies, said once: which phases mean what, and the rules a refused message
breaks.

``Phase`` (``phalanx_proto.events``) names the phases of a gang's saga (docs/saga.md); the
sets below group them the way every reader needs them: gang-coordinator's transitions, its
resync and reconciler, placement's checks and queues, the metrics' label values. A new phase
goes into ``Phase`` and into the sets it belongs to, here and nowhere else.

``RefusalRule`` names the check a command or reply failed (docs/saga.md, "Checks"): placement,
binder and gang-coordinator refuse with one of these, and its value is the ``rule`` label of
``phalanx_refused_messages_total``, so a value never changes.
"""

from __future__ import annotations

import enum
from typing import get_args

from phalanx_proto.events import Phase

PHASES: tuple[Phase, ...] = get_args(Phase)
"""Every phase, in the order of ``Phase``."""

IDLE: frozenset[Phase] = frozenset({"waiting", "backoff"})
"""The gang waits for an attempt to start: complete or not yet (``waiting``), or after a failed
attempt (``backoff``). Only from here does an attempt start (or late members join a
``scheduled`` gang)."""

RUNNING: frozenset[Phase] = frozenset({"placing", "preempting", "preparing", "binding"})
"""An attempt is under way: it may fail, and its deadline is armed. ``preempting``: placement
nominated the GPUs its victims will free and the attempt waits for them (docs/preemption.md)."""

OPEN: frozenset[Phase] = RUNNING | {"rolling_back"}
"""An attempt is under way or being rolled back: its members are fixed (a pod that arrives waits
for the next attempt) and it may hold reservations, MIG instances and bound pods."""

LIVE: frozenset[Phase] = RUNNING | {"scheduled"}
"""The current attempt's reservations are in use: none of its members' may be released."""

ASKING: frozenset[Phase] = IDLE | {"placing", "preempting"}
"""The gang asks for GPUs it does not hold yet: it waits, or its attempt is being placed, or
waits for its victims' GPUs (until its reservation is in: then it holds them and is being
bound). What a queue's fair share and the queues owed free GPUs count
(``phalanx_rules.queueorder``)."""

PLACING: frozenset[Phase] = frozenset({"placing", "preempting"})
"""The attempt has no reservation yet, or has just got it and its binds are out (no MIG): a
``Reserved`` is taken, and a placement decision made, only here."""

BOUND_WANTED: frozenset[Phase] = PLACING | {"binding", "scheduled"}
"""The attempt wants its members bound where the ledger holds them (``placing``/``preempting``:
its binds go out from there when no MIG instance is to be made first)."""

assert IDLE | OPEN | {"scheduled"} == set(PHASES), "every phase is idle, open or scheduled"


class RefusalRule(enum.StrEnum):
    """The check a message failed (docs/saga.md, "Checks"). The value is a metric label."""

    UNKNOWN_GANG = "unknown_gang"
    """placement: no record of the gang in ``phx-gangs``."""
    STALE_ATTEMPT = "stale_attempt"
    """The message is for an attempt that is over."""
    UNSTARTED_ATTEMPT = "unstarted_attempt"
    """The message is for an attempt the gang never started."""
    NOT_MEMBERS = "not_members"
    """placement: the command's members digest is not the gang record's attempt's (or the attempt
    has no member); gang-coordinator: a ``Reserved`` for members other than the attempt's."""
    NOT_PLACING = "not_placing"
    """placement: a new decision while the record says the attempt is no longer placing."""
    LIVE_RELEASE = "live_release"
    """placement: a release of a member of an attempt still live (``LIVE``)."""
    UNNAMED_RELEASE = "unnamed_release"
    """placement: a release that names no pod."""
    NOT_IN_LEDGER = "not_in_ledger"
    """binder: the ledger holds no such reservation for this gang, attempt and pod uid."""
    FOREIGN_SCHEDULER = "foreign_scheduler"
    """The pod's ``schedulerName`` is not Phalanx's."""
    UNKNOWN_NODE = "unknown_node"
    """The node has no (readable) topology report."""
    NODE_DISABLED = "node_disabled"
    """binder: the node is not enabled for Phalanx."""
    NOT_BOUND = "not_bound"
    """gang-coordinator: the cluster does not show the pod bound where ``BindsDone`` says."""
    NOT_MEMBER = "not_member"
    """gang-coordinator: the pod is not a member of the gang."""
    NOT_RECORDED = "not_recorded"
    """What the message says is not what the record holds (ledger, MIG records), or cannot be
    recorded (an adoption onto GPUs that are missing or taken)."""
    UNREADABLE_RECORD = "unreadable_record"
    """The record to check against does not decode or breaks its bucket's rule."""
    LIVE_POD = "live_pod"
    """placement: a release of a reservation whose pod still runs on the node; binder: an
    ``UnreserveClaims`` for a pod that is bound."""
    NOT_RUNNING_THERE = "not_running_there"
    """placement: an adoption of a pod the node's agent does not report running there."""
    ADOPTED_RESERVATION = "adopted_reservation"
    """binder: a bind of a reservation recorded by an adoption, not by a placement decision."""
    MIG_NOT_READY = "mig_not_ready"
    """binder: a MIG member whose instance ``phx-mig`` does not record ready for this attempt."""
