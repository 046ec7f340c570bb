"""The ``kueue`` backend of ``bench/peers.py`` (the interface and the other backends are in
``bench/peers_backends.py``).

Kueue v0.17.0, the real manager (``cmd/kueue``), installed once per control plane (its CRDs,
a self-signed webhook certificate, the Topology, ResourceFlavor and ClusterQueue), with
Topology Aware Scheduling and waitForPodsReady, its webhooks on loopback and only the ``pod``
integration: it admits plain-pod groups that kube-scheduler v1.37.2 then binds to the nodes
Kueue's topology assignment chose. A scenario with teams gets one ClusterQueue per team in a
cohort.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubeharness import HarnessError, free_port

from kwokbench import say
from peers_backends import GANG_TIMEOUT_S, REQUIRED_LEVEL, Backend, Gang
from phalanx_bench.peers import LABELS

KUEUE_NS_LABEL = "peers.phalanx.io/kueue"
KUEUE_METRICS_CERTS = Path("/etc/kueue/metrics/certs")
"""Kueue v0.17.0 reads its metrics server's certificate from this fixed path whenever its
internal certificate management is off (cmd/kueue/main.go), even with metrics disabled, and
exits when the files are missing."""
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def self_signed(directory: Path, cn: str) -> None:
    """``tls.crt``/``tls.key`` for 127.0.0.1 in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30", "-subj", f"/CN={cn}",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(directory / "tls.key"),
                    "-out", str(directory / "tls.crt")], check=True, capture_output=True, timeout=30)


@dataclass
class KueueSetup:
    """What is installed once per control plane: CRDs, certificates, cluster objects."""

    installed: bool = False
    cert_dir: Path | None = None
    queues: dict[str, str] = field(default_factory=dict)


