"""Placement's checks against the record (services/phalanx_placement/checks.py), table-driven:
which requests, releases and adoptions it carries out, and the exact release."""

from __future__ import annotations

import msgspec
import pytest

from phalanx_placement import checks
from phalanx_placement.checks import Refusal
from phalanx_proto.events import (
    AdoptRequested,
    Assignment,
    MemberSpec,
    PlaceRequested,
    PodRef,
    ReleaseRequested,
    uid_digest,
)
from phalanx_proto.state import Allocation, GangState, NodeLedger, Nomination, alloc_key
from phalanx_proto.topology import Gpu, NodeTopology

G = "default/JobSet:train"
P1, P2 = PodRef(namespace="default", name="w-0", uid="u0"), PodRef(namespace="default", name="w-1", uid="u1")
OLD_P1 = PodRef(namespace="default", name="w-0", uid="u-old")
M1, M2 = MemberSpec(pod=P1, gpus=1), MemberSpec(pod=P2, gpus=1)
replace = msgspec.structs.replace


def record(phase="placing", attempt=2, members=(M1, M2)) -> GangState:
    return GangState(gang_id=G, phase=phase, attempt=attempt, min_member=2, members=members)


def request(attempt=2, members=(M1, M2)) -> PlaceRequested:
    return PlaceRequested(gang_id=G, attempt=attempt, members_digest=uid_digest(m.pod for m in members))


DIGEST = uid_digest([P1, P2])
PHANTOM = PodRef(namespace="default", name="phantom", uid="x")
REQUESTS = [
    ("the request for the record's attempt and members is accepted", record(), request(), None),
    ("a request for a gang without a record is refused", None, request(),
     Refusal("unknown_gang", f"no record of gang {G} in phx-gangs")),
    ("a request for an attempt the gang never started is refused", record(), request(attempt=3),
     Refusal("unstarted_attempt", "attempt 3 was never started (the gang is at attempt 2)")),
    ("a request for an old attempt is refused", record(), request(attempt=1),
     Refusal("stale_attempt", "attempt 1 is over (the gang is at attempt 2)")),
    ("a request naming a pod that is not a member is refused", record(),
     request(members=(M1, MemberSpec(pod=PHANTOM, gpus=8))),
     Refusal("not_members", f"the request is for members {uid_digest([P1, PHANTOM])}, the gang record's attempt 2 "
                            f"places members {DIGEST}")),
    ("a request naming a recreated pod (another uid) is refused", record(),
     request(members=(MemberSpec(pod=OLD_P1, gpus=1), M2)),
     Refusal("not_members", f"the request is for members {uid_digest([OLD_P1, P2])}, the gang record's attempt 2 "
                            f"places members {DIGEST}")),
    ("a request naming nobody is refused", record(), PlaceRequested(gang_id=G, attempt=2),
     Refusal("not_members", f"the request is for members (none named), the gang record's attempt 2 places members "
                            f"{DIGEST}")),
    ("a request for a record whose attempt places nobody is refused", record(members=()), request(),
     Refusal("not_members", "the gang record's attempt 2 has no member to place")),
]


@pytest.mark.parametrize(("name", "rec", "ev", "expected"), REQUESTS, ids=[c[0] for c in REQUESTS])
def test_check_request(name, rec, ev, expected):
    assert checks.check_request(rec, ev) == expected


def test_a_new_decision_is_made_only_while_the_record_says_placing():
    assert checks.check_decide(record()) is None
    assert checks.check_decide(record("rolling_back")) == Refusal("not_placing", "the attempt is rolling_back, not placing")


def release(attempt=2, pods=(P1,)) -> ReleaseRequested:
    return ReleaseRequested(gang_id=G, attempt=attempt, pods=pods)


