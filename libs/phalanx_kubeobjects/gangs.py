"""Which gang a pod is in and how many pods that gang has: the one rule gang-coordinator applies
to every pod it sees and ``phalanx validate`` applies to every pod template of a workload
(docs/saga.md, "Gang identity and min-member").

Keys, first match wins; the gang id is ``<namespace>/<Kind>:<name>`` for a group and
``<namespace>/<pod>`` for a pod alone. A Kind begins with a capital letter and holds a ``:``;
pod names have neither, so a group id never equals a pod's, nor its ``phx-gangs`` key
(``subjects.gang_key`` keeps capitals and turns ``:`` into ``_``, which pod names lack too):

0. ``spec.schedulingGroup.podGroupName`` (the upstream Workload API) → ``PodGroup:<name>``,
   whatever labels the pod's controller adds (a Job's pod that names a PodGroup is in that one
   gang, not in its Job's too); its size is the PodGroup object's (``pod_group_policy``);
1. label ``scheduling.x-k8s.io/pod-group``, ``pod-group.scheduling.sigs.k8s.io/name`` or
   ``pod-group.scheduling.sigs.k8s.io`` → ``PodGroup:<name>`` (scheduler-plugins, ACK);
2. annotation ``scheduling.k8s.io/group-name`` → ``PodGroup:<name>`` (Volcano, arena ``--gang``);
3. label ``jobset.sigs.k8s.io/jobset-name`` → ``JobSet:<name>``: the whole JobSet, every
   replicated job and every replica, is one gang;
4. labels ``leaderworkerset.sigs.k8s.io/name`` and ``…/group-index`` →
   ``LeaderWorkerSet:<name>-<group-index>``: each group (replica) of a LeaderWorkerSet, leader
   and workers, is one gang;
5. label ``training.kubeflow.org/job-name`` → ``MPIJob:<name>`` (Kubeflow MPIJob workers);
6. label ``batch.kubernetes.io/job-name`` → ``Job:<name>`` (a plain ``batch/v1`` Job);
7. otherwise the pod alone, a gang of one.

min-member, the number of pods of the gang:

* ``phalanx.io/gang-min-member`` (label or annotation) is the whole gang's size, for any kind,
  and wins over everything below;
* a JobSet's pods say their own Job's size (``aliyun.com/min-member`` = the Job's
  ``parallelism``, seed rule 4.2) and, set by the JobSet controller, their replicated job's
  name and replica count and the JobSet's total Job count (``global-replicas``). The gang is
  the sum over replicated jobs of replicas × min-member — exactly what ``validate`` computes
  from the JobSet spec. Until a pod of every Job has been seen, each unseen Job counts one
  pod, so the gang waits. With exclusive placement through JobSet's pod webhook
  (``leaders_first``) a Job counts one pod, its leader: the followers do not exist until it is
  scheduled, and join as late members;
* a LeaderWorkerSet group: the ``leaderworkerset.sigs.k8s.io/size`` annotation its controller
  puts on every pod of the group (leader included); with ``exclusive-topology``, 1: the
  controller creates the workers only once the leader is scheduled, and they join as late
  members on its domain;
* any other group: ``aliyun.com/min-member``, ``scheduling.x-k8s.io/min-member`` or
  ``pod-group.scheduling.sigs.k8s.io/min-available``;
* none of these: the gang is the pods present once none arrived for the settle time (stated
  on the pods, never silent); a pod alone is a gang of one whatever it says.

An elastic gang says its largest size too, ``phalanx.io/gang-max-member`` (label or
annotation), beside a min-member said by one of the keys above (a JobSet: by
``phalanx.io/gang-min-member``): it starts with min-member pods placed together and grows one
whole member at a time up to the maximum (docs/workloads.md, "Elastic gangs"). A maximum without
a minimum, or below it, is refused naming the key.

Members are GPU pods: a pod that asks for no GPU (an MPIJob launcher) is refused with the
advice to give it the default scheduler, so min-member counts GPU pods (MPI workers) only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from phalanx_kubeobjects.names import dns_subdomain
from phalanx_kubeobjects.quantity import decimal
from phalanx_kubeobjects.requests import (
    MAX_GANG,
    GpuRequest,
    RequestError,
    RequestKind,
    gang_timeout,
    min_member_said,
    parse_pod,
)
from phalanx_kubeobjects.violations import Violation
from phalanx_proto.kubeapi import (
    GANG_MAX_MEMBER,
    GANG_MIN_MEMBER,
    GROUP_ANNOTATION,
    GROUP_LABELS,
    JOB_NAME,
    JOBSET_EXCLUSIVE,
    JOBSET_JOBS,
    JOBSET_NAME,
    JOBSET_NODE_SELECTOR_STRATEGY,
    JOBSET_REPLICAS,
    JOBSET_REPLICATED_JOB,
    LWS_EXCLUSIVE,
    LWS_GROUP_INDEX,
    LWS_NAME,
    LWS_SIZE,
    MPIJOB_NAME,
    PREEMPTION_POLICIES,
)
from phalanx_proto.state import GangPart

KINDS = ("PodGroup", "JobSet", "LeaderWorkerSet", "MPIJob", "Job", "Pod")
NO_GPU_RULE = ("Phalanx schedules GPU pods only: ask for nvidia.com/gpu, aliyun.com/gpu, gpu-core/gpu-memory or "
               "gpu-slice, or give a pod without GPUs (an MPIJob launcher) schedulerName default-scheduler; it is "
               "not a gang member")


@dataclass(frozen=True, slots=True)
class GangIdentity:
    """The gang of one pod. ``min_member`` is the gang's size where the pod says it for the
    whole gang, None otherwise; a JobSet pod says its ``part`` instead (its replicated job:
    Jobs and pods per Job) and ``jobs``, the JobSet's total Job count."""

    gang_id: str
    kind: str
    min_member: int | None
    part: GangPart | None = None
    jobs: int = 0
    timeout_s: float = 0.0
    """The ``phalanx.io/gang-timeout-seconds`` annotation; 0 when absent."""
    priority: int = 0
    """The pod's ``spec.priority`` (``pod_priority``; a template has none: 0)."""
    max_member: int = 0
    """An elastic gang's largest size (``phalanx.io/gang-max-member``); 0: not elastic."""
    pod_group: str = ""
    """The PodGroup the pod's ``spec.schedulingGroup`` names (the Workload API); its size is
    that object's, which the caller reads (``pod_group_policy``); "" for every other pod."""


