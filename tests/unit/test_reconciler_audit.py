"""The reconciler's comparison of ledger, gang records and pods
(services/phalanx_gang_coordinator/audit.py), table-driven: a reading in, the whole list of
findings with their repairs out."""

from __future__ import annotations

import msgspec
import pytest

from phalanx_gang_coordinator.audit import Adopt, Evict, Finding, Forget, Reading, Release, Report, audit
from phalanx_kube.port import Pod
from phalanx_proto.events import Assignment, MemberSpec, PodRef, encoder
from phalanx_proto.kubeapi import ASSIGNMENT_ANNOTATION
from phalanx_proto.state import Allocation, GangState, MigRecord, NodeLedger, alloc_key

G = "default/train"
P1 = PodRef(namespace="default", name="w-0", uid="u0")
P2 = PodRef(namespace="default", name="w-1", uid="u1")
STRAY = PodRef(namespace="default", name="stray", uid="s")
A1 = Assignment(pod=P1, node="n1", gpus=(0,))
A2 = Assignment(pod=P2, node="n1", gpus=(1,))
replace = msgspec.structs.replace


def pod(ref: PodRef, node: str = "", annotation: Assignment | None = None, bound_at: str = "",
        phase: str = "Running") -> Pod:
    ann = {ASSIGNMENT_ANNOTATION: encoder.encode(annotation).decode()} if annotation else {}
    raw = {"status": {"conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": bound_at}]}} \
        if bound_at else {}
    return Pod(namespace=ref.namespace, name=ref.name, uid=ref.uid, scheduler_name="phalanx", node_name=node,
               annotations=ann, raw=raw, phase=phase if node else "Pending")


def ledger(*allocs: tuple[Assignment, int], gang: str = G) -> dict[str, NodeLedger]:
    return {"n1": NodeLedger(node="n1", allocations={
        alloc_key(a.pod): Allocation(gang_id=gang, attempt=attempt, assignment=a) for a, attempt in allocs})}


def gang(phase: str, attempt: int = 2, members=(P1, P2)) -> dict[str, GangState]:
    return {G: GangState(gang_id=G, phase=phase, attempt=attempt, min_member=len(members),
                         members=tuple(MemberSpec(pod=p, gpus=1) for p in members))}


def reading(ledgers, gangs, pods, **kw) -> Reading:
    return Reading(ledgers=ledgers, gangs=gangs, pods=pods, gang_of={p.uid: G for p in pods}, **kw)