RELEASES = [
    ("a release of a rolled-back attempt is accepted", record("rolling_back"), release(), None),
    ("a release of an old attempt is accepted while a newer one runs", record("binding", 3), release(), None),
    ("a release of a pod that is no longer a member is accepted", record("scheduled", members=(M2,)), release(), None),
    ("a release of the old pod under a recreated name is accepted", record("scheduled"), release(pods=(OLD_P1,)), None),
    ("a release for a gang without a record is accepted", None, release(), None),
    ("a release of a live member of the running attempt is refused", record("scheduled"), release(),
     Refusal("live_release", "default/w-0 still member(s) of attempt 2, which is scheduled")),
    ("a release naming no pod is refused", record("rolling_back"), release(pods=()),
     Refusal("unnamed_release", "a release names (gang, attempt, pod uid) for each pod it frees")),
]


@pytest.mark.parametrize(("name", "rec", "ev", "expected"), RELEASES, ids=[c[0] for c in RELEASES])
def test_check_release(name, rec, ev, expected):
    assert checks.check_release(rec, ev) == expected


def alloc(pod, attempt=2, gang=G, gpus=(0,)) -> tuple[str, Allocation]:
    return alloc_key(pod), Allocation(gang_id=gang, attempt=attempt, assignment=Assignment(pod=pod, node="n1", gpus=gpus))


LEDGER = NodeLedger(node="n1", allocations=dict([
    alloc(P1, attempt=2), alloc(P2, attempt=1, gpus=(1,)),
    alloc(PodRef(namespace="default", name="other", uid="o"), gang="default/other", gpus=(2,))]))

WITHOUT_P1 = NodeLedger(node="n1", allocations={k: v for k, v in LEDGER.allocations.items() if k != alloc_key(P1)})
EXACT = [
    ("exactly the named pod of the named attempt is freed", release(pods=(P1,)), frozenset(),
     checks.Released(WITHOUT_P1)),
    ("a later attempt's release does not free an earlier attempt's reservation", release(attempt=3, pods=(P2,)),
     frozenset(), checks.Released(None)),
    ("an earlier attempt's release does not free a later attempt's reservation", release(attempt=1, pods=(P1,)),
     frozenset(), checks.Released(None)),
    ("a release naming the pod's old uid frees nothing", release(pods=(OLD_P1,)), frozenset(), checks.Released(None)),
    ("another gang's reservation is never freed", ReleaseRequested(gang_id="default/x", attempt=2,
                                                                   pods=(PodRef(namespace="default", name="other",
                                                                                uid="o"),)),
     frozenset(), checks.Released(None)),
    ("a reservation is kept while the node reports its pod running there", release(pods=(P1,)),
     frozenset({alloc_key(P1)}), checks.Released(None, held=(alloc_key(P1),))),
    ("a pod running on the node keeps its reservation while another named one is freed",
     release(pods=(P1, P2), attempt=2), frozenset({alloc_key(P2)}), checks.Released(WITHOUT_P1)),
    ("the old pod under a recreated name running there does not hold the new pod's reservation", release(pods=(P1,)),
     frozenset({alloc_key(OLD_P1)}), checks.Released(WITHOUT_P1)),
]


@pytest.mark.parametrize(("name", "ev", "running", "expected"), EXACT, ids=[c[0] for c in EXACT])
def test_release_is_exact_and_never_frees_a_running_pods_gpus(name, ev, running, expected):
    assert checks.release(LEDGER, ev, running) == expected


def nominated(pod, attempt, gang=G, gpus=(3,)) -> tuple[str, Nomination]:
    return alloc_key(pod), Nomination(gang_id=gang, attempt=attempt, assignment=Assignment(pod=pod, node="n1", gpus=gpus),
                                      victims={"default/low": "priority"}, expires_at=1e12)


