"""A workload for ``phalanx sim``: the YAML files users submit — Pods, Jobs, JobSets, Kubeflow
MPIJobs, ``List``s — with when each arrives and how long it runs written as annotations on
the object (on a bare Pod, on the pod):

====================================  ==========================================================
``sim.phalanx.io/arrival``            when it is submitted, from the start of the run (``0``,
                                      ``90s``, ``30m``, ``2h``, ``1d``; default 0)
``sim.phalanx.io/duration``           how long it runs once every member is placed (default:
                                      ``--default-duration``, else until the end of the run)
``sim.phalanx.io/repeat``             submit it this many times (default 1); copy *i* is named
                                      ``<name>-r<i>``
``sim.phalanx.io/every``              the time between two copies' arrivals (default 0)
====================================  ==========================================================

``PriorityClass`` objects in the files give the pods that name them their ``spec.priority``
and ``preemptionPolicy``, as the API server's Priority admission does: the built-in
``system-cluster-critical`` and ``system-node-critical`` too, and a pod that names no class gets
the ``globalDefault: true`` class's (none: priority 0). A pod may also carry ``spec.priority``
itself (as ``kubectl get -o yaml`` writes it), which is kept.

Each object is checked as ``phalanx validate`` checks it (``workloads.check_object``) and made
into the pods its controller would create (``workloads.expand_pods``); the pods are grouped into
gangs and parsed by the rules gang-coordinator applies (``gangs.identify``, ``gangs.gpu_member``),
each pod in its queue (``queueorder.resolve``: its label, its namespace's, or ``default``).
A gang whose queue refuses it is kept with the reason and never tries, as gang-coordinator
would not admit it; so is a gang with fewer pods than its min-member.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from phalanx_input import Invalid, yaml_file
from phalanx_kubeobjects import gangs, workloads
from phalanx_kubeobjects.requests import RequestError
from phalanx_kubeobjects.violations import Violation
from phalanx_proto.events import MemberSpec, PodRef
from phalanx_proto.kubeapi import SIM_ARRIVAL as ARRIVAL
from phalanx_proto.kubeapi import SIM_DURATION as DURATION
from phalanx_proto.kubeapi import SIM_EVERY as EVERY
from phalanx_proto.kubeapi import SIM_REPEAT as REPEAT
from phalanx_rules import queueorder
from phalanx_rules.queues import QueueTree
from phalanx_sim.model import SimGang, parse_duration

MAX_REPEAT = 100_000
SYSTEM_CLASSES = {"system-cluster-critical": {"value": 2_000_000_000},
                  "system-node-critical": {"value": 2_000_001_000}}
"""The PriorityClasses every API server has (``scheduling.k8s.io/v1``'s built-ins)."""


@dataclass
class _Gang:
    members: list[MemberSpec] = field(default_factory=list)
    arrival: float = 0.0
    duration: float | None = None
    priority: int = 0
    size: int = 0
    refused: str = ""


def read_workload(paths: Iterable[str], tree: QueueTree, namespaces: Mapping[str, Mapping[str, str]],
                  default_duration_s: float | None = None) -> list[SimGang]:
    """The gangs of every object in ``paths`` (``OSError`` when a file cannot be read,
    ``Invalid`` naming file, document and field when an object is not valid)."""
    objects: list[tuple[str, dict[str, Any]]] = []
    groups: dict[tuple[str, str], Mapping[str, Any]] = {}
    """The Workload API's PodGroups the files hold, by (namespace, name): their gangs' sizes."""
    classes: dict[str, Mapping[str, Any]] = dict(SYSTEM_CLASSES)
    default: tuple[str, str] | None = None
    for path in paths:
        for n, doc in enumerate(yaml_file(path), start=1):
            if doc is None or (isinstance(doc, dict) and doc.get("kind") in ("Queue", "Namespace")):
                continue
            if isinstance(doc, dict) and doc.get("kind") == "PodGroup":
                meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
                groups[(str(meta.get("namespace") or "default"), str(meta.get("name", "")))] = doc
                continue
            if isinstance(doc, dict) and doc.get("kind") == "PriorityClass":
                name = str((doc.get("metadata") or {}).get("name", ""))
                if doc.get("globalDefault") is True:
                    if default is not None and default[0] != name:
                        raise Invalid(f"{path}#{n}: PriorityClass {name}: globalDefault", f"PriorityClass "
                                      f"{default[0]} ({default[1]}) is the default already: only one may be")
                    default = (name, f"{path}#{n}")
                classes[name] = doc
                continue
            if not isinstance(doc, dict):
                raise Invalid(f"{path}#{n}", f"not a Kubernetes object (a {type(doc).__name__}, not a mapping)")
            if doc.get("kind") == "List" and isinstance(doc.get("items"), list):
                # each item keeps its own arrival and duration (kubectl get -o yaml writes Lists)
                objects.extend((f"{path}#{n}.items[{i}]", item) for i, item in enumerate(doc["items"]))
            else:
                objects.append((f"{path}#{n}", doc))
    found: dict[str, _Gang] = {}
    for where, obj in objects:
        _check(where, obj)
        times = _times(where, obj, default_duration_s)
        for copy, (arrival, duration) in enumerate(times):
            suffix = f"-r{copy}" if len(times) > 1 else ""
            for pod in workloads.expand_pods(_renamed(obj, suffix)):
                pod = _prioritised(where, pod, classes, default[0] if default else None)
                _add(found, where, pod, arrival, duration, tree, namespaces, groups)
    out = []
    for gang_id, g in found.items():
        refused = g.refused
        if not refused and g.size > len(g.members):
            refused = f"gang incomplete: {len(g.members)} of its {g.size} pods are in the workload"
        out.append(SimGang(gang_id=gang_id, members=tuple(g.members), arrival_s=g.arrival, duration_s=g.duration,
                           priority=g.priority, refused=refused))
    return sorted(out, key=lambda g: g.arrival_s)  # stable: in the order the files name them


def _check(where: str, obj: Mapping[str, Any]) -> None:
    for check in workloads.check_object(obj) or ():
        if check.violations:
            v = check.violations[0]
            raise Invalid(f"{where}: {check.where}: {v.field}", f"{v.value!r} {v.rule}")


def _times(where: str, obj: Mapping[str, Any], default_duration_s: float | None) -> list[tuple[float, float | None]]:
    """(arrival, duration) of each copy the object's annotations ask for."""
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    notes = meta.get("annotations") if isinstance(meta.get("annotations"), Mapping) else {}
    try:
        arrival = parse_duration(notes.get(ARRIVAL, 0))
        duration = parse_duration(notes[DURATION]) if DURATION in notes else default_duration_s
        every = parse_duration(notes.get(EVERY, 0))
        repeat = int(str(notes.get(REPEAT, 1)))
    except ValueError as e:
        raise Invalid(f"{where}: metadata.annotations", str(e)) from None
    if not 1 <= repeat <= MAX_REPEAT:
        raise Invalid(f"{where}: metadata.annotations[{REPEAT}]", f"{repeat}: from 1 to {MAX_REPEAT}")
    return [(arrival + i * every, duration) for i in range(repeat)]


def _renamed(obj: Mapping[str, Any], suffix: str) -> dict[str, Any]:
    if not suffix:
        return dict(obj)
    meta = dict(obj.get("metadata") or {})
    meta["name"] = f"{meta.get('name', 'unnamed')}{suffix}"
    return {**obj, "metadata": meta}


def _add(found: dict[str, _Gang], where: str, pod: dict[str, Any], arrival: float, duration: float | None,
         tree: QueueTree, namespaces: Mapping[str, Mapping[str, str]],
         groups: Mapping[tuple[str, str], Mapping[str, Any]]) -> None:
    meta = pod["metadata"]
    ns, name = meta["namespace"], meta["name"]
    labels = {k: str(v) for k, v in (meta.get("labels") or {}).items()}
    try:
        ident = gangs.identify(ns, name, labels, meta.get("annotations") or {}, pod.get("spec"))
        spec = gangs.gpu_member(pod).member_spec(PodRef(namespace=ns, name=name, uid=f"sim-{ns}-{name}"))
    except RequestError as e:
        raise Invalid(f"{where}: pod {ns}/{name}", str(e)) from None
    queue, refused = queueorder.resolve(tree, ns, labels, namespaces.get(ns, {}))
    g = found.setdefault(ident.gang_id, _Gang(arrival=arrival, duration=duration))
    pod_spec = pod.get("spec") or {}
    priority = pod_spec.get("priority")
    priority = priority if isinstance(priority, int) and not isinstance(priority, bool) else 0
    g.members.append(MemberSpec(**{**_fields(spec), "queue": queue, "priority": priority,
                                   "preemption_policy": str(pod_spec.get("preemptionPolicy") or "")}))
    g.arrival = max(g.arrival, arrival)
    if duration is not None:
        g.duration = max(g.duration or 0.0, duration)
    g.priority = max(g.priority, priority)
    g.refused = g.refused or refused
    if ident.pod_group:  # the Workload API: the PodGroup object says the size (placed whole here)
        group = groups.get((ns, ident.pod_group))
        if group is None:
            g.refused = g.refused or (f"PodGroup {ns}/{ident.pod_group} (spec.schedulingGroup.podGroupName) is not in "
                                      "the workload")
            return
        policy = gangs.pod_group_policy(group)
        if isinstance(policy, Violation):
            raise Invalid(f"{where}: PodGroup {ns}/{ident.pod_group}: {policy.field}", f"{policy.value!r} {policy.rule}")
        g.size = max(g.size, ident.min_member or policy.least)
    elif ident.min_member:
        g.size = max(g.size, ident.min_member)
    elif ident.part is not None:
        size = gangs.jobset_size((ident.part,), ident.jobs)
        g.size = max(g.size, size.members if size.declared else 0)


def _prioritised(where: str, pod: dict[str, Any], classes: Mapping[str, Mapping[str, Any]],
                 default: str | None) -> dict[str, Any]:
    """The pod as the API server's Priority admission leaves it: ``spec.priority`` (and, unless
    the pod says, ``preemptionPolicy``) from the PriorityClass its ``priorityClassName`` names
    among the workload's ``PriorityClass`` objects and the built-in ones, or, naming none, from
    the ``globalDefault`` class (``default``); a name none defines is refused, as there."""
    spec = pod.get("spec") or {}
    if "priority" in spec:
        return pod
    name = spec.get("priorityClassName") or default
    if not name:
        return pod
    cls = classes.get(str(name))
    if cls is None:
        raise Invalid(f"{where}: pod {pod['metadata'].get('name')}: spec.priorityClassName",
                      f"no PriorityClass {name!r} in the workload (add its object to a --workload file)")
    value = cls.get("value")
    if not isinstance(value, int) or isinstance(value, bool):
        raise Invalid(f"{where}: PriorityClass {name}: value", f"{value!r}: an integer")
    extra = {"priority": value}
    if "preemptionPolicy" not in spec and cls.get("preemptionPolicy"):
        extra["preemptionPolicy"] = str(cls["preemptionPolicy"])
    return {**pod, "spec": {**spec, **extra}}


def _fields(spec: MemberSpec) -> dict[str, Any]:
    return {f: getattr(spec, f) for f in spec.__struct_fields__}
