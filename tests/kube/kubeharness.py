"""The test control plane: etcd + kube-apiserver (+ kwok, + kube-scheduler) on loopback.

Used by the ``tests/kube``, ``tests/contract`` and ``tests/e2e`` conftests (one control plane per
pytest session, shared through ``acquire``/``release``) and by ``bench/kube_baseline.py``.
The binaries come from ``tools/kube/build.sh`` (``--print-bin-dir``); when they are missing the
caller gets a ``HarnessError`` saying how to build them, never a silent skip.

Everything listens on 127.0.0.1 on free ports; data lives in a temp dir (on ``/dev/shm`` when
it exists). The apiserver authenticates bearer tokens from a token-auth file (an admin in
``system:masters`` plus a few users without groups, for RBAC tests) and ServiceAccount tokens
from the TokenRequest API; authorization is RBAC. ``KubeApi`` is a small synchronous REST client
(stdlib only), so the tests check the adapter under test with an independent client.
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
BUILD_SH = REPO / "tools" / "kube" / "build.sh"
STAGES = REPO / "tools" / "kube" / "kwok-stages.yaml"
BINARIES = ("etcd", "kube-apiserver", "kube-scheduler", "kwok")
LIMITED_USERS = ("alice", "bob", "carol")
"""token-auth-file users with no groups: authenticated, but RBAC grants them nothing."""


class HarnessError(RuntimeError):
    pass


class KubeApiError(RuntimeError):
    def __init__(self, status: int, body: Any, what: str) -> None:
        self.status = status
        self.body = body
        message = body.get("message") if isinstance(body, dict) else body
        super().__init__(f"{what}: HTTP {status}: {message}")


def bin_dir() -> Path:
    """The directory with the four binaries; ``HarnessError`` (with the fix) when incomplete."""
    how = ("build them with `bash tools/kube/build.sh` (about 7 min cold, cached under "
           "~/.cache/phalanx-kube; see tools/kube/README.md)")
    if os.environ.get("CI"):
        how = "the CI job must run `bash tools/kube/build.sh` before the e2e tier"
    try:
        out = subprocess.run(["bash", str(BUILD_SH), "--print-bin-dir"], capture_output=True, text=True,
                             timeout=30, check=True).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError) as e:
        raise HarnessError(f"cannot ask {BUILD_SH} for the bin dir ({e}); {how}") from e
    d = Path(out[-1]) if out else Path()
    missing = [b for b in BINARIES if not os.access(d / b, os.X_OK)]
    if missing:
        raise HarnessError(f"Kubernetes test binaries missing in {d}: {', '.join(missing)}; {how}")
    return d


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scratch_root() -> str | None:
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


def _insecure_ctx() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


class KubeApi:
    """A tiny synchronous Kubernetes REST client: one keep-alive connection per thread."""

    def __init__(self, server: str, token: str, ca_file: Path, timeout_s: float = 30.0) -> None:
        u = urllib.parse.urlsplit(server)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 443
        self.token = token
        self.ctx = ssl.create_default_context(cafile=str(ca_file))
        self.timeout_s = timeout_s
        self._local = threading.local()

    def _conn(self, fresh: bool = False) -> http.client.HTTPSConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None or fresh:
            if conn is not None:
                conn.close()
            conn = http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=self.timeout_s)
            self._local.conn = conn
        return conn

    def request(self, method: str, path: str, body: Any = None, *, query: dict | None = None,
                content_type: str = "application/json", ok: tuple[int, ...] = ()) -> tuple[int, Any]:
        """(status, decoded body). Raises ``KubeApiError`` for a non-2xx status not in ``ok``."""
        if query:
            path += "?" + urllib.parse.urlencode(query)
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        for attempt in (0, 1):
            conn = self._conn(fresh=attempt > 0)
            try:
                conn.request(method, path, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
                break
            except (http.client.HTTPException, OSError):
                if attempt:
                    raise
        try:
            decoded = json.loads(raw) if raw else {}
        except ValueError:
            decoded = raw.decode(errors="replace")
        if not 200 <= resp.status < 300 and resp.status not in ok:
            raise KubeApiError(resp.status, decoded, f"{method} {path}")
        return resp.status, decoded

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def get(self, path: str, **kw) -> Any:
        return self.request("GET", path, **kw)[1]

    def post(self, path: str, body: Any, **kw) -> Any:
        return self.request("POST", path, body, **kw)[1]

    def patch(self, path: str, body: Any, *, merge: bool = True, **kw) -> Any:
        ctype = "application/merge-patch+json" if merge else "application/strategic-merge-patch+json"
        return self.request("PATCH", path, body, content_type=ctype, **kw)[1]

    def delete(self, path: str, **kw) -> Any:
        return self.request("DELETE", path, {"gracePeriodSeconds": 0}, ok=(404,), **kw)[1]

    # -- conveniences the tests share -------------------------------------------------------
    def create_namespace(self, name: str) -> None:
        self.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                     "metadata": {"name": name}}, ok=(409,))

    def create_pod(self, obj: dict) -> dict:
        ns = (obj.get("metadata") or {}).get("namespace") or "default"
        return self.post(f"/api/v1/namespaces/{ns}/pods", obj)

    def get_pod(self, ns: str, name: str) -> dict | None:
        status, body = self.request("GET", f"/api/v1/namespaces/{ns}/pods/{name}", ok=(404,))
        return None if status == 404 else body

    def create_node(self, obj: dict) -> dict:
        return self.post("/api/v1/nodes", obj)

    def events(self, ns: str, pod: str) -> list[dict]:
        sel = f"involvedObject.kind=Pod,involvedObject.name={pod}"
        return self.get(f"/api/v1/namespaces/{ns}/events", query={"fieldSelector": sel})["items"]

    def resource_path(self, obj: dict) -> str:
        """The REST path of ``obj`` (found by API discovery, cached)."""
        api_version, kind = obj["apiVersion"], obj["kind"]
        cache = self.__dict__.setdefault("_discovery", {})
        if api_version not in cache:
            base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            cache[api_version] = (base, {r["kind"]: (r["name"], r["namespaced"])
                                         for r in self.get(base)["resources"] if "/" not in r["name"]})
        base, kinds = cache[api_version]
        plural, namespaced = kinds[kind]
        meta = obj["metadata"]
        ns = f"/namespaces/{meta.get('namespace') or 'default'}" if namespaced else ""
        return f"{base}{ns}/{plural}/{meta['name']}"

    def apply(self, obj: dict, *, dry_run: bool = False, manager: str = "phalanx-tests") -> dict:
        """Server-side apply (``kubectl apply --server-side [--dry-run=server]``)."""
        query = {"fieldManager": manager, "force": "true"}
        if dry_run:
            query["dryRun"] = "All"
        return self.request("PATCH", self.resource_path(obj), obj, query=query,
                            content_type="application/apply-patch+yaml")[1]

    def can_i(self, verb: str, resource: str, *, namespace: str = "", subresource: str = "",
              group: str = "") -> bool:
        """SelfSubjectAccessReview as this client's user."""
        attrs = {"verb": verb, "resource": resource, "group": group}
        if namespace:
            attrs["namespace"] = namespace
        if subresource:
            attrs["subresource"] = subresource
        review = self.post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                           {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                            "spec": {"resourceAttributes": attrs}})
        return bool(review["status"].get("allowed"))


