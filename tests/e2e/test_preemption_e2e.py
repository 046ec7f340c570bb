"""Preemption on the real API server (docs/preemption.md): four kwok nodes of 4 GPUs (16 GPUs,
two network-pods of two nodes), the whole stack with ``--cluster kube``, and the real
controllers — JobSet, and in kube-controller-manager the Job, garbage-collector and disruption
controllers. PriorityClasses are API objects: the API server's Priority admission gives each pod
its ``spec.priority`` and ``spec.preemptionPolicy``; Queues are the CRD's objects;
PodDisruptionBudgets are ``policy/v1`` objects whose status the disruption controller computes.

What a test checks comes from the API server and from the plan itself:

* **Evicted through the Eviction API**: a watch of the namespace's pods, opened before the test
  submits anything, records every pod that ever carried the ``DisruptionTarget`` condition. The
  API server's eviction sets it (reason ``EvictionByEvictionAPI``) before it deletes the pod; a
  pod deleted any other way (the garbage collector, a test) never carries it. A dry run (the
  one binder makes first) sets nothing.
* **Exactly the planned victims**: placement logs one ``event=preempting`` line per plan with
  its victims; the victims evicted are compared with that list.

Every cluster is filled with four JobSets of one Job of 2 pods x 2 GPUs, one gang each, one node
each (the engine packs a gang tightest): ``lo`` (priority 1) and ``m1``-``m3`` (priority 5).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
import threading
import urllib.request

import pytest
from kubecontrollers import delete_workloads, wait_for
from kubeharness import ControlPlane, KubeApi, unique
from test_controllers_e2e import JOBSET, bound, dump, live
from test_seed_examples import condition

from phalanx_localstack.stack import Stack
from phalanx_proto import subjects as S
from phalanx_proto.kubeapi import QUEUE_LABEL
from phalanx_telemetry import exposition

pytestmark = pytest.mark.e2e

QUEUES = "/apis/scheduling.phalanx.io/v1alpha1/queues"
PRIORITY_CLASSES = "/apis/scheduling.k8s.io/v1/priorityclasses"
JOBSETS = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets"
ASSIGNMENT = "phalanx.io/assignment"
FILL = {"lo": "low", "m1": "mid", "m2": "mid", "m3": "mid"}
EVICTED = "EvictionByEvictionAPI"
BUDGET_REFUSAL = "Cannot evict pod as it would violate the pod's disruption budget."


# -- fixtures --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def classes(kube_api: KubeApi):
    """PriorityClass names: low 1, mid 5, high 100, and calm 100 with ``preemptionPolicy: Never``."""
    names = {k: unique(f"e2e-{k}") for k in ("low", "mid", "high", "calm")}
    for k, value in (("low", 1), ("mid", 5), ("high", 100), ("calm", 100)):
        body = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": names[k]},
                "value": value, **({"preemptionPolicy": "Never"} if k == "calm" else {})}
        kube_api.post(PRIORITY_CLASSES, body)
    yield names
    for n in names.values():
        kube_api.request("DELETE", f"{PRIORITY_CLASSES}/{n}", ok=(404,))


class PodWatch:
    """A watch of one namespace's pods from now on (its own connection, read by a thread):
    ``disrupted`` maps each pod that carried ``DisruptionTarget=True`` to that condition's reason,
    ``seen`` holds every pod it saw. A watch that ends or fails before ``close`` is an error."""

    def __init__(self, api: KubeApi, ns: str) -> None:
        rv = api.get(f"/api/v1/namespaces/{ns}/pods")["metadata"]["resourceVersion"]
        self.conn = http.client.HTTPSConnection(api.host, api.port, context=api.ctx, timeout=600)
        self.conn.request("GET", f"/api/v1/namespaces/{ns}/pods?watch=1&resourceVersion={rv}&timeoutSeconds=550",
                          headers={"Authorization": f"Bearer {api.token}", "Accept": "application/json"})
        resp = self.conn.getresponse()
        if resp.status != 200:
            raise AssertionError(f"the pod watch of {ns} was refused: HTTP {resp.status} {resp.read()[:300]!r}")
        self.disrupted: dict[str, str] = {}
        self.seen: set[str] = set()
        self.errors: list[str] = []
        self.closing = False
        self.thread = threading.Thread(target=self._read, args=(resp,), daemon=True, name=f"watch-{ns}")
        self.thread.start()

    def _read(self, resp: http.client.HTTPResponse) -> None:
        try:
            while line := resp.readline():
                ev = json.loads(line)
                obj = ev.get("object") or {}
                if ev.get("type") == "ERROR":
                    self.errors.append(str(obj.get("message")))
                    continue
                self.seen.add(obj["metadata"]["name"])
                for c in (obj.get("status") or {}).get("conditions") or []:
                    if c.get("type") == "DisruptionTarget" and c.get("status") == "True":
                        self.disrupted.setdefault(obj["metadata"]["name"], c.get("reason", ""))
            if not self.closing:
                self.errors.append("the pod watch ended before the test did")
        except Exception as e:  # noqa: BLE001 - closed under the reader by close(), or a real failure
            if not self.closing:
                self.errors.append(f"the pod watch failed: {e!r}")

    def close(self) -> None:
        self.closing = True
        try:
            if self.conn.sock is not None:
                self.conn.sock.shutdown(2)
        except OSError:
            pass
        self.conn.close()
        self.thread.join(5)


@pytest.fixture
def watch(kube_api, kube_ns):
    w = PodWatch(kube_api, kube_ns)
    yield w
    w.close()
    assert not w.errors, w.errors


@pytest.fixture(autouse=True)
def _workloads_deleted_after_each_test(kube_api, kube_ns):
    yield
    delete_workloads(kube_api, kube_ns)


# -- helpers ---------------------------------------------------------------------------------------
def jobset2(name: str, ns: str, priority_class: str = "", queue: str = "", pods: int = 2, gpus: int = 2) -> dict:
    """A JobSet of one Job of ``pods`` pods x ``gpus`` GPUs: one gang (``aliyun.com/min-member``)."""
    labels = {"aliyun.com/min-member": str(pods), **({QUEUE_LABEL: queue} if queue else {})}
    spec = {"schedulerName": "phalanx", "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": "registry.example/app:1",
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
            **({"priorityClassName": priority_class} if priority_class else {})}
    job = {"parallelism": pods, "completions": pods, "backoffLimit": 6,
           "template": {"metadata": {"labels": labels}, "spec": spec}}
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": name, "namespace": ns},
            "spec": {"replicatedJobs": [{"name": "w", "replicas": 1, "template": {"spec": job}}]}}


def submit(api: KubeApi, ns: str, js: dict) -> None:
    api.post(JOBSETS.format(ns=ns), js)


def gang(ns: str, name: str) -> str:
    """The gang id Phalanx gives a JobSet's pods."""
    return f"{ns}/JobSet:{name}"


