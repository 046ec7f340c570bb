"""Elastic gangs (docs/workloads.md, "Elastic gangs"): what a pod says (``gangs.identify``), which
members each attempt places (``state.attempt_members``), when a scheduled gang grows
(``saga.late_members``), which of its pods it gives up first (``state.elastic_extras``), and
that losing an extra is no repair (``repair.member_failed``). Table-driven, whole values."""

from __future__ import annotations

import msgspec
import pytest

from phalanx_kubeobjects.gangs import GangIdentity, identify
from phalanx_kubeobjects.requests import RequestError
from phalanx_proto import subjects as S
from phalanx_proto.events import MemberSpec, PodRef
from phalanx_proto.kvrules import gang_problem
from phalanx_proto.state import FailedMember, GangState, Running, attempt_members, elastic_extras
from phalanx_rules import repair, saga

replace = msgspec.structs.replace
G = "ml/Job:train"
PODS = tuple(PodRef(namespace="ml", name=f"train-{i}", uid=f"u{i}") for i in range(6))
MEMBERS = tuple(MemberSpec(pod=p, gpus=8) for p in PODS)


def elastic(n: int = 6, *, phase="waiting", running=(), bound=(), lo=2, hi=4) -> GangState:
    return GangState(gang_id=G, phase=phase, attempt=1, min_member=lo, max_member=hi, members=MEMBERS[:n],
                     running=tuple(Running(pod=p, attempt=1) for p in running), bound=tuple(bound))


@pytest.mark.parametrize("name,labels,expected", [
    ("a Job saying a minimum and a maximum is an elastic gang of that range",
     {"batch.kubernetes.io/job-name": "train", "phalanx.io/gang-min-member": "2", "phalanx.io/gang-max-member": "4"},
     GangIdentity(G, "Job", 2, max_member=4)),
    ("the maximum goes with any key that says the minimum",
     {"batch.kubernetes.io/job-name": "train", "aliyun.com/min-member": "3", "phalanx.io/gang-max-member": "3"},
     GangIdentity(G, "Job", 3, max_member=3)),
    ("without a maximum a gang is not elastic",
     {"batch.kubernetes.io/job-name": "train", "phalanx.io/gang-min-member": "2"},
     GangIdentity(G, "Job", 2)),
    ("a pod alone is a gang of one whatever it says",
     {"phalanx.io/gang-min-member": "2", "phalanx.io/gang-max-member": "4"},
     GangIdentity("ml/train-0", "Pod", 1)),
])
def test_what_a_pod_says_of_its_elastic_gang(name, labels, expected):
    assert identify("ml", "train-0", labels, {}) == expected


@pytest.mark.parametrize("name,labels,annotations,field,rule", [
    ("a maximum without a minimum is refused naming the key",
     {"batch.kubernetes.io/job-name": "train", "phalanx.io/gang-max-member": "4"}, {},
     "metadata.labels[phalanx.io/gang-max-member]", "an elastic gang's maximum needs its minimum"),
    ("a maximum below the minimum is refused naming the key",
     {"batch.kubernetes.io/job-name": "train", "phalanx.io/gang-min-member": "4", "phalanx.io/gang-max-member": "2"},
     {}, "metadata.labels[phalanx.io/gang-max-member]", "is at least its min-member (4)"),
    ("a maximum that is no whole number is refused naming the key",
     {"batch.kubernetes.io/job-name": "train", "phalanx.io/gang-min-member": "2", "phalanx.io/gang-max-member": "x"},
     {}, "metadata.labels[phalanx.io/gang-max-member]", "an elastic gang's maximum is a number of pods"),
    ("a PodGroup name that is no object name is refused (a victim unit's '#' never occurs in a gang id)",
     {}, {"scheduling.k8s.io/group-name": "a#b"},
     "metadata.annotations[scheduling.k8s.io/group-name]", "DNS-1123 subdomain"),
])
def test_an_elastic_gang_that_says_something_impossible_is_refused(name, labels, annotations, field, rule):
    with pytest.raises(RequestError) as e:
        identify("ml", "train-0", labels, annotations)
    assert [v.field for v in e.value.violations] == [field]
    assert rule in e.value.violations[0].rule


@pytest.mark.parametrize("name,state,expected", [
    ("the first attempt places the minimum, all at once", elastic(6, phase="placing"), MEMBERS[:2]),
    ("a grow attempt places one member more", elastic(6, phase="placing", running=PODS[:2]), MEMBERS[2:3]),
    ("the last grow attempt reaches the maximum", elastic(6, phase="placing", running=PODS[:3]), MEMBERS[3:4]),
    ("a gang at its maximum places nobody", elastic(6, phase="placing", running=PODS[:4]), ()),
    ("a gang that lost members below its minimum gets them back at once",
     elastic(6, phase="placing", running=PODS[:1]), MEMBERS[1:2]),
    ("a gang with a minimum of one grows one by one from its first", elastic(4, phase="placing", lo=1), MEMBERS[:1]),
    ("a gang that is not elastic places every member no earlier attempt bound",
     replace(elastic(4, phase="placing", running=PODS[:1]), max_member=0), MEMBERS[1:4]),
])
def test_which_members_each_attempt_of_an_elastic_gang_places(name, state, expected):
    assert attempt_members(state) == expected


