"""Real workload controllers on the test control plane: kube-controller-manager (Job controller,
garbage collector, resourceclaim controller, ...), the JobSet controller (with its admission
webhooks), the LeaderWorkerSet controller (with its webhooks; built by ``tools/lws/build.sh``)
and the Kubeflow MPI Operator, each with the CRDs it serves.

The binaries and manifests come from ``tools/kube/build.sh`` (kube-controller-manager) and
``tools/controllers/build.sh`` (jobset-controller, mpi-operator, and the CRD/webhook YAML copied
from the very module versions they were built from, listed in ``manifests/SOURCES``). Missing
pieces give a ``HarnessError`` naming the build command, never a skip.

Each controller runs once per control plane, started on first use (``ensure_*``), as a process of
that plane: ``ControlPlane.stop()`` ends it with the rest. Everything listens on 127.0.0.1 on free
ports and authenticates as the harness admin (RBAC of the controllers themselves is not under
test). See tools/controllers/README.md for why each flag is there.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from kubeharness import REPO, ControlPlane, HarnessError, KubeApi, _insecure_ctx, apply_crds, free_port

BUILD_SH = REPO / "tools" / "controllers" / "build.sh"
KCM_CONTROLLERS = ("job-controller", "garbage-collector-controller", "deployment-controller",
                   "replicaset-controller", "daemonset-controller", "statefulset-controller",
                   "persistentvolume-binder-controller", "disruption-controller", "resourceclaim-controller")
"""What kube-controller-manager runs: Jobs make pods (JobSet's Jobs, the MPIJob launcher), and
the garbage collector deletes what a deleted owner (JobSet, Job, MPIJob) leaves behind; the
workload controllers and the volume binder run what the Helm chart installs (test_helm_chart.py:
Deployments, DaemonSets, the nats StatefulSet and its volumes). No other test makes those kinds.
The disruption controller computes PodDisruptionBudgets' status, which the Eviction API checks
(tests/e2e/test_preemption_e2e.py: without it a budget's status stays empty and every eviction it
covers is refused, whatever it allows). The resourceclaim controller makes a pod's ResourceClaims
from its ResourceClaimTemplates, records them in ``status.resourceClaimStatuses`` and deletes them
with the pod (tests/kube/test_dra_claims.py), as DRA clusters run it."""
PROBE_NS = "phalanx-harness-probe"
PROBE_SCHEDULER = "phalanx-harness-probe"  # no scheduler serves it: probe pods are never bound

JOBSET_CRD = "jobset/jobset.x-k8s.io_jobsets.yaml"
MPIJOB_CRD = "mpi-operator/kubeflow.org_mpijobs.yaml"
JOBSET_WEBHOOK_NAMES = {"MutatingWebhookConfiguration": "jobset-mutating-webhook-configuration",
                        "ValidatingWebhookConfiguration": "jobset-validating-webhook-configuration"}

_lock = threading.Lock()


def controllers_dir() -> Path:
    """The directory with jobset-controller, mpi-operator and manifests/; ``HarnessError`` (with
    the fix) when incomplete."""
    return _built(BUILD_SH, "workload controllers", ("jobset-controller", "mpi-operator"),
                  (JOBSET_CRD, MPIJOB_CRD, "SOURCES"), "tools/controllers", "phalanx-controllers")


def _built(build_sh: Path, what: str, binaries: tuple[str, ...], manifests: tuple[str, ...], tool: str,
           cache: str) -> Path:
    """The bin dir ``build_sh --print-bin-dir`` names, when it holds ``binaries`` and
    ``manifests/<manifests>``; else ``HarnessError`` naming what is missing and the fix."""
    how = f"build them with `bash {tool}/build.sh` (cached under ~/.cache/{cache}; see {tool}/README.md)"
    if os.environ.get("CI"):
        how = f"the CI job must run `make kube` ({tool}/build.sh) before the Kubernetes tiers"
    try:
        out = subprocess.run(["bash", str(build_sh), "--print-bin-dir"], capture_output=True, text=True,
                             timeout=30, check=True).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError) as e:
        raise HarnessError(f"cannot ask {build_sh} for the bin dir ({e}); {how}") from e
    d = Path(out[-1]) if out else Path()
    missing = [b for b in binaries if not os.access(d / b, os.X_OK)]
    missing += [m for m in manifests if not (d / "manifests" / m).is_file()]
    if missing:
        raise HarnessError(f"{what} missing in {d}: {', '.join(missing)}; {how}")
    return d


def _load_yaml(path: Path) -> list[dict]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the JobSet CRD is ~0.8 MB of YAML
    with path.open() as f:
        return [d for d in yaml.load_all(f, Loader=loader) if d]


def wait_for(fn, timeout_s: float, what: str, interval_s: float = 0.2) -> Any:
    """Poll ``fn`` until it returns something truthy and return that; ``AssertionError`` naming
    ``what`` (and the last value) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last value: {last!r}")


def _running(plane: ControlPlane, name: str) -> bool:
    p = plane.procs.get(name)
    return p is not None and p.poll() is None


def _wait_until(plane: ControlPlane, name: str, probe, timeout_s: float, what: str) -> Any:
    """Poll ``probe`` until it returns something truthy, failing early if ``name`` exits."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        if not _running(plane, name):
            raise HarnessError(f"{name} exited while waiting for {what}:\n{plane.tail(name, 40)}")
        try:
            last = probe()
            if last:
                return last
        except Exception as e:  # noqa: BLE001 - not there yet
            last = e
        time.sleep(0.3)
    raise HarnessError(f"{name}: {what} not seen after {timeout_s}s (last: {last!r}):\n{plane.tail(name, 40)}")


def delete_workloads(api: KubeApi, ns: str, timeout_s: float = 90) -> None:
    """Delete every JobSet, MPIJob, LeaderWorkerSet and Job of ``ns`` (their pods go by the garbage collector)
    and then any pod left, and wait until none is there: what a test made must not be left
    pending for the next test's scheduler."""
    for plural in ("apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets", "apis/kubeflow.org/v2beta1/namespaces/{ns}/mpijobs",
                   "apis/leaderworkerset.x-k8s.io/v1/namespaces/{ns}/leaderworkersets", "apis/batch/v1/namespaces/{ns}/jobs"):
        path = "/" + plural.format(ns=ns)
        try:
            items = api.get(path)["items"]
        except Exception:  # noqa: BLE001 - the CRD may not be installed in this plane
            continue
        for item in items:
            api.request("DELETE", f"{path}/{item['metadata']['name']}", {"propagationPolicy": "Background"},
                        ok=(404,))

    def gone() -> bool:
        pods = api.get(f"/api/v1/namespaces/{ns}/pods")["items"]
        for p in pods:
            if not p["metadata"].get("deletionTimestamp"):
                api.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{p['metadata']['name']}",
                            {"gracePeriodSeconds": 0}, ok=(404,))
        return not pods

    wait_for(gone, timeout_s, f"every pod of namespace {ns} to be deleted", interval_s=0.5)