def held(api: KubeApi, ns: str, name: str) -> dict[str, tuple[str, str, tuple[int, ...]]]:
    """The JobSet's live pods: name → (uid, node, the GPUs of its assignment)."""
    out = {}
    for p in live(api, ns, f"{JOBSET}={name}"):
        a = json.loads((p["metadata"].get("annotations") or {}).get(ASSIGNMENT) or "null")
        out[p["metadata"]["name"]] = (p["metadata"]["uid"], p["spec"].get("nodeName", ""),
                                      tuple(a["gpus"]) if a else ())
    return out


def gpus(pods: dict[str, tuple[str, str, tuple[int, ...]]]) -> list[tuple[str, int]]:
    return sorted((node, g) for _, node, gs in pods.values() for g in gs)


def fill(api: KubeApi, ns: str, stack: Stack, classes: dict, gangs: dict[str, str] = FILL, queue: str = "") -> dict:
    """Every GPU taken by the gangs (JobSet name → PriorityClass key); their pods as ``held`` says.
    The highest priority first, each priority bound before the next is submitted: a gang that
    waits (the last test's reservations may still be released) would otherwise preempt a lower
    one placed meanwhile."""
    value = {"low": 1, "mid": 5, "high": 100}
    for prio in sorted({value[c] for c in gangs.values()}, reverse=True):
        names = [n for n, c in gangs.items() if value[c] == prio]
        for name in names:
            submit(api, ns, jobset2(name, ns, classes[gangs[name]], queue=queue))
        for name in names:
            bound(api, ns, f"{JOBSET}={name}", 2, stack)
    state = {name: held(api, ns, name) for name in gangs}
    assert sorted(g for pods in state.values() for g in gpus(pods)) == sorted(
        (n, g) for n in stack.network_pods for g in range(4)), f"the gangs do not fill the cluster: {state}"
    assert {n: plans(stack, gang(ns, n)) for n in gangs} == {n: [] for n in gangs}, "a gang preempted while filling"
    return state


