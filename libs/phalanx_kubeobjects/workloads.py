"""Where the pods of a workload object are, and the verdict on each: ``phalanx validate``'s
reading of a Pod, Job, JobSet, Kubeflow MPIJob, LeaderWorkerSet, Deployment-like object or ``List``.

``pod_templates`` finds the pod templates (a part of the object with the wrong shape is a
template holding the violation); ``check_object`` parses each with ``requests.parse_pod``, the
code gang-coordinator runs, and adds the gang rule that needs the workload (min-member equals
the Job's parallelism). Never raises on a malformed object.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from phalanx_kubeobjects import gangs, names
from phalanx_kubeobjects.names import name_text
from phalanx_kubeobjects.quantity import integer
from phalanx_kubeobjects.requests import MAX_GANG, GpuRequest, RequestError, min_member_said
from phalanx_kubeobjects.violations import Violation, as_map, shown
from phalanx_proto import kubeapi
from phalanx_proto.kubeapi import MIN_MEMBER_LABEL, SCHEDULER_NAMES
from phalanx_proto.state import GangPart


class PodTemplate(msgspec.Struct, frozen=True, kw_only=True):
    """One pod (template) inside a workload object. ``where`` names it for people
    (``JobSet/gang-nccl-test spec.replicatedJobs[worker]``); ``parallelism`` is the pods
    one gang of it has where the workload says (Job/JobSet), else 0; ``violations`` are the
    object's own shape errors around the template (a ``parallelism`` that is not an integer)."""

    where: str
    template: Mapping[str, Any]
    parallelism: int = 0
    violations: tuple[Violation, ...] = ()
    role: str = ""
    """The replicated job (JobSet) or replica role (MPIJob) the template is for."""
    replicas: int = 1
    """How many Jobs (JobSet), pods (MPIJob) or groups (LeaderWorkerSet) the template makes."""
    size: int = 0
    """LeaderWorkerSet: the pods of one group, leader included (``leaderWorkerTemplate.size``)."""