def gang_id(namespace: str, kind: str, name: str) -> str:
    """``<ns>/<Kind>:<name>`` for a group, ``<ns>/<pod>`` for a pod alone."""
    return f"{namespace}/{name}" if kind == "Pod" else f"{namespace}/{kind}:{name}"


def identify(namespace: str, name: str, labels: Mapping[str, Any], annotations: Mapping[str, Any],
             spec: Mapping[str, Any] | None = None) -> GangIdentity:
    """The gang of a pod (or pod template) with these names, labels and annotations (and
    ``spec``, for its ``schedulingGroup``). Raises ``RequestError`` naming the field and rule for
    a count that is not a whole number in bounds."""
    def said(key: str) -> str | None:
        for where in (labels, annotations):
            if isinstance(where.get(key), str) and where[key]:
                return where[key]
        return None

    kind, group = "Pod", name
    v: list[Violation] = []
    named = scheduling_group(spec, f"{namespace}/{name}")
    if named:
        timeout_s = gang_timeout(annotations, v)
        explicit = min_member_said(labels, annotations, v).explicit
        if v:
            raise RequestError(v, f"{namespace}/{name}")
        return GangIdentity(gang_id(namespace, "PodGroup", named), "PodGroup", explicit, timeout_s=timeout_s,
                            pod_group=named)
    for key in GROUP_LABELS:
        if isinstance(labels.get(key), str) and labels[key]:
            kind, group = "PodGroup", labels[key]
            break
    else:
        if isinstance(annotations.get(GROUP_ANNOTATION), str) and annotations[GROUP_ANNOTATION]:
            kind, group = "PodGroup", annotations[GROUP_ANNOTATION]
            if not dns_subdomain(group):
                raise RequestError([Violation(f"metadata.annotations[{GROUP_ANNOTATION}]", group,
                                              "names a PodGroup object: must be a DNS-1123 subdomain")],
                                   f"{namespace}/{name}")
        elif _text(labels.get(LWS_NAME)) and _text(labels.get(LWS_GROUP_INDEX)):
            kind, group = "LeaderWorkerSet", f"{labels[LWS_NAME]}-{labels[LWS_GROUP_INDEX]}"
        else:
            for key, k in ((JOBSET_NAME, "JobSet"), (MPIJOB_NAME, "MPIJob"), (JOB_NAME, "Job")):
                if isinstance(labels.get(key), str) and labels[key]:
                    kind, group = k, labels[key]
                    break
    explicit, declared, _ = min_member_said(labels, annotations, v)
    part, jobs = None, 0
    if kind == "LeaderWorkerSet" and explicit is None:
        size = annotations.get(LWS_SIZE)
        declared = _count(size if isinstance(size, str) else None, LWS_SIZE, v, "metadata.annotations")
        if declared and isinstance(annotations.get(LWS_EXCLUSIVE), str):
            declared = 1  # leaders first: the workers exist only once the leader is scheduled
    if kind == "JobSet":
        replicas = _count(said(JOBSET_REPLICAS), JOBSET_REPLICAS, v)
        jobs = _count(said(JOBSET_JOBS), JOBSET_JOBS, v) or 0
        members = 1 if leaders_first(annotations) else declared or 0
        part = GangPart(name=str(said(JOBSET_REPLICATED_JOB) or ""), jobs=replicas or 1, members=members)
        declared = None
    timeout_s = gang_timeout(annotations, v)
    least = explicit or declared
    maximum = max_member(labels, annotations, least, v) if kind != "Pod" else 0
    if v:
        raise RequestError(v, f"{namespace}/{name}")
    if kind == "Pod":
        return GangIdentity(gang_id(namespace, kind, group), kind, 1, timeout_s=timeout_s)
    return GangIdentity(gang_id(namespace, kind, group), kind, least, part, jobs, timeout_s=timeout_s,
                        max_member=maximum)