@pytest.mark.parametrize("name,state,expected", [
    ("a gang running its minimum with more pods present grows", elastic(4, phase="scheduled", bound=PODS[:2]), True),
    ("a gang running its maximum does not grow, whatever pods wait",
     elastic(6, phase="scheduled", running=PODS[:2], bound=PODS[2:4]), False),
    ("a gang with every present pod running does not grow", elastic(3, phase="scheduled", bound=PODS[:3]), False),
])
def test_when_a_scheduled_elastic_gang_grows(name, state, expected):
    assert saga.late_members(state) is expected


def test_a_whole_elastic_gang_is_placed_at_its_minimum_then_grows_one_member_per_attempt():
    s = elastic(4)
    s = saga.start_attempt(s, now=1.0, settle_s=0)
    assert (s.phase, s.attempt, attempt_members(s)) == ("placing", 2, MEMBERS[:2])
    s = saga.bound(s, 2, PODS[:2])
    assert (s.phase, saga.late_members(s)) == ("scheduled", True)
    s = saga.start_attempt(s, now=2.0, settle_s=0)
    assert (s.phase, s.attempt, attempt_members(s), {r.pod for r in s.running}) == (
        "placing", 3, MEMBERS[2:3], set(PODS[:2]))
    s = saga.bound(s, 3, PODS[2:3])
    s = saga.start_attempt(s, now=3.0, settle_s=0)
    s = saga.bound(s, 4, PODS[3:4])
    assert (s.phase, saga.late_members(s), saga.start_attempt(s, now=4.0, settle_s=0)) == ("scheduled", False, None)


def test_adding_members_keeps_the_elastic_range_the_pods_say():
    s = None
    for m in MEMBERS[:3]:
        s = saga.add_member(s, m, gang_id=G, min_member=2, max_member=4, timeout_s=0, priority=0, now=1.0) or s
    assert (s.min_member, s.max_member, len(s.members), saga.complete(s, 1.0, 0)) == (2, 4, 3, True)


@pytest.mark.parametrize("name,held,expected", [
    ("the pods past the minimum, the latest first", PODS[:4], (PODS[3], PODS[2])),
    ("a gang holding only its minimum gives up none one by one", PODS[:2], ()),
    ("member order decides, not the order asked", (PODS[3], PODS[0], PODS[1]), (PODS[3],)),
])
def test_the_extras_an_elastic_gang_gives_up_first(name, held, expected):
    assert elastic_extras(elastic(6), set(held)) == expected


def test_a_gang_that_is_not_elastic_has_no_extras():
    assert elastic_extras(replace(elastic(6), max_member=0), set(PODS)) == ()


def test_losing_an_extra_is_no_repair_but_losing_the_minimum_is():
    running = elastic(4, phase="scheduled", running=PODS[:3])
    lost_extra = FailedMember(pod=PODS[2], node="n3", signal="pod_deleted")
    assert repair.member_failed(running, lost_extra, now=5.0, timeout_s=180) is None
    at_minimum = elastic(4, phase="scheduled", running=PODS[:2])
    lost_core = FailedMember(pod=PODS[1], node="n2", signal="pod_deleted")
    got = repair.member_failed(at_minimum, lost_core, now=5.0, timeout_s=180)
    assert got is not None and got.repair is not None and got.repair.failed == (lost_core,)


@pytest.mark.parametrize("name,state,problem", [
    ("a maximum below the minimum", replace(elastic(2), max_member=1), "max_member 1 is outside min_member (2)"),
    ("a maximum past the largest gang", replace(elastic(2), max_member=10_001), "max_member 10001 is outside"),
])
def test_a_poisoned_elastic_gang_record_is_not_believed(name, state, problem):
    assert problem in gang_problem(S.gang_key(G), state)


# -- preemption: the extras go first, one by one; the minimum only whole ---------------------------

def _elastic_world():
    """Node a and b (8 V100s each), fully held by elastic gang ns/el: four members of 4 GPUs,
    minimum 2, maximum 4; the candidates placement offers the planner for it."""
    from engine_builders import node

    from phalanx_engine.decide import Cluster
    from phalanx_placement import preempting
    from phalanx_proto.events import Assignment
    from phalanx_rules.preemption import RunningGang

    pods = tuple(PodRef(namespace="ns", name=f"el-{i}", uid=f"uid-el-{i}") for i in range(4))
    spots = (("a", (0, 1, 2, 3)), ("a", (4, 5, 6, 7)), ("b", (0, 1, 2, 3)), ("b", (4, 5, 6, 7)))
    nodes = {n: node(n).gpus(8).tiers(leaf="leaf-1") for n in ("a", "b")}
    held = tuple(Assignment(pod=p, node=n, gpus=g) for p, (n, g) in zip(pods, spots, strict=True))
    for a in held:
        nodes[a.node].reserved(a)
    gang = RunningGang(gang_id="ns/el", assignments=held, priority=1)
    record = GangState(gang_id="ns/el", phase="scheduled", min_member=2, max_member=4,
                       members=tuple(MemberSpec(pod=p, gpus=4) for p in pods))
    from engine_builders import snapshot
    cluster = Cluster.from_snapshot(snapshot(*nodes.values()))
    return cluster, (gang, *preempting.extras(gang, record)), pods


