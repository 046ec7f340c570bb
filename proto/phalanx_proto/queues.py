"""Queues on the wire: what a ``Queue`` object says (``QueueSpec``, KV ``phx-queues``, written by
gang-coordinator from the API server) and what each queue holds (``QueueUsage``, in KV
``phx-ledger`` under ``usage_key(queue)``, written by placement in the same atomic batch as
the reservations it accounts for). docs/queues.md has the model.

Amounts are **queue units**, integers: one whole GPU is ``GPU_UNITS`` = 700, so a MIG slice
(a seventh of a GPU) is 100 and one percent of a GPU's core (a TDM share) is 7 — every request
kind is a whole number of units, and sums never round.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from phalanx_proto.events import Assignment, MemberSpec, RequestKind
from phalanx_proto.queuespec import LabelRequirement as LabelRequirement
from phalanx_proto.queuespec import LabelSelector as LabelSelector
from phalanx_proto.queuespec import QueueHistory as QueueHistory
from phalanx_proto.queuespec import QueueName as QueueName
from phalanx_proto.queuespec import QueueSpec as QueueSpec
from phalanx_proto.queuespec import RepairReserve as RepairReserve
from phalanx_proto.queuespec import Units as Units

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


HISTORY_PREFIX = "history."


def history_key(name: str) -> str:
    """The ``phx-ledger`` key of a queue's recent usage: ``history.<token>``, two tokens, so it
    never meets a node's key (one token)."""
    return HISTORY_PREFIX + queue_key(name)


def is_history_key(key: str) -> bool:
    return key.startswith(HISTORY_PREFIX)


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