def gone(api: KubeApi, ns: str, before: dict) -> bool:
    """None of those pods (by uid) is live any more."""
    uids = {uid for uid, _, _ in before.values()}
    return not any(p["metadata"]["uid"] in uids for p in live(api, ns, JOBSET))


def events(api: KubeApi, ns: str, reason: str) -> list[tuple[str, str, str]]:
    """The namespace's events of ``reason``: sorted (pod, type, message)."""
    items = api.get(f"/api/v1/namespaces/{ns}/events", query={"fieldSelector": f"reason={reason}"})["items"]
    return sorted((e["involvedObject"]["name"], e["type"], e["message"]) for e in items)


def log_of(stack: Stack, service: str) -> str:
    return stack.procs[service].log_path.read_text(errors="replace")


def plans(stack: Stack, gang_id: str) -> list[list[str]]:
    """The victim sets placement planned for ``gang_id``, in order (its ``preempting`` log lines)."""
    return [m.group(1).split(",") for m in re.finditer(
        rf"event=preempting gang={re.escape(gang_id)} attempt=\d+ .*? victims=(\S+)", log_of(stack, "placement"))]


def no_preemption(stack: Stack, gang_id: str) -> set[str]:
    """The planner's reasons for not preempting for ``gang_id`` (placement's log)."""
    return set(re.findall(rf'event="no preemption" gang={re.escape(gang_id)} attempt=\d+ reason="([^"]*)"',
                          log_of(stack, "placement")))


def evicted_total(stack: Stack) -> float:
    """binder's ``phalanx_evictions_total{result="evicted"}``."""
    port = int(stack.procs["binder"].ready_file.read_text().split()[1])
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return exposition.samples(resp.read().decode()).get('phalanx_evictions_total{result="evicted"}', 0.0)


ATTEMPT = re.compile(r"\(attempt (\d+)")


def refused(api: KubeApi, ns: str, name: str, n: int, stack: Stack, attempts: int = 2,
            timeout_s: float = 60) -> list[dict]:
    """The JobSet's ``n`` pods once each says ``PodScheduled=False`` after at least ``attempts``
    attempts (the ``(attempt N)`` of its message, or ``(attempt N was the last)``), unbound."""
    def check():
        pods = live(api, ns, f"{JOBSET}={name}")
        conds = [condition(p) for p in pods]
        if len(pods) != n or any(p["spec"].get("nodeName") or not c or c["status"] != "False"
                                 for p, c in zip(pods, conds, strict=True)):
            return None
        seen = [int(m.group(1)) if (m := ATTEMPT.search(c.get("message", ""))) else 0 for c in conds]
        return min(seen) >= attempts and pods
    try:
        return wait_for(check, timeout_s, f"{name}'s {n} pods to be refused {attempts} times")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{dump(stack)}") from None


def explain(stack: Stack, plane: ControlPlane, ns: str, pod: str) -> dict:
    """``phalanx explain NS/POD --json`` as a user runs it (the reader identity)."""
    out = subprocess.run([sys.executable, "-m", "phalanx_cli.main", "explain", f"{ns}/{pod}", "--json",
                          "--nats", stack.url, "--cluster", "kube", "--kubeconfig", str(plane.kubeconfig)],
                         capture_output=True, text=True, timeout=60, env={**os.environ, **stack.identity_env(S.READER)})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def preempted_message(preemptor: str, queue: str, priority: int, rule: str, victim: str) -> str:
    return (f"Preempted by gang {preemptor} (queue {queue}, priority {priority}) under rule {rule}: "
            f"victim gang {victim} is evicted whole")


