"""Gang identity and member requests: which gang a pod belongs to and what it asks for.

Keys, first match wins (docs/saga.md):

1. ``scheduling.x-k8s.io/pod-group`` label (scheduler-plugins PodGroup); min-member from the
   ``scheduling.x-k8s.io/min-member`` / ``aliyun.com/min-member`` label or annotation;
2. ``jobset.sigs.k8s.io/jobset-name`` label (JobSet; the gang is the whole JobSet);
   min-member from ``aliyun.com/min-member``;
3. ``training.kubeflow.org/job-name`` label (Kubeflow MPIJob submitted with gang on);
4. otherwise the pod alone is a gang of one.

When min-member is absent it is taken as 1 for a single pod and as the number of member pods
seen so far for a group — which is reported on the pods as a Warning event, because it
cannot know whether more members are coming.
"""

from __future__ import annotations

from dataclasses import dataclass

from phalanx_kube.port import Pod
from phalanx_proto.events import MemberSpec

MIN_MEMBER_KEYS = ("aliyun.com/min-member", "scheduling.x-k8s.io/min-member", "pod-group.scheduling.sigs.k8s.io/min-available")
GROUP_LABELS = (
    ("scheduling.x-k8s.io/pod-group", "podgroup"),
    ("pod-group.scheduling.sigs.k8s.io", "podgroup"),
    ("jobset.sigs.k8s.io/jobset-name", "jobset"),
    ("training.kubeflow.org/job-name", "mpijob"),
)
WHOLE_GPU_RESOURCES = ("nvidia.com/gpu", "aliyun.com/gpu")


@dataclass(frozen=True, slots=True)
class GangIdentity:
    gang_id: str
    kind: str
    min_member: int | None
    """None when the pod does not say."""


class InvalidMember(ValueError):
    """The pod's request cannot be scheduled; the message names the field and the rule."""


def identity(pod: Pod) -> GangIdentity:
    for label, kind in GROUP_LABELS:
        group = pod.labels.get(label)
        if group:
            return GangIdentity(f"{pod.namespace}/{kind}-{group}", kind, _min_member(pod))
    return GangIdentity(f"{pod.namespace}/{pod.name}", "pod", 1)


def _min_member(pod: Pod) -> int | None:
    for key in MIN_MEMBER_KEYS:
        raw = pod.labels.get(key) or pod.annotations.get(key)
        if raw is None:
            continue
        try:
            value = int(raw)
        except ValueError:
            raise InvalidMember(f"{key}={raw!r} is not an integer; it must be the number of pods in the gang") from None
        if value < 1:
            raise InvalidMember(f"{key}={raw!r} must be at least 1")
        return value
    return None


def _limits(pod: Pod) -> dict[str, str]:
    merged: dict[str, str] = {}
    for c in (pod.raw.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        for k, v in {**(res.get("requests") or {}), **(res.get("limits") or {})}.items():
            merged[k] = str(v)
    return merged


def member_spec(pod: Pod) -> MemberSpec:
    """The wire request of one pod (whole GPUs in this version). Raises ``InvalidMember``."""
    limits = _limits(pod)
    for name in WHOLE_GPU_RESOURCES:
        if name in limits:
            try:
                count = int(limits[name])
            except ValueError:
                raise InvalidMember(f"resources.limits[{name}]={limits[name]!r} must be a whole number of GPUs") from None
            if count < 1:
                raise InvalidMember(f"resources.limits[{name}]={count} must be at least 1")
            return MemberSpec(pod=pod.ref, gpus=count, resource_name=name)
    raise InvalidMember("the pod asks for no GPU: set resources.limits[nvidia.com/gpu] or [aliyun.com/gpu]")