# -- CRDs ------------------------------------------------------------------------------------------
def install_crds(plane: ControlPlane) -> None:
    """Apply the JobSet, MPIJob and LeaderWorkerSet CRDs and wait until all are Established."""
    d = controllers_dir() / "manifests"
    apply_crds(plane, [doc for rel in (JOBSET_CRD, MPIJOB_CRD) for doc in _load_yaml(d / rel)]
               + _load_yaml(lws_dir() / "manifests" / LWS_CRD))


# -- kube-controller-manager -----------------------------------------------------------------------
def ensure_controller_manager(plane: ControlPlane) -> None:
    """kube-controller-manager with ``KCM_CONTROLLERS``, ready once a probe Job got its pod and the
    garbage collector removed that pod after the Job was deleted. The CRDs go in first so that the
    garbage collector watches JobSets, MPIJobs and LeaderWorkerSets from its start (it
    rediscovers resources only every 30 s)."""
    with _lock:
        if _running(plane, "kube-controller-manager"):
            return
        if not os.access(plane.bins / "kube-controller-manager", os.X_OK):
            raise HarnessError(f"kube-controller-manager missing in {plane.bins}; build it with "
                               "`bash tools/kube/build.sh` (it builds only what the cache lacks)")
        install_crds(plane)
        kcfg = plane.kubeconfig
        for attempt in range(3):
            port = free_port()
            plane._run("kube-controller-manager", [
                plane.bins / "kube-controller-manager", f"--kubeconfig={kcfg}",
                f"--authentication-kubeconfig={kcfg}", f"--authorization-kubeconfig={kcfg}",
                "--leader-elect=false", "--bind-address=127.0.0.1", f"--secure-port={port}",
                f"--controllers={','.join(KCM_CONTROLLERS)}", "--use-service-account-credentials=false",
                "--authentication-skip-lookup=true"])
            try:
                plane._wait("kube-controller-manager", lambda port=port: plane._http_ok(
                    f"https://127.0.0.1:{port}/healthz", None, _insecure_ctx()), 60)
                break
            except HarnessError:
                plane._terminate("kube-controller-manager")
                if attempt == 2:
                    raise
        _probe_job_and_gc(plane)