# -- the cases -------------------------------------------------------------------------------------
def test_a_high_priority_gang_evicts_exactly_the_planned_lower_priority_gang_whole_and_binds_on_its_gpus(
        stack4, kube_api, kube_ns, classes, watch):
    before = fill(kube_api, kube_ns, stack4, classes)
    evicted_before = evicted_total(stack4)
    submit(kube_api, kube_ns, jobset2("hi", kube_ns, classes["high"]))
    hi = bound(kube_api, kube_ns, f"{JOBSET}=hi", 2, stack4)
    assert [(p["spec"]["priority"], p["spec"].get("preemptionPolicy")) for p in hi] == [(100, "PreemptLowerPriority")] * 2
    # one plan, naming lo alone (priority 1: the lowest, 4 GPUs: the fewest)
    assert plans(stack4, gang(kube_ns, "hi")) == [[gang(kube_ns, "lo")]]
    # lo went whole, both pods through the Eviction API (the API server's own condition says so)
    wait_for(lambda: gone(kube_api, kube_ns, before["lo"]), 30, "lo's pods to be gone")
    wait_for(lambda: set(before["lo"]) <= set(watch.disrupted), 10, "the watch to see lo's evictions")
    assert watch.disrupted == {p: EVICTED for p in before["lo"]}
    assert evicted_total(stack4) - evicted_before == 2
    # and nothing else moved
    assert {n: held(kube_api, kube_ns, n) for n in ("m1", "m2", "m3")} == {n: before[n] for n in ("m1", "m2", "m3")}
    # each victim pod was told who preempted it, under which rule; no other pod got that event
    message = preempted_message(gang(kube_ns, "hi"), "default", 100, "priority", gang(kube_ns, "lo"))
    assert events(kube_api, kube_ns, "Preempted") == sorted((p, "Warning", message) for p in before["lo"])
    # the preemptor holds exactly the GPUs lo held
    assert gpus(held(kube_api, kube_ns, "hi")) == gpus(before["lo"])


def test_a_queue_below_its_quota_reclaims_borrowed_gpus_down_to_the_lenders_quota_and_no_further(
        stack4, kube_api, kube_ns, classes, watch):
    a, b = unique("team-a"), unique("team-b")
    for name in (a, b):
        kube_api.post(QUEUES, {"apiVersion": "scheduling.phalanx.io/v1alpha1", "kind": "Queue",
                               "metadata": {"name": name}, "spec": {"resources": {"nvidia.com/gpu": {"quota": 8}}}})

    def status(name: str) -> dict:
        return kube_api.get(f"{QUEUES}/{name}").get("status") or {}

    try:
        # gang-coordinator read both (it writes their status), so placement has them too
        wait_for(lambda: all({c["type"]: c["status"] for c in status(q).get("conditions", [])} == {"Valid": "True"}
                             for q in (a, b)), 30, "the Queues' status")
        # team-b borrows the idle half: four gangs of 4 GPUs (priority 5: reclaim ignores priority)
        before = fill(kube_api, kube_ns, stack4, classes, gangs={f"b{i}": "mid" for i in range(4)}, queue=b)
        # team-a (priority 0, holding 0 of its quota 8) asks for 8 GPUs: two of team-b's gangs go, whole
        submit(kube_api, kube_ns, jobset2("a1", kube_ns, queue=a, pods=4))
        bound(kube_api, kube_ns, f"{JOBSET}=a1", 4, stack4)
        made = plans(stack4, gang(kube_ns, "a1"))
        assert len(made) == 1 and len(made[0]) == 2, made
        went = sorted(v.rsplit(":", 1)[1] for v in made[0])
        wait_for(lambda: all(gone(kube_api, kube_ns, before[n]) for n in went), 30, f"{went}'s pods to be gone")
        wait_for(lambda: {p for n in went for p in before[n]} <= set(watch.disrupted), 10, "the watch")
        assert watch.disrupted == {p: EVICTED for n in went for p in before[n]}
        stayed = sorted(set(before) - set(went))
        assert {n: held(kube_api, kube_ns, n) for n in stayed} == {n: before[n] for n in stayed}
        assert events(kube_api, kube_ns, "Preempted") == sorted(
            (p, "Warning", preempted_message(gang(kube_ns, "a1"), a, 0, "reclaim", gang(kube_ns, n)))
            for n in went for p in before[n])
        assert gpus(held(kube_api, kube_ns, "a1")) == sorted(g for n in went for g in gpus(before[n]))
        # team-a at its quota, team-b at its own: 4 more GPUs for team-a would take team-b below it
        submit(kube_api, kube_ns, jobset2("a2", kube_ns, queue=a))
        refused(kube_api, kube_ns, "a2", 2, stack4, attempts=3)
        assert plans(stack4, gang(kube_ns, "a2")) == []
        assert no_preemption(stack4, gang(kube_ns, "a2")) == {
            f"no running gang may be preempted: no gang of queue {a} with a priority below 0 holds GPUs; "
            f"queue {a} is at or above its quota (8 of 8 GPUs): it does not reclaim"}
        assert {n: held(kube_api, kube_ns, n) for n in stayed} == {n: before[n] for n in stayed}
        assert set(watch.disrupted) == {p for n in went for p in before[n]}
        # the Queues' status agrees: both at their quota, neither borrowing, team-a's a2 waiting
        wait_for(lambda: [(s.get("allocated"), s.get("borrowed")) for s in map(status, (a, b))] == [(8, 0), (8, 0)]
                 and status(a).get("pendingGangs") == 1, 30, "the Queues' status after the reclaim")
    finally:
        for name in (a, b):
            kube_api.request("DELETE", f"{QUEUES}/{name}", ok=(404,))


