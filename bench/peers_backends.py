"""The schedulers ``bench/peers.py`` compares, each behind one small interface.

A ``Backend`` starts its scheduler on the shared control plane, dresses the bench's plain pods
the way its users would write them (scheduler name, gang labels, PodGroup reference, queue
labels), says what a pending pod of a gang is told (verbatim), and stops. One backend runs at
a time, so the kwok nodes (which have no kubelet to refuse an overcommit) are never shared.

* ``phalanx``: the Phalanx services as in ``bench/scale.py`` (nats-server, placement,
  gang-coordinator, binder, one node-fleet), restarted for every scenario.
* ``kueue``: Kueue v0.17.0 (the real manager, ``cmd/kueue``, with its webhooks on loopback)
  with Topology Aware Scheduling and waitForPodsReady, admitting plain-pod groups that
  kube-scheduler v1.37.2 then binds to the nodes Kueue's topology assignment chose; it is
  ``bench/peers_kueue.py`` (it installs more than the others).
* ``kube-gang``: kube-scheduler v1.37.2 with the ``GenericWorkload`` (gang scheduling, beta)
  and ``TopologyAwareWorkloadScheduling`` (alpha) gates: one PodGroup per gang with
  ``gang.minCount`` and one required topology level.
* ``kube``: the same kube-scheduler without PodGroups (no gangs): the baseline.

``bench/peers.py`` names the four in its ``BACKENDS``.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubeharness import (
    PHALANX_CRDS,
    ControlPlane,
    HarnessError,
    KubeApi,
    _insecure_ctx,
    apply_crds,
    free_port,
)

from kwokbench import delete_pods, say
from phalanx_bench.peers import LABELS, Layout
from phalanx_localstack.inputs import ClusterFile, ClusterNode
from phalanx_localstack.stack import Stack

REPO = Path(__file__).resolve().parents[1]
TOPOLOGY = REPO / "examples" / "clusters" / "topology" / "dgx1v-like_8xV100-SXM2_mlx5_oneflow.txt"
GANG_TIMEOUT_S = 180
"""The seed's all-or-nothing deadline, given to Phalanx (annotation) and Kueue (waitForPodsReady).
kube-scheduler's gang Permit timeout is fixed at 5 minutes upstream."""
REQUIRED_LEVEL = LABELS["netpod"]
"""The one hard topology level Kueue and kube-scheduler are given: a gang stays inside one
network-pod, as the seed asks of Phalanx."""


@dataclass
class Gang:
    name: str
    size: int