OTHER_NOM = nominated(PodRef(namespace="default", name="x-0", uid="x"), 1, gang="default/x", gpus=(4,))
NOMINATIONS = [
    ("a release of the attempt that nominated ends its nomination", release(attempt=2, pods=(P1,)),
     dict([nominated(P1, 2), OTHER_NOM]), dict([OTHER_NOM])),
    ("a release of a later attempt ends an earlier attempt's nomination", release(attempt=3, pods=(P1,)),
     dict([nominated(P1, 2)]), {}),
    ("a release of an earlier attempt keeps a later attempt's nomination", release(attempt=1, pods=(P1,)),
     dict([nominated(P1, 2)]), dict([nominated(P1, 2)])),
    ("a release of other pods keeps the nomination", release(attempt=2, pods=(P2,)),
     dict([nominated(P1, 2)]), dict([nominated(P1, 2)])),
    ("another gang's nomination of the same pod name is kept", release(attempt=2, pods=(P1,)),
     dict([nominated(P1, 2, gang="default/x")]), dict([nominated(P1, 2, gang="default/x")])),
]


@pytest.mark.parametrize(("name", "ev", "before", "after"), NOMINATIONS, ids=[c[0] for c in NOMINATIONS])
def test_a_release_ends_the_gangs_nominations_of_that_attempt_or_earlier(name, ev, before, after):
    ledger = NodeLedger(node="n1", nominations=before)
    got = checks.release(ledger, ev)
    assert (got.ledger.nominations if got.ledger is not None else before) == after


TOPO = NodeTopology(node="n1", gpus=tuple(Gpu(index=i, name=f"GPU{i}", mig_enabled=i == 2) for i in range(4)))
STRAY = PodRef(namespace="default", name="stray", uid="s")
RUNNING = frozenset({alloc_key(STRAY)})


def adopt(gpus=(3,), pod=STRAY, **fields) -> AdoptRequested:
    return AdoptRequested(gang_id="default/stray", attempt=1,
                          assignment=Assignment(pod=pod, node="n1", gpus=gpus, **fields))


def test_a_pod_running_on_free_gpus_is_recorded_as_adopted():
    got = checks.adopt(LEDGER, TOPO, adopt(), RUNNING)
    assert got == NodeLedger(node="n1", allocations={**LEDGER.allocations, alloc_key(STRAY): Allocation(
        gang_id="default/stray", attempt=1, assignment=adopt().assignment, adopted=True)})


ADOPTIONS = [
    ("a pod on a GPU another pod holds is never recorded", adopt(gpus=(0,)), RUNNING,
     Refusal("not_recorded", "cannot record default/stray on n1: GPU 0 is booked by default/stray, default/w-0")),
    ("a pod on a GPU the node does not have is refused", adopt(gpus=(9,)), RUNNING,
     Refusal("not_recorded", "GPU(s) [9] do not exist on n1")),
    ("a pod that already holds its reservation changes nothing", adopt(pod=P1, gpus=(0,)), RUNNING, None),
    ("a pod the node does not report running there is refused (a pending pod, say)", adopt(), frozenset(),
     Refusal("not_running_there", "default/stray (uid s): node n1's agent does not report it running there; a "
                                  "reservation is recorded only for a pod bound and running on the node")),
    ("a pod on a node that reports no state is refused: nothing confirms it runs there", adopt(), None,
     Refusal("not_running_there", "default/stray (uid s): node n1's agent reports no Kubernetes state; a "
                                  "reservation is recorded only for a pod bound and running on the node")),
    ("a whole GPU in MIG mode is refused", adopt(gpus=(2,)), RUNNING,
     Refusal("not_recorded", "GPU(s) [2] of n1 are in MIG mode: they cannot hold default/stray's whole assignment")),
    ("a MIG instance on a GPU not in MIG mode is refused", adopt(gpus=(3,), mig_profile="1g.5gb", mig_start=0),
     RUNNING, Refusal("not_recorded", "GPU(s) [3] of n1 are not in MIG mode: they cannot hold default/stray's mig "
                                      "assignment")),
]


@pytest.mark.parametrize(("name", "ev", "running", "expected"), ADOPTIONS, ids=[c[0] for c in ADOPTIONS])
def test_adopt(name, ev, running, expected):
    assert checks.adopt(LEDGER, TOPO, ev, running) == expected
