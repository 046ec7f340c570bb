"""One release of deploy/helm/phalanx on the real kube-apiserver, from install to uninstall.

The control plane runs kube-scheduler, kwok (three GPU nodes: the Deployments', DaemonSets' and
nats StatefulSet's pods "run" there), kube-controller-manager (workload controllers, the volume
binder, the garbage collector) and a stand-in kubelet on a fourth node for the credentials hook
Jobs, which really run ``phalanx bus kube-secrets`` under the hook's own ServiceAccount
(hookrunner.py). ``helm install --wait``, then every object and every Secret is checked (the
certificate, the credentials chain, a real nats-server accepting them), ``helm upgrade`` with
more placement replicas, ``helm upgrade`` with a new credentials rotation, and ``helm
uninstall``: nothing of the release is left but the nats volumes the chart says it keeps.
"""

from __future__ import annotations

import base64
import secrets

import anyio
import pytest
import yaml
from helmtool import (
    CHART,
    SECRET_MATERIAL,
    Helm,
    account_signing_roles,
    check_certificate,
    creds_issuer,
    helm_binary,
    nats_accepts,
    values_file,
)
from hookrunner import HookRunner, runner_node
from kubecontrollers import wait_for
from kubeharness import ControlPlane, HarnessError, KubeApi, fake_gpu_node

pytestmark = pytest.mark.e2e

TEST_TAINT = "phalanx.io/helm-test"
GENERATED_SECRETS = {"phalanx-nats-auth", "phalanx-nats-keys", "phalanx-nats-admin", "phalanx-nats-gang-coordinator",
                     "phalanx-nats-placement", "phalanx-nats-binder", "phalanx-nats-tls"}
CLUSTER_KINDS = {"ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
WORKLOADS = {"Deployment": ("phalanx-gang-coordinator", "phalanx-placement", "phalanx-binder"),
             "DaemonSet": ("phalanx-topology-discovery", "phalanx-mig-manager"), "StatefulSet": ("nats",)}


class Cluster:
    """Nodes and volumes of this test, removed afterwards (they would change other tests' node
    counts): three kwok GPU nodes, the hook runner's node and one pre-bound volume per nats server."""

    def __init__(self, api: KubeApi, ns: str) -> None:
        self.api, self.ns, self.id = api, ns, secrets.token_hex(3)
        self.gpu_nodes = [f"helm-{self.id}-gpu-{i}" for i in range(3)]
        self.runner = f"helm-{self.id}-hooks"

    def create(self) -> None:
        for name in self.gpu_nodes:
            node = fake_gpu_node(name, labels={TEST_TAINT: self.id, "lj_runtimekit_enable": self.id})
            node["spec"] = {"taints": [{"key": TEST_TAINT, "value": self.id, "effect": "NoSchedule"}]}
            self.api.create_node(node)
        self.api.create_node(runner_node(self.runner, f"{TEST_TAINT}-hooks"))
        for i in range(3):
            self.api.post("/api/v1/persistentvolumes", {
                "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"helm-{self.id}-nats-{i}"},
                "spec": {"capacity": {"storage": "10Gi"}, "accessModes": ["ReadWriteOnce"],
                         "hostPath": {"path": f"/tmp/helm-{self.id}-{i}"}, "storageClassName": "",
                         "claimRef": {"namespace": self.ns, "name": f"data-nats-{i}"}}})

    def values(self) -> dict:
        """Every pod on this test's nodes only (its own label and taint): other tests' GPU nodes carry
        lj_runtimekit_enable=true, these carry this test's id as the value."""
        on_gpu = [{"key": TEST_TAINT, "operator": "Equal", "value": self.id, "effect": "NoSchedule"}]
        return {"nodeAgents": {"nodeSelector": {"lj_runtimekit_enable": self.id},
                               "tolerations": on_gpu},
                "nodeSelector": {TEST_TAINT: self.id}, "tolerations": on_gpu,
                "credentials": {"job": {"nodeSelector": {f"{TEST_TAINT}-hooks": self.runner},
                                        "tolerations": [{"key": f"{TEST_TAINT}-hooks", "operator": "Exists"}]}}}

    def remove(self) -> None:
        for i in range(3):
            self.api.delete(f"/api/v1/namespaces/{self.ns}/persistentvolumeclaims/data-nats-{i}")
            self.api.delete(f"/api/v1/persistentvolumes/helm-{self.id}-nats-{i}")
        for name in [*self.gpu_nodes, self.runner]:
            self.api.delete(f"/api/v1/nodes/{name}")


@pytest.fixture
def helm(kube, kube_scheduler, kube_controller_manager) -> Helm:
    try:
        return Helm(helm_binary(), kube)
    except HarnessError as e:
        pytest.fail(str(e), pytrace=False)


def read_secrets(api: KubeApi, ns: str) -> dict[str, dict]:
    items = api.get(f"/api/v1/namespaces/{ns}/secrets",
                    query={"labelSelector": "app.kubernetes.io/managed-by=phalanx-bus-kube-secrets"})["items"]
    return {s["metadata"]["name"]: s for s in items}


def decoded(secret: dict) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in secret["data"].items()}