class Backend:
    """The interface (and shared helpers). ``start``/``stop`` bracket one scenario's phase."""

    name = ""
    label = ""
    queues = ""
    """Empty when the backend runs the queue scenario; else why it cannot (printed as n/a)."""

    def __init__(self, plane: ControlPlane, layout: Layout, peers_bin: Path, work: Path, qps: int) -> None:
        self.plane, self.layout, self.peers_bin, self.work, self.qps = plane, layout, peers_bin, work, qps
        self.api: KubeApi = plane.api

    def start(self, namespace: str) -> None: ...

    def stop(self) -> None: ...

    def pids(self) -> list[int]:
        return []

    def prepare(self, namespace: str, gangs: list[Gang], teams: dict[str, float]) -> None:
        """Objects the scenario's pods need before they are created (PodGroups, queues)."""

    def dress(self, pod: dict, gang: Gang | None, team: str) -> dict:
        raise NotImplementedError

    def reason(self, namespace: str, pod: dict, gang: str) -> list[str]:
        """What a pending member is told: its PodScheduled condition, its scheduling gates and
        its latest event, verbatim."""
        out = []
        st = pod.get("status") or {}
        for c in st.get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") != "True":
                out.append(f"pod condition PodScheduled={c.get('status')} {c.get('reason', '')}: {c.get('message', '')}")
        gates = [g["name"] for g in (pod.get("spec") or {}).get("schedulingGates") or []]
        if gates:
            out.append(f"pod schedulingGates: {', '.join(gates)}")
        events = sorted(self.api.events(namespace, pod["metadata"]["name"]),
                        key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
        if events:
            e = events[-1]
            out.append(f"pod event {e.get('type')} {e.get('reason')}: {e.get('message')}")
        return out or ["(nothing: no condition, gate or event on the pod)"]

    def cleanup(self, namespace: str) -> None:
        """Delete the phase's pods (and what the backend made) and wait until they are gone."""
        delete_pods(self.api, namespace, timeout_s=180)

    # -- kube-scheduler, shared by three backends --------------------------------------------
    def start_kube_scheduler(self, gates: str) -> None:
        """kube-scheduler v1.37.2 with its client raised to ``qps`` and NodeResourcesFit scoring
        GPUs MostAllocated (bin packing, the Kubernetes docs' "Resource Bin Packing"), so that
        it packs gangs the way a GPU cluster would configure it."""
        cfg = self.work / f"kube-scheduler-{self.name}.yaml"
        cfg.write_text(json.dumps({
            "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(self.plane.kubeconfig), "qps": self.qps, "burst": self.qps},
            "leaderElection": {"leaderElect": False},
            "profiles": [{"schedulerName": "default-scheduler", "pluginConfig": [{
                "name": "NodeResourcesFit", "args": {"scoringStrategy": {
                    "type": "MostAllocated", "resources": [{"name": "nvidia.com/gpu", "weight": 1}]}}}]}]}))
        args = [f"--config={cfg}"] + ([f"--feature-gates={gates}"] if gates else [])
        plane = self.plane
        for attempt in range(3):
            sp = free_port()
            plane._run("kube-scheduler", [
                self.peers_bin / "kube-scheduler", *args, "--bind-address=127.0.0.1", f"--secure-port={sp}",
                f"--authentication-kubeconfig={plane.kubeconfig}", f"--authorization-kubeconfig={plane.kubeconfig}"])
            try:
                plane._wait("kube-scheduler", lambda sp=sp: plane._http_ok(
                    f"https://127.0.0.1:{sp}/healthz", None, _insecure_ctx()), 60)
                return
            except HarnessError:
                plane._terminate("kube-scheduler")
                if attempt == 2:
                    raise

    def _scheduler_pids(self) -> list[int]:
        p = self.plane.procs.get("kube-scheduler")
        return [p.pid] if p else []


class Terminator:
    """The part of a kubelet kwok leaves out: a running pod that is deleted while a finalizer
    holds it gets its containers killed and a terminal phase (``Failed``), so that the
    controller holding the finalizer (Kueue's ``kueue.x-k8s.io/managed`` on a preempted pod
    group) can let it go and the scheduler stops counting its GPUs. kwok's stages leave such a
    pod ``Running`` (a Stage doing this was tried and missed some pods). Polls ``namespace``
    every 0.5 s in its own thread until ``close``."""

    def __init__(self, plane: ControlPlane, namespace: str) -> None:
        self.api, self.namespace = plane.api_as(plane.admin_token), namespace
        self.done = threading.Event()
        self.terminated = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(0.5):
            try:
                pods = self.api.get(f"/api/v1/namespaces/{self.namespace}/pods")["items"]
                for pod in pods:
                    meta = pod["metadata"]
                    if meta.get("deletionTimestamp") and meta.get("finalizers") and \
                            (pod.get("status") or {}).get("phase") == "Running":
                        self._terminate(pod)
            except Exception as e:  # noqa: BLE001 - a missed round is retried
                say(f"  (terminator: {e!r})")

    def _terminate(self, pod: dict) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        statuses = [{"name": c["name"], "image": c["image"], "imageID": "", "ready": False, "restartCount": 0,
                     "started": False, "state": {"terminated": {"exitCode": 137, "reason": "Error",
                                                                "startedAt": now, "finishedAt": now}}}
                    for c in pod["spec"]["containers"]]
        self.api.request("PATCH", f"/api/v1/namespaces/{self.namespace}/pods/{pod['metadata']['name']}/status",
                         {"status": {"phase": "Failed", "containerStatuses": statuses}},
                         content_type="application/merge-patch+json", ok=(404, 409, 422))
        self.terminated += 1

    def close(self) -> None:
        self.done.set()
        self.thread.join(5)


def base_pod(name: str, namespace: str, rdma: bool) -> dict:
    """One worker: 1 GPU (+ an RDMA NIC, host network, IPC_LOCK: the seed's JobSet worker)."""
    limits = {"nvidia.com/gpu": "1"}
    spec: dict[str, Any] = {"terminationGracePeriodSeconds": 0, "containers": [
        {"name": "worker", "image": "registry.example/trainer:1", "resources": {"limits": limits}}]}
    if rdma:
        limits["aliyun.com/rdma"] = "1"
        spec["hostNetwork"] = True
        spec["containers"][0]["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace, "labels": {},
                                                             "annotations": {}}, "spec": spec}