class Kueue(Backend):
    """Kueue's manager with only the ``pod`` integration; pods carry the queue label, the
    pod-group labels and ``podset-required-topology``; kube-scheduler binds them after Kueue's
    TopologyUngater removed the topology gate and set each pod's node selector."""

    name, label = "kueue", "Kueue TAS"
    setup = KueueSetup()

    def manifests(self) -> Path:
        return self.peers_bin / "manifests" / "kueue"

    def install(self) -> None:
        if self.setup.installed:
            return
        api = self.api
        names = []
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        for f in sorted(self.manifests().glob("kueue.x-k8s.io_*.yaml")):
            for doc in yaml.load_all(f.read_text(), Loader=loader):
                if doc:
                    api.apply(doc)
                    names.append(doc["metadata"]["name"])
        deadline = time.monotonic() + 90
        for n in names:
            while not any(c["type"] == "Established" and c["status"] == "True" for c in (api.get(
                    f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{n}").get("status") or {}).get(
                    "conditions") or []):
                if time.monotonic() > deadline:
                    raise HarnessError(f"Kueue CRD {n} not Established after 90 s")
                time.sleep(0.3)
        api.__dict__.pop("_discovery", None)
        api.create_namespace("kueue-system")
        self.setup.cert_dir = self.work / "kueue-certs"
        self.setup.cert_dir.mkdir(parents=True, exist_ok=True)
        self_signed(self.setup.cert_dir, "kueue-webhook.phalanx-peers")
        if not (KUEUE_METRICS_CERTS / "tls.crt").is_file():
            try:
                self_signed(KUEUE_METRICS_CERTS, "kueue-metrics.phalanx-peers")
            except OSError as e:
                raise HarnessError(f"Kueue needs a certificate in {KUEUE_METRICS_CERTS} (a fixed path in its "
                                   f"cmd/kueue/main.go) and it cannot be written here: {e}") from e
            say(f"  wrote a self-signed certificate to {KUEUE_METRICS_CERTS} (Kueue's fixed metrics cert path)")
        self.setup.installed = True

    def start(self, namespace: str) -> None:
        self.install()
        self.start_kube_scheduler("")
        plane, work = self.plane, self.work
        for attempt in range(3):
            webhook_port, probe_port = free_port(), free_port()
            config = {
                "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration", "namespace": "kueue-system",
                "health": {"healthProbeBindAddress": f"127.0.0.1:{probe_port}"}, "metrics": {"bindAddress": "0"},
                "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(self.setup.cert_dir)},
                "leaderElection": {"leaderElect": False}, "internalCertManagement": {"enable": False},
                "clientConnection": {"qps": self.qps, "burst": self.qps},
                "waitForPodsReady": {"timeout": f"{GANG_TIMEOUT_S}s", "blockAdmission": False,
                                     "requeuingStrategy": {"timestamp": "Eviction", "backoffBaseSeconds": 10}},
                "managedJobsNamespaceSelector": {"matchLabels": {KUEUE_NS_LABEL: "true"}},
                "integrations": {"frameworks": ["pod"]}}
            (work / "kueue.yaml").write_text(json.dumps(config, indent=1))
            plane._run("kueue", [self.peers_bin / "kueue", f"--config={work / 'kueue.yaml'}",
                                 f"--kubeconfig={plane.kubeconfig}", "--feature-gates=VisibilityOnDemand=false",
                                 "--zap-log-level=info"])
            try:
                plane._wait("kueue", lambda p=probe_port: plane._http_ok(f"http://127.0.0.1:{p}/readyz"), 120)
                break
            except HarnessError:
                plane._terminate("kueue")
                if attempt == 2:
                    raise
        self._register_webhooks(webhook_port)
        self._cluster_objects()

    def _register_webhooks(self, port: int) -> None:
        """Kueue's own objects' webhooks and the pod webhook of the release, pointed at the
        loopback server by URL; the pod webhook only for the bench's Kueue namespaces."""
        ca = base64.b64encode((self.setup.cert_dir / "tls.crt").read_bytes()).decode()
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        for doc in yaml.load_all((self.manifests() / "manifests.yaml").read_text(), Loader=loader):
            if not doc:
                continue
            hooks = []
            for hook in doc["webhooks"]:
                path = hook["clientConfig"]["service"]["path"]
                if "kueue-x-k8s-io" not in path and not path.endswith("--v1-pod"):
                    continue
                hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca}
                hook["timeoutSeconds"] = 30
                if path.endswith("--v1-pod"):
                    hook["namespaceSelector"] = {"matchLabels": {KUEUE_NS_LABEL: "true"}}
                hooks.append(hook)
            doc["metadata"]["name"] = "peers-kueue-" + doc["metadata"]["name"]
            doc["webhooks"] = hooks
            self.api.apply(doc)

    def _cluster_objects(self) -> None:
        """The Topology (the tiers as Kueue levels, hostname last so pods get a node), the
        ResourceFlavor that uses it, and the ClusterQueue holding every GPU."""
        api, gpus = self.api, self.layout.gpus
        api.apply({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Topology", "metadata": {"name": "peers"},
                   "spec": {"levels": [{"nodeLabel": LABELS["netpod"]}, {"nodeLabel": LABELS["leaf"]},
                                       {"nodeLabel": LABELS["hypernode"]}, {"nodeLabel": "kubernetes.io/hostname"}]}})
        api.apply({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "tas-gpu"},
                   "spec": {"nodeLabels": {"type": "kwok"}, "topologyName": "peers"}})
        self._cluster_queue("all", gpus, None)

    def _cluster_queue(self, name: str, quota: int, cohort: str | None) -> None:
        rs = [{"name": r, "nominalQuota": str(quota)} for r in ("nvidia.com/gpu", "aliyun.com/rdma")]
        spec: dict[str, Any] = {"namespaceSelector": {}, "resourceGroups": [{
            "coveredResources": ["nvidia.com/gpu", "aliyun.com/rdma"], "flavors": [{"name": "tas-gpu", "resources": rs}]}]}
        if cohort:
            spec |= {"cohortName": cohort, "preemption": {"reclaimWithinCohort": "Any", "withinClusterQueue": "Never"}}
        self.api.apply({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
                        "metadata": {"name": f"peers-{name}"}, "spec": spec})

    def prepare(self, namespace: str, gangs: list[Gang], teams: dict[str, float]) -> None:
        self.api.request("PATCH", f"/api/v1/namespaces/{namespace}", {"metadata": {"labels": {KUEUE_NS_LABEL: "true"}}},
                         content_type="application/merge-patch+json")
        for team, share in (teams or {"": 1.0}).items():
            cq = "all"
            if team:
                cq = f"team-{team}"
                self._cluster_queue(cq, int(share * self.layout.gpus), "peers-org")
            self.api.apply({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                            "metadata": {"name": cq, "namespace": namespace},
                            "spec": {"clusterQueue": f"peers-{cq}"}})
            self.setup.queues[team] = cq

    def dress(self, pod: dict, gang: Gang | None, team: str) -> dict:
        pod["spec"]["schedulerName"] = "default-scheduler"
        meta = pod["metadata"]
        meta["labels"][QUEUE_LABEL] = self.setup.queues.get(team, "all")
        meta["annotations"]["kueue.x-k8s.io/podset-required-topology"] = REQUIRED_LEVEL
        if gang:
            meta["labels"]["kueue.x-k8s.io/pod-group-name"] = gang.name
            meta["annotations"]["kueue.x-k8s.io/pod-group-total-count"] = str(gang.size)
        return pod

    def reason(self, namespace: str, pod: dict, gang: str) -> list[str]:
        out = super().reason(namespace, pod, gang)
        for wl in self.api.get(f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{namespace}/workloads")["items"]:
            owners = {o.get("name") for o in wl["metadata"].get("ownerReferences") or []}
            if pod["metadata"]["name"] in owners or wl["metadata"]["name"] == gang:
                for c in (wl.get("status") or {}).get("conditions") or []:
                    out.append(f"Workload condition {c.get('type')}={c.get('status')} {c.get('reason', '')}: "
                               f"{c.get('message', '')}")
                break
        return out

    def cleanup(self, namespace: str) -> None:
        """Workloads first, then the pods; the bench takes Kueue's ``kueue.x-k8s.io/managed``
        finalizer off the deleted pods itself (Kueue keeps it on a group whose pods are deleted
        while its Workload is still admitted, and the phase does not wait for that)."""
        api = self.api
        api.request("DELETE", f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{namespace}/workloads", {})
        api.request("DELETE", f"/api/v1/namespaces/{namespace}/pods", {"gracePeriodSeconds": 0})
        for pod in api.get(f"/api/v1/namespaces/{namespace}/pods")["items"]:
            if pod["metadata"].get("finalizers"):
                api.request("PATCH", f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}",
                            {"metadata": {"finalizers": None}}, content_type="application/merge-patch+json",
                            ok=(404, 409))
        super().cleanup(namespace)

    def stop(self) -> None:
        for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
            for item in self.api.get(f"/apis/admissionregistration.k8s.io/v1/{kind}")["items"]:
                if item["metadata"]["name"].startswith("peers-kueue-"):
                    self.api.delete(f"/apis/admissionregistration.k8s.io/v1/{kind}/{item['metadata']['name']}")
        self.plane._terminate("kueue")
        self.plane._terminate("kube-scheduler")

    def pids(self) -> list[int]:
        p = self.plane.procs.get("kueue")
        return self._scheduler_pids() + ([p.pid] if p else [])