CASES = [
    ("a scheduled gang whose pods run where they are reserved is healthy",
     reading(ledger((A1, 2), (A2, 2)), gang("scheduled"), [pod(P1, "n1", A1), pod(P2, "n1", A2)]), []),
    ("an attempt in flight keeps the reservations of its pods not bound yet",
     reading(ledger((A1, 2), (A2, 2)), gang("binding"), [pod(P1, "n1", A1), pod(P2)]), []),
    ("a rollback in progress keeps them too: the rollback releases them itself",
     reading(ledger((A1, 2)), gang("rolling_back"), [pod(P1), pod(P2)]), []),
    ("a reservation of a pod that is gone and no member is released",
     reading(ledger((A1, 2), (A2, 2)), gang("scheduled", members=(P2,)), [pod(P2, "n1", A2)]),
     [Finding("reservation_without_pod", "default/w-0 (uid u0) holds a reservation on n1 (gang default/train "
              "attempt 2) but is gone", Release(G, 2, P1, "n1"))]),
    ("a reservation of a pod that is gone but still a member makes the member forgotten",
     reading(ledger((A1, 2), (A2, 2)), gang("scheduled"), [pod(P2, "n1", A2)]),
     [Finding("reservation_without_pod", "default/w-0 (uid u0) holds a reservation on n1 (gang default/train "
              "attempt 2) but is gone", Forget(G, P1))]),
    ("a reservation of the old pod of a recreated name is released",
     reading(ledger((A1, 2)), gang("waiting", members=(replace(P1, uid="new"),)), [pod(replace(P1, uid="new"))]),
     [Finding("reservation_without_pod", "default/w-0 (uid u0) holds a reservation on n1 (gang default/train "
              "attempt 2) but is gone", Release(G, 2, P1, "n1"))]),
    ("a reservation of an old attempt whose pod waits is released",
     reading(ledger((A1, 1)), gang("placing", attempt=2), [pod(P1), pod(P2)]),
     [Finding("stale_reservation", "default/w-0 holds a reservation on n1 for gang default/train attempt 1, is not "
              "bound, and the gang is placing at attempt 2", Release(G, 1, P1, "n1"))]),
    ("a reservation left after a rollback (its release lost) is released",
     reading(ledger((A1, 2)), gang("backoff"), [pod(P1), pod(P2)]),
     [Finding("stale_reservation", "default/w-0 holds a reservation on n1 for gang default/train attempt 2, is not "
              "bound, and the gang is backoff at attempt 2", Release(G, 2, P1, "n1"))]),
    ("a reservation backing a running pod is kept whatever the gang record says",
     reading(ledger((A1, 1)), gang("placing", attempt=5), [pod(P1, "n1", A1), pod(P2)]), []),
    ("a bound pod without a reservation gets one recorded when its GPUs are free",
     reading(ledger((A2, 2)), gang("scheduled"), [pod(P1, "n1", A1), pod(P2, "n1", A2)]),
     [Finding("pod_without_reservation", "default/w-0 is bound to n1 on GPU(s) 0 without a reservation; recording one",
              Adopt(G, 2, A1))]),
    ("a pod bound while the reading was taken, whose reservation the node's re-read after the listing holds, "
     "is healthy",
     reading(ledger((A2, 2)), gang("binding"), [pod(P1, "n1", A1), pod(P2, "n1", A2)],
             recent=ledger((A1, 2), (A2, 2))), []),
    ("a re-read that still lacks the pod's reservation leaves the finding",
     reading(ledger((A2, 2)), gang("scheduled"), [pod(P1, "n1", A1), pod(P2, "n1", A2)], recent=ledger((A2, 2))),
     [Finding("pod_without_reservation", "default/w-0 is bound to n1 on GPU(s) 0 without a reservation; recording one",
              Adopt(G, 2, A1))]),
    ("two pods sharing a GPU: the one bound later is rolled back, even when it holds the reservation",
     reading(ledger((replace(A2, gpus=(0,)), 2)), gang("scheduled"),
             [pod(P1, "n1", A1, "2026-12-04T10:00:00Z"), pod(P2, "n1", replace(A2, gpus=(0,)), "2026-12-04T10:05:00Z")]),
     [Finding("pod_on_booked_gpus", "default/w-0: bound to n1 on GPU(s) 0 without a Phalanx reservation, and those "
              "GPUs are booked by another pod: GPU 0 is booked by default/w-0, default/w-1",
              Evict(P2, "shares GPU(s) on n1 with default/w-0, which was bound to them first: deleted so that its "
                        "controller creates it again and Phalanx places it anew"))]),
    ("two pods sharing a GPU: the later one without a reservation is rolled back",
     reading(ledger((replace(A2, gpus=(0,)), 2)), gang("scheduled"),
             [pod(P1, "n1", A1, "2026-12-04T10:09:00Z"), pod(P2, "n1", replace(A2, gpus=(0,)), "2026-12-04T10:05:00Z")]),
     [Finding("pod_on_booked_gpus", "default/w-0: bound to n1 on GPU(s) 0 without a Phalanx reservation, and those "
              "GPUs are booked by another pod: GPU 0 is booked by default/w-0, default/w-1",
              Evict(P1, "shares GPU(s) on n1 with default/w-1, which was bound to them first: deleted so that its "
                        "controller creates it again and Phalanx places it anew"))]),
    ("a bound pod on GPUs whose holder is gone is reported: the holder's reservation goes first",
     reading(ledger((replace(A2, gpus=(0,)), 2)), gang("scheduled", members=(P1,)), [pod(P1, "n1", A1)]),
     [Finding("reservation_without_pod", "default/w-1 (uid u1) holds a reservation on n1 (gang default/train "
              "attempt 2) but is gone", Release(G, 2, P2, "n1")),
      Finding("pod_on_booked_gpus", "default/w-0: bound to n1 on GPU(s) 0 without a Phalanx reservation, and those "
              "GPUs are booked by another pod: GPU 0 is booked by default/w-0, default/w-1",
              Report(P1, "bound to n1 on GPU(s) 0 without a Phalanx reservation, and those GPUs are booked by another "
                         "pod: GPU 0 is booked by default/w-0, default/w-1"))]),
    # A pod that ended (Failed, Succeeded) holds no GPU, though the API keeps it (a Job keeps its
    # failed pods) with its node and assignment annotation: found by the JobSet restart e2e.
    ("a failed pod's GPUs taken by its replacement: neither is rolled back, nothing is adopted",
     reading(ledger((replace(A2, gpus=(0,)), 2)), gang("scheduled", members=(P2,)),
             [pod(P1, "n1", A1, "2026-12-04T10:00:00Z", phase="Failed"),
              pod(P2, "n1", replace(A2, gpus=(0,)), "2026-12-04T10:05:00Z")]), []),
    ("a failed pod whose GPUs are free gets no reservation recorded",
     reading({}, gang("scheduled", members=(P2,)), [pod(P1, "n1", A1, phase="Failed")]), []),
    ("a succeeded pod whose GPUs are free gets no reservation recorded",
     reading({}, gang("scheduled", members=(P2,)), [pod(P1, "n1", A1, phase="Succeeded")]), []),
    ("a reservation of a pod that failed on its node is released",
     reading(ledger((A1, 2), (A2, 2)), gang("scheduled", members=(P2,)),
             [pod(P1, "n1", A1, phase="Failed"), pod(P2, "n1", A2)]),
     [Finding("reservation_without_pod", "default/w-0 (uid u0) holds a reservation on n1 (gang default/train "
              "attempt 2) but has failed", Release(G, 2, P1, "n1"))]),
    ("a reservation of a member that failed makes the member forgotten",
     reading(ledger((A1, 2), (A2, 2)), gang("scheduled"), [pod(P1, "n1", A1, phase="Failed"), pod(P2, "n1", A2)]),
     [Finding("reservation_without_pod", "default/w-0 (uid u0) holds a reservation on n1 (gang default/train "
              "attempt 2) but has failed", Forget(G, P1))]),
    ("a member that succeeded keeps its reservation (forgetting it would open a repair for it)",
     reading(ledger((A1, 2), (A2, 2)), gang("scheduled"), [pod(P1, "n1", A1, phase="Succeeded"), pod(P2, "n1", A2)]),
     []),
    ("a bound pod without a readable assignment is reported",
     reading({}, {}, [pod(STRAY, "n1")]),
     [Finding("pod_without_reservation", "default/stray is bound to n1 without a reservation and without a readable "
              "assignment annotation",
              Report(STRAY, "bound to n1 without a Phalanx reservation and without a readable phalanx.io/assignment "
                            "annotation: its GPUs are unknown to the scheduler"))]),
    ("an assignment annotation for another pod or node is not believed",
     reading({}, {}, [pod(STRAY, "n1", A1)]),
     [Finding("pod_without_reservation", "default/stray is bound to n1 without a reservation and without a readable "
              "assignment annotation",
              Report(STRAY, "bound to n1 without a Phalanx reservation and without a readable phalanx.io/assignment "
                            "annotation: its GPUs are unknown to the scheduler"))]),
    ("nothing is concluded about a gang whose record cannot be read",
     reading(ledger((A1, 2)), {}, [pod(P1)], unreadable=("phx-gangs/default.train (revision 3): undecodable",),
             unreadable_gangs=frozenset({"default.train"})),
     [Finding("unreadable_record", "phx-gangs/default.train (revision 3): undecodable")]),
    ("nothing is concluded about a bound pod on a node whose ledger cannot be read",
     reading({}, gang("scheduled"), [pod(P1, "n1", A1), pod(P2, "n1", A2)], unreadable_nodes=frozenset({"n1"})), []),
]


