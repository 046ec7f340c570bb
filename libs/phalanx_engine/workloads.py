"""Where the pods of a workload object are, and the verdict on each: ``phalanx validate``'s
reading of a Pod, Job, JobSet, Kubeflow MPIJob, Deployment-like object or ``List``.

``pod_templates`` finds the pod templates (a part of the object with the wrong shape is a
template holding the violation); ``check_object`` parses each with ``requests.parse_pod``, the
code gang-coordinator runs, and adds the gang rule that needs the workload (min-member equals
the Job's parallelism). Never raises on a malformed object.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from phalanx_engine import names
from phalanx_engine.quantity import Violation, integer, shown
from phalanx_engine.requests import MAX_GANG, MIN_MEMBER_LABEL, GpuRequest, RequestError, parse_pod


class PodTemplate(msgspec.Struct, frozen=True, kw_only=True):
    """One pod (template) inside a workload object. ``where`` names it for people
    (``JobSet/gang-nccl-test spec.replicatedJobs[worker]``); ``parallelism`` is the pods
    one gang of it has where the workload says (Job/JobSet), else 0; ``violations`` are the
    object's own shape errors around the template (a ``parallelism`` that is not an integer)."""

    where: str
    template: Mapping[str, Any]
    parallelism: int = 0
    violations: tuple[Violation, ...] = ()


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
    name = _text(_mapping(obj.get("metadata")).get("name"))
    label = f"{kind or 'Pod'}/{name}" if name else f"{kind or 'Pod'} (unnamed)"
    spec = _mapping(obj.get("spec"))
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
            where = f"{label} spec.replicatedJobs[{_text(rname) or i}]"
            out.append(_job_template(where, _mapping(_mapping(rj.get("template")).get("spec")), f"{path}.template.spec"))
        return tuple(out)
    if kind == "MPIJob":
        replicas = spec.get("mpiReplicaSpecs") or {}
        if not isinstance(replicas, Mapping):
            return (_broken(label, "spec.mpiReplicaSpecs", replicas, "must be a map of role to replica spec"),)
        return tuple(PodTemplate(where=f"{label} spec.mpiReplicaSpecs[{shown(role)}]",
                                 template=_mapping(_mapping(rs).get("template")))
                     for role, rs in replicas.items())
    if kind in _TEMPLATE_KINDS:
        return (PodTemplate(where=label, template=_mapping(spec.get("template"))),)
    return None


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
    return PodTemplate(where=where, template=_mapping(job.get("template")),
                       parallelism=0 if bad else parallelism, violations=bad)


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
        try:
            req = parse_pod(t.template)
        except RequestError as e:
            out.append(ObjectCheck(where=t.where, violations=t.violations + e.violations))
            continue
        if t.violations:
            out.append(ObjectCheck(where=t.where, violations=t.violations))
            continue
        if t.parallelism and req.min_member and req.min_member != t.parallelism:
            out.append(ObjectCheck(where=t.where, violations=(Violation(
                f"metadata.labels[{MIN_MEMBER_LABEL}]", str(req.min_member),
                f"must equal the job's parallelism ({t.parallelism}): the gang is all the job's pods "
                "(seed 4.2)"),)))
            continue
        out.append(ObjectCheck(where=t.where, request=req, warnings=req.warnings))
    return tuple(out)


def _mapping(x: Any) -> Mapping[str, Any]:
    return x if isinstance(x, Mapping) else {}


def _text(raw: Any) -> str:
    """A name as written ('' when it is not a string, cut when too long to be a name)."""
    if not isinstance(raw, str):
        return ""
    return raw if len(raw) <= names.SUBDOMAIN_MAX else shown(raw)
