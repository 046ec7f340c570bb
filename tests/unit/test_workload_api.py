"""The upstream Workload API's PodGroups (docs/workloads.md, "The upstream Workload API"): which
gang a pod naming one is in (``gangs.identify``), what size its object says
(``gangs.pod_group_policy``), gang-coordinator's book (``podgroups.PodGroupBook``: sizes, waiting,
status written back) and the effect that reports it. Table-driven, whole values; the book runs
over a fake ``ClusterPort`` that records what it was asked."""

from __future__ import annotations

import anyio
import pytest

from phalanx_gang_coordinator import effects
from phalanx_gang_coordinator.podgroups import PodGroupBook, Waiting
from phalanx_kubeobjects.gangs import GangIdentity, PodGroupPolicy, identify, pod_group_policy
from phalanx_kubeobjects.requests import RequestError
from phalanx_kubeobjects.violations import Violation
from phalanx_proto.state import GangState

NAMED = {"schedulingGroup": {"podGroupName": "train"}}


@pytest.mark.parametrize("name,labels,spec,expected", [
    ("a pod naming a PodGroup is in that PodGroup's gang, its size left to the object",
     {}, NAMED, GangIdentity("ml/PodGroup:train", "PodGroup", None, pod_group="train")),
    ("a Job's pod naming a PodGroup is in the PodGroup's gang, not its Job's", {"batch.kubernetes.io/job-name": "j"},
     NAMED, GangIdentity("ml/PodGroup:train", "PodGroup", None, pod_group="train")),
    ("phalanx.io/gang-min-member still wins", {"phalanx.io/gang-min-member": "3"}, NAMED,
     GangIdentity("ml/PodGroup:train", "PodGroup", 3, pod_group="train")),
    ("an empty schedulingGroup names nothing", {"batch.kubernetes.io/job-name": "j"}, {"schedulingGroup": {}},
     GangIdentity("ml/Job:j", "Job", None)),
])
def test_which_gang_a_pod_naming_a_podgroup_is_in(name, labels, spec, expected):
    assert identify("ml", "p-0", labels, {}, spec) == expected


def test_a_podgroup_name_that_is_no_object_name_is_refused_naming_the_field():
    with pytest.raises(RequestError) as e:
        identify("ml", "p-0", {}, {}, {"schedulingGroup": {"podGroupName": "Not_A_Name"}})
    assert [(v.field, v.rule) for v in e.value.violations] == [
        ("spec.schedulingGroup.podGroupName", "names a PodGroup object: must be a DNS-1123 subdomain")]


def group(policy: dict, name: str = "train", conditions: list | None = None) -> dict:
    return {"metadata": {"namespace": "ml", "name": name}, "spec": {"schedulingPolicy": policy},
            **({"status": {"conditions": conditions}} if conditions is not None else {})}


@pytest.mark.parametrize("name,policy,expected", [
    ("gang.minCount: that many together, then the rest one by one", {"gang": {"minCount": 4}}, PodGroupPolicy(4, 10_000)),
    ("basic: one by one from the first", {"basic": {}}, PodGroupPolicy(1, 10_000)),
    ("a minCount of 0 is refused", {"gang": {"minCount": 0}},
     Violation("spec.schedulingPolicy.gang.minCount", "0", "the gang's size is a whole number of pods, 1 to 10000")),
    ("a minCount that is no number is refused", {"gang": {"minCount": "4"}},
     Violation("spec.schedulingPolicy.gang.minCount", "4", "the gang's size is a whole number of pods, 1 to 10000")),
    ("a policy that says neither is refused", {},
     Violation("spec.schedulingPolicy", "{}", "says neither gang (with minCount) nor basic")),
])
def test_what_a_podgroup_says_of_its_gang(name, policy, expected):
    assert pod_group_policy(group(policy)) == expected


class Cluster:
    """The part of ``ClusterPort`` the book uses: PodGroups read one by one, status writes."""

    def __init__(self, *objs: dict) -> None:
        self.objs = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objs}
        self.reads: list[tuple[str, str]] = []
        self.writes: list[tuple[str, str, list]] = []

    async def get_pod_group(self, namespace: str, name: str):
        self.reads.append((namespace, name))
        return self.objs.get((namespace, name))

    async def update_pod_group_status(self, namespace: str, name: str, conditions: list) -> None:
        self.writes.append((namespace, name, conditions))


IDENT = GangIdentity("ml/PodGroup:train", "PodGroup", None, pod_group="train")