@pytest.mark.parametrize(("name", "r", "expected"), CASES, ids=[c[0] for c in CASES])
def test_audit(name, r, expected):
    assert audit(r) == expected


def test_a_ready_mig_instance_without_a_reservation_under_a_running_pod_is_a_finding_and_the_pod_is_adopted():
    m = Assignment(pod=P1, node="n1", gpus=(3,), mig_profile="3g.20gb", mig_start=4)
    record = MigRecord(node="n1", gpu=3, start=4, profile="3g.20gb", gang_id=G, attempt=2, pod=P1, state="ready",
                       uuid="MIG-1")
    r = reading({}, gang("scheduled"), [pod(P1, "n1", replace(m, mig_instance_uuid="MIG-1")), pod(P2)], mig=[record])
    assert audit(r) == [
        Finding("pod_without_reservation", "default/w-0 is bound to n1 on GPU(s) 3 without a reservation; recording one",
                Adopt(G, 2, m)),
        Finding("mig_without_reservation", "MIG instance MIG-1 on n1 GPU 3 slot 4 has no reservation while "
                                           "default/w-0 runs on it"),
    ]


def test_a_ready_mig_instance_under_a_pod_that_ended_is_no_finding_and_the_pod_is_not_adopted():
    m = Assignment(pod=P1, node="n1", gpus=(3,), mig_profile="3g.20gb", mig_start=4, mig_instance_uuid="MIG-1")
    record = MigRecord(node="n1", gpu=3, start=4, profile="3g.20gb", gang_id=G, attempt=2, pod=P1, state="ready",
                       uuid="MIG-1")
    assert audit(reading({}, gang("scheduled"), [pod(P1, "n1", m, phase="Failed")], mig=[record])) == []