def wait_workloads_ready(api: KubeApi, ns: str, placement_replicas: int) -> None:
    want = {"phalanx-gang-coordinator": 1, "phalanx-placement": placement_replicas, "phalanx-binder": 2,
            "phalanx-topology-discovery": 3, "phalanx-mig-manager": 3, "nats": 3}

    def ready() -> dict[str, int]:
        got = {}
        for kind, names in WORKLOADS.items():
            for name in names:
                st = api.get(f"/apis/apps/v1/namespaces/{ns}/{kind.lower()}s/{name}").get("status", {})
                got[name] = st.get("numberReady" if kind == "DaemonSet" else "readyReplicas", 0)
                if kind == "Deployment":  # a finished rollout: only new pods left
                    got[name] = got[name] if st.get("updatedReplicas") == st.get("replicas") else -1
        return got

    wait_for(lambda: ready() == want, 120, f"every workload ready as {want} (last: {ready()})")


def check_generated_secrets(api: KubeApi, ns: str, plane: ControlPlane, rotation: str) -> dict[str, dict[str, bytes]]:
    """The hook's Secrets: all there, labelled, and consistent: the certificate names the nats
    Services and is signed by the CA; each credential is signed by its identity's signing key in
    the account that auth.conf trusts; keys.json holds that operator; a real nats-server serving
    them accepts admin and placement."""
    found = read_secrets(api, ns)
    assert set(found) == GENERATED_SECRETS
    assert {s["metadata"]["annotations"]["phalanx.io/rotation"] for s in found.values()} == {rotation}
    data = {name: decoded(s) for name, s in found.items()}
    tls = data["phalanx-nats-tls"]
    assert found["phalanx-nats-tls"]["type"] == "kubernetes.io/tls"
    check_certificate(tls["tls.crt"], tls["ca.crt"], {f"nats.{ns}.svc", f"*.nats-headless.{ns}.svc",
                                                      f"nats.{ns}.svc.cluster.local"})
    operator, roles, account = account_signing_roles(data["phalanx-nats-auth"]["auth.conf"].decode())
    assert sorted(roles.values()) == sorted(r for r in roles.values())  # one role per signing key
    for identity in ("gang-coordinator", "placement", "binder"):
        issuer, name = creds_issuer(data[f"phalanx-nats-{identity}"]["creds"].decode())
        assert (roles.get(issuer), name) == (identity, identity)
    assert creds_issuer(data["phalanx-nats-admin"]["creds"].decode()) == (account, "admin")
    from phalanx_bus.credentials import KeySet, public_key

    assert public_key(KeySet.from_json(data["phalanx-nats-keys"]["keys.json"].decode()).operator) == operator
    info = anyio.run(nats_accepts, plane.workdir, data, ns)
    assert "streams" in info, info
    return data


def check_nothing_printed(runner: HookRunner, helm_outputs: list[str]) -> None:
    assert runner.outputs and all(code == 0 for _, code, _ in runner.outputs), runner.outputs
    for _, _, printed in runner.outputs:
        assert not SECRET_MATERIAL.search(printed), printed
    for out in helm_outputs:
        assert not SECRET_MATERIAL.search(out)


def release_objects(helm: Helm, release: str, ns: str) -> list[dict]:
    out = helm.run("get", "manifest", release, "-n", ns).stdout
    assert not SECRET_MATERIAL.search(out), "the release manifest must hold no key material"
    return [d for d in yaml.safe_load_all(out) if d]