def scheduling_group(spec: Mapping[str, Any] | None, pod: str = "") -> str:
    """The PodGroup a pod's ``spec.schedulingGroup.podGroupName`` names ("" when none). Raises
    ``RequestError`` for a name that is no object name."""
    group = (spec or {}).get("schedulingGroup")
    named = group.get("podGroupName") if isinstance(group, Mapping) else None
    if named is None or named == "":
        return ""
    if not dns_subdomain(named):
        raise RequestError([Violation("spec.schedulingGroup.podGroupName", str(named)[:253],
                                      "names a PodGroup object: must be a DNS-1123 subdomain")], pod)
    return named


@dataclass(frozen=True, slots=True)
class PodGroupPolicy:
    """What a ``PodGroup`` object says of its gang: at least ``least`` pods placed together, then
    one by one up to ``most`` (``gang.minCount``: the rest of the group joins as an elastic gang's
    members do; ``basic``: each pod on its own, placed near the group's others)."""

    least: int
    most: int


def pod_group_policy(obj: Mapping[str, Any]) -> PodGroupPolicy | Violation:
    """The gang a ``PodGroup`` (``scheduling.k8s.io`` v1alpha2 or v1beta1, as stored) says, or
    the violation naming the field and the rule."""
    spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
    policy = spec.get("schedulingPolicy") if isinstance(spec.get("schedulingPolicy"), Mapping) else {}
    gang = policy.get("gang")
    if isinstance(gang, Mapping):
        count = gang.get("minCount")
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_GANG.most:
            return Violation("spec.schedulingPolicy.gang.minCount", str(count)[:40],
                             f"the gang's size is a whole number of pods, 1 to {MAX_GANG.most}")
        return PodGroupPolicy(count, MAX_GANG.most)
    if isinstance(policy.get("basic"), Mapping):
        return PodGroupPolicy(1, MAX_GANG.most)
    return Violation("spec.schedulingPolicy", "{}", "says neither gang (with minCount) nor basic")