@dataclass
class ControlPlane:
    """Start with ``start()``; ``stop()`` ends every process and removes the work dir."""

    bins: Path
    workdir: Path
    with_kwok: bool = True
    server: str = ""
    admin_token: str = field(default_factory=lambda: "admin-" + secrets.token_hex(16))
    users: dict[str, str] = field(default_factory=lambda: {u: f"{u}-" + secrets.token_hex(12) for u in LIMITED_USERS})
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    scheduler_port: int = 0
    etcd_url: str = ""
    kwok_config: Path = STAGES
    """kwok's stage file (benchmarks drop the periodic node heartbeat at thousands of nodes)."""
    kwok_lease_s: int = 40
    kwok_cidr: str = "10.0.0.0/24"
    """Pod IPs kwok hands out: a /24 holds 254 running pods."""
    bin_overrides: dict[str, Path] = field(default_factory=dict)
    """Binary name → path used instead of ``bins/<name>`` (bench/peers.py runs a newer
    kube-apiserver from tools/peers with etcd and kwok from tools/kube)."""
    apiserver_args: tuple[str, ...] = ()
    """Extra kube-apiserver flags (feature gates, ``--runtime-config``)."""

    @property
    def ca_file(self) -> Path:
        return self.workdir / "pki" / "apiserver.crt"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    @property
    def api(self) -> KubeApi:
        return self.api_as(self.admin_token)

    def api_as(self, token: str) -> KubeApi:
        return KubeApi(self.server, token, self.ca_file)

    # -- processes ---------------------------------------------------------------------------
    def binary(self, name: str) -> Path:
        return self.bin_overrides.get(name) or self.bins / name

    def _run(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child
        p = subprocess.Popen([str(a) for a in args], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)
        log.close()
        self.procs[name] = p
        return p

    def tail(self, name: str, lines: int = 20) -> str:
        try:
            text = (self.workdir / f"{name}.log").read_text(errors="replace").splitlines()
        except OSError:
            return f"[{name}: no log]"
        return "\n".join(f"[{name}] {line}" for line in text[-lines:])

    def _wait(self, name: str, probe, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            p = self.procs[name]
            if p.poll() is not None:
                raise HarnessError(f"{name} exited with {p.returncode} during start-up:\n{self.tail(name)}")
            try:
                if probe():
                    return
            except Exception as e:  # noqa: BLE001 - not up yet
                last = e
            time.sleep(0.2)
        raise HarnessError(f"{name} not ready after {timeout_s}s (last error: {last!r}):\n{self.tail(name)}")

    @staticmethod
    def _http_ok(url: str, token: str | None = None, ctx: ssl.SSLContext | None = None) -> bool:
        u = urllib.parse.urlsplit(url)
        cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
        kw = {"context": ctx} if u.scheme == "https" else {}
        conn = cls(u.hostname, u.port, timeout=2, **kw)
        try:
            conn.request("GET", u.path, headers={"Authorization": f"Bearer {token}"} if token else {})
            return conn.getresponse().status == 200
        finally:
            conn.close()

    def start(self) -> ControlPlane:
        try:
            self._start_etcd_and_apiserver()
            self._write_kubeconfig(self.kubeconfig, "admin", self.admin_token)
            if self.with_kwok:
                self._start_kwok()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_etcd_and_apiserver(self) -> None:
        for attempt in range(3):  # a free port can be taken between probing and binding
            ep, pp, ap = free_port(), free_port(), free_port()
            self._run("etcd", [
                self.binary("etcd"), "--name", "default", "--data-dir", self.workdir / "etcd",
                f"--listen-client-urls=http://127.0.0.1:{ep}", f"--advertise-client-urls=http://127.0.0.1:{ep}",
                f"--listen-peer-urls=http://127.0.0.1:{pp}", f"--initial-advertise-peer-urls=http://127.0.0.1:{pp}",
                f"--initial-cluster=default=http://127.0.0.1:{pp}", "--unsafe-no-fsync",
                "--listen-metrics-urls=", "--log-level=warn"])
            try:
                self._wait("etcd", lambda ep=ep: self._http_ok(f"http://127.0.0.1:{ep}/health"), 30)
                self.etcd_url = f"http://127.0.0.1:{ep}"
                break
            except HarnessError:
                self._terminate("etcd")
                shutil.rmtree(self.workdir / "etcd", ignore_errors=True)
                if attempt == 2:
                    raise
        key = self.workdir / "sa.key"
        subprocess.run(["openssl", "genrsa", "-out", str(key), "2048"], check=True, capture_output=True, timeout=30)
        lines = [f'{self.admin_token},admin,uid-admin,"system:masters"']
        lines += [f"{tok},{user},uid-{user}" for user, tok in self.users.items()]
        (self.workdir / "tokens.csv").write_text("\n".join(lines) + "\n")
        for attempt in range(3):
            self._run("kube-apiserver", [
                self.binary("kube-apiserver"), f"--etcd-servers=http://127.0.0.1:{ep}",
                f"--cert-dir={self.workdir / 'pki'}", "--bind-address=127.0.0.1", f"--secure-port={ap}",
                "--advertise-address=127.0.0.1", "--service-cluster-ip-range=10.0.0.0/24",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={key}", f"--service-account-signing-key-file={key}",
                f"--token-auth-file={self.workdir / 'tokens.csv'}", "--authorization-mode=RBAC",
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
                "--allow-privileged=true", "--endpoint-reconciler-type=none", *self.apiserver_args])
            try:
                self._wait("kube-apiserver", lambda ap=ap: self._http_ok(
                    f"https://127.0.0.1:{ap}/readyz", self.admin_token, _insecure_ctx()), 90)
                self.server = f"https://127.0.0.1:{ap}"
                break
            except HarnessError:
                self._terminate("kube-apiserver")
                if attempt == 2:
                    raise
                ap = free_port()
        # kwok needs kube-node-lease, which the apiserver creates right after it is ready.
        deadline = time.monotonic() + 30
        while self.api.request("GET", "/api/v1/namespaces/kube-node-lease", ok=(404,))[0] == 404:
            if time.monotonic() > deadline:
                raise HarnessError("namespace kube-node-lease never appeared:\n" + self.tail("kube-apiserver"))
            time.sleep(0.2)

    def _write_kubeconfig(self, path: Path, user: str, token: str) -> Path:
        doc = {"apiVersion": "v1", "kind": "Config", "current-context": "phalanx-test",
               "clusters": [{"name": "phalanx-test",
                             "cluster": {"server": self.server, "certificate-authority": str(self.ca_file)}}],
               "users": [{"name": user, "user": {"token": token}}],
               "contexts": [{"name": "phalanx-test", "context": {"cluster": "phalanx-test", "user": user}}]}
        path.write_text(json.dumps(doc, indent=1))  # JSON is YAML
        return path

    def _start_kwok(self) -> None:
        self._run("kwok", [
            self.binary("kwok"), f"--kubeconfig={self.kubeconfig}", "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake", f"--config={self.kwok_config}",
            f"--cidr={self.kwok_cidr}", f"--node-lease-duration-seconds={self.kwok_lease_s}"])
        # Prove kwok works before any test relies on it: a fake node must turn Ready.
        probe = f"kwok-probe-{secrets.token_hex(3)}"
        self.api.create_node(fake_gpu_node(probe))
        try:
            def ready() -> bool:
                node = self.api.get(f"/api/v1/nodes/{probe}")
                return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", []))
            self._wait("kwok", ready, 60)
        finally:
            self.api.delete(f"/api/v1/nodes/{probe}")

    def start_scheduler(self, *, qps: float = 0, burst: int = 0) -> None:
        """Start kube-scheduler once (for tests and benchmarks that compare with it). ``qps`` and
        ``burst`` (when set) raise its client's rate limit through a KubeSchedulerConfiguration
        (``clientConnection``), as scheduler_perf does."""
        if "kube-scheduler" in self.procs and self.procs["kube-scheduler"].poll() is None:
            return
        if qps:
            cfg = self.workdir / "kube-scheduler.yaml"
            cfg.write_text(json.dumps({
                "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
                "clientConnection": {"kubeconfig": str(self.kubeconfig), "qps": qps, "burst": burst or int(qps)},
                "leaderElection": {"leaderElect": False}}))
            how = [f"--config={cfg}"]
        else:
            how = [f"--kubeconfig={self.kubeconfig}", "--leader-elect=false"]
        for attempt in range(3):
            sp = free_port()
            self._run("kube-scheduler", [
                self.binary("kube-scheduler"), *how,
                "--bind-address=127.0.0.1", f"--secure-port={sp}",
                f"--authentication-kubeconfig={self.kubeconfig}", f"--authorization-kubeconfig={self.kubeconfig}"])
            try:
                self._wait("kube-scheduler", lambda sp=sp: self._http_ok(
                    f"https://127.0.0.1:{sp}/healthz", None, _insecure_ctx()), 60)
                self.scheduler_port = sp
                return
            except HarnessError:
                self._terminate("kube-scheduler")
                if attempt == 2:
                    raise

    def stop_scheduler(self) -> None:
        """Stop kube-scheduler (a benchmark runs one scheduler at a time)."""
        self._terminate("kube-scheduler")

    # -- identities --------------------------------------------------------------------------
    def kubeconfig_for(self, name: str, token: str) -> Path:
        """A kubeconfig file that authenticates with ``token``."""
        return self._write_kubeconfig(self.workdir / f"kubeconfig-{name}", name, token)

    def user_kubeconfig(self, user: str) -> Path:
        """A kubeconfig of one of ``LIMITED_USERS`` (token-auth-file, no groups)."""
        return self.kubeconfig_for(user, self.users[user])

    def service_account_token(self, namespace: str, sa: str, expiration_s: int = 3600) -> str:
        """A bound token for ServiceAccount ``namespace/sa`` from the TokenRequest API."""
        tr = self.api.post(f"/api/v1/namespaces/{namespace}/serviceaccounts/{sa}/token",
                           {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                            "spec": {"expirationSeconds": expiration_s}})
        return tr["status"]["token"]

    # -- teardown ----------------------------------------------------------------------------
    def _terminate(self, name: str) -> None:
        p = self.procs.pop(name, None)
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)

    def stop(self) -> None:
        for name in reversed(list(self.procs)):
            self._terminate(name)
        if not os.environ.get("PHALANX_KEEP_KUBE"):
            shutil.rmtree(self.workdir, ignore_errors=True)


def start_control_plane(*, with_kwok: bool = True, with_scheduler: bool = False, **tuning: Any) -> ControlPlane:
    """Start a control plane in a fresh temp dir. Raises ``HarnessError`` (binaries, start-up).
    ``tuning``: ``kwok_config``, ``kwok_lease_s``, ``kwok_cidr``, ``bin_overrides``, ``apiserver_args``
    (see ``ControlPlane``)."""
    bins = bin_dir()
    workdir = Path(tempfile.mkdtemp(prefix="phalanx-kube-", dir=_scratch_root()))
    plane = ControlPlane(bins=bins, workdir=workdir, with_kwok=with_kwok, **tuning).start()
    if with_scheduler:
        try:
            plane.start_scheduler()
        except BaseException:
            plane.stop()
            raise
    return plane


# -- one control plane per pytest session, shared by every conftest that asks --------------------
_shared: dict[str, Any] = {"plane": None, "users": 0}
_lock = threading.Lock()


PHALANX_CRDS = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "crds"


def apply_crds(plane: ControlPlane, docs: list[dict], timeout_s: float = 60.0) -> None:
    """Apply CRDs (server-side apply, idempotent) and wait until every one is Established and its
    resources can be listed (an Established CRD's storage may still answer 429 "storage is
    (re)initializing" for a moment)."""
    api = plane.api
    names = []
    lists = []
    for doc in docs:
        api.apply(doc)
        names.append(doc["metadata"]["name"])
        spec = doc["spec"]
        lists += [f"/apis/{spec['group']}/{v['name']}/{spec['names']['plural']}" for v in spec["versions"] if v.get("served")]

    def established() -> bool:
        for n in names:
            crd = api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{n}")
            if not any(c["type"] == "Established" and c["status"] == "True"
                       for c in (crd.get("status") or {}).get("conditions") or []):
                return False
        return all(api.request("GET", path, ok=(404, 429, 503))[0] == 200 for path in lists)

    deadline = time.monotonic() + timeout_s
    while not established():
        if time.monotonic() > deadline:
            raise HarnessError(f"CRDs {names} not Established after {timeout_s:g}s:\n{plane.tail('kube-apiserver')}")
        time.sleep(0.3)
    api.__dict__.pop("_discovery", None)  # new API groups: rediscover


WORKLOAD_API_ARGS = ("--feature-gates=GenericWorkload=true", "--runtime-config=scheduling.k8s.io/v1alpha2=true")
"""The upstream Workload API as v1.36 serves it (alpha: ``scheduling.k8s.io/v1alpha2`` PodGroups and
the pods' ``spec.schedulingGroup``), which gang-coordinator reads (docs/workloads.md)."""


def acquire() -> ControlPlane:
    """The shared control plane, started on first use with Phalanx's own CRDs (deploy/k8s/crds)
    and the Workload API served (``WORKLOAD_API_ARGS``)."""
    import yaml

    with _lock:
        if _shared["plane"] is None:
            plane = start_control_plane(apiserver_args=WORKLOAD_API_ARGS)
            apply_crds(plane, [d for f in sorted(PHALANX_CRDS.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text())
                               if d])
            _shared["plane"] = plane
        _shared["users"] += 1
        return _shared["plane"]


def release() -> None:
    with _lock:
        _shared["users"] -= 1
        if _shared["users"] == 0 and _shared["plane"] is not None:
            _shared["plane"].stop()
            _shared["plane"] = None


# -- object builders -------------------------------------------------------------------------------
def fake_gpu_node(name: str, *, gpus: int = 8, labels: dict[str, str] | None = None, kwok: bool = True) -> dict:
    """A Node kwok manages (annotation ``kwok.x-k8s.io/node: fake``) with ``gpus`` whole GPUs."""
    res = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    meta: dict[str, Any] = {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                                     "type": "kwok", **(labels or {})}}
    if kwok:
        meta["annotations"] = {"kwok.x-k8s.io/node": "fake"}
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta,
            "status": {"capacity": dict(res), "allocatable": dict(res)}}


