"""What the reconciler compares: the ledger, the gang records and the cluster's pods. Pure.

``audit`` takes one consistent-enough reading — the ledger read **first**, then the gang
records, then the pods (so a reservation seen always belongs to a pod that existed before the
pods were listed) — and returns every disagreement as a ``Finding`` with the repair it calls
for. Rules (docs/saga.md, "The reconciler"):

1. A reservation whose pod (by uid) is gone, or has failed (phase ``Failed``: it holds no GPU,
   though the API keeps it, as a Job keeps its failed pods), is released; if the pod is still a
   member of its gang's record, the member is forgotten first (which releases it: ``Forget``).
   A pod that ended (``Failed``, ``Succeeded``) is no pod of rule 4: never adopted, never
   sharing a GPU. (A ``Succeeded`` pod's reservation is kept, by rule 2, as pod intake keeps
   it: forgetting a member that completed would open a repair for it.)
2. A reservation on the node its pod is bound to backs a running pod: it is kept, whatever
   the gang record says.
3. A reservation of a pod that is not bound there is kept only while its attempt is in
   flight (the record is at that attempt, ``placing``…``binding``, and names the pod) or is
   being rolled back (the rollback releases it); otherwise it is released.
4. A pod with a Phalanx schedulerName bound to a node without a reservation there gets one
   recorded (``Adopt``, from its assignment annotation) if its GPUs are free there; without a
   readable assignment it is reported loudly (``Report``: a Warning event on the pod, the
   metric, ``phalanx doctor``) and never booked twice. If its GPUs are booked by another pod
   that runs there too, two pods share a GPU: the one bound later is rolled back (``Evict``:
   deleted, so its controller recreates it, with a Warning event saying why), and the one
   that stays is then recorded by rule 1 or 4.
5. A MIG instance recorded ready in ``phx-mig`` without a reservation while a pod still runs
   on it is a finding; the pod's adoption (rule 4) gives the slot its owner back, so
   mig-manager does not destroy it.
6. Values that cannot be read are findings; nothing is concluded from them (no repair).
7. A queue's usage that is not what the ledger says (``phalanx_rules.queues.usage_drift``) is a
   finding; placement, which writes both, repairs it from the ledger (its own audit).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field

import msgspec

from phalanx_kube.port import Pod
from phalanx_proto.events import Assignment, PodRef
from phalanx_proto.kubeapi import ASSIGNMENT_ANNOTATION, decode_assignment
from phalanx_proto.kvrules import gpu_conflicts
from phalanx_proto.queues import QueueUsage, shown
from phalanx_proto.state import Allocation, GangState, MigRecord, NodeLedger, alloc_key
from phalanx_proto.subjects import gang_key
from phalanx_proto.vocab import OPEN
from phalanx_rules.queues import QueueTree, usage_drift


@dataclass(frozen=True, slots=True)
class Release:
    gang_id: str
    attempt: int
    pod: PodRef
    node: str


@dataclass(frozen=True, slots=True)
class Forget:
    gang_id: str
    pod: PodRef


@dataclass(frozen=True, slots=True)
class Adopt:
    gang_id: str
    attempt: int
    assignment: Assignment


@dataclass(frozen=True, slots=True)
class Report:
    pod: PodRef
    message: str


@dataclass(frozen=True, slots=True)
class Evict:
    """Delete ``pod`` (the later of two pods sharing a GPU), telling it ``message``."""

    pod: PodRef
    message: str


Repair = Release | Forget | Adopt | Report | Evict


@dataclass(frozen=True, slots=True)
class Finding:
    kind: str
    """A value of ``phalanx_telemetry.metrics.RECONCILER_FINDING_KINDS``."""
    detail: str
    repair: Repair | None = None


@dataclass(frozen=True, slots=True)
class Reading:
    """One reading of everything the reconciler compares."""

    ledgers: dict[str, NodeLedger]
    """Node → its (readable) ledger."""
    gangs: dict[str, GangState]
    pods: list[Pod]
    """Every pod with a Phalanx schedulerName, bound or not."""
    gang_of: dict[str, str]
    """Pod uid → the gang id its labels name (for pods in no record)."""
    mig: list[MigRecord] = ()
    unreadable: tuple[str, ...] = ()
    """Bad entries (``bucket/key (revision): error``) of the buckets read."""
    unreadable_nodes: frozenset[str] = frozenset()
    """Nodes whose ledger entry is bad: nothing is concluded about them."""
    unreadable_gangs: frozenset[str] = frozenset()
    """KV keys of gang records that are bad: nothing is concluded about their gangs."""
    usage: dict[str, QueueUsage] = field(default_factory=dict)
    """Queue → its usage record (``phx-ledger`` ``queue.*``; only queues with a limit keep one)."""
    queues: QueueTree | None = None
    """The queue tree (which queues have a limit)."""
    recent: dict[str, NodeLedger] = field(default_factory=dict)
    """Nodes whose ledger was read again after the pods were listed, because a pod bound there
    had no reservation in ``ledgers``: a pod bound while the reading was taken had its
    reservation written before its Binding, so rule 4 looks here too before it concludes."""


def audit(r: Reading) -> list[Finding]:
    """Every disagreement between ledger, gang records and pods, each with its repair."""
    by_uid = {p.uid: p for p in r.pods if p.uid}
    out = [Finding("unreadable_record", bad) for bad in r.unreadable]
    for node, ledger in sorted(r.ledgers.items()):
        for alloc in ledger.allocations.values():
            finding = _reservation(r, node, alloc, by_uid)
            if finding is not None:
                out.append(finding)
    for pod in r.pods:
        if pod.node_name and not pod.terminal and pod.node_name not in r.unreadable_nodes:
            finding = _bound_pod(r, pod)
            if finding is not None:
                out.append(finding)
    out += _mig(r, by_uid)
    if not r.unreadable_nodes and r.queues is not None:
        for q, want in sorted(usage_drift(r.queues, r.ledgers.values(), r.usage).items()):
            have = r.usage[q].allocated if q in r.usage else 0
            out.append(Finding("queue_usage_mismatch", f"queue {q}: its usage says {shown(have)} GPUs, the ledger "
                                                       f"{shown(want.allocated)}"))
    return out


def _member_of(state: GangState | None, pod: PodRef) -> bool:
    return state is not None and pod in {m.pod for m in state.members}


def _reservation(r: Reading, node: str, alloc: Allocation, by_uid: dict[str, Pod]) -> Finding | None:
    """Rules 1-3 for one reservation."""
    ref, gang = alloc.assignment.pod, alloc.gang_id
    state = r.gangs.get(gang)
    if _unreadable_gang(r, gang):
        return None
    pod = by_uid.get(ref.uid)
    same = pod is not None and (pod.namespace, pod.name) == (ref.namespace, ref.name)
    if pod is None or not same or pod.phase == "Failed":
        gone = "has failed" if same else "is gone"
        detail = f"{ref} (uid {ref.uid}) holds a reservation on {node} (gang {gang} attempt {alloc.attempt}) but {gone}"
        if _member_of(state, ref):
            return Finding("reservation_without_pod", detail, Forget(gang, ref))
        return Finding("reservation_without_pod", detail, Release(gang, alloc.attempt, ref, node))
    if pod.node_name == node:
        return None
    if state is not None and state.attempt == alloc.attempt and _member_of(state, ref) and (
            state.phase in OPEN):
        return None
    where = f"bound to {pod.node_name}" if pod.node_name else "not bound"
    phase = f"{state.phase} at attempt {state.attempt}" if state is not None else "gone"
    return Finding("stale_reservation", f"{ref} holds a reservation on {node} for gang {gang} attempt {alloc.attempt}, "
                                        f"is {where}, and the gang is {phase}",
                   Release(gang, alloc.attempt, ref, node))


def _unreadable_gang(r: Reading, gang_id: str) -> bool:
    return gang_key(gang_id) in r.unreadable_gangs


def _bound_pod(r: Reading, pod: Pod) -> Finding | None:
    """Rule 4 for one bound pod."""
    node = pod.node_name
    ledger = r.recent.get(node) or r.ledgers.get(node)
    held = ledger.allocations if ledger is not None else {}
    if alloc_key(pod.ref) in held:
        return None
    a = _annotation(pod)
    if a is None:
        return Finding("pod_without_reservation", f"{pod.ref} is bound to {node} without a reservation and without a "
                                                  "readable assignment annotation",
                       Report(pod.ref, f"bound to {node} without a Phalanx reservation and without a readable "
                                       f"{ASSIGNMENT_ANNOTATION} annotation: its GPUs are unknown to the scheduler"))
    conflicts = gpu_conflicts([v.assignment for v in held.values()] + [a])
    if conflicts:
        message = (f"bound to {node} on GPU(s) {','.join(map(str, a.gpus))} without a Phalanx reservation, and "
                   f"those GPUs are booked by another pod: {'; '.join(conflicts)}")
        return Finding("pod_on_booked_gpus", f"{pod.ref}: {message}", _double_booked(r, pod, a, held, message))
    state = next((s for s in r.gangs.values() if _member_of(s, pod.ref)), None)
    gang = state.gang_id if state is not None else r.gang_of.get(pod.uid, f"{pod.namespace}/{pod.name}")
    attempt = max(1, state.attempt) if state is not None else 1
    return Finding("pod_without_reservation", f"{pod.ref} is bound to {node} on GPU(s) "
                                              f"{','.join(map(str, a.gpus))} without a reservation; recording one",
                   Adopt(gang, attempt, a))


def _double_booked(r: Reading, pod: Pod, a: Assignment, held: dict[str, Allocation], message: str) -> Repair:
    """Two pods share a GPU: roll back the one bound later, if the other runs there too;
    else (its holder is gone) only report: rule 1 frees the holder's reservation first."""
    by_uid = {p.uid: p for p in r.pods if p.uid}
    holders = [by_uid.get(v.assignment.pod.uid) for v in held.values()
               if gpu_conflicts([v.assignment, a])]
    running = [h for h in holders if h is not None and h.node_name == pod.node_name and not h.deleting
               and not h.terminal]
    if not running:
        return Report(pod.ref, message)
    later = max([pod, *running], key=lambda p: (bound_at(p), p.namespace, p.name))
    others = ", ".join(str(p.ref) for p in [pod, *running] if p is not later)
    return Evict(later.ref, f"shares GPU(s) on {pod.node_name} with {others}, which was bound to them first: "
                            "deleted so that its controller creates it again and Phalanx places it anew")