def test_a_gang_whose_priority_class_says_never_preempt_waits_evicts_nothing_and_explain_says_why(
        stack4, kube, kube_api, kube_ns, classes, watch):
    before = fill(kube_api, kube_ns, stack4, classes)
    submit(kube_api, kube_ns, jobset2("calm", kube_ns, classes["calm"]))
    pods = refused(kube_api, kube_ns, "calm", 2, stack4, attempts=3)
    assert [(p["spec"]["priority"], p["spec"]["preemptionPolicy"]) for p in pods] == [(100, "Never")] * 2
    for p in pods:  # the engine's reason, not a preemption's
        c = condition(p)
        assert c["reason"] == "Unschedulable" and c["message"].startswith(
            "0/4 nodes are available: 4 insufficient free GPUs") and "preempt" not in c["message"], c
    calm = gang(kube_ns, "calm")
    assert plans(stack4, calm) == []
    assert no_preemption(stack4, calm) == {"its pods' preemptionPolicy is Never: it waits and never preempts"}
    # nothing evicted, nothing moved, nobody told it was preempted
    assert {n: held(kube_api, kube_ns, n) for n in FILL} == before
    assert {p["metadata"]["name"] for p in pods} | {p for b in before.values() for p in b} <= watch.seen
    assert watch.disrupted == {}
    assert events(kube_api, kube_ns, "Preempted") == []
    # explain names what preemption would take, and why it is not done
    pod = pods[0]["metadata"]["name"]

    def answered():
        r = explain(stack4, kube, kube_ns, pod)
        return any(a["probe"] == "preempt" for a in (r.get("whatif") or {}).get("answers") or []) and r

    r = wait_for(answered, 45, f"explain {pod} to name the preemption it does not do")
    assert [(a["text"], a["starts"]) for a in r["whatif"]["answers"] if a["probe"] == "preempt"] == [
        (f"would start if gang(s) {gang(kube_ns, 'lo')} were preempted; not done: its pods' preemptionPolicy is "
         "Never: it waits and never preempts", False)]
    assert (r["status"], r["preempting"]) == ("pending", None)


