"""Gang identity and member requests: which gang a pod belongs to and what it asks for.

Called by the coordinator for every unbound pod it sees. Keys, first match wins
(docs/saga.md, "Gang identity"):

1. label ``scheduling.x-k8s.io/pod-group`` (scheduler-plugins PodGroup), or the older
   ``pod-group.scheduling.sigs.k8s.io/name`` (ACK / lightweight coscheduling) or the older ``pod-group.scheduling.sigs.k8s.io`` label → ``<ns>/podgroup-<name>``;
2. annotation ``scheduling.k8s.io/group-name`` (the pod group Volcano and arena
   ``--gang`` write, e.g. on a Kubeflow MPIJob) → ``<ns>/podgroup-<name>``;
3. label ``jobset.sigs.k8s.io/jobset-name`` (JobSet: the whole JobSet is one gang)
   → ``<ns>/jobset-<name>``;
4. label ``training.kubeflow.org/job-name`` (Kubeflow MPIJob submitted with gang on)
   → ``<ns>/mpijob-<name>``;
5. otherwise the pod alone is a gang of one (``<ns>/<pod>``).

min-member is the label or annotation ``aliyun.com/min-member`` (= the job's parallelism),
``scheduling.x-k8s.io/min-member`` or ``pod-group.scheduling.sigs.k8s.io/min-available``.
When a group's pods do not say it, the gang is the GPU pods seen once no new member has
arrived for the settle time, and every member gets a Warning event saying so. When pods of
one gang disagree, the largest value wins and the pods get a Warning event. When more pods
than min-member are present, every present pod is placed (all or nothing) and the pods are
told.

Pods that ask for no GPU (an MPIJob launcher) are not gang members: Phalanx places GPUs, so
such a pod is refused with a Warning event telling to give it the default scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass

from phalanx_engine.quantity import Bound, decimal
from phalanx_engine.requests import MAX_GANG, RequestError, RequestKind, Violation, parse_pod
from phalanx_kube.port import Pod
from phalanx_proto.events import MemberSpec
from phalanx_proto.state import MAX_GANG_TIMEOUT_S

MIN_MEMBER_KEYS = ("aliyun.com/min-member", "scheduling.x-k8s.io/min-member",
                   "pod-group.scheduling.sigs.k8s.io/min-available")
GROUP_LABELS = (
    ("scheduling.x-k8s.io/pod-group", "podgroup"),
    ("pod-group.scheduling.sigs.k8s.io/name", "podgroup"),
    ("pod-group.scheduling.sigs.k8s.io", "podgroup"),
)
GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
JOB_LABELS = (
    ("jobset.sigs.k8s.io/jobset-name", "jobset"),
    ("training.kubeflow.org/job-name", "mpijob"),
)
TIMEOUT_ANNOTATION = "phalanx.io/gang-timeout-seconds"
MAX_TIMEOUT = Bound(int(MAX_GANG_TIMEOUT_S), "a gang waits at most a week for its members")


@dataclass(frozen=True, slots=True)
class GangIdentity:
    gang_id: str
    kind: str
    """podgroup, jobset, mpijob or pod."""
    min_member: int | None
    """None when the pod does not say."""
    timeout_s: float = 0.0
    """The pod's ``phalanx.io/gang-timeout-seconds``; 0 when absent."""
    priority: int = 0


class InvalidMember(ValueError):
    """The pod cannot be a gang member; ``violations`` name field, value and rule."""

    def __init__(self, violations: tuple[Violation, ...]) -> None:
        self.violations = violations
        super().__init__("; ".join(str(v) for v in violations))


def identity(pod: Pod) -> GangIdentity:
    """The gang of ``pod``. Raises ``InvalidMember`` for a bad min-member or timeout value."""
    common = dict(min_member=_min_member(pod), timeout_s=_timeout(pod), priority=_priority(pod))
    for label, kind in GROUP_LABELS:
        if pod.labels.get(label):
            return GangIdentity(f"{pod.namespace}/{kind}-{pod.labels[label]}", kind, **common)
    if pod.annotations.get(GROUP_ANNOTATION):
        return GangIdentity(f"{pod.namespace}/podgroup-{pod.annotations[GROUP_ANNOTATION]}", "podgroup", **common)
    for label, kind in JOB_LABELS:
        if pod.labels.get(label):
            return GangIdentity(f"{pod.namespace}/{kind}-{pod.labels[label]}", kind, **common)
    return GangIdentity(f"{pod.namespace}/{pod.name}", "pod", **{**common, "min_member": 1})


def member_spec(pod: Pod) -> MemberSpec:
    """The wire request of one pod, parsed by ``phalanx_engine.requests.parse_pod`` (whole,
    multi-GPU, TDM, MIG, RDMA). Raises ``InvalidMember`` with every violation."""
    try:
        req = parse_pod(pod.raw)
    except RequestError as e:
        raise InvalidMember(e.violations) from None
    if req.kind is RequestKind.NONE:
        raise InvalidMember((Violation(
            "spec.containers[*].resources.limits", "no GPU resource",
            "Phalanx schedules GPU pods only: ask for nvidia.com/gpu, aliyun.com/gpu, gpu-core/gpu-memory or "
            "gpu-slice, or give a pod without GPUs (an MPIJob launcher) schedulerName default-scheduler"),))
    return req.member_spec(pod.ref)


def _min_member(pod: Pod) -> int | None:
    for key in MIN_MEMBER_KEYS:
        raw = pod.labels.get(key) or pod.annotations.get(key)
        if raw is None:
            continue
        value = decimal(raw, f"metadata.labels[{key}]", most=MAX_GANG)
        if isinstance(value, Violation):
            raise InvalidMember((Violation(value.field, value.value,
                                           f"min-member is the number of pods in the gang: {value.rule}"),))
        return value
    return None


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


