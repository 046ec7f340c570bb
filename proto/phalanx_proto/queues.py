"""Queues on the wire: what a ``Queue`` object says (``QueueSpec``, KV ``phx-queues``, written by
gang-coordinator from the API server) and what each queue holds (``QueueUsage``, in KV
``phx-ledger`` under ``usage_key(queue)``, written by placement in the same atomic batch as
the reservations it accounts for). docs/queues.md has the model.

Amounts are **queue units**, integers: one whole GPU is ``GPU_UNITS`` = 700, so a MIG slice
(a seventh of a GPU) is 100 and one percent of a GPU's core (a TDM share) is 7 — every request
kind is a whole number of units, and sums never round.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from phalanx_proto.events import Assignment, MemberSpec, RequestKind

GROUP, VERSION, KIND, PLURAL = "scheduling.phalanx.io", "v1alpha1", "Queue", "queues"
"""The Queue custom resource (deploy/k8s/crds/queues.scheduling.phalanx.io.yaml)."""
GPU_UNITS = 700
"""Units in one whole GPU: 7 MIG slices × 100, 100 core-percent × 7."""
MIG_SLICE_UNITS = GPU_UNITS // 7
CORE_PCT_UNITS = GPU_UNITS // 100
DEFAULT_QUEUE = "default"
"""The queue of a pod whose labels and namespace name none: quota 0, no limit (it only
borrows), unless a Queue of that name says otherwise."""
MAX_QUEUES = 1024
MAX_DEPTH = 16
MAX_CHARGES = 20_000
"""Gang attempts one queue's usage record lists at most (about 60 bytes each)."""

QueueName = Annotated[str, msgspec.Meta(min_length=1, max_length=253)]
Units = Annotated[int, msgspec.Meta(ge=0, le=2**53)]


class LabelRequirement(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    key: Annotated[str, msgspec.Meta(max_length=317)]
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: Annotated[tuple[Annotated[str, msgspec.Meta(max_length=63)], ...], msgspec.Meta(max_length=64)] = ()


class LabelSelector(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A Kubernetes label selector (``matchLabels`` and ``matchExpressions``, all must hold);
    an empty one selects everything."""

    match_labels: Annotated[dict[str, str], msgspec.Meta(max_length=64)] = {}
    match_expressions: Annotated[tuple[LabelRequirement, ...], msgspec.Meta(max_length=16)] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        if any(labels.get(k) != v for k, v in self.match_labels.items()):
            return False
        for r in self.match_expressions:
            present = r.key in labels
            if r.operator == "In" and (not present or labels[r.key] not in r.values):
                return False
            if r.operator == "NotIn" and present and labels[r.key] in r.values:
                return False
            if r.operator == "Exists" and not present:
                return False
            if r.operator == "DoesNotExist" and present:
                return False
        return True


class QueueSpec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One queue as its ``Queue`` object says, in queue units (KV ``phx-queues``, key
    ``queue_key(name)``). ``problem`` is why the queue cannot be used (an unknown parent, a
    cycle, children's quotas beyond the parent's): its gangs wait with that reason."""

    name: QueueName
    parent: Annotated[str, msgspec.Meta(max_length=253)] = ""
    quota: Units = 0
    """Guaranteed share (deserved)."""
    limit: Units | None = None
    """Hard cap including borrowing; None: no cap beyond the cluster."""
    over_quota_weight: Annotated[float, msgspec.Meta(ge=0, le=1e6)] = 1.0
    """Share of idle capacity beyond the quotas, relative to the queue's siblings."""
    namespace_selector: LabelSelector | None = None
    """Which namespaces' pods may name the queue; None: every namespace."""
    within_queue: Literal["LowerPriority", "Never"] = "LowerPriority"
    """Preemption inside the queue: a gang may evict gangs of strictly lower priority, or never."""
    reclaim: Literal["Any", "Never"] = "Any"
    """Below its quota, the queue may take back what queues above theirs borrowed, or never."""
    problem: Annotated[str, msgspec.Meta(max_length=1000)] = ""
    generation: Annotated[int, msgspec.Meta(ge=0)] = 0


class QueueUsage(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What one queue holds: a charge per gang attempt (``charge_key``) in queue units, for the
    queue's own gangs and those of every queue below it. Written by placement only, in the
    atomic batch of the reservations it accounts for, expecting the revision the decision
    read: two decisions can never push a queue past its limit between them."""

    queue: QueueName
    charges: Annotated[dict[str, Units], msgspec.Meta(max_length=MAX_CHARGES)] = {}

    @property
    def allocated(self) -> int:
        return sum(self.charges.values())


def charge_key(gang_id: str, attempt: int) -> str:
    return f"{gang_id}#{attempt}"


def queue_key(name: str) -> str:
    """The ``phx-queues`` key of a queue (a queue name is a DNS subdomain: dots become ``_``)."""
    from phalanx_proto.subjects import token

    return token(name)


USAGE_PREFIX = "queue."


def usage_key(name: str) -> str:
    """The ``phx-ledger`` key of a queue's usage: ``queue.<token>``, two tokens, so it never
    meets a node's key (one token)."""
    return USAGE_PREFIX + queue_key(name)


def is_usage_key(key: str) -> bool:
    return key.startswith(USAGE_PREFIX)


def units_of_member(m: MemberSpec) -> int:
    """What one member takes from its queue: whole GPUs × 700, a MIG instance 100 per slice, a
    TDM share 7 per core-percent on each of its GPUs (at least 1 %: a share that names only
    memory still takes a share), nothing without GPUs."""
    match m.kind:
        case RequestKind.WHOLE:
            return m.gpus * GPU_UNITS
        case RequestKind.MIG:
            return m.mig_slices * MIG_SLICE_UNITS
        case RequestKind.TDM:
            return max(1, m.core_pct) * CORE_PCT_UNITS * max(1, m.gpus)
    return 0


def units_of_assignment(a: Assignment) -> int:
    """What one reservation takes from its queue (the same rule as ``units_of_member``; a MIG
    profile ``<g>g.<mem>`` holds ``g`` slices)."""
    match a.kind:
        case RequestKind.WHOLE:
            return len(a.gpus) * GPU_UNITS
        case RequestKind.MIG:
            slices = a.mig_profile.split("g", 1)[0]
            return (int(slices) if slices.isdigit() else 7) * MIG_SLICE_UNITS
        case RequestKind.TDM:
            return max(1, a.core_pct) * CORE_PCT_UNITS * max(1, len(a.gpus))
    return 0


def gpus(units: int) -> float:
    """Queue units as GPUs (for people)."""
    return units / GPU_UNITS


def shown(units: int | None) -> str:
    """Queue units as a GPU count for a message: ``16``, ``2.5``, ``0.43``; ``-`` for None."""
    if units is None:
        return "-"
    text = f"{units / GPU_UNITS:.2f}".rstrip("0").rstrip(".")
    return text or "0"