def test_a_disruption_budget_that_refuses_the_eviction_keeps_its_gang_and_the_planner_takes_another(
        stack4, kube_api, kube_ns, classes, watch):
    before = fill(kube_api, kube_ns, stack4, classes)
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "lo", "namespace": kube_ns},
           "spec": {"minAvailable": 2, "selector": {"matchLabels": {JOBSET: "lo"}}}}
    kube_api.post(f"/apis/policy/v1/namespaces/{kube_ns}/poddisruptionbudgets", pdb)

    def computed():  # the real disruption controller counts lo's healthy pods
        s = kube_api.get(f"/apis/policy/v1/namespaces/{kube_ns}/poddisruptionbudgets/lo").get("status") or {}
        return s.get("observedGeneration", 0) >= 1 and "disruptionsAllowed" in s and s

    s = wait_for(computed, 60, "the disruption controller to compute lo's budget")
    assert {k: s.get(k) for k in ("currentHealthy", "desiredHealthy", "expectedPods", "disruptionsAllowed")} == {
        "currentHealthy": 2, "desiredHealthy": 2, "expectedPods": 2, "disruptionsAllowed": 0}, s
    submit(kube_api, kube_ns, jobset2("hi", kube_ns, classes["high"]))
    hi = bound(kube_api, kube_ns, f"{JOBSET}=hi", 2, stack4)
    # the first plan named lo; the budget refused its dry run; the second plan named a priority-5 gang
    made = plans(stack4, gang(kube_ns, "hi"))
    assert len(made) == 2 and made[0] == [gang(kube_ns, "lo")] and len(made[1]) == 1, made
    taken = made[1][0].rsplit(":", 1)[1]
    assert taken in ("m1", "m2", "m3"), made
    wait_for(lambda: gone(kube_api, kube_ns, before[taken]), 30, f"{taken}'s pods to be gone")
    wait_for(lambda: set(before[taken]) <= set(watch.disrupted), 10, "the watch")
    assert watch.disrupted == {p: EVICTED for p in before[taken]}  # lo: not even one pod
    assert {n: held(kube_api, kube_ns, n) for n in FILL if n != taken} == {n: before[n] for n in FILL if n != taken}
    assert gpus(held(kube_api, kube_ns, "hi")) == gpus(before[taken])
    # the preemptor's pods were told the budget blocked it; only the taken gang's pods were preempted
    blocked = events(kube_api, kube_ns, "PreemptionBlocked")
    assert sorted(p for p, _, _ in blocked) == sorted(p["metadata"]["name"] for p in hi), blocked
    head = (f"preempting for gang {gang(kube_ns, 'hi')} is blocked, the planner will choose again: "
            f"gang {gang(kube_ns, 'lo')}: evicting {kube_ns}/lo-w-0-")
    assert all(t == "Warning" and m.startswith(head) and m.endswith(BUDGET_REFUSAL) for _, t, m in blocked), blocked
    message = preempted_message(gang(kube_ns, "hi"), "default", 100, "priority", gang(kube_ns, taken))
    assert events(kube_api, kube_ns, "Preempted") == sorted((p, "Warning", message) for p in before[taken])


def test_a_preempted_jobset_is_recreated_by_its_job_waits_while_the_preemptor_runs_and_is_placed_again_when_it_goes(
        stack4, kube_api, kube_ns, classes, watch):
    before = fill(kube_api, kube_ns, stack4, classes)
    submit(kube_api, kube_ns, jobset2("hi", kube_ns, classes["high"]))
    bound(kube_api, kube_ns, f"{JOBSET}=hi", 2, stack4)
    hi = held(kube_api, kube_ns, "hi")
    wait_for(lambda: gone(kube_api, kube_ns, before["lo"]), 30, "lo's pods to be gone")
    # lo's Job (the JobSet controller's) makes two new pods after its failure backoff; priority 1
    # may preempt nobody here, so they are refused and wait
    again = refused(kube_api, kube_ns, "lo", 2, stack4, attempts=1, timeout_s=90)
    assert not {p["metadata"]["uid"] for p in again} & {uid for uid, _, _ in before["lo"].values()}
    js = kube_api.get(f"{JOBSETS.format(ns=kube_ns)}/lo")
    assert (js.get("status") or {}).get("restarts", 0) == 0, js.get("status")  # the JobSet itself was not restarted
    # the preemptor goes (its JobSet deleted, its pods by the garbage collector): lo is placed on
    # the GPUs it held before, without preempting anything
    kube_api.request("DELETE", f"{JOBSETS.format(ns=kube_ns)}/hi", {"propagationPolicy": "Background"})
    bound(kube_api, kube_ns, f"{JOBSET}=lo", 2, stack4, timeout_s=60)
    assert gpus(held(kube_api, kube_ns, "lo")) == gpus(before["lo"])
    assert plans(stack4, gang(kube_ns, "lo")) == []  # not even of the deleted preemptor, going anyway
    assert {n: held(kube_api, kube_ns, n) for n in ("m1", "m2", "m3")} == {n: before[n] for n in ("m1", "m2", "m3")}
    # evicted through the API: lo's first pods only; hi's pods were deleted, never evicted nor "preempted"
    assert watch.disrupted == {p: EVICTED for p in before["lo"]}
    message = preempted_message(gang(kube_ns, "hi"), "default", 100, "priority", gang(kube_ns, "lo"))
    assert events(kube_api, kube_ns, "Preempted") == sorted((p, "Warning", message) for p in before["lo"])
    assert not set(hi) & set(watch.disrupted)


def test_every_service_process_is_still_running_after_the_preemptions(stack4):
    dead = {n: sp.proc.returncode for n, sp in stack4.procs.items() if sp.proc.poll() is not None}
    assert dead == {}, dump(stack4)
    assert "KubeApiError" not in log_of(stack4, "binder")