def _probe_job_and_gc(plane: ControlPlane) -> None:
    api = plane.api
    api.create_namespace(PROBE_NS)
    name = f"probe-{secrets.token_hex(3)}"
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": PROBE_NS},
           "spec": {"parallelism": 1, "completions": 1, "template": {"spec": {
               "schedulerName": PROBE_SCHEDULER, "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
               "containers": [{"name": "c", "image": "registry.example/probe:1"}]}}}}
    api.post(f"/apis/batch/v1/namespaces/{PROBE_NS}/jobs", job)
    sel = {"labelSelector": f"batch.kubernetes.io/job-name={name}"}
    _wait_until(plane, "kube-controller-manager",
                lambda: api.get(f"/api/v1/namespaces/{PROBE_NS}/pods", query=sel)["items"], 60,
                "the probe Job's pod (job-controller)")
    api.request("DELETE", f"/apis/batch/v1/namespaces/{PROBE_NS}/jobs/{name}",
                {"propagationPolicy": "Background"})
    _wait_until(plane, "kube-controller-manager",
                lambda: not api.get(f"/api/v1/namespaces/{PROBE_NS}/pods", query=sel)["items"], 60,
                "the probe Job's pod to be garbage-collected (garbage-collector-controller)")


# -- controller managers with webhooks (JobSet's, LeaderWorkerSet's) -------------------------------
def _start_webhook_manager(plane: ControlPlane, name: str, binary: Path, config_api: str) -> tuple[int, bytes]:
    """Start a controller-runtime manager ``name`` of the plane: a self-signed certificate for
    its webhook server on 127.0.0.1, its ``Configuration`` (``config_api``) with leader election,
    internal certificate management and metrics off, ready once ``/readyz`` answers (three tries
    on fresh ports). Returns the webhook port and the certificate (the webhooks' CA bundle)."""
    work = plane.workdir / name
    cert_dir = work / "certs"
    cert_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", f"/CN={name}-webhook.phalanx-test", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(cert_dir / "tls.key"), "-out", str(cert_dir / "tls.crt")],
                   check=True, capture_output=True, timeout=30)
    for attempt in range(3):
        webhook_port, probe_port = free_port(), free_port()
        config = {"apiVersion": config_api, "kind": "Configuration",
                  "leaderElection": {"leaderElect": False},
                  "internalCertManagement": {"enable": False},
                  "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
                  "metrics": {"bindAddress": "0"},
                  "health": {"healthProbeBindAddress": f"127.0.0.1:{probe_port}"},
                  "clientConnection": {"qps": 100, "burst": 200}}
        (work / "config.yaml").write_text(json.dumps(config, indent=1))
        plane._run(name, [binary, f"--kubeconfig={plane.kubeconfig}", f"--config={work / 'config.yaml'}",
                          "--zap-devel=false", "--zap-log-level=info"])
        try:
            plane._wait(name, lambda p=probe_port: plane._http_ok(f"http://127.0.0.1:{p}/readyz"), 60)
            return webhook_port, (cert_dir / "tls.crt").read_bytes()
        except HarnessError:
            plane._terminate(name)
            if attempt == 2:
                raise
    raise HarnessError(f"{name} did not start")  # unreachable: the last attempt raised


# -- JobSet controller -----------------------------------------------------------------------------
def ensure_jobset_controller(plane: ControlPlane) -> None:
    """The JobSet controller manager with its webhooks served on loopback (self-signed cert) and
    registered with the API server, ready once a server-side dry-run JobSet comes back defaulted."""
    ensure_controller_manager(plane)
    with _lock:
        if _running(plane, "jobset-controller"):
            return
        d = controllers_dir()
        webhook_port, cert = _start_webhook_manager(plane, "jobset-controller", d / "jobset-controller",
                                                    "config.jobset.x-k8s.io/v1alpha1")
        _register_jobset_webhooks(plane, d, webhook_port, cert)
        _wait_until(plane, "jobset-controller", lambda: _dry_run_jobset_defaulted(plane.api), 60,
                    "a dry-run JobSet defaulted by the mutating webhook")


