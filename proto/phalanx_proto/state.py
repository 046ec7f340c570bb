"""Values stored in the shared KV buckets: saga state (``phx-gangs``), the ledger
(``phx-ledger``), MIG ownership (``phx-mig``), gang-coordinator's lease and reconciler report
(``phx-leases``); the rules a value must keep to be believed are ``kvrules.BUCKETS``. They are part
of the contract because ``phalanx explain``, ``phalanx doctor`` and other systems read them;
like events they accept unknown fields and only grow fields with defaults.

"""

from __future__ import annotations

from collections.abc import Collection
from typing import Annotated, Literal

import msgspec

from phalanx_proto.codec import Decoder
from phalanx_proto.events import (
    Assignment,
    MemberSpec,
    NodeHeartbeat,
    NodeTopologyReported,
    Phase,
    PodRef,
    WaitsFor,
    WhatIf,
    pod_key,
    uid_digest,
)
from phalanx_proto.scheduling import NodeKubeState
from phalanx_proto.topology import MAX_GPUS

MAX_GANG_TIMEOUT_S = 7 * 24 * 3600.0
"""The largest per-gang attempt deadline (``phalanx.io/gang-timeout-seconds``): a week."""
MAX_GANG_MEMBERS = 10_000
"""The largest gang (min-member): a decision commits at most 1,000 nodes at once anyway."""
MAX_CLOCK_SKEW_S = 60.0
"""How far ahead of this process's clock a node's timestamp may be (nodes keep NTP time)."""
MIG_STARTS = 8
"""MIG start slots per GPU (0..7)."""