def bound_at(pod: Pod) -> float:
    """When the pod was bound: its ``PodScheduled=True`` condition's transition time, else its
    creation time."""
    for c in ((pod.raw.get("status") or {}).get("conditions") or []):
        if c.get("type") == "PodScheduled" and c.get("status") == "True":
            at = _rfc3339(c.get("lastTransitionTime"))
            if at is not None:
                return at
    return pod.created


def _rfc3339(text: object) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _annotation(pod: Pod) -> Assignment | None:
    """The pod's assignment annotation, if it is one for this very pod on its node."""
    raw = pod.annotations.get(ASSIGNMENT_ANNOTATION)
    if not raw:
        return None
    try:
        a = decode_assignment(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if (a.pod.namespace, a.pod.name) != (pod.namespace, pod.name) or a.node != pod.node_name or not a.gpus:
        return None
    return msgspec.structs.replace(a, pod=pod.ref, mig_instance_uuid="")


def _mig(r: Reading, by_uid: dict[str, Pod]) -> list[Finding]:
    """Rule 5: ready MIG instances without a reservation while their pod runs on that node."""
    out = []
    for rec in r.mig:
        if rec.state != "ready" or rec.node in r.unreadable_nodes:
            continue
        ledger = r.ledgers.get(rec.node)
        held = any(a.assignment.mig_profile and rec.gpu in a.assignment.gpus and a.assignment.mig_start == rec.start
                   for a in (ledger.allocations.values() if ledger is not None else ()))
        pod = by_uid.get(rec.pod.uid) if rec.pod.uid else None
        if not held and pod is not None and pod.node_name == rec.node and not pod.terminal:
            out.append(Finding("mig_without_reservation", f"MIG instance {rec.uuid or '-'} on {rec.node} GPU {rec.gpu} "
                                                          f"slot {rec.start} has no reservation while {rec.pod} runs on it"))
    return out