def _register_jobset_webhooks(plane: ControlPlane, d: Path, port: int, ca: bytes) -> None:
    """The webhook configurations of the JobSet release (manifests.yaml with its kustomize patches,
    which limit the pod webhooks to JobSet pods), pointed at the loopback server by URL."""
    _register_webhooks(plane, d / "manifests" / "jobset", {"MutatingWebhookConfiguration": "mutating-patch.yaml",
                                                           "ValidatingWebhookConfiguration": "validating-patch.yaml"},
                       JOBSET_WEBHOOK_NAMES, port, ca)


def _register_webhooks(plane: ControlPlane, manifests: Path, patches: dict[str, str], names: dict[str, str],
                       port: int, ca: bytes) -> None:
    """A release's webhook configurations (``manifests.yaml`` with its kustomize ``replace``
    patches, which limit the pod webhooks to the controller's pods), named ``names`` and pointed
    at the loopback server by URL."""
    ca_b64 = base64.b64encode(ca).decode()
    for doc in _load_yaml(manifests / "manifests.yaml"):
        for op in _load_yaml(manifests / patches[doc["kind"]])[0]:
            if op["op"] != "replace" or not op["path"].startswith("/webhooks/"):
                raise HarnessError(f"unexpected patch op in the webhook manifests of {manifests}: {op}")
            doc["webhooks"][int(op["path"].rsplit("/", 1)[1])] = op["value"]
        doc["metadata"]["name"] = names[doc["kind"]]
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca_b64}
            hook["timeoutSeconds"] = 30  # a loaded 2-core machine: the default 10 s can run out
        plane.api.apply(doc)


def unregister_jobset_webhooks(api: KubeApi) -> None:
    for kind, name in JOBSET_WEBHOOK_NAMES.items():
        plural = kind.lower() + "s"
        api.delete(f"/apis/admissionregistration.k8s.io/v1/{plural}/{name}")


def _dry_run_jobset_defaulted(api: KubeApi) -> bool:
    js = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
          "metadata": {"name": "harness-probe", "namespace": "default"},
          "spec": {"replicatedJobs": [{"name": "w", "replicas": 1, "template": {"spec": {
              "template": {"spec": {"containers": [{"name": "c", "image": "registry.example/probe:1"}]}}}}}]}}
    out = api.post("/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets", js, query={"dryRun": "All"})
    return (out["spec"].get("successPolicy") or {}).get("operator") == "All"


def stop_jobset_controller(plane: ControlPlane) -> None:
    """Unregister the webhooks first (they fail closed), then stop the process."""
    with _lock:
        if "jobset-controller" in plane.procs:
            unregister_jobset_webhooks(plane.api)
            plane._terminate("jobset-controller")


# -- LeaderWorkerSet controller --------------------------------------------------------------------
LWS_BUILD_SH = REPO / "tools" / "lws" / "build.sh"
LWS_CRD = "leaderworkerset.x-k8s.io_leaderworkersets.yaml"
LWS_WEBHOOK_NAMES = {"MutatingWebhookConfiguration": "lws-mutating-webhook-configuration",
                     "ValidatingWebhookConfiguration": "lws-validating-webhook-configuration"}
LWS_API = "/apis/leaderworkerset.x-k8s.io/v1"


def lws_dir() -> Path:
    """The directory with lws-controller and manifests/; ``HarnessError`` (with the fix) when
    incomplete."""
    return _built(LWS_BUILD_SH, "LeaderWorkerSet controller", ("lws-controller",),
                  (LWS_CRD, "manifests.yaml", "SOURCES"), "tools/lws", "phalanx-lws")