def test_install_upgrade_rotate_and_uninstall_leave_only_the_volumes_the_chart_keeps(helm, kube, kube_api, kube_ns):
    ns = kube_ns
    cluster = Cluster(kube_api, ns)
    release = f"phalanx-{cluster.id}"
    cluster.create()
    values = values_file(helm.home, cluster.values())
    wait = ("--wait=watcher", "--timeout", "180s")
    try:
        with HookRunner(kube, ns, cluster.runner) as runner:
            # install: the hook makes the Secrets, every workload runs
            out = helm.run("install", release, str(CHART), "-n", ns, "-f", values, *wait)
            assert "STATUS: deployed" in out.stdout
            wait_workloads_ready(kube_api, ns, placement_replicas=2)
            objs = release_objects(helm, release, ns)
            for obj in objs:
                live = kube_api.get(kube_api.resource_path(obj))
                assert live["metadata"]["labels"]["app.kubernetes.io/instance"] == release
                assert ("namespace" in live["metadata"]) == (obj["kind"] not in CLUSTER_KINDS)
            pods = kube_api.get(f"/api/v1/namespaces/{ns}/pods")["items"]
            agents = sorted(p["spec"]["nodeName"] for p in pods
                            if p["metadata"]["labels"]["app.kubernetes.io/name"] == "phalanx-topology-discovery")
            assert agents == sorted(cluster.gpu_nodes), "one node agent per labelled GPU node"
            running = [p for p in pods if p["spec"].get("nodeName") in cluster.gpu_nodes]  # not the hooks' node
            assert all(p["status"]["phase"] == "Running" for p in running), [
                (p["metadata"]["name"], p["status"].get("phase")) for p in pods]
            assert len(running) == 1 + 2 + 2 + 3 + 3 + 3 + 1, "the services, nats and bus-init, all on the GPU nodes"
            first = check_generated_secrets(kube_api, ns, kube, rotation="")
            assert not [o for o in kube_api.get(f"/apis/batch/v1/namespaces/{ns}/jobs")["items"]
                        if o["metadata"]["name"].startswith("phalanx-credentials")], "hook Jobs are removed on success"

            # upgrade: more placement replicas; the credentials stay (the seeds moved offline by the
            # admin do not count as missing), bus-init runs again
            kube_api.delete(f"/api/v1/namespaces/{ns}/secrets/phalanx-nats-keys")
            out2 = helm.run("upgrade", release, str(CHART), "-n", ns, "--reuse-values",
                            "--set", "placement.replicas=3", *wait)
            wait_workloads_ready(kube_api, ns, placement_replicas=3)
            kept = {n: decoded(s) for n, s in read_secrets(kube_api, ns).items()}
            assert kept == {n: v for n, v in first.items() if n != "phalanx-nats-keys"}
            jobs = {j["metadata"]["name"] for j in kube_api.get(f"/apis/batch/v1/namespaces/{ns}/jobs")["items"]}
            assert jobs == {"phalanx-bus-init-2"}

            # rotation: a new value replaces every key and certificate and rolls the pods
            out3 = helm.run("upgrade", release, str(CHART), "-n", ns, "--reuse-values",
                            "--set", "credentials.rotation=2026-12-04", *wait)
            wait_workloads_ready(kube_api, ns, placement_replicas=3)
            rotated = check_generated_secrets(kube_api, ns, kube, rotation="2026-12-04")
            assert all(rotated[n] != first[n] for n in GENERATED_SECRETS)
            template = kube_api.get(f"/apis/apps/v1/namespaces/{ns}/deployments/phalanx-placement")["spec"]["template"]
            assert template["metadata"]["annotations"]["phalanx.io/rotation"] == "2026-12-04"

            # uninstall: the post-delete hook removes the Secrets; only the nats volumes stay
            out4 = helm.run("uninstall", release, "-n", ns, *wait)
            check_nothing_printed(runner, [out.stdout, out2.stdout, out3.stdout, out4.stdout])
            did = [sorted({line.rsplit(" ", 1)[1] for line in printed.splitlines()}) for _, _, printed in runner.outputs]
            assert did == [["created"], ["kept"], ["created", "replaced"], ["deleted"]], runner.outputs

        def left() -> list[str]:
            names = []
            for obj in objs:
                if kube_api.request("GET", kube_api.resource_path(obj), ok=(404,))[0] != 404:
                    names.append(f"{obj['kind']}/{obj['metadata']['name']}")
            for plural in ("pods", "secrets", "serviceaccounts", "configmaps"):
                for item in kube_api.get(f"/api/v1/namespaces/{ns}/{plural}")["items"]:
                    if item["metadata"]["name"] not in ("kube-root-ca.crt",):
                        names.append(f"{plural}/{item['metadata']['name']}")
            for api in ("batch/v1/namespaces/{ns}/jobs", "rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
                        "rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings", "apps/v1/namespaces/{ns}/replicasets",
                        "apps/v1/namespaces/{ns}/controllerrevisions"):
                names += [f"{api.rsplit('/', 1)[1]}/{o['metadata']['name']}"
                          for o in kube_api.get("/apis/" + api.format(ns=ns))["items"]]
            return names

        wait_for(lambda: not left(), 90, "nothing of the release left")
        for crd in (d for f in sorted((CHART / "crds").glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d):
            assert kube_api.get(kube_api.resource_path(crd))["metadata"]["name"] == crd["metadata"]["name"]
        pvcs = kube_api.get(f"/api/v1/namespaces/{ns}/persistentvolumeclaims")["items"]
        assert sorted(p["metadata"]["name"] for p in pvcs) == ["data-nats-0", "data-nats-1", "data-nats-2"]
        gone = helm.run("status", release, "-n", ns, check=False)
        assert gone.returncode == 1 and "release: not found" in gone.stderr, gone.stderr
    finally:
        cluster.remove()
