"""deploy/k8s: every manifest passes the real apiserver's validation and admission (server-side
dry run), and the workloads are wired the way docs/kubernetes.md says."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.e2e

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
NAMESPACE = "phalanx-system"
SERVICES = {  # service -> (kind, talks to the Kubernetes API)
    "gang-coordinator": ("Deployment", True),
    "placement": ("Deployment", False),
    "binder": ("Deployment", True),
    "topology-discovery": ("DaemonSet", True),
    "mig-manager": ("DaemonSet", False),
}


def render() -> list[dict]:
    """The base as kustomize builds it. It uses no transformers (checked here), so rendering is
    reading the listed files in order."""
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert set(kustomization) == {"apiVersion", "kind", "resources"}, "the base must stay transformer-free"
    listed = kustomization["resources"]
    assert sorted(listed) == sorted(p.name for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml")
    return [d for f in listed for d in yaml.safe_load_all((DEPLOY / f).read_text()) if d]


def by_kind(objs: list[dict], kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objs if o["kind"] == kind}


def test_kubectl_kustomize_builds_the_same_objects():
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed; the transformer-free rendering is still checked by the other tests")
    out = subprocess.run([kubectl, "kustomize", str(DEPLOY)], capture_output=True, text=True, timeout=60, check=True)
    built = [d for d in yaml.safe_load_all(out.stdout) if d]
    key = lambda o: (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"])  # noqa: E731
    assert sorted(map(key, built)) == sorted(map(key, render()))


def test_every_manifest_passes_a_server_side_dry_run(kube_api):
    kube_api.create_namespace(NAMESPACE)  # for real: namespaced dry runs need it
    objs = render()
    assert len(objs) >= 19
    for obj in objs:
        result = kube_api.apply(obj, dry_run=True)
        assert (result["kind"], result["metadata"]["name"]) == (obj["kind"], obj["metadata"]["name"])
    assert kube_api.request("GET", f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/phalanx-binder",
                            ok=(404,))[0] == 404, "a dry run must not create anything"


def test_every_object_lives_in_phalanx_system_or_is_cluster_scoped():
    for obj in render():
        if obj["kind"] in ("Namespace", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
                           "ValidatingAdmissionPolicyBinding"):
            assert "namespace" not in obj["metadata"], obj["metadata"]
        else:
            assert obj["metadata"]["namespace"] == NAMESPACE, obj["metadata"]


@pytest.mark.parametrize("service", SERVICES)
def test_each_service_runs_phalanx_with_its_own_account_probes_and_the_bus_url(service):
    kind, uses_api = SERVICES[service]
    objs = render()
    workload = by_kind(objs, kind)[f"phalanx-{service}"]
    pod = workload["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["phalanx"]
    assert container["args"][:2] == ["run", service]
    assert ("--cluster" in container["args"]) == uses_api
    if uses_api:
        assert container["args"][container["args"].index("--cluster") + 1] == "kube"
    assert container["args"][-2:] == ["--health-addr", "0.0.0.0:8080"]
    env = {e["name"]: e for e in container["env"]}
    assert (env["PHALANX_NATS_URL"]["value"], env["PHALANX_NATS_CREDS"]["value"], env["PHALANX_NATS_CA"]["value"]) == (
        "tls://nats.phalanx-system.svc:4222", f"/etc/phalanx/nats/creds/{service}.creds", "/etc/phalanx/nats/ca/ca.crt")
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {"name": "health", "containerPort": 8080} in container["ports"]
    assert pod["serviceAccountName"] == f"phalanx-{service}"
    assert f"phalanx-{service}" in by_kind(objs, "ServiceAccount")
    assert pod.get("automountServiceAccountToken", True) == uses_api
    if kind == "DaemonSet":
        assert pod["nodeSelector"] == {"lj_runtimekit_enable": "true"}
        assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    privileged = (container.get("securityContext") or {}).get("privileged", False)
    assert privileged == (service == "mig-manager"), "only mig-manager needs privileges (MIG configuration)"
    host_paths = {v["hostPath"]["path"] for v in pod.get("volumes", []) if "hostPath" in v}
    mounts = {m["mountPath"]: m.get("readOnly", False) for m in container.get("volumeMounts", [])}
    assert host_paths == {"topology-discovery": {"/sys", "/var/lib/kubelet/device-plugins", "/var/lib/kubelet/pod-resources",
                                                 "/var/lib/phalanx", "/etc/phalanx/nats"},
                          "mig-manager": {"/sys", "/dev", "/etc/phalanx/nats"}}.get(service, set())
    assert mounts.get("/sys", True), "/sys is mounted read-only"
    assert mounts["/etc/phalanx/nats/creds"] and mounts["/etc/phalanx/nats/ca"], "credentials are mounted read-only"
    volumes = {v["name"]: v for v in pod["volumes"]}
    if kind == "DaemonSet":  # a node agent's credential is its node's own, provisioned on the node
        assert volumes["nats-creds"]["hostPath"] == {"path": "/etc/phalanx/nats", "type": "Directory"}
    else:
        assert volumes["nats-creds"]["secret"] == {"secretName": f"phalanx-nats-{service}",
                                                   "items": [{"key": "creds", "path": f"{service}.creds"}]}
    assert volumes["nats-ca"]["secret"] == {"secretName": "phalanx-nats-tls", "items": [{"key": "ca.crt", "path": "ca.crt"}]}


def test_nats_runs_a_three_node_jetstream_cluster_with_tls_routes_and_auth():
    objs = render()
    sts = by_kind(objs, "StatefulSet")["nats"]
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    image, tag = container["image"].split(":")
    assert image == "nats" and tuple(int(x) for x in tag.split("-")[0].split(".")[:2]) >= (2, 12)
    assert (sts["spec"]["replicas"], container["args"]) == (3, ["-c", "/etc/nats/nats.conf"])
    assert sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    conf = by_kind(objs, "ConfigMap")["nats-config"]["data"]["nats.conf"]
    routes = [f"tls://nats-{i}.nats-headless.phalanx-system.svc:6222" for i in range(3)]
    assert all(r in conf for r in routes) and "verify: true" in conf and 'include "auth/auth.conf"' in conf
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "phalanx-nats-tls"
    assert volumes["auth"]["secret"]["secretName"] == "phalanx-nats-auth"
    job = by_kind(objs, "Job")["phalanx-bus-init"]["spec"]["template"]["spec"]
    assert job["containers"][0]["args"] == ["bus", "init", "--replicas", "3"]


def test_only_phalanx_pods_reach_nats_and_only_monitoring_its_monitor_port():
    policy = by_kind(render(), "NetworkPolicy")["nats"]["spec"]
    assert policy["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "nats"}}
    rules = {r["ports"][0]["port"]: r["from"] for r in policy["ingress"]}
    assert rules == {
        4222: [{"podSelector": {"matchLabels": {"app.kubernetes.io/part-of": "phalanx"}}}],
        6222: [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "nats"}}}],
        8222: [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
    }