@pytest.mark.parametrize("name,sizes,expected,evicted", [
    ("a preemptor one extra makes room for takes that extra alone", (4,), ["ns/el#el-2"], {2}),
    ("a preemptor two extras make room for takes both", (4, 4), ["ns/el#el-2", "ns/el#el-3"], {2, 3}),
    ("a preemptor that needs more than the extras free takes the whole gang", (4, 4, 4), ["ns/el"], {0, 1, 2, 3}),
])
def test_an_elastic_gang_gives_up_its_extras_first_and_its_minimum_only_whole(name, sizes, expected, evicted):
    from engine_builders import pod

    from phalanx_engine.preempt import Plan, Preemptor, plan_preemption
    from phalanx_rules.queues import QueueTree

    cluster, running, pods = _elastic_world()
    members = tuple(pod(f"hi-{i}").gpus(k).spec() for i, k in enumerate(sizes))
    got = plan_preemption(cluster, Preemptor(gang_id="default/hi", members=members, priority=10), running,
                          QueueTree.of(()))
    assert isinstance(got, Plan)
    assert [v.gang_id for v in got.victims] == expected
    assert {p for v in got.victims for p in v.pods} == {pods[i] for i in evicted}


def test_the_extras_are_candidates_beside_their_gang_with_its_priority_and_queues():
    _, running, pods = _elastic_world()
    assert [(g.gang_id, [a.pod for a in g.assignments], g.priority) for g in running] == [
        ("ns/el", list(pods), 1), ("ns/el#el-3", [pods[3]], 1), ("ns/el#el-2", [pods[2]], 1)]


def test_a_nomination_naming_an_extra_counts_only_that_member_as_gone_from_its_queue():
    from phalanx_proto.events import Assignment
    from phalanx_proto.queues import GPU_UNITS, QueueSpec
    from phalanx_proto.state import Allocation, NodeLedger, Nomination, alloc_key
    from phalanx_rules.preemption import with_nominations
    from phalanx_rules.queues import QueueTree

    pods = [PodRef(namespace="ns", name=f"el-{i}", uid=f"u{i}") for i in range(4)]
    held = {alloc_key(p): Allocation(gang_id="ns/el", attempt=1, queues=("team-b",),
                                     assignment=Assignment(pod=p, node="a", gpus=(2 * i, 2 * i + 1)))
            for i, p in enumerate(pods)}
    nominated = Nomination(gang_id="ns/hi", attempt=1, queue="team-a", expires_at=100.0,
                           assignment=Assignment(pod=PodRef(namespace="ns", name="hi", uid="h"), node="a", gpus=(6, 7)),
                           victims={"ns/el#el-3": "reclaim"})
    ledgers = [NodeLedger(node="a", allocations=held, nominations={"ns/hi/h": nominated})]
    tree = QueueTree.of((QueueSpec(name="team-a"), QueueSpec(name="team-b")))
    got = with_nominations({"team-b": 8 * GPU_UNITS}, ledgers, tree, now=1.0)
    assert got == {"team-a": 2 * GPU_UNITS, "team-b": 6 * GPU_UNITS}


def _job(parallelism: int, least: str, most: str) -> dict:
    labels = {"phalanx.io/gang-min-member": least, "phalanx.io/gang-max-member": most}
    spec = {"schedulerName": "phalanx", "restartPolicy": "Never",
            "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "el", "namespace": "ml"},
            "spec": {"parallelism": parallelism, "completions": parallelism,
                     "template": {"metadata": {"labels": labels}, "spec": spec}}}


@pytest.mark.parametrize("name,job,expected", [
    ("an elastic Job whose parallelism lies in its range is valid", _job(4, "2", "4"), []),
    ("an elastic Job that runs more pods than its maximum is refused", _job(5, "2", "4"),
     [("spec.parallelism", "an elastic gang's job runs between its min-member (2) and its maximum (4) pods: "
                           "parallelism must lie in that range")]),
    ("a maximum below the minimum is refused naming the key", _job(4, "5", "4"),
     [("metadata.labels[phalanx.io/gang-max-member]", "an elastic gang's maximum is at least its min-member (5)")]),
])
def test_phalanx_validate_reads_an_elastic_jobs_range(name, job, expected):
    from phalanx_kubeobjects.workloads import check_object

    assert [(v.field, v.rule) for c in check_object(job) for v in c.violations] == expected
