"""Which commands placement carries out: each is checked against the gang's record in
``phx-gangs`` and the ledger before anything is written (docs/saga.md, "Checks").

Pure: a record and a command in, a ``Refusal`` (rule + reason) or ``None`` out; the exact
release is a pure ledger edit. Called by ``service.Placement``.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from phalanx_proto.events import AdoptRequested, PlaceRequested, ReleaseRequested
from phalanx_proto.kvrules import gpu_conflicts
from phalanx_proto.state import Allocation, GangState, NodeLedger, alloc_key, attempt_members, members_digest
from phalanx_proto.topology import NodeTopology
from phalanx_proto.vocab import LIVE, PLACING
from phalanx_proto.vocab import RefusalRule as R


@dataclass(frozen=True, slots=True)
class Refusal:
    rule: R
    why: str


def check_request(record: GangState | None, ev: PlaceRequested) -> Refusal | None:
    """A request is for the gang's current attempt and for the members the record's attempt
    places (``members_digest``): the members themselves are read from the record, never
    from the command."""
    if record is None:
        return Refusal(R.UNKNOWN_GANG, f"no record of gang {ev.gang_id} in phx-gangs")
    if ev.attempt > record.attempt:
        return Refusal(R.UNSTARTED_ATTEMPT, f"attempt {ev.attempt} was never started (the gang is at "
                                            f"attempt {record.attempt})")
    if ev.attempt < record.attempt:
        return Refusal(R.STALE_ATTEMPT, f"attempt {ev.attempt} is over (the gang is at attempt {record.attempt})")
    if not attempt_members(record):
        return Refusal(R.NOT_MEMBERS, f"the gang record's attempt {record.attempt} has no member to place")
    if ev.members_digest != members_digest(record):
        return Refusal(R.NOT_MEMBERS, f"the request is for members {ev.members_digest or '(none named)'}, the gang "
                                      f"record's attempt {record.attempt} places members {members_digest(record)}")
    return None


def check_decide(record: GangState) -> Refusal | None:
    """A new decision is made only while the record says the attempt is placing (or preempting:
    a request redelivered after its ``Preempting`` was answered is decided again, on the cluster
    as it is then)."""
    if record.phase not in PLACING:
        return Refusal(R.NOT_PLACING, f"the attempt is {record.phase}, not placing")
    return None


def check_release(record: GangState | None, ev: ReleaseRequested) -> Refusal | None:
    """A release names its pods, and none of them may be a member of the gang's attempt while
    that attempt is live (placing to scheduled): the coordinator drops a member, or rolls the
    attempt back, before it asks for a release."""
    if not ev.pods:
        return Refusal(R.UNNAMED_RELEASE, "a release names (gang, attempt, pod uid) for each pod it frees")
    if record is not None and record.attempt == ev.attempt and record.phase in LIVE:
        members = {m.pod for m in record.members}
        live = [str(p) for p in ev.pods if p in members]
        if live:
            return Refusal(R.LIVE_RELEASE, f"{', '.join(live[:5])} still member(s) of attempt {ev.attempt}, "
                                           f"which is {record.phase}")
    return None


@dataclass(frozen=True, slots=True)
class Released:
    """What a release does to one node's ledger: the new ledger (None: nothing to free there)
    and the pods it holds back because the node's agent reports them running there."""

    ledger: NodeLedger | None
    held: tuple[str, ...] = ()


def release(ledger: NodeLedger, ev: ReleaseRequested, running: frozenset[str] = frozenset()) -> Released:
    """The ledger without exactly the allocations of (gang, attempt, pod uid) the release
    names, and without the gang's nominations of that attempt or earlier for those pods (a
    rolled-back preemptor keeps no GPUs), except the allocations of pods in ``running`` (the
    node agent's ``phalanx_pods``): a
    reservation is never freed under a pod that runs on its GPUs, whatever a command says; it
    is freed once the node's report no longer lists the pod (the command is retried)."""
    keys = {alloc_key(p) for p in ev.pods}
    named = {k for k, v in ledger.allocations.items()
             if k in keys and v.gang_id == ev.gang_id and v.attempt == ev.attempt}
    held = tuple(sorted(named & running))
    freed = named - running
    # A preemption is compensated with the attempt that made it: a release of that attempt (or a
    # later one) of the gang's pods ends the nomination, so the GPUs it kept are free again.
    nominations = {k: n for k, n in ledger.nominations.items()
                   if not (k in keys and n.gang_id == ev.gang_id and n.attempt <= ev.attempt)}
    if not freed and nominations == ledger.nominations:
        return Released(None, held)
    keep = {k: v for k, v in ledger.allocations.items() if k not in freed}
    return Released(msgspec.structs.replace(ledger, allocations=keep, nominations=nominations), held)


def adopt(ledger: NodeLedger, topology: NodeTopology | None, ev: AdoptRequested,
          running: frozenset[str] | None, queues: tuple[str, ...] = ()) -> NodeLedger | Refusal | None:
    """The ledger with a reservation recorded for a pod found bound without one: only for a
    pod the node's agent reports running there (``running``: its ``phalanx_pods``; None when the
    node reports no state, so nothing can be confirmed), on GPUs that exist, suit the kind of
    work (MIG only on a GPU in MIG mode, whole GPUs and shares only on one that is not), and
    are free: never a GPU booked twice, never a reservation for a pod that is not there. None
    when the pod already holds one there."""
    a = ev.assignment
    key = alloc_key(a.pod)
    if key in ledger.allocations:
        return None
    if topology is None:
        return Refusal(R.UNKNOWN_NODE, f"node {a.node} has no topology report")
    if running is None or key not in running:
        why = "reports no Kubernetes state" if running is None else "does not report it running there"
        return Refusal(R.NOT_RUNNING_THERE, f"{a.pod} (uid {a.pod.uid or '-'}): node {a.node}'s agent {why}; "
                                            "a reservation is recorded only for a pod bound and running on the node")
    gpus = {g.index: g for g in topology.gpus}
    unknown = sorted(set(a.gpus) - set(gpus))
    if unknown or not a.gpus:
        return Refusal(R.NOT_RECORDED, f"GPU(s) {unknown or '[]'} do not exist on {a.node}")
    wrong = sorted(i for i in a.gpus if gpus[i].mig_enabled != bool(a.mig_profile))
    if wrong:
        mode = "not in MIG mode" if a.mig_profile else "in MIG mode"
        return Refusal(R.NOT_RECORDED, f"GPU(s) {wrong} of {a.node} are {mode}: they cannot hold {a.pod}'s "
                                       f"{a.kind} assignment")
    new = Allocation(gang_id=ev.gang_id, attempt=ev.attempt, assignment=a, adopted=True, queues=queues)
    conflicts = gpu_conflicts([v.assignment for v in ledger.allocations.values()] + [a])
    if conflicts:
        return Refusal(R.NOT_RECORDED, f"cannot record {a.pod} on {a.node}: {'; '.join(conflicts)}")
    return msgspec.structs.replace(ledger, allocations={**ledger.allocations, key: new})