@pytest.mark.parametrize("name,objs,ident,expected", [
    ("the object's minCount is the minimum, the group's other pods its elastic extras",
     (group({"gang": {"minCount": 2}}),), IDENT,
     GangIdentity("ml/PodGroup:train", "PodGroup", 2, max_member=10_000, pod_group="train")),
    ("the pods' own min-member wins over the object's", (group({"gang": {"minCount": 2}}),),
     GangIdentity("ml/PodGroup:train", "PodGroup", 3, pod_group="train"),
     GangIdentity("ml/PodGroup:train", "PodGroup", 3, max_member=10_000, pod_group="train")),
    ("no such PodGroup: the pod waits, told why", (), IDENT,
     Waiting("PodGroup ml/train (spec.schedulingGroup.podGroupName) does not exist (yet): the pod waits for it")),
    ("a PodGroup that says something impossible: its violation, naming the object", (group({}),), IDENT,
     Violation("PodGroup ml/train spec.schedulingPolicy", "{}", "says neither gang (with minCount) nor basic")),
])
def test_the_book_sizes_a_gang_from_its_podgroup(name, objs, ident, expected):
    book = PodGroupBook(Cluster(*objs))
    assert anyio.run(book.sized, "ml", ident) == expected


def test_the_book_reads_a_podgroup_the_watch_has_not_shown_once_and_keeps_it():
    cluster = Cluster(group({"gang": {"minCount": 2}}))
    book = PodGroupBook(cluster)
    for _ in range(3):
        anyio.run(book.sized, "ml", IDENT)
    assert cluster.reads == [("ml", "train")]


def test_the_status_says_scheduled_or_unschedulable_keeps_other_conditions_and_writes_no_repeat():
    other = {"type": "DisruptionTarget", "status": "False", "reason": "x", "message": "",
             "lastTransitionTime": "2026-01-01T00:00:00Z"}
    cluster = Cluster()
    book = PodGroupBook(cluster)
    book.known[("ml", "train")] = group({"gang": {"minCount": 2}}, conditions=[other])

    async def story():
        await book.report("ml/PodGroup:train", scheduled=False, message="0/4 nodes are available")
        await book.report("ml/PodGroup:train", scheduled=False, message="0/4 nodes are available")
        await book.report("ml/PodGroup:train", scheduled=True, message="2 pods placed")
        await book.report("ml/PodGroup:other", scheduled=True, message="not one the watch shows")
        await book.report("ml/Job:train", scheduled=True, message="not a PodGroup")
    anyio.run(story)
    shown = [(ns, n, [(c["type"], c["status"], c.get("reason"), c["message"]) for c in conds])
             for ns, n, conds in cluster.writes]
    assert shown == [
        ("ml", "train", [("DisruptionTarget", "False", "x", ""),
                         ("PodGroupScheduled", "False", "Unschedulable", "0/4 nodes are available")]),
        ("ml", "train", [("DisruptionTarget", "False", "x", ""),
                         ("PodGroupScheduled", "True", "Scheduled", "2 pods placed")]),
    ]


@pytest.mark.parametrize("name,gang_id,expected", [
    ("a PodGroup's gang reports when it waits", "ml/PodGroup:train", 1),
    ("any other gang does not", "ml/Job:train", 0),
])
def test_a_pending_podgroup_gang_reports_to_its_podgroup(name, gang_id, expected):
    s = GangState(gang_id=gang_id, phase="backoff", attempt=1, reason="no room")
    got = [e for e in effects.pending(s, now=0.0) if isinstance(e, effects.ReportGroup)]
    assert got == [effects.ReportGroup(gang_id, False, saga_reason(s))][:expected]


def saga_reason(s: GangState) -> str:
    from phalanx_rules import saga

    return saga.pending_reason(s, 0.0)


# -- phalanx validate and phalanx sim read the same identity -------------------------------------

WORKLOAD = """
apiVersion: scheduling.k8s.io/v1alpha2
kind: PodGroup
metadata: {name: train, namespace: ml}
spec: {schedulingPolicy: {gang: {minCount: 2}}}
---
apiVersion: batch/v1
kind: Job
metadata: {name: job, namespace: ml}
spec:
  parallelism: 3
  completions: 3
  template:
    spec:
      schedulerName: phalanx
      restartPolicy: Never
      schedulingGroup: {podGroupName: train}
      containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: "4"}}}]
---
apiVersion: v1
kind: Pod
metadata: {name: stray, namespace: ml}
spec:
  schedulerName: phalanx
  schedulingGroup: {podGroupName: absent}
  containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: "1"}}}]
"""


def test_validate_names_the_podgroup_a_jobs_pods_name_as_their_gang():
    import yaml

    from phalanx_kubeobjects.workloads import gang_check

    job = list(yaml.safe_load_all(WORKLOAD))[1]
    got = gang_check(job)
    assert (got.gang_id, got.members, got.how) == (
        "ml/PodGroup:train", 0, "the pods name PodGroup train (spec.schedulingGroup): its gang.minCount, read from "
                                "the object when the pods are admitted")


def test_the_simulator_gangs_pods_by_the_podgroup_they_name_sized_by_its_min_count(tmp_path):
    from phalanx_rules.queues import QueueTree
    from phalanx_sim.workload import read_workload

    f = tmp_path / "w.yaml"
    f.write_text(WORKLOAD)
    got = [(g.gang_id, len(g.members), g.refused) for g in read_workload([str(f)], QueueTree.of(()), {})]
    assert got == [("ml/PodGroup:train", 3, ""),
                   ("ml/PodGroup:absent", 1, "PodGroup ml/absent (spec.schedulingGroup.podGroupName) is not in the "
                                             "workload")]
