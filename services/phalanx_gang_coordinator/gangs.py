"""Gang identity and member requests of the pods gang-coordinator sees.

The rules are ``phalanx_kubeobjects.gangs`` (docs/saga.md, "Gang identity and min-member"), the
same code ``phalanx validate`` runs on pod templates; this module adds what only the running
coordinator reads: the per-gang timeout annotation and the pod's priority (also carried on each
member, with its ``preemptionPolicy``, for preemption: docs/preemption.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from phalanx_kube.port import Pod
from phalanx_kubeobjects import gangs as rules
from phalanx_kubeobjects.quantity import Bound, decimal
from phalanx_kubeobjects.requests import RequestError, Violation
from phalanx_proto.events import MemberSpec
from phalanx_proto.state import MAX_GANG_TIMEOUT_S, GangPart

TIMEOUT_ANNOTATION = "phalanx.io/gang-timeout-seconds"
MAX_TIMEOUT = Bound(int(MAX_GANG_TIMEOUT_S), "a gang waits at most a week for its members")


@dataclass(frozen=True, slots=True)
class GangIdentity:
    gang_id: str
    kind: str
    """PodGroup, JobSet, MPIJob, Job or Pod (``phalanx_kubeobjects.gangs.KINDS``)."""
    min_member: int | None
    """The whole gang's size where the pod says it; None when it does not (a JobSet's pods say
    their ``part`` instead)."""
    timeout_s: float = 0.0
    """The pod's ``phalanx.io/gang-timeout-seconds``; 0 when absent."""
    priority: int = 0
    part: GangPart | None = None
    """A JobSet pod: its replicated job (Jobs, pods per Job)."""
    jobs: int = 0
    """A JobSet pod: the JobSet's total Job count."""


class InvalidMember(ValueError):
    """The pod cannot be a gang member; ``violations`` name field, value and rule."""

    def __init__(self, violations: tuple[Violation, ...]) -> None:
        self.violations = violations
        super().__init__("; ".join(str(v) for v in violations))


def identity(pod: Pod) -> GangIdentity:
    """The gang of ``pod``. Raises ``InvalidMember`` for a bad min-member or timeout value."""
    try:
        g = rules.identify(pod.namespace, pod.name, pod.labels, pod.annotations)
    except RequestError as e:
        raise InvalidMember(e.violations) from None
    return GangIdentity(g.gang_id, g.kind, g.min_member, timeout_s=_timeout(pod), priority=_priority(pod),
                        part=g.part, jobs=g.jobs)


def member_spec(pod: Pod) -> MemberSpec:
    """The wire request of one pod, parsed by ``phalanx_kubeobjects.gangs.gpu_member`` (whole,
    multi-GPU, TDM, MIG, RDMA; a pod without GPU is no member). Raises ``InvalidMember`` with
    every violation."""
    try:
        req = rules.gpu_member(pod.raw)
    except RequestError as e:
        raise InvalidMember(e.violations) from None
    except Exception as e:  # noqa: BLE001 - a pod of a shape the parser did not expect: refuse it, say why
        raise InvalidMember((Violation("spec", type(e).__name__,
                                       f"the pod's spec could not be read as a Kubernetes pod ({e})"),)) from None
    spec = req.member_spec(pod.ref)
    policy = (pod.raw.get("spec") or {}).get("preemptionPolicy")
    return msgspec.structs.replace(spec, priority=_priority(pod),
                                   preemption_policy=policy if policy in ("Never", "PreemptLowerPriority") else "")


def _timeout(pod: Pod) -> float:
    raw = pod.annotations.get(TIMEOUT_ANNOTATION)
    if raw is None:
        return 0.0
    value = decimal(raw, f"metadata.annotations[{TIMEOUT_ANNOTATION}]", most=MAX_TIMEOUT)
    if isinstance(value, Violation):
        raise InvalidMember((Violation(value.field, value.value,
                                       f"the gang timeout is a whole number of seconds: {value.rule}"),))
    return float(value)


def _priority(pod: Pod) -> int:
    value = (pod.raw.get("spec") or {}).get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