class ObjectCheck(msgspec.Struct, frozen=True, kw_only=True):
    """The verdict on one pod template: the parsed request, or the violations."""

    where: str
    request: GpuRequest | None = None
    violations: tuple[Violation, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.violations


_TEMPLATE_KINDS = ("Deployment", "StatefulSet", "ReplicaSet", "DaemonSet", "ReplicationController")


def pod_templates(obj: Mapping[str, Any]) -> tuple[PodTemplate, ...] | None:
    """The pod templates of a Pod, Job, JobSet, Kubeflow MPIJob, Deployment-like object or
    ``List``; a bare ``spec:`` snippet with containers counts as a pod. None when the object
    holds no pods (a Service, a ConfigMap). A part of the object that has the wrong shape (a
    ``replicatedJobs`` that is not a list) is a template holding the violation."""
    kind = obj.get("kind") if isinstance(obj.get("kind"), str) else ""
    name = name_text(as_map(obj.get("metadata")).get("name"))
    label = f"{kind or 'Pod'}/{name}" if name else f"{kind or 'Pod'} (unnamed)"
    spec = as_map(obj.get("spec"))
    if kind == "List":
        return tuple(_list_items(obj, label))
    if kind == "Pod" or (not kind and "containers" in spec):
        return (PodTemplate(where=label, template=obj),)
    if kind == "Job":
        return (_job_template(label, spec, "spec"),)
    if kind == "JobSet":
        jobs = spec.get("replicatedJobs") or []
        if not isinstance(jobs, list):
            return (_broken(label, "spec.replicatedJobs", jobs, "must be a list of replicated jobs"),)
        out = []
        for i, rj in enumerate(jobs):
            path = f"spec.replicatedJobs[{i}]"
            if not isinstance(rj, Mapping):
                out.append(_broken(label, path, rj, "must be a replicated job (a mapping)"))
                continue
            rname = rj.get("name")
            where = f"{label} spec.replicatedJobs[{name_text(rname) or i}]"
            t = _job_template(where, as_map(as_map(rj.get("template")).get("spec")), f"{path}.template.spec")
            replicas = integer(rj.get("replicas", 1), f"{path}.replicas", most=MAX_GANG)
            if isinstance(replicas, Violation):
                t = msgspec.structs.replace(t, violations=t.violations + (replicas,))
            out.append(msgspec.structs.replace(t, role=name_text(rname), replicas=replicas if isinstance(replicas, int)
                                               else 1))
        return tuple(out)
    if kind == "MPIJob":
        replicas = spec.get("mpiReplicaSpecs") or {}
        if not isinstance(replicas, Mapping):
            return (_broken(label, "spec.mpiReplicaSpecs", replicas, "must be a map of role to replica spec"),)
        return tuple(PodTemplate(where=f"{label} spec.mpiReplicaSpecs[{shown(role)}]",
                                 template=as_map(as_map(rs).get("template")), role=str(role).lower(),
                                 replicas=_replicas(as_map(rs).get("replicas")))
                     for role, rs in replicas.items())
    if kind == "LeaderWorkerSet":
        return _lws_templates(label, spec)
    if kind in _TEMPLATE_KINDS:
        return (PodTemplate(where=label, template=as_map(spec.get("template"))),)
    return None


def _lws_templates(label: str, spec: Mapping[str, Any]) -> tuple[PodTemplate, ...]:
    """A LeaderWorkerSet's leader and worker templates (the leader's is the workers' unless
    ``leaderTemplate`` says otherwise), each for ``replicas`` groups of ``size`` pods."""
    lwt = as_map(spec.get("leaderWorkerTemplate"))
    replicas = integer(spec.get("replicas", 1), "spec.replicas", most=MAX_GANG)
    size = integer(lwt.get("size", 1), "spec.leaderWorkerTemplate.size", least=1, most=MAX_GANG)
    bad = tuple(x for x in (replicas, size) if isinstance(x, Violation))
    groups, per = (replicas if isinstance(replicas, int) else 1), (size if isinstance(size, int) else 1)
    worker = as_map(lwt.get("workerTemplate"))
    leader = as_map(lwt.get("leaderTemplate")) or worker
    out = [PodTemplate(where=f"{label} spec.leaderWorkerTemplate.{'leaderTemplate' if lwt.get('leaderTemplate') else 'workerTemplate'} (leader)",
                       template=leader, role="leader", replicas=groups, size=per, violations=bad)]
    if per > 1:
        out.append(PodTemplate(where=f"{label} spec.leaderWorkerTemplate.workerTemplate", template=worker,
                               role="worker", replicas=groups, size=per, violations=bad))
    return tuple(out)


def _list_items(obj: Mapping[str, Any], label: str) -> list[PodTemplate]:
    """The templates of a ``List``'s items; a List inside a List is not unpacked (the API
    server has no such object), so a self-referencing List ends here."""
    items = obj.get("items") or []
    if not isinstance(items, list):
        return [_broken(label, "items", items, "must be a list of objects")]
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            out.append(_broken(label, f"items[{i}]", item, "must be a Kubernetes object (a mapping)"))
        elif item.get("kind") == "List":
            out.append(_broken(label, f"items[{i}].kind", "List", "a List item cannot itself be a List"))
        else:
            out.extend(pod_templates(item) or ())
    return out


def _job_template(where: str, job: Mapping[str, Any], path: str) -> PodTemplate:
    """A Job spec's pod template; ``parallelism`` defaults to 1 as in Kubernetes."""
    raw = job.get("parallelism", 1)
    parallelism = integer(raw, f"{path}.parallelism", most=MAX_GANG) if raw is not None else 1
    bad = (parallelism,) if isinstance(parallelism, Violation) else ()
    return PodTemplate(where=where, template=as_map(job.get("template")),
                       parallelism=0 if bad else parallelism, violations=bad)


def _replicas(raw: Any) -> int:
    n = integer(raw if raw is not None else 1, "replicas", most=MAX_GANG)
    return n if isinstance(n, int) else 1


def _broken(where: str, field: str, raw: Any, rule: str) -> PodTemplate:
    return PodTemplate(where=where, template={}, violations=(Violation(field, shown(raw), rule),))


def check_object(obj: Mapping[str, Any]) -> tuple[ObjectCheck, ...] | None:
    """Validate every pod template of a workload object (see ``pod_templates``); gang
    templates must have ``aliyun.com/min-member`` equal to ``parallelism`` (seed 4.2).
    None when the object holds no pods. Never raises on a malformed object: its shape
    errors are violations like any other."""
    templates = pod_templates(obj)
    if templates is None:
        return None
    out = []
    meta = obj.get("metadata")
    if obj.get("kind") not in ("Pod", None) and isinstance(meta, Mapping):
        named = names.check_metadata(meta)
        if named:
            out.append(ObjectCheck(where=templates[0].where if templates else str(obj.get("kind")),
                                   violations=tuple(named)))
    for t in templates:
        if t.violations and not t.template:
            out.append(ObjectCheck(where=t.where, violations=t.violations))
            continue
        if obj.get("kind") == "MPIJob" and t.role == "launcher" and not _phalanx(t.template):
            out.append(ObjectCheck(where=t.where, warnings=(
                "not a gang member: the launcher asks for no GPU and is left to its scheduler "
                f"({as_map(t.template.get('spec')).get('schedulerName') or 'default-scheduler'})",)))
            continue
        try:
            req = gangs.gpu_member(t.template)
        except RequestError as e:
            out.append(ObjectCheck(where=t.where, violations=t.violations + e.violations))
            continue
        if t.violations:
            out.append(ObjectCheck(where=t.where, violations=t.violations))
            continue
        tmeta, bad = as_map(t.template.get("metadata")), []
        most = gangs.max_member(as_map(tmeta.get("labels")), as_map(tmeta.get("annotations")), req.min_member or None, bad)
        if bad:
            out.append(ObjectCheck(where=t.where, violations=tuple(bad)))
            continue
        if most and t.parallelism and req.min_member and not req.min_member <= t.parallelism <= most:
            out.append(ObjectCheck(where=t.where, violations=(Violation(
                "spec.parallelism", str(t.parallelism),
                f"an elastic gang's job runs between its min-member ({req.min_member}) and its maximum ({most}) "
                "pods: parallelism must lie in that range"),)))
            continue
        if not most and t.parallelism and req.min_member and req.min_member != t.parallelism:
            out.append(ObjectCheck(where=t.where, violations=(Violation(
                f"metadata.labels[{_min_member_key(t.template)}]", str(req.min_member),
                f"must equal the job's parallelism ({t.parallelism}): the gang is all the job's pods "
                "(seed 4.2)"),)))
            continue
        out.append(ObjectCheck(where=t.where, request=req, warnings=req.warnings))
    return tuple(out)


def _phalanx(template: Mapping[str, Any]) -> bool:
    return as_map(template.get("spec")).get("schedulerName") in SCHEDULER_NAMES


class GangCheck(msgspec.Struct, frozen=True, kw_only=True):
    """The gang a workload's pods form, as gang-coordinator will see them: ``gangs.identify``
    on each template labelled the way its controller labels the pods, sized by the same rule
    (``gangs.jobset_size`` for a JobSet). ``members`` 0: no pod says (the settle rule)."""

    gang_id: str
    members: int
    how: str
    violations: tuple[Violation, ...] = ()


def gang_check(obj: Mapping[str, Any]) -> GangCheck | None:
    """The gang of a Job, JobSet or MPIJob (None for other objects or when a template is
    malformed: ``check_object`` says why)."""
    kind = obj.get("kind")
    if kind == "Pod":
        return _pod_gang(obj)
    templates = pod_templates(obj) if kind in ("Job", "JobSet", "MPIJob", "LeaderWorkerSet") else None
    if not templates or any(t.violations for t in templates):
        return None
    meta = as_map(obj.get("metadata"))
    ns, name = name_text(meta.get("namespace")) or "default", name_text(meta.get("name"))
    jobs = sum(t.replicas for t in templates) if kind == "JobSet" else 0
    parts: list[GangPart] = []
    declared: list[int] = []
    ident = None
    v: list[Violation] = []
    for t in templates:
        if not _phalanx(t.template):
            if kind == "JobSet":
                v.append(Violation(f"{t.where} spec.schedulerName", str(as_map(t.template.get("spec")).get(
                    "schedulerName") or "default-scheduler"), "every replicated job of a JobSet gang is scheduled by "
                    "Phalanx, or the gang waits for the Jobs it never sees; or set phalanx.io/gang-min-member"))
            continue
        tmeta = as_map(t.template.get("metadata"))
        labels = dict(as_map(tmeta.get("labels")))
        labels.update(_controller_labels(kind, name, t, jobs))
        try:
            ident = gangs.identify(ns, name, labels, {**as_map(tmeta.get("annotations")),
                                                      **_controller_annotations(kind, t, meta)},
                                   as_map(t.template.get("spec")))
        except RequestError:
            return None  # check_object names the bad value
        if ident.pod_group:
            return _named_group(ident)
        if ident.part is not None:
            parts.append(msgspec.structs.replace(ident.part, members=ident.part.members or 0))
        if ident.min_member:
            declared.append(ident.min_member)
    if ident is None:
        return GangCheck(gang_id=f"{ns}/{kind}:{name}", members=0, how="no pod scheduled by Phalanx",
                         violations=tuple(v))
    if kind == "LeaderWorkerSet" and declared:
        groups = templates[0].replicas
        size, how = max(declared), (f"each of {groups} group{'s' if groups != 1 else ''} (leader and workers) is a "
                                    f"gang; this is group 0")
        if isinstance(as_map(meta.get("annotations")).get(kubeapi.LWS_EXCLUSIVE), str):
            how += "; exclusive: its leader first, the workers join once it is scheduled"
    elif declared:
        size, how = max(declared), (f"{kubeapi.GANG_MIN_MEMBER} of the pods" if kind == "JobSet"
                                    else "min-member said by the pods")
    elif parts:
        size_ = gangs.jobset_size(parts, jobs)
        size = size_.members if size_.declared and not v else 0
        how = " + ".join(f"{p.name} {p.jobs} x {p.members or '?'}" for p in parts)
        if gangs.leaders_first(_controller_annotations(kind, templates[0], meta)):
            how += "; exclusive through JobSet's webhook: each Job's leader, the followers join once it is scheduled"
    else:
        size, how = 0, "no pod says min-member"
    workers = next((t.replicas for t in templates if t.role == "worker"), 0)
    if kind == "MPIJob" and size and workers and size != workers:
        v.append(Violation(f"metadata.labels[{MIN_MEMBER_LABEL}]", str(size),
                           f"must equal the Worker replicas ({workers}): the launcher asks for no GPU and is not a "
                           "gang member"))
    if not size:
        how += "; the gang is the pods present once none arrived for the settle time"
    return GangCheck(gang_id=ident.gang_id, members=size, how=how, violations=tuple(v))


def _pod_gang(pod: Mapping[str, Any]) -> GangCheck | None:
    """A bare Pod's gang: a group it names, or itself alone (then a min-member it says is
    not used, and validate says so rather than "gang of N")."""
    meta = as_map(pod.get("metadata"))
    labels, annotations = as_map(meta.get("labels")), as_map(meta.get("annotations"))
    try:
        ident = gangs.identify(name_text(meta.get("namespace")) or "default", name_text(meta.get("name")), labels,
                               annotations, as_map(pod.get("spec")))
    except RequestError:
        return None  # check_object names the bad value
    if ident.pod_group:
        return _named_group(ident)
    says = any(k in labels or k in annotations for k in (*kubeapi.MIN_MEMBER_KEYS, kubeapi.GANG_MIN_MEMBER))
    if ident.kind == "Pod":
        if not says:
            return None
        return GangCheck(gang_id=ident.gang_id, members=1, how="no group label or annotation: a gang of one; its "
                                                               "min-member is not used")
    size = ident.min_member or 0
    if not size and ident.part is not None:
        js = gangs.jobset_size((ident.part,), ident.jobs)
        size = js.members if js.declared else 0
    return GangCheck(gang_id=ident.gang_id, members=size, how="min-member said by the pod" if size else
                     "no pod says min-member; the gang is the pods present once none arrived for the settle time")


def _named_group(ident: gangs.GangIdentity) -> GangCheck:
    """The gang of pods naming a Workload API PodGroup: its size is that object's."""
    return GangCheck(gang_id=ident.gang_id, members=ident.min_member or 0,
                     how=f"the pods name PodGroup {ident.pod_group} (spec.schedulingGroup): "
                         + ("min-member said by the pods" if ident.min_member else
                            "its gang.minCount, read from the object when the pods are admitted"))


def _controller_labels(kind: Any, name: str, t: PodTemplate, jobs: int) -> dict[str, str]:
    """The labels the controller puts on the pods of template ``t``."""
    match kind:
        case "JobSet":
            return {kubeapi.JOBSET_NAME: name, kubeapi.JOBSET_REPLICATED_JOB: t.role,
                    kubeapi.JOBSET_REPLICAS: str(t.replicas), kubeapi.JOBSET_JOBS: str(jobs)}
        case "MPIJob":
            return {kubeapi.MPIJOB_NAME: name, kubeapi.MPIJOB_ROLE: t.role}
        case "LeaderWorkerSet":
            return {kubeapi.LWS_NAME: name, kubeapi.LWS_GROUP_INDEX: "0",
                    kubeapi.LWS_WORKER_INDEX: "0" if t.role == "leader" else "1"}
        case _:
            return {kubeapi.JOB_NAME: name}


def _controller_annotations(kind: Any, t: PodTemplate, meta: Mapping[str, Any]) -> dict[str, str]:
    """The annotations the controller puts on the pods of template ``t`` that say the gang: an
    LWS group's size, and the object's exclusive placement (both controllers copy it from the
    object's own annotations onto every pod)."""
    own = as_map(meta.get("annotations"))
    copied = {k: own[k] for k in (kubeapi.JOBSET_EXCLUSIVE, kubeapi.JOBSET_NODE_SELECTOR_STRATEGY, kubeapi.LWS_EXCLUSIVE)
              if isinstance(own.get(k), str)}
    return {**copied, kubeapi.LWS_SIZE: str(t.size)} if kind == "LeaderWorkerSet" else copied


def expand_pods(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pods a workload object's controllers would make, labelled as they label them (the
    labels ``gangs.identify`` reads): a Pod itself, a Job's ``parallelism`` pods, every
    replicated Job's pods of a JobSet, an MPIJob's pods per replica role; a ``List``'s items'.
    Pods are named ``<object>-<role>-<job>-<index>`` (the controllers add a random suffix).
    Templates with violations (``check_object`` names them) and pods not scheduled by Phalanx
    are left out. Used by ``phalanx sim``, which submits what a cluster would see."""
    kind = obj.get("kind")
    if kind == "List":
        return [p for item in obj.get("items") or () if isinstance(item, Mapping) for p in expand_pods(item)]
    templates = pod_templates(obj)
    if not templates:
        return []
    meta = as_map(obj.get("metadata"))
    name, ns = name_text(meta.get("name")) or "unnamed", name_text(meta.get("namespace")) or "default"
    if kind == "Pod" or (not kind and "containers" in as_map(obj.get("spec"))):
        pod = dict(obj)
        pod["metadata"] = {**meta, "namespace": ns, "name": name}
        return [pod] if _phalanx(pod) else []
    jobs = sum(t.replicas for t in templates) if kind == "JobSet" else 0
    if kind == "LeaderWorkerSet":
        return _lws_pods(templates, name, ns)
    out = []
    for t in templates:
        if t.violations or not _phalanx(t.template):
            continue
        tmeta = as_map(t.template.get("metadata"))
        labels = {**as_map(tmeta.get("labels")), **_controller_labels(kind, name, t, jobs)}
        per_job = max(1, t.parallelism) if kind in ("Job", "JobSet") else 1
        count = t.replicas if kind in ("JobSet", "MPIJob") else 1
        for j in range(count):
            for i in range(per_job):
                role = f"-{t.role}" if t.role else ""
                pod_name = f"{name}{role}-{j}-{i}" if kind == "JobSet" else (
                    f"{name}{role}-{j}" if kind == "MPIJob" else f"{name}-{i}")
                out.append({**t.template, "apiVersion": "v1", "kind": "Pod",
                            "metadata": {**tmeta, "name": pod_name, "namespace": ns, "labels": dict(labels)}})
    return out


def _lws_pods(templates: tuple[PodTemplate, ...], name: str, ns: str) -> list[dict[str, Any]]:
    """A LeaderWorkerSet's pods as its controller names and labels them: per group ``g`` the
    leader ``<name>-<g>`` and the workers ``<name>-<g>-<w>``."""
    out = []
    for t in templates:
        if t.violations or not _phalanx(t.template):
            continue
        tmeta = as_map(t.template.get("metadata"))
        for g in range(t.replicas):
            for w in ((0,) if t.role == "leader" else range(1, t.size)):
                labels = {**as_map(tmeta.get("labels")), kubeapi.LWS_NAME: name, kubeapi.LWS_GROUP_INDEX: str(g),
                          kubeapi.LWS_WORKER_INDEX: str(w)}
                annotations = {**as_map(tmeta.get("annotations")), kubeapi.LWS_SIZE: str(t.size)}
                out.append({**t.template, "apiVersion": "v1", "kind": "Pod", "metadata": {
                    **tmeta, "name": f"{name}-{g}" if w == 0 else f"{name}-{g}-{w}", "namespace": ns,
                    "labels": labels, "annotations": annotations}})
    return out


def _min_member_key(template: Mapping[str, Any]) -> str:
    """The key a pod template says its gang's size with (``requests.min_member_said``)."""
    meta = as_map(template.get("metadata"))
    return min_member_said(as_map(meta.get("labels")), as_map(meta.get("annotations")), []).key or MIN_MEMBER_LABEL