class Allocation(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One member's reservation on one node: the authority for what may be bound there.

    ``(gang_id, attempt, pod uid)`` name it exactly; a release must name all three."""

    gang_id: str
    attempt: int
    assignment: Assignment
    adopted: bool = False
    """Recorded for a pod found bound without a reservation (the reconciler's repair), not by
    a placement decision."""
    queues: tuple[str, ...] = ()
    """The gang's queue and its ancestors when the reservation was made, nearest first: the
    queues whose usage (``QueueUsage``) it is charged to, and from which its release takes it
    back, whatever the tree looks like by then."""


class Nomination(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Where a preemptor's member will go once its victims are gone (docs/preemption.md,
    "Wiring"): placement's view takes these GPUs for every gang but ``gang_id`` until
    ``expires_at``, so nothing else takes what the evictions free. Not a reservation: nothing
    is bound to it, no queue is charged for it, and it may overlap the victims' reservations
    until they are released. Written by placement with the node's reservations (one
    compare-and-set), dropped when the preemptor reserves, when an eviction is refused, or
    once expired."""

    gang_id: str
    attempt: int
    assignment: Assignment
    victims: Annotated[dict[str, str], msgspec.Meta(max_length=1000)] = {}
    """Victim → the rule that allows it (``priority`` or ``reclaim``): binder evicts only
    these victims' pods for this preemptor. A victim is a gang (all its pods) or one extra
    member of an elastic gang (``victim_unit``)."""
    queue: str = ""
    """The preemptor's queue (for the victims' ``Preempted`` events)."""
    priority: int = 0
    """The preemptor's priority."""
    expires_at: float = 0.0

    def active(self, now: float) -> bool:
        return now < self.expires_at


class NodeLedger(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Every reservation on one node, keyed by ``alloc_key(pod)``. Written only by placement,
    always by compare-and-set on the KV revision it read, so no GPU is booked twice."""

    node: str
    allocations: dict[str, Allocation] = {}
    nominations: dict[str, Nomination] = {}
    """Preemptors' members nominated onto this node, keyed by ``alloc_key(pod)`` (``Nomination``)."""


VICTIM_EXTRA = "#"
"""Joins an elastic gang's id and one of its extra members' pod name into a victim. Neither a
gang id (namespaces, pod names, label values and PodGroup names have no ``#``:
``phalanx_kubeobjects.gangs.identify`` refuses one) nor a pod name contains it."""


def victim_unit(gang_id: str, pod_name: str) -> str:
    """The victim that is one extra member of an elastic gang: ``<gang id>#<pod name>``."""
    return f"{gang_id}{VICTIM_EXTRA}{pod_name}"


def victim_of(victim: str) -> tuple[str, str]:
    """(gang id, pod name) of a victim: the pod name of an extra member, "" for a whole gang."""
    gang_id, mark, pod = victim.rpartition(VICTIM_EXTRA)
    return (gang_id, pod) if mark else (victim, "")


def names_victim(victims: Collection[str], gang_id: str, pod_name: str) -> bool:
    """Does a set of victims take this pod of this gang: its whole gang, or the pod as an extra?"""
    return gang_id in victims or victim_unit(gang_id, pod_name) in victims


def alloc_key(pod: PodRef) -> str:
    """Key of a pod's allocation in ``NodeLedger.allocations``: ``<namespace>/<name>/<uid>``
    (contract C1), so a recreated pod (same name, new uid) never matches the old one's."""
    return pod_key(pod)


class GangPart(msgspec.Struct, frozen=True, kw_only=True):
    """One replicated job of a JobSet gang, as its pods say: ``jobs`` Jobs (its replicas) of
    ``members`` pods each (0: its pods do not say)."""

    name: str
    jobs: int
    members: int


class Running(msgspec.Struct, frozen=True, kw_only=True):
    """A member placed and bound by an earlier attempt of its gang (``attempt``), which later
    attempts for late members leave alone."""

    pod: PodRef
    attempt: int


RepairPolicy = Literal["wait-then-restart", "wait", "widen", "restart"]
"""What a running gang that lost members does when its domain has no room for their
replacements (docs/repair.md): wait in the domain until the repair's deadline and then restart
whole (the default), wait in it for as long as it takes, widen by one network tier, or restart
whole at once."""
REPAIR_POLICIES: tuple[str, ...] = ("wait-then-restart", "wait", "widen", "restart")
FailureSignal = Literal["node_not_ready", "node_deleted", "node_tainted", "node_cordoned", "gpu_unhealthy", "pod_deleted",
                        "pod_failed"]
"""Why a bound member counts as failed (a metric label; ``FailedMember.detail`` is the text)."""


class FailedMember(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A bound member of a running gang that failed: its pod, the node it ran on, and why."""

    pod: PodRef
    node: str
    signal: FailureSignal
    detail: str = ""
    at: float = 0.0


class RepairDomain(msgspec.Struct, frozen=True, kw_only=True):
    """One network domain a repair may place replacements in: ``tier`` (``node``,
    ``hypernode``, ``leaf``, ``netpod``) and the domain's name at that tier."""

    tier: str
    domain: str


class Repair(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A running gang being repaired (docs/repair.md): its failed members, the domains their
    replacements may go to (the tightest the gang held when the first failed, then each wider
    one), how far the repair has widened (``level``), its policy and deadline. Set by
    gang-coordinator when a failure is seen, read by placement (the decision's domain), cleared
    when every replacement is bound (``GangRepaired``) or the gang is restarted whole."""

    failed: tuple[FailedMember, ...] = ()
    domains: tuple[RepairDomain, ...] = ()
    level: int = 0
    """Index into ``domains`` of the domain the replacements are placed in now."""
    policy: RepairPolicy = "wait-then-restart"
    started_at: float = 0.0
    deadline_at: float = 0.0
    attempts: int = 0
    """Repair attempts started so far (placements tried inside the domain)."""
    replaced: int = 0
    """Failed members already replaced by an earlier repair attempt of this repair (one that
    started before a later failure joined it)."""
    restart: bool = False
    """The repair gave up the domain: every member is being deleted so the whole gang is placed
    again (``GangRestarted``)."""

    def domain(self) -> RepairDomain | None:
        """Where the replacements go now (None: anywhere, the gang has no known domain)."""
        return self.domains[self.level] if 0 <= self.level < len(self.domains) else None


class GangState(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The saga state of one gang, owned by gang-coordinator and updated by compare-and-set."""

    gang_id: str
    phase: Phase = "waiting"
    attempt: int = 0
    min_member: int = 1
    members: tuple[MemberSpec, ...] = ()
    bound: tuple[PodRef, ...] = ()
    """Members of the current attempt bound so far (their assignments: the ledger's)."""
    reason: str = ""
    """Why the gang is not scheduled (yet): the pending reason its pods show."""
    held_back: bool = msgspec.field(default=False, name="held")
    """``reason`` says what holds the gang back from starting an attempt (the fairness gate, or
    its members' queues), not how its last attempt ended; cleared when an attempt starts. (The
    wire and KV name is ``held``.)"""
    failure: str = ""
    """What ended the last failed attempt, as a code: ``placement_failed``, ``deadline``,
    ``bind_failed``, ``mig_failed``, ``member_deleted`` (a metric label; ``reason`` is the text)."""
    fits_empty_cluster: bool = True
    """From the last PlacementFailed: could the gang fit the cluster with nothing reserved?"""
    reserve_nodes: tuple[str, ...] = ()
    """From the last PlacementFailed: where it would go on the empty cluster (kept for it while
    it is the starving head of the queue)."""
    avoid_nodes: tuple[str, ...] = ()
    """Nodes the current attempt may not use (backfill behind a starving head, ``avoid_for``)."""
    avoid_for: str = ""
    """The starving head the current attempt backfills behind ("" when none)."""
    created_at: float = 0.0
    updated_at: float = 0.0
    trace_id: str = ""
    priority: int = 0
    """``spec.priority`` of the members (the highest); orders the queue before arrival."""
    timeout_s: float = 0.0
    """Per-gang attempt deadline (pod annotation ``phalanx.io/gang-timeout-seconds``); 0: default."""
    min_member_declared: bool = True
    """False when no pod said min-member: the gang is the pods seen once the group is quiet."""
    max_member: int = 0
    """An elastic gang's largest size (``phalanx.io/gang-max-member``); 0: not elastic. Its
    first attempt places ``min_member`` members at once, each later one a single member more
    (``attempt_members``); members past ``min_member`` are its extras, given up first to a
    preemptor (``elastic_extras``)."""
    parts: tuple[GangPart, ...] = ()
    """A JobSet gang: its replicated jobs seen so far (``phalanx_kubeobjects.gangs.jobset_size``)."""
    jobs: int = 0
    """A JobSet gang: the JobSet's total Job count (its pods' ``global-replicas``)."""
    running: tuple[Running, ...] = ()
    """Members bound by earlier attempts: an attempt started for late members of a scheduled
    gang places only the others (``saga.attempt_members``)."""
    last_member_at: float = 0.0
    attempt_started_at: float = 0.0
    """Unix time the current attempt started; its deadline is this + the timeout."""
    failures: int = 0
    """Failed attempts so far (drives the backoff)."""
    backoff_until: float = 0.0
    rollback_done: tuple[str, ...] = ()
    """Compensations of the current attempt already run (``unbind``, ``mig``, ``release``)."""
    unbound: tuple[PodRef, ...] = ()
    """Members deleted by the ``unbind`` compensation (so their deletion is not a new failure)."""
    whatif: WhatIf | None = None
    """From the last PlacementFailed: what would start the gang now (docs/whatif.md); None
    before the first, once placed, or when placement's probes ran out of their time budget."""
    waits_for: WaitsFor = ""
    """From the last PlacementFailed: what must change before a retry can help (``WaitsFor``);
    gang-coordinator wakes the gang when it does (``phalanx_rules.fairness``)."""
    repair: Repair | None = None
    """The gang lost members while it ran and is being repaired inside its domain
    (docs/repair.md); None when it is not."""
    home: tuple[str, ...] = ()
    """The nodes the gang's previous incarnation ran on when it was restarted whole (a repair's
    restart, a JobSet restarted by its failure policy): the new incarnation is placed back in
    their domain first. Kept by the tombstone; cleared once the gang is placed again."""


def attempt_members(s: GangState) -> tuple[MemberSpec, ...]:
    """The members the current attempt places: all but those bound by earlier attempts
    (``running``). What a ``placement.place`` command refers to.

    An elastic gang (``max_member``) places what brings it to ``min_member`` all at once (its
    first attempt, or a repair of its minimum), otherwise one member more, and never more than
    ``max_member`` in all; the members after those wait for the next attempt."""
    running = {r.pod for r in s.running}
    out = tuple(m for m in s.members if m.pod not in running)
    if s.max_member:
        held = sum(1 for m in s.members if m.pod in running)
        out = out[:max(0, min(s.max_member - held, max(1, s.min_member - held)))]
    return out


def elastic_extras(s: GangState, held: Collection[PodRef]) -> tuple[PodRef, ...]:
    """Of ``held`` (the gang's pods holding reservations), those an elastic gang may give up
    one by one while its minimum stays whole: every one past the first ``min_member`` in member
    order, the latest first. Not elastic, or no more than its minimum held: none."""
    if not s.max_member:
        return ()
    order = [m.pod for m in s.members if m.pod in held]
    return tuple(reversed(order[s.min_member:]))


def members_digest(s: GangState) -> str:
    """``uid_digest`` of the attempt's members: names this incarnation of the gang's attempt."""
    return uid_digest(m.pod for m in attempt_members(s))


class MigRecord(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Who owns the MIG instance at one GPU start slot of a node (in ``NodeMig.instances``
    under ``mig_slot``). Written only by that node's mig-manager; gang-coordinator's
    reconciler and ``phalanx doctor`` read it."""

    node: str
    gpu: Annotated[int, msgspec.Meta(ge=0, lt=MAX_GPUS)]
    start: Annotated[int, msgspec.Meta(ge=0, lt=MIG_STARTS)]
    profile: Annotated[str, msgspec.Meta(max_length=64)]
    gang_id: Annotated[str, msgspec.Meta(max_length=512)]
    attempt: int
    pod: PodRef
    state: Literal["creating", "ready"] = "creating"
    """``creating`` (intent, written before the create) or ``ready`` (verified)."""
    uuid: Annotated[str, msgspec.Meta(max_length=128)] = ""
    gi_id: int = -1
    updated_at: float = 0.0

    def owned_by(self, gang_id: str, attempt: int, pod: PodRef) -> bool:
        return (self.gang_id, self.attempt, str(self.pod)) == (gang_id, attempt, str(pod))


class NodeMig(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Every MIG ownership record of one node (KV ``phx-mig``, key the node's token), by slot
    (``mig_slot``). One key per node, written by compare-and-set by that node's mig-manager
    alone: a node can neither write another's records nor grow the bucket past one value."""

    node: str
    instances: Annotated[dict[str, MigRecord], msgspec.Meta(max_length=MAX_GPUS * MIG_STARTS)] = {}


def mig_slot(gpu: int, start: int) -> str:
    """The key of a slot in ``NodeMig.instances``: ``<gpu>.<start>``."""
    return f"{gpu}.{start}"


class Lease(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A lease in ``phx-leases``: held by ``owner`` until ``expires_at`` (unix seconds), taken
    and renewed by compare-and-set on the entry's revision."""

    name: str
    owner: str
    expires_at: float
    acquired_at: float = 0.0


class ReconcilerReport(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What gang-coordinator's reconciler found in its last pass (``phx-leases``, key
    ``RECONCILER_REPORT_KEY``): findings by kind (0 is healthy), and a few lines naming them."""

    owner: str
    at: float
    findings: dict[str, int] = {}
    details: tuple[str, ...] = ()
    repairs: dict[str, int] = {}
    """Repairs asked for in that pass, by action."""


RECONCILER_LEASE_KEY = "gang-coordinator.reconciler"
RECONCILER_REPORT_KEY = "gang-coordinator.reconciler-report"

gang_state_decoder = Decoder(GangState)
ledger_decoder = Decoder(NodeLedger)
report_decoder = Decoder(NodeTopologyReported)
heartbeat_decoder = Decoder(NodeHeartbeat)
node_mig_decoder = Decoder(NodeMig)
lease_decoder = Decoder(Lease)
reconciler_report_decoder = Decoder(ReconcilerReport)
node_kube_state_decoder = Decoder(NodeKubeState)
"""``phx-node-state``: the key is the node's token (only that node's agent may write it, so
the value needs no name of its own to be checked against)."""
