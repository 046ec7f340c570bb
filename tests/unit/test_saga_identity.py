"""Gang identity and member requests (services/phalanx_gang_coordinator/gangs.py), and what the
intake tells a pod whose request is invalid."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
import yaml

from phalanx_gang_coordinator.gangs import InvalidMember, identity, member_spec
from phalanx_gang_coordinator.intake import PodIntake
from phalanx_gang_coordinator.notify import Notifier
from phalanx_kube.port import pod_from_dict
from phalanx_kubeobjects import names
from phalanx_kubeobjects.gangs import GangSize, jobset_size
from phalanx_proto.events import MemberSpec, PodRef
from phalanx_proto.scheduling import HostPort, Toleration
from phalanx_proto.state import GangPart
from phalanx_proto.subjects import gang_key


def pod(name="p", *, labels=None, annotations=None, limits=None, priority=None, host_network=False, caps=None,
        namespace="ml"):
    """Builder: a pod for the phalanx scheduler."""
    spec = {"schedulerName": "phalanx", "containers": [
        {"name": "c", "image": "x", "resources": {"limits": limits if limits is not None else {"nvidia.com/gpu": "1"}},
         **({"securityContext": {"capabilities": {"add": caps}}} if caps else {})}]}
    if priority is not None:
        spec["priority"] = priority
    if host_network:
        spec["hostNetwork"] = True
    return pod_from_dict({"metadata": {"name": name, "namespace": namespace, "uid": "u", "labels": labels or {},
                                       "annotations": annotations or {}}, "spec": spec})


JS = "jobset.sigs.k8s.io/jobset-name"
RJ = "jobset.sigs.k8s.io/replicatedjob-name"
RJ_REPLICAS = "jobset.sigs.k8s.io/replicatedjob-replicas"
JOBS = "jobset.sigs.k8s.io/global-replicas"
MIN = "aliyun.com/min-member"
LWS, LWS_GROUP, LWS_WORKER = ("leaderworkerset.sigs.k8s.io/name", "leaderworkerset.sigs.k8s.io/group-index",
                              "leaderworkerset.sigs.k8s.io/worker-index")
LWS_SIZE = "leaderworkerset.sigs.k8s.io/size"


def jobset_pod(name="p", *, rj="workers", replicas="2", jobs="3", min_member="2", **extra):
    """A pod as the JobSet controller labels it (replicated job, its replicas, the JobSet's Jobs)."""
    labels = {JS: "train", RJ: rj, RJ_REPLICAS: replicas, JOBS: jobs, **extra}
    if min_member:
        labels[MIN] = min_member
    return pod(name, labels=labels)


IDS = [
    ("a single pod is a gang of one, whatever min-member it says", pod("solo", labels={MIN: "4"}),
     ("ml/solo", "Pod", 1, None, 0)),
    ("a JobSet pod says its replicated job: Jobs and pods per Job", jobset_pod(),
     ("ml/JobSet:train", "JobSet", None, GangPart(name="workers", jobs=2, members=2), 3)),
    ("a JobSet pod placed exclusively through JobSet's webhook counts its Job's leader only: the followers come later",
     pod(labels={JS: "train", RJ: "workers", RJ_REPLICAS: "2", JOBS: "2", MIN: "4"},
         annotations={"alpha.jobset.sigs.k8s.io/exclusive-topology": "rack"}),
     ("ml/JobSet:train", "JobSet", None, GangPart(name="workers", jobs=2, members=1), 2)),
    ("... not with the node-selector strategy, which creates every pod at once",
     pod(labels={JS: "train", RJ: "workers", RJ_REPLICAS: "2", JOBS: "2", MIN: "4"},
         annotations={"alpha.jobset.sigs.k8s.io/exclusive-topology": "rack", "alpha.jobset.sigs.k8s.io/node-selector": ""}),
     ("ml/JobSet:train", "JobSet", None, GangPart(name="workers", jobs=2, members=4), 2)),
    ("a JobSet pod without min-member says its Job's pod count is unknown (0)", jobset_pod(min_member=""),
     ("ml/JobSet:train", "JobSet", None, GangPart(name="workers", jobs=2, members=0), 3)),
    ("phalanx.io/gang-min-member is the whole gang's size and wins", jobset_pod(**{"phalanx.io/gang-min-member": "9"}),
     ("ml/JobSet:train", "JobSet", 9, GangPart(name="workers", jobs=2, members=2), 3)),
    ("an MPIJob's pods are one gang", pod(labels={"training.kubeflow.org/job-name": "mpi", MIN: "2"}),
     ("ml/MPIJob:mpi", "MPIJob", 2, None, 0)),
    ("each group of a LeaderWorkerSet, leader and workers, is one gang of the size its controller says",
     pod(labels={LWS: "serve", LWS_GROUP: "1", LWS_WORKER: "2"}, annotations={LWS_SIZE: "4"}),
     ("ml/LeaderWorkerSet:serve-1", "LeaderWorkerSet", 4, None, 0)),
    ("an exclusive LeaderWorkerSet group waits for its leader only: the workers come once it is scheduled",
     pod(labels={LWS: "serve", LWS_GROUP: "1", LWS_WORKER: "0"},
         annotations={LWS_SIZE: "4", "leaderworkerset.sigs.k8s.io/exclusive-topology": "rack"}),
     ("ml/LeaderWorkerSet:serve-1", "LeaderWorkerSet", 1, None, 0)),
    ("phalanx.io/gang-min-member wins over a LeaderWorkerSet group's size",
     pod(labels={LWS: "serve", LWS_GROUP: "0", "phalanx.io/gang-min-member": "2"}, annotations={LWS_SIZE: "4"}),
     ("ml/LeaderWorkerSet:serve-0", "LeaderWorkerSet", 2, None, 0)),
    ("a plain Job's pods are one gang", pod(labels={"batch.kubernetes.io/job-name": "train", MIN: "3"}),
     ("ml/Job:train", "Job", 3, None, 0)),
    ("a plain Job that says no min-member is an undeclared gang", pod(labels={"batch.kubernetes.io/job-name": "j"}),
     ("ml/Job:j", "Job", None, None, 0)),
    ("a JobSet's pods are its gang, not their Job's",
     pod(labels={JS: "js", "batch.kubernetes.io/job-name": "js-w-0", MIN: "2"}),
     ("ml/JobSet:js", "JobSet", None, GangPart(name="", jobs=1, members=2), 0)),
    ("the Volcano/arena pod-group annotation names the gang",
     pod(labels={"training.kubeflow.org/job-name": "mpi"}, annotations={"scheduling.k8s.io/group-name": "mpi-pg"}),
     ("ml/PodGroup:mpi-pg", "PodGroup", None, None, 0)),
    ("a scheduler-plugins PodGroup label names the gang, min-member from its label",
     pod(labels={"scheduling.x-k8s.io/pod-group": "pg", "scheduling.x-k8s.io/min-member": "3"}),
     ("ml/PodGroup:pg", "PodGroup", 3, None, 0)),
    ("ACK's pod-group labels name the gang, min-available its size",
     pod(labels={"pod-group.scheduling.sigs.k8s.io/name": "pg", "pod-group.scheduling.sigs.k8s.io/min-available": "4"}),
     ("ml/PodGroup:pg", "PodGroup", 4, None, 0)),
    ("a pod named like a group's id is still a gang of its own", pod("jobset-train", labels={}),
     ("ml/jobset-train", "Pod", 1, None, 0)),
]


@pytest.mark.parametrize(("name", "p", "expected"), IDS, ids=[c[0] for c in IDS])
def test_identity(name, p, expected):
    i = identity(p)
    assert (i.gang_id, i.kind, i.min_member, i.part, i.jobs) == expected


def test_group_ids_never_equal_a_pod_id_nor_its_gang_key_nor_each_other():
    pods = [pod(n) for n in ("jobset-train", "jobset.train", "JobSet-train", "job.train", "podgroup-train")]
    groups = [pod(labels={k: "train"}) for k in (JS, "training.kubeflow.org/job-name", "batch.kubernetes.io/job-name",
                                                 "scheduling.x-k8s.io/pod-group")]
    pod_ids = [identity(p).gang_id for p in pods if validate_name(p.name)]
    group_ids = [identity(g).gang_id for g in groups]
    assert group_ids == ["ml/JobSet:train", "ml/MPIJob:train", "ml/Job:train", "ml/PodGroup:train"]
    assert len({gang_key(i) for i in pod_ids + group_ids}) == len(pod_ids) + len(group_ids)
    assert identity(pod(labels={JS: "train"}, namespace="other")).gang_id != group_ids[0]


def validate_name(name: str) -> bool:
    """Only names the API server accepts for a pod (RFC 1123 subdomain) can collide."""
    return not names.check_metadata({"name": name})


SIZES = [
    ("driver and workers: the sum of replicas x pods per Job over the replicated jobs",
     [GangPart(name="driver", jobs=1, members=1), GangPart(name="workers", jobs=2, members=2)], 3, GangSize(5, True)),
    ("a replicated job not seen yet counts one pod per missing Job, and the size is not known",
     [GangPart(name="workers", jobs=2, members=2)], 3, GangSize(5, True, known=False)),
    ("replicas 2 of the seed's 7-pod Job", [GangPart(name="worker", jobs=2, members=7)], 2, GangSize(14, True)),
    ("a replicated job that does not say its pods per Job makes the gang undeclared",
     [GangPart(name="driver", jobs=1, members=0), GangPart(name="workers", jobs=2, members=2)], 3, GangSize(0, False)),
    ("pods made by hand (no JobSet counts) are sized by what they say", [GangPart(name="", jobs=1, members=4)], 0,
     GangSize(4, True)),
]


@pytest.mark.parametrize(("name", "parts", "jobs", "expected"), SIZES, ids=[c[0] for c in SIZES])
def test_jobset_size(name, parts, jobs, expected):
    assert jobset_size(parts, jobs) == expected


def test_timeout_annotation_and_priority_are_read():
    i = identity(pod(annotations={"phalanx.io/gang-timeout-seconds": "30"}, priority=5))
    assert (i.timeout_s, i.priority) == (30.0, 5)


DIGITS = "must be a whole number written with ASCII digits 0-9 only"
WEEK = "must be at most 604800: a gang waits at most a week for its members"


@pytest.mark.parametrize(("bad", "rule"), [("0", "must be at least 1"), ("soon", DIGITS), ("250000000000", WEEK),
                                           ("604801", WEEK), ("1e9", DIGITS), ("-5", DIGITS), ("٣٠", DIGITS)])
def test_a_bad_gang_timeout_names_the_annotation_and_the_bound(bad, rule):
    with pytest.raises(InvalidMember) as e:
        identity(pod(annotations={"phalanx.io/gang-timeout-seconds": bad}))
    assert str(e.value) == (f"metadata.annotations[phalanx.io/gang-timeout-seconds] = '{bad}': the gang timeout is a "
                            f"whole number of seconds: {rule}")


def test_the_largest_gang_timeout_is_a_week():
    assert identity(pod(annotations={"phalanx.io/gang-timeout-seconds": "604800"})).timeout_s == 604800.0


MAX_GANG = ("must be at most 10000: a gang has at most 10000 pods (the wire contract's bound: one decision commits "
            "at most 1,000 nodes)")


@pytest.mark.parametrize(("bad", "rule"), [("0", "must be at least 1"), ("10001", MAX_GANG),
                                           ("99999999999999999999", MAX_GANG), ("many", DIGITS)])
def test_a_min_member_out_of_bounds_names_the_label_and_the_bound(bad, rule):
    with pytest.raises(InvalidMember) as e:
        identity(pod(labels={"jobset.sigs.k8s.io/jobset-name": "js", "aliyun.com/min-member": bad}))
    assert str(e.value) == f"metadata.labels[aliyun.com/min-member] = '{bad}': min-member is the number of pods in the gang: {rule}"


@pytest.mark.parametrize("spec", [{"containers": "not a list"}, {"containers": [{"resources": ["limits"]}]},
                                  {"containers": [None]}])
def test_a_pod_of_an_odd_shape_is_refused_with_a_reason_not_an_exception(spec):
    odd = pod_from_dict({"metadata": {"name": "odd", "namespace": "ml", "uid": "u"},
                         "spec": {"schedulerName": "phalanx", **spec}})
    with pytest.raises(InvalidMember, match="spec"):
        member_spec(odd)


def test_a_pod_the_request_parser_trips_over_is_refused_with_a_reason(monkeypatch):
    from phalanx_gang_coordinator import gangs

    def trip(raw, **kw):
        raise TypeError("'NoneType' object is not iterable")

    monkeypatch.setattr(gangs.rules, "parse_pod", trip)
    with pytest.raises(InvalidMember) as e:
        member_spec(pod())
    assert str(e.value) == ("spec = 'TypeError': the pod's spec could not be read as a Kubernetes pod "
                            "('NoneType' object is not iterable)")


REF = PodRef(namespace="ml", name="p", uid="u")
SPECS = [
    ("whole GPUs", {"nvidia.com/gpu": "2"}, {}, MemberSpec(pod=REF, gpus=2, vendor="nvidia")),
    ("a TDM share", {"aliyun.com/gpu-core": "30", "aliyun.com/gpu-memory": "4"}, {},
     MemberSpec(pod=REF, gpus=1, core_pct=30, memory_mib=4096)),
    ("a MIG slice", {"aliyun.com/gpu-slice": "3", "aliyun.com/gpu-memory": "20"}, {},
     MemberSpec(pod=REF, gpus=1, mig_slices=3, memory_mib=20480)),
    ("RDMA with whole GPUs", {"aliyun.com/gpu": "4", "aliyun.com/rdma": "1"}, {"host_network": True},
     MemberSpec(pod=REF, gpus=4, rdma=True, resource_name="aliyun.com/gpu", host_network=True)),
]


@pytest.mark.parametrize(("name", "limits", "kw", "expected"), SPECS, ids=[c[0] for c in SPECS])
def test_member_spec_admits_every_request_kind(name, limits, kw, expected):
    assert member_spec(pod(limits=limits, **kw)) == expected


def test_an_invalid_request_names_field_value_and_rule():
    with pytest.raises(InvalidMember) as e:
        member_spec(pod(limits={"aliyun.com/gpu-core": "0"}))
    (v,) = e.value.violations
    assert (v.field, v.value) == ("spec.containers[c].resources.limits[aliyun.com/gpu-core]", "0")
    assert "gpu-core 0 is not allowed" in v.rule


def test_a_launcher_without_gpus_is_told_to_use_the_default_scheduler():
    with pytest.raises(InvalidMember, match="schedulerName default-scheduler"):
        member_spec(pod(limits={}))


def test_member_spec_carries_what_the_pod_asks_of_a_node_besides_gpus():
    raw = pod(limits={"nvidia.com/gpu": "1"}).raw
    spec = {**raw["spec"], "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
            "nodeSelector": {"pool": "train"},
            "containers": [{**raw["spec"]["containers"][0], "resources": {
                "limits": {"nvidia.com/gpu": "1", "memory": "8Gi"}, "requests": {"cpu": "1500m"}},
                "ports": [{"containerPort": 8080, "hostPort": 9090}]}]}
    got = member_spec(pod_from_dict({**raw, "spec": spec}))
    assert got == MemberSpec(pod=REF, gpus=1, vendor="nvidia", requests={"cpu": 1500, "memory": 8 << 30},
                             tolerations=(Toleration(key="dedicated", operator="Exists", effect="NoSchedule"),),
                             node_selector={"pool": "train"}, host_ports=(HostPort(port=9090),))


class Told:
    """A cluster that records the notices the notifier sends."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    async def record_event(self, ref, *, reason: str, message: str, type: str = "Normal") -> None:
        self.calls.append(("event", ref.name, reason, type, message))

    async def set_scheduled_condition(self, ref, *, status: bool, reason: str, message: str) -> None:
        self.calls.append(("condition", ref.name, status, reason, message))


class AdmitsNothing:
    """A saga driver no gang may reach."""

    async def admit(self, gang_id, change):
        raise AssertionError(f"gang {gang_id} admitted")


@pytest.mark.anyio
async def test_the_mig_demo_asking_for_five_slices_is_told_the_allowed_values_and_joins_no_gang():
    """gang-coordinator's intake on the seed's mig-demo pod with ``gpu-slice: 5``: a Warning
    ``FailedScheduling`` event and ``PodScheduled=False`` naming the field and the allowed slice
    counts, and no gang (so nothing places or binds it). This ran on a whole MIG stack before
    (test_mig_end_to_end); the way from intake to the pod's event through real processes is
    proven for an invalid request by test_saga_processes and the e2e seed examples."""
    demo = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "pods" / "mig-demo.yaml").read_text())
    demo["metadata"] |= {"name": "slice-five", "namespace": "default", "uid": "u5"}
    demo["spec"]["containers"][0]["resources"]["limits"] = {"aliyun.com/gpu-slice": "5", "aliyun.com/gpu-memory": "4"}
    cluster = Told()
    notifier = Notifier(cluster)
    intake = PodIntake(cluster, None, AdmitsNothing(), notifier, settle_s=0)
    async with anyio.create_task_group() as tg:
        await tg.start(notifier.run)
        await intake.on_pods([pod_from_dict(demo)])
        with anyio.fail_after(5):
            await notifier.drained()
        tg.cancel_scope.cancel()
    (condition, event) = sorted(cluster.calls)  # one of each
    assert event[:4] == ("event", "slice-five", "FailedScheduling", "Warning")
    assert condition[:4] == ("condition", "slice-five", False, "Unschedulable")
    message = event[4]
    assert condition[4] == message and message.startswith("invalid request: ")
    assert "aliyun.com/gpu-slice" in message and "1, 2, 3, 4" in message


def test_a_leaderworkerset_size_that_is_no_count_names_the_annotation():
    with pytest.raises(InvalidMember) as e:
        identity(pod(labels={LWS: "serve", LWS_GROUP: "0"}, annotations={LWS_SIZE: "four"}))
    assert [v.field for v in e.value.violations] == [f"metadata.annotations[{LWS_SIZE}]"]
