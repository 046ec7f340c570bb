"""A ``Queue`` object (``scheduling.phalanx.io/v1alpha1``, deploy/k8s/crds/) read into a
``QueueSpec``: the same rules as the CRD's schema and CEL validation, so ``phalanx validate``
tells a user before ``kubectl apply`` does, and gang-coordinator never believes a value the
API server would have refused. A broken object becomes a spec with its ``problem`` (field
and rule named): its gangs wait with that reason, nobody else is held up.

Example::

    apiVersion: scheduling.phalanx.io/v1alpha1
    kind: Queue
    metadata: {name: team-a}
    spec:
      parent: research
      namespaceSelector: {matchLabels: {team: a}}
      resources:
        nvidia.com/gpu: {quota: 8, limit: 16, overQuotaWeight: 1}
      preemption: {withinQueue: LowerPriority, reclaim: Any, preemptMinRuntime: 10m, reclaimMinRuntime: 30m}
      repairReserve: {tier: leaf, gpus: 4}
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from phalanx_kubeobjects import names
from phalanx_proto.kubeapi import NVIDIA_GPU
from phalanx_proto.queues import GPU_UNITS, LabelRequirement, LabelSelector, QueueSpec, RepairReserve, shown
from phalanx_proto.queuespec import MAX_MIN_RUNTIME_S, RESERVE_TIERS
from phalanx_proto.state import REPAIR_POLICIES

RESOURCE = NVIDIA_GPU
MAX_GPUS = 1_000_000
"""No queue is granted a million GPUs."""


class QueueObjectError(ValueError):
    """The object breaks a rule; the message names the field and the rule."""


def queue_from_object(obj: Mapping[str, Any]) -> QueueSpec:
    """The spec of a Queue object; ``QueueObjectError`` for a name that is no queue's (the rest
    of a broken object becomes the spec's ``problem``)."""
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    name = meta.get("name")
    if not names.dns_subdomain(name):
        raise QueueObjectError("metadata.name: a queue's name is a DNS subdomain (lower case letters, digits, "
                               "'-' and '.', at most 253 characters)")
    generation = meta.get("generation") if isinstance(meta.get("generation"), int) else 0
    try:
        return _spec(name, obj.get("spec") or {}, generation)
    except QueueObjectError as e:
        return QueueSpec(name=name, problem=str(e), generation=generation)


def _spec(name: str, spec: Any, generation: int) -> QueueSpec:
    if not isinstance(spec, Mapping):
        raise QueueObjectError("spec: must be an object")
    unknown = sorted(set(spec) - {"parent", "resources", "namespaceSelector", "preemption", "repairPolicy",
                                  "repairReserve"})
    if unknown:
        raise QueueObjectError(f"spec.{unknown[0]}: unknown field (parent, resources, namespaceSelector, preemption, "
                               "repairPolicy, repairReserve)")
    repair = spec.get("repairPolicy", "")
    if repair not in ("", *REPAIR_POLICIES):
        raise QueueObjectError(f"spec.repairPolicy: one of {', '.join(REPAIR_POLICIES)}")
    parent = spec.get("parent", "")
    if not isinstance(parent, str) or (parent and not names.dns_subdomain(parent)):
        raise QueueObjectError("spec.parent: the name of another Queue (a DNS subdomain)")
    if parent == name:
        raise QueueObjectError("spec.parent: a queue is not its own parent")
    resources = spec.get("resources") or {}
    if not isinstance(resources, Mapping) or set(resources) - {RESOURCE}:
        raise QueueObjectError(f"spec.resources: only {RESOURCE} is accounted (whole-GPU equivalents: a MIG "
                               "slice counts g/7, a TDM share its core % / 100)")
    gpu = resources.get(RESOURCE) or {}
    if not isinstance(gpu, Mapping):
        raise QueueObjectError(f"spec.resources[{RESOURCE}]: must be an object with quota, limit, overQuotaWeight")
    field = f"spec.resources[{RESOURCE}]"
    quota = _amount(gpu.get("quota", 0), f"{field}.quota")
    limit = _amount(gpu["limit"], f"{field}.limit") if gpu.get("limit") is not None else None
    if limit is not None and quota > limit:
        raise QueueObjectError(f"{field}: quota must not exceed limit")
    weight = gpu.get("overQuotaWeight", 1)
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight) or not 0 <= weight <= 1e6:
        raise QueueObjectError(f"{field}.overQuotaWeight: a number from 0 to 1000000")
    reserve = _reserve(spec["repairReserve"], quota) if spec.get("repairReserve") is not None else None
    preemption = spec.get("preemption") or {}
    if not isinstance(preemption, Mapping):
        raise QueueObjectError("spec.preemption: must be an object")
    unknown = sorted(set(preemption) - set(PREEMPTION_FIELDS))
    if unknown:
        raise QueueObjectError(f"spec.preemption.{unknown[0]}: unknown field ({', '.join(PREEMPTION_FIELDS)})")
    within = preemption.get("withinQueue", "LowerPriority")
    reclaim = preemption.get("reclaim", "Any")
    if within not in ("LowerPriority", "Never"):
        raise QueueObjectError("spec.preemption.withinQueue: LowerPriority or Never")
    if reclaim not in ("Any", "Never"):
        raise QueueObjectError("spec.preemption.reclaim: Any or Never")
    return QueueSpec(name=name, parent=parent, quota=quota, limit=limit, over_quota_weight=float(weight),
                     namespace_selector=_selector(spec.get("namespaceSelector")), within_queue=within,
                     reclaim=reclaim, generation=generation, repair_policy=repair, repair_reserve=reserve,
                     preempt_min_runtime_s=_min_runtime(preemption, "preemptMinRuntime"),
                     reclaim_min_runtime_s=_min_runtime(preemption, "reclaimMinRuntime"))


