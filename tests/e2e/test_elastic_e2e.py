"""Elastic gangs on the real API server (docs/workloads.md, "Elastic gangs"): a plain
``batch/v1`` Job whose pods say ``phalanx.io/gang-min-member: "2"`` and
``phalanx.io/gang-max-member: "4"``, with the real Job controller (kube-controller-manager)
making its pods and recreating an evicted one. On the shared four-node stack (``stack4``: four
kwok nodes of 4 GPUs); each pod takes a whole node.

What is checked comes from the API server (bindings, the ``DisruptionTarget`` condition the
Eviction API sets, events) and from placement's plan log.
"""

from __future__ import annotations

import re

import pytest
from kubecontrollers import delete_workloads, wait_for
from kubeharness import KubeApi, unique
from test_controllers_e2e import bound, dump, live
from test_preemption_e2e import (
    EVICTED,
    PRIORITY_CLASSES,
    events,
    log_of,
    watch,  # noqa: F401 - the fixture, shared
)
from test_seed_examples import condition

from phalanx_localstack.stack import Stack

pytestmark = pytest.mark.e2e

JOB = "batch.kubernetes.io/job-name"


@pytest.fixture(scope="module")
def classes(kube_api: KubeApi):
    """PriorityClass names: low 1, high 100."""
    names = {k: unique(f"elastic-{k}") for k in ("low", "high")}
    for k, value in (("low", 1), ("high", 100)):
        kube_api.post(PRIORITY_CLASSES, {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                         "metadata": {"name": names[k]}, "value": value})
    yield names
    for n in names.values():
        kube_api.request("DELETE", f"{PRIORITY_CLASSES}/{n}", ok=(404,))


@pytest.fixture(autouse=True)
def _workloads_deleted_after_each_test(kube_api, kube_ns):
    yield
    delete_workloads(kube_api, kube_ns)


def job(name: str, ns: str, *, pods: int, priority_class: str, least: int, most: int = 0) -> dict:
    """A Job of ``pods`` pods of 4 GPUs (a whole node each), one gang of min-member ``least``
    and, with ``most``, elastic up to it."""
    labels = {"phalanx.io/gang-min-member": str(least), **({"phalanx.io/gang-max-member": str(most)} if most else {})}
    spec = {"schedulerName": "phalanx", "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
            "priorityClassName": priority_class,
            "containers": [{"name": "c", "image": "registry.example/train:1",
                            "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": ns},
            "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 10,
                     "template": {"metadata": {"labels": labels}, "spec": spec}}}


def submit(api: KubeApi, ns: str, body: dict) -> None:
    api.post(f"/apis/batch/v1/namespaces/{ns}/jobs", body)


def remove(api: KubeApi, ns: str, name: str) -> None:
    api.request("DELETE", f"/apis/batch/v1/namespaces/{ns}/jobs/{name}", {"propagationPolicy": "Background"}, ok=(404,))


def split(api: KubeApi, ns: str, name: str) -> tuple[dict[str, tuple[str, str]], list[str]]:
    """The Job's live pods: the bound ones (name → (uid, node)) and the names of the others."""
    pods = live(api, ns, f"{JOB}={name}")
    placed = {p["metadata"]["name"]: (p["metadata"]["uid"], p["spec"]["nodeName"]) for p in pods
              if p["spec"].get("nodeName")}
    return placed, sorted(p["metadata"]["name"] for p in pods if not p["spec"].get("nodeName"))


def settled(api: KubeApi, ns: str, name: str, placed: int, waiting: int, stack: Stack, timeout_s: float = 90):
    """The Job once exactly ``placed`` pods are bound and ``waiting`` more are live and unbound,
    each of those told why (``PodScheduled=False``)."""
    def check():
        got, rest = split(api, ns, name)
        told = all((c := condition(p)) and c["status"] == "False" for p in live(api, ns, f"{JOB}={name}")
                   if not p["spec"].get("nodeName"))
        return len(got) == placed and len(rest) == waiting and told and (got, rest)
    try:
        return wait_for(check, timeout_s, f"{name}: {placed} pods bound and {waiting} waiting")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{dump(stack)}") from None


def plans(stack: Stack, gang_id: str) -> list[list[str]]:
    return [m.group(1).split(",") for m in re.finditer(
        rf"event=preempting gang={re.escape(gang_id)} attempt=\d+ .*? victims=(\S+)", log_of(stack, "placement"))]


def test_an_elastic_job_starts_at_its_minimum_grows_as_gpus_free_and_gives_up_one_extra_to_a_preemptor(
        stack4, kube_api, kube_ns, classes, watch):  # noqa: F811 - the fixture imported above
    gang = f"{kube_ns}/Job:el"
    # Two of the four nodes are taken by a gang the elastic one may not preempt (higher priority).
    submit(kube_api, kube_ns, job("block", kube_ns, pods=2, priority_class=classes["high"], least=2))
    blocker = bound(kube_api, kube_ns, f"{JOB}=block", 2, stack4)

    # The elastic Job starts with its minimum on the two free nodes; the other two pods wait.
    submit(kube_api, kube_ns, job("el", kube_ns, pods=4, priority_class=classes["low"], least=2, most=4))
    first, waiting = settled(kube_api, kube_ns, "el", 2, 2, stack4)
    assert {node for _, node in first.values()}.isdisjoint({p["spec"]["nodeName"] for p in blocker})

    # The blocker goes: the elastic gang grows into its nodes, the first two staying where they are.
    remove(kube_api, kube_ns, "block")
    grown, waiting = settled(kube_api, kube_ns, "el", 4, 0, stack4)
    assert {k: grown[k] for k in first} == first
    assert len({node for _, node in grown.values()}) == 4

    # A higher-priority pod of one node's GPUs: the planner takes one extra of the elastic gang,
    # not the gang; the other three keep running where they were.
    submit(kube_api, kube_ns, job("hi", kube_ns, pods=1, priority_class=classes["high"], least=1))
    hi = bound(kube_api, kube_ns, f"{JOB}=hi", 1, stack4)
    [[victim]] = plans(stack4, f"{kube_ns}/Job:hi")
    gang_id, _, pod = victim.rpartition("#")
    assert gang_id == gang and pod in grown and pod not in first, victim
    assert hi[0]["spec"]["nodeName"] == grown[pod][1]
    wait_for(lambda: pod in watch.disrupted, 30, f"the watch to see {pod}'s eviction")
    assert {p: r for p, r in watch.disrupted.items() if p.startswith("el-")} == {pod: EVICTED}
    kept, waiting = settled(kube_api, kube_ns, "el", 3, 1, stack4)  # the Job made a new pod; it waits
    assert kept == {k: v for k, v in grown.items() if k != pod}
    assert [m for p, _, m in events(kube_api, kube_ns, "Preempted")] == [
        f"Preempted by gang {kube_ns}/Job:hi (queue default, priority 100) under rule priority: an extra member "
        f"of elastic gang {gang}, given up while the gang keeps running its minimum"]
    assert [e for e in events(kube_api, kube_ns, "GangRepairing") if e[0].startswith("el-")] == [], \
        "losing an extra is no repair"

    # The preemptor finishes (deleted): the Job's new pod joins the gang on the freed node.
    remove(kube_api, kube_ns, "hi")
    back, _ = settled(kube_api, kube_ns, "el", 4, 0, stack4)
    assert {k: back[k] for k in kept} == kept
    assert [n for k, (_, n) in back.items() if k not in kept] == [grown[pod][1]]