def ensure_lws_controller(plane: ControlPlane) -> None:
    """The LeaderWorkerSet controller manager (its StatefulSets need kube-controller-manager)
    with its webhooks served on loopback (self-signed cert) and registered with the API server,
    ready once a server-side dry-run LeaderWorkerSet comes back defaulted."""
    ensure_controller_manager(plane)
    with _lock:
        if _running(plane, "lws-controller"):
            return
        d = lws_dir()  # its CRD is in since kube-controller-manager started (install_crds)
        webhook_port, cert = _start_webhook_manager(plane, "lws-controller", d / "lws-controller",
                                                    "config.lws.x-k8s.io/v1alpha1")
        _register_webhooks(plane, d / "manifests", {"MutatingWebhookConfiguration": "mutating-patch.yaml",
                                                    "ValidatingWebhookConfiguration": "validating-patch.yaml"},
                           LWS_WEBHOOK_NAMES, webhook_port, cert)
        _wait_until(plane, "lws-controller", lambda: _dry_run_lws_defaulted(plane.api), 60,
                    "a dry-run LeaderWorkerSet defaulted by the mutating webhook")


def _dry_run_lws_defaulted(api: KubeApi) -> bool:
    lws = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
           "metadata": {"name": "harness-probe", "namespace": "default"},
           "spec": {"leaderWorkerTemplate": {"size": 2, "workerTemplate": {"spec": {
               "containers": [{"name": "c", "image": "registry.example/probe:1"}]}}}}}
    out = api.post(f"{LWS_API}/namespaces/default/leaderworkersets", lws, query={"dryRun": "All"})
    return bool(out["spec"].get("startupPolicy"))


def stop_lws_controller(plane: ControlPlane) -> None:
    """Unregister the webhooks first (they fail closed), then stop the process."""
    with _lock:
        if "lws-controller" in plane.procs:
            for kind, name in LWS_WEBHOOK_NAMES.items():
                plane.api.delete(f"/apis/admissionregistration.k8s.io/v1/{kind.lower()}s/{name}")
            plane._terminate("lws-controller")


# -- MPI Operator ----------------------------------------------------------------------------------
def ensure_mpi_operator(plane: ControlPlane) -> None:
    """The MPI Operator's v2beta1 controller, ready once its informer caches synced (/readyz)."""
    ensure_controller_manager(plane)
    with _lock:
        if _running(plane, "mpi-operator"):
            return
        d = controllers_dir()
        for attempt in range(3):
            port = free_port()
            plane._run("mpi-operator", [d / "mpi-operator", f"--kubeconfig={plane.kubeconfig}",
                                        f"--health-addr=127.0.0.1:{port}", "--kube-api-qps=100",
                                        "--kube-api-burst=200"])
            try:
                plane._wait("mpi-operator", lambda port=port: plane._http_ok(f"http://127.0.0.1:{port}/readyz"), 60)
                return
            except HarnessError:
                plane._terminate("mpi-operator")
                if attempt == 2:
                    raise


# -- pytest fixtures (imported by the tests/kube and tests/e2e conftests) -------------------------
try:
    import pytest
except ImportError:  # pragma: no cover - the harness is usable without pytest
    pytest = None  # type: ignore[assignment]

if pytest is not None:
    def _ensure(plane: ControlPlane, start, what: str) -> ControlPlane:
        try:
            start(plane)
        except HarnessError as e:
            pytest.fail(f"{what} did not start: {e}", pytrace=False)
        return plane

    @pytest.fixture(scope="session")
    def kube_controller_manager(kube: ControlPlane) -> ControlPlane:
        """The control plane with kube-controller-manager (Job controller, garbage collector) and
        the JobSet and MPIJob CRDs installed."""
        return _ensure(kube, ensure_controller_manager, "kube-controller-manager")

    @pytest.fixture(scope="session")
    def lws_controller(kube_controller_manager: ControlPlane) -> ControlPlane:
        """The control plane with the LeaderWorkerSet controller and its webhooks."""
        return _ensure(kube_controller_manager, ensure_lws_controller, "lws-controller")

    @pytest.fixture(scope="session")
    def jobset_controller(kube_controller_manager: ControlPlane) -> ControlPlane:
        """The control plane with the JobSet controller and its webhooks too."""
        return _ensure(kube_controller_manager, ensure_jobset_controller, "the JobSet controller")

    @pytest.fixture(scope="session")
    def mpi_operator(kube_controller_manager: ControlPlane) -> ControlPlane:
        """The control plane with the MPI Operator too."""
        return _ensure(kube_controller_manager, ensure_mpi_operator, "the MPI Operator")