def gpu_pod(name: str, namespace: str, gpus: int | str = 1, *, scheduler: str = "phalanx",
            labels: dict[str, str] | None = None, resource: str = "nvidia.com/gpu") -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
            "spec": {"schedulerName": scheduler, "terminationGracePeriodSeconds": 0, "containers": [
                {"name": "c", "image": "registry.example/app:1", "resources": {"limits": {resource: str(gpus)}}}]}}


def unique(prefix: str) -> str:
    """A DNS-1123 name unique in this session (namespaces never finish deleting here)."""
    return f"{prefix}-{secrets.token_hex(3)}"


# -- pytest fixtures (imported by the tests/kube, tests/contract and tests/e2e conftests) -------
try:
    import pytest
except ImportError:  # the benchmark uses the harness without pytest
    pytest = None  # type: ignore[assignment]

if pytest is not None:
    @pytest.fixture(scope="session")
    def kube() -> Any:
        """The session's control plane (etcd, kube-apiserver, kwok). Fails, never skips, when the
        binaries are missing."""
        try:
            plane = acquire()
        except HarnessError as e:
            pytest.fail(f"Kubernetes test control plane unavailable: {e}", pytrace=False)
        try:
            yield plane
        finally:
            release()

    @pytest.fixture(scope="session")
    def kube_scheduler(kube: ControlPlane) -> ControlPlane:
        """The control plane with kube-scheduler running too."""
        try:
            kube.start_scheduler()
        except HarnessError as e:
            pytest.fail(f"kube-scheduler did not start: {e}", pytrace=False)
        return kube

    @pytest.fixture(scope="session")
    def kube_api(kube: ControlPlane) -> KubeApi:
        """An admin REST client (system:masters)."""
        return kube.api

    @pytest.fixture
    def kube_ns(kube_api: KubeApi, request) -> str:
        """A fresh namespace for one test (never deleted: without kube-controller-manager a
        namespace stays Terminating forever, and the control plane ends with the session)."""
        name = unique(request.node.originalname.removeprefix("test_")[:40].replace("_", "-").strip("-"))
        kube_api.create_namespace(name)
        return name
