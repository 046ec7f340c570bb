"""Saga, topology and node-command events: the tagged unions that travel on JetStream.

One base per stream (style rule 5): ``GangEvent`` on ``PHX_GANG``, ``TopologyEvent`` on
``PHX_TOPOLOGY``, ``NodeEvent`` on ``PHX_NODE``. Every event is frozen, keyword-only, omits
defaults on the wire and carries its stable tag in the ``kind`` field. Tags never change;
new fields are only added with defaults; unknown fields are ignored on decode, so an older
service reads a newer event.

Every event has an ``idempotency_key`` (``key()``): it is also the ``Nats-Msg-Id`` it is
published with, so a republished command is dropped by the server's duplicate window and a
redelivered one is recognised by its handler. Keys name the pods they are about by uid
(contract C2): a per-pod message carries ``<namespace>/<name>/<uid>``, a gang-level one a
digest of its pods' uids (``uid_digest``). So a pod recreated under the same name, or a gang
recreated under the same id, is a new message, not a duplicate of the old one.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Iterable
from typing import Annotated, Literal

import msgspec

from phalanx_proto.codec import Decoder
from phalanx_proto.dra import MAX_CLAIMS_PER_POD, ClaimAllocated, PodClaim
from phalanx_proto.queuespec import QueueHistory, QueueSpec
from phalanx_proto.scheduling import (
    MAX_HOST_PORTS,
    MAX_POD_LABELS,
    MAX_RESOURCES,
    MAX_SELECTOR_LABELS,
    MAX_TERMS,
    MAX_TOLERATIONS,
    HostPort,
    NodeKubeState,
    NodeSelectorTerm,
    PodAffinityTerm,
    QualifiedName,
    SpreadConstraint,
    Toleration,
    WeightedNodeSelectorTerm,
    WeightedPodAffinityTerm,
)
from phalanx_proto.topology import MAX_GPUS, NetworkTiers, NodeTopology

Attempt = Annotated[int, msgspec.Meta(ge=1)]
MAX_BATCH_PODS = 10_000
"""Pods one message may name (a gang's members at most: ``state.MAX_GANG_MEMBERS``)."""
NonNegative = Annotated[int, msgspec.Meta(ge=0)]


WaitsFor = Literal["", "gpus", "queue", "cluster"]
"""What a gang that did not fit waits for before it is tried again (docs/saga.md, "Retried when
something changed"): ``gpus`` — GPUs to be released; ``queue`` — its queue's usage to drop (a
release charged to its queue's line) or the queues to change; ``cluster`` — the cluster itself
to change (a node added, relabelled, uncordoned…), since it would not fit even were every GPU
free. "" (a sender from before the field): ``gpus`` when it fits the empty cluster, else
``cluster``."""

class PodRef(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A pod by namespace/name, plus its uid so a recreated pod is not mistaken for the old one."""

    namespace: str
    name: str
    uid: str = ""

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class RequestKind(enum.StrEnum):
    """What kind of GPU work a member asks for (and an assignment holds): the one vocabulary
    every part of Phalanx uses. Derived from the fields, never sent on its own."""

    NONE = "none"
    """No GPU: CPU, memory and other resources only."""
    WHOLE = "whole"
    """Whole GPUs, nothing else on them."""
    TDM = "tdm"
    """A time-division share of each GPU: core percent and/or GPU memory."""
    MIG = "mig"
    """A MIG instance (compute slices) on one GPU."""


def request_kind(*, gpus: int, core_pct: int, memory_mib: int, mig: bool) -> RequestKind:
    """The kind of a request or reservation: MIG when it names a MIG slice or profile, TDM when
    it names a core percent or GPU memory, whole GPUs when it counts GPUs, else none."""
    if mig:
        return RequestKind.MIG
    if core_pct or memory_mib:
        return RequestKind.TDM
    return RequestKind.WHOLE if gpus else RequestKind.NONE


def pod_key(pod: PodRef) -> str:
    """``<namespace>/<name>/<uid>``: one pod, not one pod name (a recreated pod is another)."""
    return f"{pod.namespace}/{pod.name}/{pod.uid}"


def uid_digest(pods: Iterable[PodRef]) -> str:
    """A short digest of a set of pods by uid (order does not matter): the part of a
    gang-level idempotency key that tells one incarnation of a gang from another."""
    text = "\n".join(sorted(pod_key(p) for p in pods))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class MemberSpec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What one gang member asks for, in wire form (parsed from the pod by gang-coordinator).

    ``gpus`` whole GPUs; or a share of ``gpus`` GPUs with ``core_pct``/``memory_mib`` each
    (TDM); or a MIG slice (``mig_slices``). ``rdma`` switches on joint GPU+NIC placement.
    """

    pod: PodRef
    gpus: NonNegative = 0
    core_pct: Annotated[int, msgspec.Meta(ge=0, le=100)] = 0
    memory_mib: NonNegative = 0
    mig_slices: NonNegative = 0
    rdma: bool = False
    vendor: str = ""
    resource_name: str = "nvidia.com/gpu"
    requests: Annotated[dict[str, NonNegative], msgspec.Meta(max_length=MAX_RESOURCES)] = {}
    """What the pod requests besides GPUs, summed as kube-scheduler sums it (containers,
    init containers, overhead): ``cpu`` in millicores, ``memory`` and ``ephemeral-storage``
    in bytes, every other resource as its integer amount (``phalanx_proto.scheduling``). The
    pod itself always counts one towards the node's ``pods``."""
    tolerations: Annotated[tuple[Toleration, ...], msgspec.Meta(max_length=MAX_TOLERATIONS)] = ()
    node_selector: Annotated[dict[str, str], msgspec.Meta(max_length=MAX_SELECTOR_LABELS)] = {}
    """``spec.nodeSelector``: every label must be on the node with that value."""
    node_affinity: Annotated[tuple[NodeSelectorTerm, ...], msgspec.Meta(max_length=MAX_TERMS)] | None = None
    """Required node affinity (``requiredDuringSchedulingIgnoredDuringExecution``): the node
    must match one of the terms. ``None``: the pod has none."""
    preferred_node_affinity: Annotated[tuple[WeightedNodeSelectorTerm, ...], msgspec.Meta(max_length=MAX_TERMS)] = ()
    """Preferred node affinity: among the nodes that fit, one matching more weight ranks higher
    (docs/placement.md)."""
    node_name: str = ""
    """``spec.nodeName`` asked by the pod: only that node will do."""
    host_ports: Annotated[tuple[HostPort, ...], msgspec.Meta(max_length=MAX_HOST_PORTS)] = ()
    """Host ports the pod binds (with ``host_network``, every container port)."""
    host_network: bool = False
    unsupported: Annotated[tuple[str, ...], msgspec.Meta(max_length=8)] = ()
    """Scheduling terms the pod has that Phalanx does not evaluate (``podAffinity``/
    ``podAntiAffinity`` whose terms select namespaces by their labels): such a member fits no
    node, with that reason, rather than having them ignored."""
    labels: Annotated[dict[QualifiedName, str], msgspec.Meta(max_length=MAX_POD_LABELS)] = {}
    """The pod's labels, for pod (anti-)affinity: the terms of other pods (and of the gang's
    other members) select it by them."""
    pod_affinity: Annotated[tuple[PodAffinityTerm, ...], msgspec.Meta(max_length=MAX_TERMS)] = ()
    """Required pod affinity terms (``InterPodAffinity``): every one must hold on the node."""
    pod_anti_affinity: Annotated[tuple[PodAffinityTerm, ...], msgspec.Meta(max_length=MAX_TERMS)] = ()
    """Required pod anti-affinity terms: none may select a pod in the node's domain; they also
    keep later pods they select out of it (the reservation carries them)."""
    preferred_affinity: Annotated[tuple[WeightedPodAffinityTerm, ...], msgspec.Meta(max_length=MAX_TERMS)] = ()
    """Preferred pod affinity terms: among the nodes that fit, one whose domain holds pods they
    select ranks higher (after the GPU set's quality, before packing: docs/placement.md)."""
    preferred_anti_affinity: Annotated[tuple[WeightedPodAffinityTerm, ...], msgspec.Meta(max_length=MAX_TERMS)] = ()
    """Preferred pod anti-affinity terms: the same, ranking such a node lower."""
    spread: Annotated[tuple[SpreadConstraint, ...], msgspec.Meta(max_length=MAX_TERMS)] = ()
    """The pod's ``topologySpreadConstraints`` with ``whenUnsatisfiable: DoNotSchedule``
    (PodTopologySpread's filter)."""
    soft_spread: Annotated[tuple[SpreadConstraint, ...], msgspec.Meta(max_length=MAX_TERMS)] = ()
    """The ``ScheduleAnyway`` ones (PodTopologySpread's score): among the nodes that fit, one
    whose domains hold fewer pods they select ranks higher (docs/placement.md)."""
    queue: Annotated[str, msgspec.Meta(max_length=253)] = ""
    """The queue the pod is in (its label, else its namespace's, else ``default``:
    docs/queues.md); "" before queues, read as ``default``."""
    priority: int = 0
    """The pod's ``spec.priority`` (set by the API server from its PriorityClass): a gang's
    members must agree on it to preempt (docs/preemption.md)."""
    preemption_policy: Annotated[str, msgspec.Meta(max_length=32)] = ""
    """The pod's ``spec.preemptionPolicy``: ``Never`` never preempts; "" is Kubernetes' default,
    ``PreemptLowerPriority``."""
    claims: Annotated[tuple[PodClaim, ...], msgspec.Meta(max_length=MAX_CLAIMS_PER_POD)] = ()
    """The pod's ResourceClaims (``spec.resourceClaims``), resolved (docs/dra.md): the devices
    Phalanx must allocate for it, on the node it goes to, in the same decision."""

    @property
    def kind(self) -> RequestKind:
        return request_kind(gpus=self.gpus, core_pct=self.core_pct, memory_mib=self.memory_mib,
                            mig=bool(self.mig_slices))


class Assignment(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Where one member goes: the node, its GPUs and NICs, and how good the fit is.

    This is also the JSON written to the pod annotation ``phalanx.io/assignment`` before the
    binding, for a device plugin or runtime hook on the node.
    """

    pod: PodRef
    node: str
    gpus: tuple[int, ...] = ()
    gpu_uuids: tuple[str, ...] = ()
    core_pct: NonNegative = 0
    memory_mib: NonNegative = 0
    mig_profile: str = ""
    mig_start: int = -1
    mig_instance_uuid: str = ""
    nics: tuple[str, ...] = ()
    rdma_level: str = ""
    """RDMA fallback level reached: pcie-switch, numa, socket, cross-socket (empty without RDMA)."""
    requests: Annotated[dict[str, NonNegative], msgspec.Meta(max_length=MAX_RESOURCES)] = {}
    """The member's requests besides GPUs (``MemberSpec.requests``), so the ledger accounts
    for Phalanx's own pods on the node."""
    host_ports: Annotated[tuple[HostPort, ...], msgspec.Meta(max_length=MAX_HOST_PORTS)] = ()
    """The host ports the member binds on the node."""
    claims: Annotated[tuple[ClaimAllocated, ...], msgspec.Meta(max_length=MAX_CLAIMS_PER_POD)] = ()
    """The member's ResourceClaims and what Phalanx allocated for each (docs/dra.md); the
    devices joined to the node's GPUs are also in ``gpus``."""
    labels: Annotated[dict[QualifiedName, str], msgspec.Meta(max_length=MAX_POD_LABELS)] = {}
    """The member's pod labels (``MemberSpec.labels``), so pod (anti-)affinity sees Phalanx's
    own pods on the node, bound or still reserved."""
    anti_affinity: Annotated[tuple[PodAffinityTerm, ...], msgspec.Meta(max_length=MAX_TERMS)] = ()
    """The member's required pod anti-affinity terms (``MemberSpec.pod_anti_affinity``): they
    keep the pods they select out of its domain."""

    @property
    def kind(self) -> RequestKind:
        return request_kind(gpus=len(self.gpus), core_pct=self.core_pct, memory_mib=self.memory_mib,
                            mig=bool(self.mig_profile))


# --- counterfactual answers (docs/whatif.md) ------------------------------------------------
# Here, not in ``whatif.py``, because ``PlacementFailed`` carries them and they hold
# ``Assignment``s: one module, no import cycle. ``phalanx_proto.whatif`` re-exports them.

Probe = Literal["queue-limit", "queue-quota", "wait", "preempt", "tier", "model", "smaller", "fewer"]
PROBES: tuple[str, ...] = ("queue-limit", "queue-quota", "wait", "preempt", "tier", "model", "smaller", "fewer")
"""Every probe, in the order its answers are listed (docs/whatif.md says why)."""
MAX_ANSWERS = 16
"""Answers one ``WhatIf`` carries on the wire and in a gang record (the smaller probe answers
once per request dimension; every other probe at most once)."""
MAX_HOLDERS = 8
"""Holders an answer names on the wire (the most GPUs first; its text names three)."""
MAX_ANSWER_TEXT = 1000
Text = Annotated[str, msgspec.Meta(max_length=MAX_ANSWER_TEXT)]
Name = Annotated[str, msgspec.Meta(max_length=512)]


class Holder(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A running gang that holds capacity the pending gang would need."""

    gang_id: Name
    queue: Name = ""
    priority: int = 0
    age_s: float = 0.0
    """How long it has held its reservation (0 when unknown)."""
    gpus: int = 0
    """Whole GPUs (or GPUs with a share of it) it holds where the pending gang would go."""


class Answer(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One probe's answer: ``text`` for people (``would start if 3 GPUs free in network-pod p1
    (held by gangs a/train-7, b/exp-2)``), the fields for programs. ``starts``: the change alone
    lets the gang start now (the engine placed it, and its queue lets it); False for a necessary
    change that is not enough by itself. ``assignments``: the engine's decision under the change
    (left out on the wire and in gang records: ``WhatIf.bounded``)."""

    probe: Probe
    text: Text
    starts: bool = True
    tier: Name = ""
    """The tightest network tier holding the decision (node, hypernode, leaf, netpod)."""
    domain: Name = ""
    """That tier's domain (a node, HyperNode, leaf switch or network-pod name)."""
    gpus: int = 0
    """wait/preempt: GPUs that would have to be freed."""
    holders: Annotated[tuple[Holder, ...], msgspec.Meta(max_length=MAX_HOLDERS)] = ()
    queue: Name = ""
    lacking_gpus: float = 0.0
    """queue-limit/queue-quota: GPUs of headroom the queue lacks."""
    members: int = 0
    """fewer: how many members would start."""
    change: Text = ""
    """smaller/model/tier: what changes, ``gpus 8 -> 4``, ``nvidia.com/gpu.product=A100``."""
    minimal: bool = True
    """False when the probe ran out of time before proving its answer minimal."""
    assignments: Annotated[tuple[Assignment, ...], msgspec.Meta(max_length=MAX_BATCH_PODS)] = ()


class WhatIf(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Every answer, ordered; ``cut``: probes that ran out of their time budget."""

    answers: Annotated[tuple[Answer, ...], msgspec.Meta(max_length=MAX_ANSWERS)] = ()
    spent_ms: float = 0.0
    decisions: int = 0
    """Engine decisions the probes made."""
    cut: Annotated[tuple[Annotated[str, msgspec.Meta(max_length=32)], ...], msgspec.Meta(max_length=len(PROBES))] = ()
    """The probe steps not run, the first one out of time (``queue``, ``wait``, ... ``fewer``)."""

    def top(self) -> str:
        """One line to append to the pending reason ("" when nothing would start it): the first
        answer that starts the gang by itself."""
        return next((a.text for a in self.answers if a.starts), "")

    def bounded(self) -> WhatIf:
        """This, within the wire's bounds: at most ``MAX_ANSWERS`` answers, each without its
        assignments (a gang of thousands of members would double the message), with at most
        ``MAX_HOLDERS`` holders and its texts cut to ``MAX_ANSWER_TEXT`` characters."""
        def cut(text: str) -> str:
            return text if len(text) <= MAX_ANSWER_TEXT else text[:MAX_ANSWER_TEXT - 3] + "..."

        answers = tuple(msgspec.structs.replace(a, assignments=(), holders=a.holders[:MAX_HOLDERS], text=cut(a.text),
                                                change=cut(a.change))
                        for a in self.answers[:MAX_ANSWERS])
        return msgspec.structs.replace(self, answers=answers)


class GangEvent(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="kind"):
    """Base of every event on the gang stream (saga commands and replies)."""

    gang_id: str
    attempt: Attempt = 1

    def key(self) -> str:
        """The idempotency key, also sent as ``Nats-Msg-Id``: tag, gang, attempt and the
        pods the event is about (``scope``)."""
        base = f"{self.__struct_config__.tag}:{self.gang_id}:{self.attempt}"
        scope = self.scope()
        return f"{base}:{scope}" if scope else base

    def scope(self) -> str:
        """The pods part of the key: a pod's ``pod_key`` or a digest of several pods' uids."""
        return ""


class GangAdmitted(GangEvent, frozen=True, tag="gang.admitted"):
    """gang-coordinator has seen all min-member pods and starts an attempt."""

    members: tuple[PodRef, ...] = ()
    min_member: NonNegative = 1

    def scope(self) -> str:
        return uid_digest(self.members)


class PlaceRequested(GangEvent, frozen=True, tag="placement.place"):
    """Command to placement: place the gang's attempt, all or nothing, and reserve it.

    A reference: the members to place and the nodes to avoid are the gang's record in
    ``phx-gangs`` (``attempt_members``, ``avoid_nodes``), their only home. Placement carries it
    out only while that record is at this attempt, placing, with exactly the members
    ``members_digest`` names (docs/saga.md, "Checks"). Replaces ``placement.requested``, which
    carried the members (retired tag, never reused)."""

    members_digest: str = ""
    """``uid_digest`` of the attempt's members: this incarnation of the gang's attempt."""

    def scope(self) -> str:
        return self.members_digest


class Reserved(GangEvent, frozen=True, tag="gang.reserved"):
    """Reply from placement: the attempt's reservations are committed in ``phx-ledger``.

    A reference: the assignments live in the ledger only, one per member under (gang,
    attempt, pod uid); gang-coordinator reads them from its mirror of it. Replaces
    ``gang.placed``, which carried them (retired tag, never reused)."""

    members_digest: str = ""
    """``uid_digest`` of the attempt's members, as in the ``placement.place`` it answers."""

    def scope(self) -> str:
        return self.members_digest


class PlacementFailed(GangEvent, frozen=True, tag="gang.placement_failed"):
    """Reply from placement: the gang does not fit now. ``summary`` is kube-scheduler style."""

    summary: str = ""
    reasons: dict[str, int] = {}
    """Reason → number of nodes that failed for it."""
    fits_empty_cluster: bool = True
    """False when the gang would not fit even if every current reservation were gone: waiting
    cannot help, so it must not hold other gangs back (fairness gate)."""
    members: tuple[PodRef, ...] = ()
    """The pods of the request this answers (so a reply is matched to one gang incarnation)."""
    reserve_nodes: tuple[str, ...] = ()
    """Where the gang would go were the cluster empty (when it could fit at all): the nodes
    the fairness gate keeps for it if it becomes the starving head of the queue."""
    whatif: WhatIf | None = None
    """What would start the gang now (placement's counterfactual probes, docs/whatif.md), within
    the wire's bounds (``WhatIf.bounded``); None when they were not run (out of their time budget)
    or before they existed. gang-coordinator stores it in the record and appends its top line
    to the pending reason."""
    waits_for: WaitsFor = ""
    """What must change before trying again can help (``WaitsFor``): gang-coordinator retries
    the gang when that happens, not on a timer."""
    retry_at: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    """Unix time from which a preemption the gang needs becomes possible (the victims' minimum
    runtime ends then, docs/preemption.md): gang-coordinator retries it then instead of after
    its backoff (0: no such time)."""

    def scope(self) -> str:
        return uid_digest(self.members)


class Preempting(GangEvent, frozen=True, tag="gang.preempting"):
    """Reply from placement: the attempt does not fit as the cluster is, so placement nominated
    GPUs its victims will free and sent their eviction (docs/preemption.md). The attempt stays
    open: gang-coordinator moves it to ``preempting`` and waits, with no backoff and no new
    attempt, until placement turns the nomination into the attempt's reservation (``Reserved``,
    in the same compare-and-set that frees the victims' last GPUs) or gives it up
    (``PlacementFailed``). Sent again, with another ``reason``, while the victims are slow to go."""

    members_digest: str = ""
    """``uid_digest`` of the attempt's members, as in the ``placement.place`` it answers."""
    reason: Annotated[str, msgspec.Meta(max_length=4000)] = ""
    """What the pods say meanwhile: the victims, or those still holding GPUs."""
    nodes: Annotated[tuple[str, ...], msgspec.Meta(max_length=MAX_BATCH_PODS)] = ()
    """Where the GPUs are kept for it (the nominated nodes)."""

    def scope(self) -> str:
        return f"{self.members_digest}:{hashlib.sha256(self.reason.encode()).hexdigest()[:8]}"


class BindPods(GangEvent, frozen=True, tag="bind.pods"):
    """Command to binder: bind these members of the attempt. A reference: each pod is bound
    to what the ledger holds for exactly (gang, attempt, pod uid), a MIG member with the
    instance its node's mig-manager recorded ready for it in ``phx-mig`` — never to anything a
    command says (docs/saga.md, "Checks"). Replaces ``bind.requested`` (one assignment per
    message, believed after a comparison with the ledger; retired tag, never reused)."""

    pods: Annotated[tuple[PodRef, ...], msgspec.Meta(max_length=MAX_BATCH_PODS)] = ()

    def scope(self) -> str:
        return uid_digest(self.pods)


class HeldClaims(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One member's claims as its reservation holds them (``Assignment.claims``)."""

    pod: PodRef
    claims: Annotated[tuple[ClaimAllocated, ...], msgspec.Meta(max_length=MAX_CLAIMS_PER_POD)] = ()


class UnreserveClaims(GangEvent, frozen=True, tag="binder.unreserve_claims"):
    """Command to binder, the ``claims`` compensation of a rolled-back attempt (docs/dra.md):
    take each pod out of its ResourceClaims' ``reservedFor`` and clear the allocations Phalanx
    wrote that nobody else holds. binder does it only for a pod that is not bound (gone, or never
    bound: the ``unbind`` compensation runs first), so a forged command cannot take a running
    pod's devices away; each claim's allocation is cleared only while it is still the one named."""

    held: Annotated[tuple[HeldClaims, ...], msgspec.Meta(max_length=MAX_BATCH_PODS)] = ()

    def scope(self) -> str:
        return uid_digest(h.pod for h in self.held)


class BindFailure(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One member binder could not bind, and why."""

    pod: PodRef
    reason: Annotated[str, msgspec.Meta(max_length=2000)]


class BindsDone(GangEvent, frozen=True, tag="gang.binds_done"):
    """Reply from binder to one ``bind.pods``: the members it bound (or found bound where the
    ledger says) and those it could not bind, with the reason. A member it refused (the ledger
    holds no such reservation, a foreign pod) is in neither: a forged command gets no answer.
    Replaces ``gang.bound`` and ``gang.bind_failed`` (one message per pod; retired tags)."""

    bound: Annotated[tuple[PodRef, ...], msgspec.Meta(max_length=MAX_BATCH_PODS)] = ()
    failed: Annotated[tuple[BindFailure, ...], msgspec.Meta(max_length=MAX_BATCH_PODS)] = ()

    def scope(self) -> str:
        return f"{uid_digest(self.bound)}:{uid_digest(f.pod for f in self.failed)}"


class RollbackStarted(GangEvent, frozen=True, tag="gang.rollback"):
    """gang-coordinator gives the attempt up and runs its compensations."""

    reason: str = ""
    members_digest: str = ""
    """``uid_digest`` of the attempt's members."""

    def scope(self) -> str:
        return self.members_digest


class ReleaseRequested(GangEvent, frozen=True, tag="placement.release_requested"):
    """Command to placement: drop exactly the reservations of (gang, attempt, pod uid) for
    each of ``pods`` — never another attempt's, never by name alone (contract C1)."""

    reason: str = ""
    pods: tuple[PodRef, ...] = ()

    def scope(self) -> str:
        return uid_digest(self.pods)


class AdoptRequested(GangEvent, frozen=True, tag="placement.adopt_requested"):
    """Command to placement from gang-coordinator's reconciler: a pod with a Phalanx
    schedulerName is bound to ``assignment.node`` without a reservation; record one for it if
    its GPUs are free there (never a GPU booked twice), as (gang, attempt, pod uid)."""

    assignment: Assignment
    reason: str = ""

    def scope(self) -> str:
        return pod_key(self.assignment.pod)


class Released(GangEvent, frozen=True, tag="gang.released"):
    """Reply from placement: the reservations are gone from the ledger."""

    pods: tuple[PodRef, ...] = ()
    queues: Annotated[tuple[Annotated[str, msgspec.Meta(max_length=253)], ...], msgspec.Meta(max_length=64)] = ()
    """The queues the freed reservations were charged to (``Allocation.queues``): gangs waiting
    at a limit of one of them are tried again."""

    def scope(self) -> str:
        return uid_digest(self.pods)


class GangScheduled(GangEvent, frozen=True, tag="gang.scheduled"):
    """Every member is bound: the attempt succeeded."""

    assignments: tuple[Assignment, ...] = ()

    def scope(self) -> str:
        return uid_digest(a.pod for a in self.assignments)


class GangPending(GangEvent, frozen=True, tag="gang.pending"):
    """The gang waits; ``reason`` is what its pods' events and PodScheduled condition say."""

    reason: str = ""


class GangDeadline(GangEvent, frozen=True, tag="gang.deadline"):
    """The attempt's deadline: published by gang-coordinator as a JetStream scheduled message
    when the attempt starts (``phx.deadline.sched.<gang>``) and delivered by the server at the
    deadline to ``phx.deadline.fired.<gang>``. Ignored unless ``attempt`` is still running
    with exactly these members (``members_digest``)."""

    members_digest: str = ""
    """``uid_digest`` of the attempt's members: a deadline of an earlier incarnation of the
    gang (same id, same attempt number, other pods) is not this attempt's."""

    def scope(self) -> str:
        return self.members_digest


MAX_VICTIMS = 1_000
"""Victim gangs one eviction command may name (the planner evicts far fewer)."""


class EvictPods(GangEvent, frozen=True, tag="binder.evict"):
    """Command from placement to binder: evict, through the Eviction API, every pod of the
    victim gangs of a preemption, for the preemptor ``gang_id`` at ``attempt``
    (docs/preemption.md, "Wiring"). A reference: binder evicts only for a nomination the
    ledger holds for exactly this preemptor and attempt, only gangs that nomination names as
    victims, and only the pods the ledger says belong to them — never what a command says."""

    victims: Annotated[tuple[str, ...], msgspec.Meta(max_length=MAX_VICTIMS)] = ()

    def scope(self) -> str:
        return hashlib.sha256("\n".join(sorted(self.victims)).encode()).hexdigest()[:16]


class EvictionRefused(GangEvent, frozen=True, tag="placement.eviction_refused"):
    """Reply from binder to placement: evicting a victim of the preemptor ``gang_id``'s
    nomination was refused (a PodDisruptionBudget: HTTP 429), so nothing was evicted; placement
    drops the nomination and leaves those gangs out of the preemptor's next plans for a while."""

    victims: Annotated[tuple[str, ...], msgspec.Meta(max_length=MAX_VICTIMS)] = ()
    """The victim gangs whose eviction was refused."""
    reason: Annotated[str, msgspec.Meta(max_length=2000)] = ""

    def scope(self) -> str:
        return hashlib.sha256("\n".join(sorted(self.victims)).encode()).hexdigest()[:16]


GANG_EVENTS = (
    GangAdmitted, PlaceRequested, Reserved, PlacementFailed, BindPods, BindsDone,
    RollbackStarted, ReleaseRequested, AdoptRequested, Released, GangScheduled, GangPending, GangDeadline,
    EvictPods, EvictionRefused, UnreserveClaims, Preempting,
)
AnyGangEvent = (
    GangAdmitted | PlaceRequested | Reserved | PlacementFailed | BindPods | BindsDone
    | RollbackStarted | ReleaseRequested | AdoptRequested | Released | GangScheduled | GangPending | GangDeadline
    | EvictPods | EvictionRefused | UnreserveClaims | Preempting
)

MAX_BATCH_EVENTS = 1_024
"""Events one ``GangBatch`` may carry (a scheduling cycle answers at most a few hundred)."""


class Carried(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One event of a ``GangBatch``, with the trace it continues (its W3C ``traceparent``: the
    header it would have travelled with alone)."""

    event: AnyGangEvent
    traceparent: Annotated[str, msgspec.Meta(max_length=128)] = ""


class GangBatch(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="gang.batch", tag_field="kind"):
    """Several gang events one process sends over the same hop, as one message (docs/events.md,
    "Batches"): each is handled as if it had come alone on its gang's subject — checked against
    the kinds its channel carries, in order with that gang's other messages, in its own trace.
    The batch is acknowledged once every event in it is handled; one that must be retried
    sends the whole batch again (handlers are idempotent). ``sender`` names the publishing
    replica; the key digests the events' keys, so the same batch published twice is stored once."""

    sender: Annotated[str, msgspec.Meta(min_length=1, max_length=253)]
    events: Annotated[tuple[Carried, ...], msgspec.Meta(min_length=1, max_length=MAX_BATCH_EVENTS)]

    def key(self) -> str:
        return batch_key(self.sender, (c.event.key() for c in self.events))


def batch_of(sender: str, *events: GangEvent, traceparent: str = "") -> GangBatch:
    """A batch of ``events`` from ``sender`` (tests and tools; services use ``BatchSender``)."""
    # A GangEvent passed here is one of AnyGangEvent's members; mypy sees only the base.
    return GangBatch(sender=sender, events=tuple(Carried(event=e, traceparent=traceparent)  # type: ignore[arg-type]
                                                 for e in events))


def batch_key(sender: str, keys: Iterable[str]) -> str:
    """The idempotency key of a batch: its sender and a digest of its events' keys, in order."""
    digest = hashlib.sha256("\n".join(keys).encode()).hexdigest()[:24]
    return f"gang.batch:{sender}:{digest}"


class TopologyEvent(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="kind"):
    """Base of every event on the topology stream."""

    node: str

    def key(self) -> str:
        return f"{self.__struct_config__.tag}:{self.node}"


class NodeTopologyReported(TopologyEvent, frozen=True, tag="topology.reported"):
    """A node's topology changed (or was seen for the first time)."""

    topology: NodeTopology
    tiers: NetworkTiers = NetworkTiers()
    enabled: bool = True
    """False when the node's labels do not enable Phalanx (R10/R11)."""
    unhealthy: Annotated[tuple[int, ...], msgspec.Meta(max_length=MAX_GPUS)] = ()
    """Indexes of the node's GPUs reported unhealthy (NVML cannot use them; docs/repair.md):
    a running gang's member on one is repaired, and no new work is placed on them."""
    device_plugin: bool = False
    """The node's agent serves the kubelet device plugin (docs/delivery.md), so binder records
    every bind to this node in the node's fence; nodes without a kubelet (the simulator, kwok)
    have nothing that reads a fence."""

    def key(self) -> str:
        return f"{super().key()}:{self.topology.generation}"


class NodeHeartbeat(TopologyEvent, frozen=True, tag="topology.heartbeat"):
    """topology-discovery is alive on ``node`` and its topology is still ``generation``."""

    generation: NonNegative = 0
    at: float = 0.0
    """Unix time (seconds) of the beat."""

    def key(self) -> str:
        return f"{super().key()}:{self.at:.3f}"


TOPOLOGY_EVENTS = (NodeTopologyReported, NodeHeartbeat)
AnyTopologyEvent = NodeTopologyReported | NodeHeartbeat


class NodeEvent(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="kind"):
    """Base of every command to, and reply from, a node agent (mig-manager)."""

    node: str
    gang_id: str
    attempt: Attempt = 1

    def key(self) -> str:
        return f"{self.__struct_config__.tag}:{self.node}:{self.gang_id}:{self.attempt}"


class _PodNodeEvent(NodeEvent, frozen=True, kw_only=True, omit_defaults=True, tag_field="kind"):
    """A node event about one pod: its key carries the pod's uid (C2)."""

    pod: PodRef

    def key(self) -> str:
        return f"{super().key()}:{pod_key(self.pod)}"


class MigPrepareRequested(_PodNodeEvent, frozen=True, tag="mig.prepare_requested"):
    """Command: create a MIG instance of ``profile`` at ``start`` on ``gpu`` for ``pod``."""

    gpu: NonNegative = 0
    profile: str = ""
    start: NonNegative = 0


class MigDestroyRequested(_PodNodeEvent, frozen=True, tag="mig.destroy_requested"):
    gpu: NonNegative = 0
    instance_uuid: str = ""


class MigReady(_PodNodeEvent, frozen=True, tag="mig.ready"):
    instance_uuid: str


class MigFailed(_PodNodeEvent, frozen=True, tag="mig.failed"):
    reason: str


class MigDestroyed(_PodNodeEvent, frozen=True, tag="mig.destroyed"):
    pass


NODE_EVENTS = (MigPrepareRequested, MigDestroyRequested, MigReady, MigFailed, MigDestroyed)
AnyNodeEvent = MigPrepareRequested | MigDestroyRequested | MigReady | MigFailed | MigDestroyed

class RecordedNode(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="node", tag_field="item"):
    """One node as placement's cluster took it (the engine's ``NodeView``), or its removal.
    ``topology`` and ``kube`` are left out when the replica's previous record of the node, since
    its last base, carried the same (``same``)."""

    name: str
    removed: bool = False
    topology: NodeTopology | None = None
    enabled: bool = True
    fresh: bool = True
    tiers: NetworkTiers = NetworkTiers()
    unhealthy: Annotated[tuple[int, ...], msgspec.Meta(max_length=MAX_GPUS)] = ()
    """The node's GPUs reported unhealthy (``NodeTopologyReported.unhealthy``)."""
    allocations: tuple[Assignment, ...] = ()
    revision: NonNegative = 0
    kube: NodeKubeState | None = None
    invalid: str = ""
    same: tuple[Literal["topology", "kube"], ...] = ()


RecordedUnits = Annotated[dict[Annotated[str, msgspec.Meta(max_length=253)], Annotated[int, msgspec.Meta(ge=0)]],
                          msgspec.Meta(max_length=1024)]
RecordedSpecs = Annotated[tuple[QueueSpec, ...], msgspec.Meta(max_length=1024)]


class RecordedQueueGate(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What placement's queue rules read for one request (``phalanx_rules.queueorder``) and what
    they answered: the queues of the gang's line, the units each holds (``limited_held``: by the
    usage records where the queue has a limit; ``held``: by the ledgers), the units the decision
    gives back, the limit's refusal ("" none), whether it would borrow, and the queues below
    their quota it left the free GPUs to."""

    specs: RecordedSpecs = ()
    limited_held: RecordedUnits = {}
    held: RecordedUnits = {}
    releasing: RecordedUnits = {}
    refusal: Annotated[str, msgspec.Meta(max_length=2000)] = ""
    borrowing: bool = False
    owed: tuple[Annotated[str, msgspec.Meta(max_length=253)], ...] = ()
    order: RecordedOrder | None = None
    """The cycle order this request was taken in, when it changed since the replica last
    recorded one (the fair shares, with the queues' recent usage)."""


class RecordedOrder(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a scheduling cycle's order read and said (``phalanx_rules.queueorder.shares_and_ranks``):
    every queue, the units each holds (its subtree included) and its waiting gangs ask, the
    usable GPUs (units), each queue's recent-usage record (the fair share that remembers) and
    the time they were read at; and each queue's fair share. Recorded when it changed."""

    specs: RecordedSpecs = ()
    held: RecordedUnits = {}
    waiting: RecordedUnits = {}
    capacity: Annotated[int, msgspec.Meta(ge=0)] = 0
    history: Annotated[tuple[QueueHistory, ...], msgspec.Meta(max_length=1024)] = ()
    now: float = 0.0
    shares: RecordedUnits = {}


class RecordedRunning(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A running gang the preemption planner could choose from: its pods (their assignments are
    the recorded cluster's), priority, queues and start."""

    gang_id: str
    pods: tuple[PodRef, ...] = ()
    priority: int = 0
    queues: tuple[str, ...] = ()
    started_at: float | None = None


class RecordedPreemption(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What the preemption planner read for one request and what it answered: the preemptor's
    priority, policy and queue (its members are the decision's), the queue tree, the units each
    queue holds with the nominations in force, the running gangs it could choose from, and the
    plan (victims and where the preemptor goes) or why there is none. ``omitted``: the running
    gangs were too many to record (the plan is then not replayed)."""

    priority: int = 0
    policy: Annotated[str, msgspec.Meta(max_length=32)] = ""
    queue: Annotated[str, msgspec.Meta(max_length=253)] = ""
    specs: RecordedSpecs = ()
    held_by: RecordedUnits = {}
    running: tuple[RecordedRunning, ...] = ()
    now: float = 0.0
    victims: tuple[str, ...] = ()
    placed: tuple[Assignment, ...] = ()
    no_plan: Annotated[str, msgspec.Meta(max_length=2000)] = ""
    omitted: bool = False


class RecordedDecision(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="decision",
                       tag_field="item"):
    """One decision of a scheduling cycle: its request, what its queue's rules read and said
    (``queue``), what the engine came to (``placed``, or the ``NoFit`` summary in ``no_fit``;
    nothing when the queue refused it first: ``engine`` False), and what the preemption planner
    read and planned when it was asked (``preemption``)."""

    gang_id: str
    attempt: Attempt = 1
    members: Annotated[tuple[MemberSpec, ...], msgspec.Meta(max_length=MAX_BATCH_PODS)] = ()
    node_state_required: bool = False
    avoid: tuple[str, ...] = ()
    within: tuple[str, ...] = ()
    """The nodes the decision was confined to (a repair's domain, ``within_required``) or tried
    first (the domain a restarted gang ran in); empty: the whole cluster."""
    within_required: bool = False
    placed: tuple[Assignment, ...] = ()
    no_fit: str = ""
    engine: bool = True
    queue: RecordedQueueGate | None = None
    preemption: RecordedPreemption | None = None


class DecisionsRecorded(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="decisions.recorded",
                        tag_field="kind"):
    """Part of one placement replica's decision log (``phx.decisions.<replica>``, docs/whatif.md
    "Replay"): its cluster's changes and its decisions, in the order they happened. ``seq``
    counts the replica's records from 1 (a gap: records lost); a ``base`` record starts from an
    empty cluster, so a replay may begin there."""

    replica: str
    seq: Attempt = 1
    at: float = 0.0
    """Unix time of the scheduling cycle that ends with this record."""
    base: bool = False
    items: tuple[RecordedNode | RecordedDecision, ...] = ()

    def key(self) -> str:
        return f"decisions.recorded:{self.replica}:{self.seq}"


gang_decoder = Decoder(AnyGangEvent | GangBatch)
decisions_decoder = Decoder(DecisionsRecorded)
topology_decoder = Decoder(AnyTopologyEvent)
node_decoder = Decoder(AnyNodeEvent)
encoder = msgspec.json.Encoder()

ALL_EVENTS = GANG_EVENTS + (GangBatch,) + TOPOLOGY_EVENTS + NODE_EVENTS + (DecisionsRecorded,)
RETIRED_TAGS = ("placement.requested", "gang.placed", "bind.requested", "gang.bound", "gang.bind_failed")
"""Tags no version sends any more (commands and replies that carried data now held in one
place, docs/events.md): never given to another event."""


def tag_of(event_type: type[msgspec.Struct]) -> str:
    """The stable wire tag of an event type."""
    return event_type.__struct_config__.tag  # type: ignore[return-value]  # str | int | None: ours are str tags


Phase = Literal["waiting", "placing", "preempting", "preparing", "binding", "scheduled", "rolling_back", "backoff"]
