"""The Queue object's spec as Phalanx keeps it (KV ``phx-queues``): the queue's place in the
tree, its quota and limit in queue units, who may use it and how it preempts. Apart from
``phalanx_proto.queues`` (units, usage records, the Queue resource's names) so that the wire
events may carry a spec (the decision log records what the queue rules read) without an import
circle; ``phalanx_proto.queues`` re-exports it, and ``QueueHistory`` (a queue's recent usage)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

QueueName = Annotated[str, msgspec.Meta(min_length=1, max_length=253)]
Units = Annotated[int, msgspec.Meta(ge=0, le=2**53)]
MAX_MIN_RUNTIME_S = 7 * 86400.0
"""A queue's minimum runtime before preemption is at most a week."""
MinRuntime = Annotated[float, msgspec.Meta(ge=0, le=MAX_MIN_RUNTIME_S)]


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


RESERVE_TIERS = ("node", "hypernode", "leaf", "netpod")
"""The domain tiers a repair reserve may name (the engine's, tightest first)."""


class RepairReserve(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``spec.repairReserve``: free GPUs the queue keeps, in each domain of ``tier`` where it runs
    gangs, from other queues' new work, for its repairs (docs/queues.md)."""

    tier: Literal["node", "hypernode", "leaf", "netpod"]
    gpus: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)]


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
    preempt_min_runtime_s: MinRuntime | None = None
    """``spec.preemption.preemptMinRuntime``: a gang of this queue that started less than this
    long ago is no victim of priority preemption (a gang of its own queue with a higher
    priority); None: as the parent says (the root: 0, none)."""
    reclaim_min_runtime_s: MinRuntime | None = None
    """``spec.preemption.reclaimMinRuntime``: a gang of this queue that started less than this
    long ago is not reclaimed by another queue; None: as the parent says (the root: 0)."""
    problem: Annotated[str, msgspec.Meta(max_length=1000)] = ""
    generation: Annotated[int, msgspec.Meta(ge=0)] = 0
    repair_policy: Annotated[str, msgspec.Meta(max_length=32)] = ""
    """``spec.repairPolicy``: what its running gangs that lose members do when their domain has
    no room (docs/repair.md; a gang's own ``phalanx.io/repair-policy`` wins); "": the default."""
    repair_reserve: RepairReserve | None = None
    """``spec.repairReserve``: spare capacity per domain for its repairs, within its quota
    (``phalanx_rules.reserve``); None: none."""


MAX_HALF_LIFE_S = 365 * 86400.0


class QueueHistory(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A queue's recent usage, for the fair share that remembers (docs/queues.md, "Fair share
    that remembers"): the GPU-seconds it held, each second weighing less by half every
    ``half_life_s`` (``gpu_seconds``, as of unix time ``at``), and the units it held from
    ``at`` on (its subtree included). Its usage at any later time follows from these alone
    (``phalanx_rules.usage.usage_at``) while what it holds does not change, so the record is
    rewritten only when that changes. In KV ``phx-ledger`` under ``history_key(queue)``,
    written by placement only, by compare-and-set on the revision it read: of two replicas the
    first advances it, the second finds it advanced; every second is counted once, across
    restarts too (the record says from when)."""

    queue: QueueName
    gpu_seconds: Annotated[float, msgspec.Meta(ge=0, le=1e18)] = 0.0
    at: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    held: Units = 0
    half_life_s: Annotated[float, msgspec.Meta(gt=0, le=MAX_HALF_LIFE_S)] = 3600.0