# -- Phalanx ------------------------------------------------------------------------------------
class Phalanx(Backend):
    name, label = "phalanx", "Phalanx"
    team_queues: dict[str, str]
    """The scenario's team -> its Queue (``prepare``); empty without teams."""

    def start(self, namespace: str) -> None:
        cluster = ClusterFile(tuple(
            ClusterNode(self.layout.name(i), {"lj_runtimekit_enable": "true", **self.layout.labels(i)}, str(TOPOLOGY),
                        "Tesla V100-SXM2-16GB", 16384) for i in range(self.layout.nodes)))
        kube = ["--cluster", "kube", "--kubeconfig", str(self.plane.kubeconfig),
                "--kube-api-qps", str(self.qps), "--kube-api-burst", str(self.qps)]
        self.stack = Stack(cluster, workdir=str(self.work / f"phalanx-{namespace}"), fleet=True, service_args={
            "placement": kube, "gang-coordinator": kube, "binder": kube,
            "node-fleet": [*kube, "--heartbeat-s", "10", "--label-refresh-s", "3600"]})
        self.stack.start_nats()
        self.stack.start_services(timeout_s=240)
        deadline = time.monotonic() + 120
        while True:
            items = self.api.get("/api/v1/nodes", query={"labelSelector": "type=kwok"})["items"]
            if sum(1 for i in items if i["status"].get("capacity", {}).get("aliyun.com/gpu-core")) >= self.layout.nodes:
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the node fleet did not advertise every node within 120 s")
            time.sleep(1)
        time.sleep(2)

    def stop(self) -> None:
        self.stack.stop()

    def pids(self) -> list[int]:
        return [self.stack.procs[s].proc.pid for s in ("placement", "gang-coordinator", "binder")] + \
            [self.stack.nats.proc.pid]

    def prepare(self, namespace: str, gangs: list[Gang], teams: dict[str, float]) -> None:
        """For a scenario with teams: Phalanx's Queue CRD and one Queue per team with its share of
        the GPUs as quota, under a parent holding the whole cluster (docs/queues.md); the teams
        borrow each other's idle quota with the default weight, as Kueue's cohort does."""
        self.team_queues = {}
        if not teams:
            return
        apply_crds(self.plane, [d for f in sorted(PHALANX_CRDS.glob("*.yaml")) for d in yaml.safe_load_all(
            f.read_text()) if d])
        queues = [("peers-org", "", self.layout.gpus)] + [
            (f"peers-team-{team}", "peers-org", int(share * self.layout.gpus)) for team, share in teams.items()]
        for name, parent, quota in queues:
            self.api.apply({"apiVersion": "scheduling.phalanx.io/v1alpha1", "kind": "Queue", "metadata": {"name": name},
                            "spec": {**({"parent": parent} if parent else {}),
                                     "resources": {"nvidia.com/gpu": {"quota": quota}}}})
        self.team_queues = {team: f"peers-team-{team}" for team in teams}
        time.sleep(3)  # gang-coordinator reads the Queue objects every 2 s

    def dress(self, pod: dict, gang: Gang | None, team: str) -> dict:
        pod["spec"]["schedulerName"] = "phalanx"
        if team:
            pod["metadata"]["labels"]["scheduling.phalanx.io/queue"] = self.team_queues[team]
        if gang:
            pod["metadata"]["labels"] |= {"jobset.sigs.k8s.io/jobset-name": gang.name,
                                          "aliyun.com/min-member": str(gang.size)}
            pod["metadata"]["annotations"]["phalanx.io/gang-timeout-seconds"] = str(GANG_TIMEOUT_S)
        return pod


# -- kube-scheduler -----------------------------------------------------------------------------
class KubePlain(Backend):
    name, label = "kube", "kube-scheduler"
    queues = "n/a: kube-scheduler has no queues or quota"

    def start(self, namespace: str) -> None:
        self.start_kube_scheduler("")

    def stop(self) -> None:
        self.plane._terminate("kube-scheduler")

    def pids(self) -> list[int]:
        return self._scheduler_pids()

    def dress(self, pod: dict, gang: Gang | None, team: str) -> dict:
        pod["spec"]["schedulerName"] = "default-scheduler"
        return pod


class KubeGang(KubePlain):
    name, label = "kube-gang", "kube-sched gang+TAS"

    def start(self, namespace: str) -> None:
        self.start_kube_scheduler("GenericWorkload=true,TopologyAwareWorkloadScheduling=true")

    def prepare(self, namespace: str, gangs: list[Gang], teams: dict[str, float]) -> None:
        for g in gangs:
            self.api.post(f"/apis/scheduling.k8s.io/v1beta1/namespaces/{namespace}/podgroups", {
                "apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
                "metadata": {"name": g.name, "namespace": namespace},
                "spec": {"schedulingPolicy": {"gang": {"minCount": g.size}},
                         "schedulingConstraints": {"topology": [{"key": REQUIRED_LEVEL}]}}})

    def dress(self, pod: dict, gang: Gang | None, team: str) -> dict:
        super().dress(pod, gang, team)
        if gang:
            pod["spec"]["schedulingGroup"] = {"podGroupName": gang.name}
        return pod

    def reason(self, namespace: str, pod: dict, gang: str) -> list[str]:
        out = super().reason(namespace, pod, gang)
        _, pg = self.api.request("GET", f"/apis/scheduling.k8s.io/v1beta1/namespaces/{namespace}/podgroups/{gang}",
                                 ok=(404,))
        for c in (pg.get("status") or {}).get("conditions") or []:
            out.append(f"PodGroup condition {c.get('type')}={c.get('status')} {c.get('reason', '')}: {c.get('message', '')}")
        return out

    def cleanup(self, namespace: str) -> None:
        super().cleanup(namespace)
        self.api.request("DELETE", f"/apis/scheduling.k8s.io/v1beta1/namespaces/{namespace}/podgroups", {})