def _reserve(value: Any, quota: int) -> RepairReserve:
    """``spec.repairReserve``: {tier, gpus}, the GPUs at most the queue's quota (the reserve is
    kept out of it: docs/queues.md, "Spare capacity for repairs")."""
    if not isinstance(value, Mapping):
        raise QueueObjectError("spec.repairReserve: must be an object with tier and gpus")
    unknown = sorted(set(value) - {"tier", "gpus"})
    if unknown:
        raise QueueObjectError(f"spec.repairReserve.{unknown[0]}: unknown field (tier, gpus)")
    tier = value.get("tier")
    if tier not in RESERVE_TIERS:
        raise QueueObjectError(f"spec.repairReserve.tier: one of {', '.join(RESERVE_TIERS)}")
    gpus = value.get("gpus")
    if isinstance(gpus, bool) or not isinstance(gpus, int) or not 1 <= gpus <= MAX_GPUS:
        raise QueueObjectError(f"spec.repairReserve.gpus: a whole number of GPUs from 1 to {MAX_GPUS}")
    if gpus * GPU_UNITS > quota:
        raise QueueObjectError(f"spec.repairReserve.gpus: at most the queue's quota ({shown(quota)} GPUs): the reserve "
                               "is kept out of it")
    return RepairReserve(tier=tier, gpus=gpus)


PREEMPTION_FIELDS = ("withinQueue", "reclaim", "preemptMinRuntime", "reclaimMinRuntime")
_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)(h|m|s|ms))+$")
_PART = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s)")
_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def _min_runtime(preemption: Mapping[str, Any], key: str) -> float | None:
    """A minimum runtime (a Kubernetes duration, ``30s``, ``10m``, ``1h30m``) in seconds; None
    when absent (the parent's applies)."""
    if preemption.get(key) is None:
        return None
    return duration_s(preemption[key], f"spec.preemption.{key}")


def duration_s(value: Any, field: str) -> float:
    """A duration as Kubernetes writes one (``metav1.Duration``: ``90s``, ``10m``, ``1h30m``,
    ``500ms``; units h, m, s, ms) in seconds, at most ``MAX_MIN_RUNTIME_S``; ``QueueObjectError``
    naming ``field`` otherwise."""
    rule = f"{field}: a duration such as 30s, 10m or 1h30m (units h, m, s, ms), at most 168h"
    if not isinstance(value, str) or not _DURATION.match(value.strip()):
        raise QueueObjectError(rule)
    seconds = sum(float(n) * _SECONDS[u] for n, u in _PART.findall(value.strip()))
    if not math.isfinite(seconds) or seconds > MAX_MIN_RUNTIME_S:
        raise QueueObjectError(rule)
    return seconds


def _amount(value: Any, field: str) -> int:
    """GPUs (a number, may be fractional) as queue units."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise QueueObjectError(f"{field}: a number of GPUs")
    if value < 0:
        raise QueueObjectError(f"{field}: must not be negative")
    if value > MAX_GPUS:
        raise QueueObjectError(f"{field}: at most {MAX_GPUS} GPUs")
    return round(value * GPU_UNITS)


def _selector(raw: Any) -> LabelSelector | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise QueueObjectError("spec.namespaceSelector: a label selector (matchLabels, matchExpressions)")
    unknown = sorted(set(raw) - {"matchLabels", "matchExpressions"})
    if unknown:
        raise QueueObjectError(f"spec.namespaceSelector.{unknown[0]}: unknown field (matchLabels, matchExpressions)")
    labels = raw.get("matchLabels") or {}
    if not isinstance(labels, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise QueueObjectError("spec.namespaceSelector.matchLabels: a map of label to value")
    exprs = []
    for i, e in enumerate(raw.get("matchExpressions") or []):
        where = f"spec.namespaceSelector.matchExpressions[{i}]"
        if not isinstance(e, Mapping) or not isinstance(e.get("key"), str):
            raise QueueObjectError(f"{where}.key: required")
        op, values = e.get("operator"), e.get("values") or []
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise QueueObjectError(f"{where}.operator: In, NotIn, Exists or DoesNotExist")
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise QueueObjectError(f"{where}.values: a list of strings")
        if (op in ("In", "NotIn")) != bool(values):
            raise QueueObjectError(f"{where}.values: required for In and NotIn, not allowed otherwise")
        exprs.append(LabelRequirement(key=e["key"], operator=op, values=tuple(values)))
    if len(labels) > 64 or len(exprs) > 16:
        raise QueueObjectError("spec.namespaceSelector: at most 64 labels and 16 expressions")
    return LabelSelector(match_labels=dict(labels), match_expressions=tuple(exprs))