def max_member(labels: Mapping[str, Any], annotations: Mapping[str, Any], least: int | None,
               v: list[Violation]) -> int:
    """An elastic gang's maximum (``phalanx.io/gang-max-member``, label or annotation, the label
    first), beside the min-member ``least`` the pod says (None: none); 0 when it says none. One
    that is no whole number in bounds, that comes without a minimum or lies below it is a
    violation naming the key (appended to ``v``; then 0)."""
    raw = next((w[GANG_MAX_MEMBER] for w in (labels, annotations)
                if isinstance(w.get(GANG_MAX_MEMBER), str) and w[GANG_MAX_MEMBER]), None)
    maximum = _count(raw, GANG_MAX_MEMBER, v, what="an elastic gang's maximum is a number of pods")
    field = f"metadata.labels[{GANG_MAX_MEMBER}]"
    if maximum is not None and least is None:
        v.append(Violation(field, str(maximum), f"an elastic gang's maximum needs its minimum: say {GANG_MIN_MEMBER} too"))
    elif maximum is not None and least is not None and maximum < least:
        v.append(Violation(field, str(maximum), f"an elastic gang's maximum is at least its min-member ({least})"))
    else:
        return maximum or 0
    return 0


def leaders_first(annotations: Mapping[str, Any]) -> bool:
    """Does a JobSet pod's exclusive placement go through JobSet's pod webhook, which creates a
    Job's followers only once its leader is scheduled? Then the gang is the Jobs' leaders, all
    at once; the followers join as late members, each on its leader's domain (the webhook's
    ``nodeSelector``)."""
    return isinstance(annotations.get(JOBSET_EXCLUSIVE), str) and JOBSET_NODE_SELECTOR_STRATEGY not in annotations


def pod_priority(spec: Mapping[str, Any] | None) -> int:
    """A pod's ``spec.priority`` (the admission controller's resolution of its class); 0 when unset."""
    value = (spec or {}).get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def preemption_policy(spec: Mapping[str, Any] | None) -> str:
    """A pod's ``spec.preemptionPolicy`` when it is one Kubernetes knows, else ""."""
    policy = (spec or {}).get("preemptionPolicy")
    return policy if policy in PREEMPTION_POLICIES else ""


def _text(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


def _count(raw: str | None, key: str, v: list[Violation], where: str = "metadata.labels",
           what: str = "min-member is the number of pods in the gang") -> int | None:
    if raw is None:
        return None
    n = decimal(raw, f"{where}[{key}]", most=MAX_GANG)
    if isinstance(n, Violation):
        v.append(Violation(n.field, n.value, f"{what}: {n.rule}"))
        return None
    return n


@dataclass(frozen=True, slots=True)
class GangSize:
    """How many pods a gang needs: ``members`` (a lower bound while ``known`` is False because
    some Job of a JobSet has no pod yet); ``declared`` False when no pod says (settle rule)."""

    members: int
    declared: bool
    known: bool = True


def jobset_size(parts: Iterable[GangPart], jobs: int) -> GangSize:
    """A JobSet's gang: Σ replicas × pods per Job over its replicated jobs. A replicated job
    that does not say its pods per Job makes the gang undeclared; Jobs not yet seen (``jobs``,
    the JobSet's Job count, minus the Jobs of the replicated jobs seen) count one pod each."""
    parts = list(parts)
    if not parts or any(p.members <= 0 for p in parts):
        return GangSize(members=0, declared=False)
    seen = sum(p.jobs for p in parts)
    missing = max(0, jobs - seen)
    return GangSize(members=sum(p.jobs * p.members for p in parts) + missing, declared=True, known=missing == 0)


def merge_part(parts: tuple[GangPart, ...], part: GangPart) -> tuple[GangPart, ...]:
    """``parts`` with ``part`` in (by replicated job name; the larger pods-per-Job wins)."""
    old = next((p for p in parts if p.name == part.name), None)
    if old is not None and old.jobs >= part.jobs and old.members >= part.members:
        return parts
    if old is not None:
        part = GangPart(name=part.name, jobs=max(old.jobs, part.jobs), members=max(old.members, part.members))
    return tuple(sorted((*[p for p in parts if p.name != part.name], part), key=lambda p: p.name))


def gpu_member(pod: Mapping[str, Any], *, require_scheduler: bool = True) -> GpuRequest:
    """The request of a gang member (``requests.parse_pod``); a pod asking for no GPU, and
    naming no ResourceClaim (``spec.resourceClaims``: its devices come from DRA, docs/dra.md), is
    not one: ``RequestError`` with ``NO_GPU_RULE``."""
    req = parse_pod(pod, require_scheduler=require_scheduler)
    if req.kind is RequestKind.NONE and not (pod.get("spec") or {}).get("resourceClaims"):
        raise RequestError((Violation("spec.containers[*].resources.limits", "no GPU resource", NO_GPU_RULE),),
                           req.pod)
    return req
