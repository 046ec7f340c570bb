"""The embedded stack: a nats-server and every service as its own OS process.

``phalanx up`` / ``phalanx demo`` and the integration tests use it. Per node of the cluster
file it runs one topology-discovery and one mig-manager (they are node agents), exactly as the
DaemonSets do; above ``FLEET_ABOVE`` nodes (or with ``fleet=True``) one ``node-fleet`` process
serves every node's agents instead (``phalanx_node_fleet``), so a simulated cluster of
thousands of nodes fits on one machine. One gang-coordinator, one placement and one binder
serve the whole cluster. Each process is ``python -m phalanx_cli.main run <service> …``,
exactly what a Deployment runs.

Security: the stack's nats-server requires TLS and credentials (``LocalSecurity``: the test
session's bundle when it exported one, else a fresh one in the work dir). Before the services
start, ``phalanx bus init`` declares the streams and buckets as the admin; then every process
runs with its own identity: a node agent's credential names its node, so the permission
table is exercised by every stack.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from phalanx_localstack.children import popen_options
from phalanx_localstack.inputs import ClusterFile, ClusterNode, load_workload
from phalanx_localstack.localauth import LocalSecurity
from phalanx_localstack.natsserver import NatsServer
from phalanx_telemetry import exposition

__all__ = ["FLEET_ABOVE", "ClusterFile", "ClusterNode", "ServiceProc", "Stack", "StackError", "fake_mig_spec",
           "load_workload"]


class StackError(RuntimeError):
    pass


FLEET_ABOVE = 16
"""Clusters with more nodes than this run their node agents as one ``node-fleet`` process."""
WORKDIR_PREFIX = "phalanx-stack-"
OWNER_FILE = "owner.pid"
STOP_GRACE_S = 10.0  # for all services together, after SIGTERM; then SIGKILL


def remove_stale_workdirs(tmp: str | None = None) -> list[Path]:
    """Remove the temp dirs of stacks whose process is gone (killed with SIGKILL, so it could
    not clean up): their credentials and TLS key must not outlive them. Returns what went."""
    import shutil

    gone = []
    for d in Path(tmp or tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}*"):
        try:
            pid = int((d / OWNER_FILE).read_text())
            if d.stat().st_uid != os.getuid() or _alive(pid):
                continue
        except (OSError, ValueError):
            continue
        shutil.rmtree(d, ignore_errors=True)
        gone.append(d)
    return gone


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fake_mig_spec(node: ClusterNode) -> str | None:
    """The simulated node's MIG GPUs as a fake-NVML spec (``<table>x<count>[@off]``), or None
    when its GPU model has no MIG: mig-manager then exercises the real create/verify/destroy
    path against the rules of that model."""
    from phalanx_engine import mig
    from phalanx_topology import load_file

    table = mig.mig_table(node.gpu_model, node.gpu_memory_mib) if node.gpu_model else None
    if table is None:
        return None
    count = len(load_file(node.topology_file, node=node.name).gpus)
    return f"{table.model}x{count}" + ("" if node.mig_enabled else "@off")


def _fake_mig_nvml(node: ClusterNode) -> list[str]:
    spec = fake_mig_spec(node)
    return [] if spec is None else ["--nvml", f"fake:{spec}"]


@dataclass
class ServiceProc:
    name: str
    args: list[str]
    ready_file: Path
    log_path: Path
    proc: subprocess.Popen | None = None
    env: dict[str, str] = field(default_factory=dict)
    """This process's own identity (``PHALANX_NATS_CREDS``/``PHALANX_NATS_CA``)."""


@dataclass
class Stack:
    """Start with ``start()``, stop with ``stop()``; ``kill``/``restart`` one service for chaos."""

    cluster: ClusterFile
    nats_url: str | None = None
    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    service_args: dict[str, list[str]] = field(default_factory=dict)
    replicas: dict[str, int] = field(default_factory=dict)
    """Extra replicas of cluster-wide services, e.g. ``{"placement": 2}``."""
    fleet: bool | None = None
    """Node agents as one ``node-fleet`` process (True), as two processes per node (False), or
    by cluster size (None: a fleet above ``FLEET_ABOVE`` nodes). In fleet mode the agents'
    flags go in ``service_args["node-fleet"]``."""
    nats: NatsServer | None = None
    procs: dict[str, ServiceProc] = field(default_factory=dict)
    bus_replicas: int = 1
    """Copies of each stream and bucket that ``bootstrap`` declares (3 on a cluster)."""
    security: LocalSecurity | None = None
    """Keys and CA of the bus; default: the session's (``PHALANX_BUS_SECRETS_DIR``), else a
    fresh bundle when the stack starts its own server, else none (``nats_url`` given)."""

    def __post_init__(self) -> None:
        self._tmp = None
        if self.workdir is None:
            remove_stale_workdirs()
            self._tmp = tempfile.TemporaryDirectory(prefix=WORKDIR_PREFIX)
            self.workdir = self._tmp.name
            Path(self.workdir, OWNER_FILE).write_text(str(os.getpid()))
        Path(self.workdir).mkdir(parents=True, exist_ok=True)
        if self.security is None:
            self.security = LocalSecurity.from_env()
        if self.security is None and self.nats_url is None:
            self.security = LocalSecurity.create(os.path.join(self.workdir, "secrets"))

    @property
    def url(self) -> str:
        return self.nats_url or self.nats.url  # type: ignore[union-attr]

    def start_nats(self) -> None:
        if self.nats_url is None and self.nats is None:
            self.nats = NatsServer(store_dir=os.path.join(self.workdir, "nats"), security=self.security)
            os.makedirs(self.nats.store_dir, exist_ok=True)
            self.nats.start()

    @property
    def uses_fleet(self) -> bool:
        return self.fleet if self.fleet is not None else len(self.cluster.nodes) > FLEET_ABOVE

    @property
    def fleet_file(self) -> Path:
        """The cluster file the ``node-fleet`` process reads (written by ``start_services``)."""
        return Path(self.workdir) / "fleet-cluster.yaml"

    def identity_env(self, identity: str, nodes: tuple[str, ...] = ()) -> dict[str, str]:
        """Environment for a process (or ``Bus.connect``) acting as ``identity``; empty when
        the stack has no security bundle (its environment decides)."""
        return self.security.env(identity, nodes) if self.security is not None else {}

    def bootstrap(self, timeout_s: float = 60.0) -> None:
        """``phalanx bus init`` as the admin: declare every stream and bucket (once)."""
        if getattr(self, "_bootstrapped", False):
            return
        env = {**os.environ, **self.env, **self.identity_env("admin")}
        try:
            out = subprocess.run([sys.executable, "-m", "phalanx_cli.main", "bus", "init", "--nats", self.url,
                                  "--replicas", str(self.bus_replicas), "--simulator"],
                                 env=env, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            raise StackError(f"phalanx bus init did not finish in {timeout_s}s") from e
        if out.returncode != 0:
            raise StackError(f"phalanx bus init failed ({out.returncode}): {out.stderr.strip()[-2000:]}")
        self._bootstrapped = True

    def plan(self) -> list[tuple[str, str, list[str]]]:
        """(process name, service, extra args) for every process of the stack."""
        out = []
        if self.uses_fleet:
            out.append(("node-fleet", "node-fleet", ["--cluster-file", str(self.fleet_file)]))
        else:
            for n in self.cluster.nodes:
                fill = (["--gpu-model", n.gpu_model] if n.gpu_model else []) + (
                    ["--gpu-memory-mib", str(n.gpu_memory_mib)] if n.gpu_memory_mib else [])
                if n.mig_enabled:
                    fill.append("--mig-enabled")
                if n.advertise:
                    fill += ["--advertise", n.advertise]
                out.append((f"topology-discovery@{n.name}", "topology-discovery",
                            ["--node", n.name, "--topology-file", n.topology_file, *fill]))
                out.append((f"mig-manager@{n.name}", "mig-manager", ["--node", n.name, *_fake_mig_nvml(n)]))
        for service in ("placement", "binder", "gang-coordinator"):
            for i in range(self.replicas.get(service, 1)):
                out.append((service if i == 0 else f"{service}#{i + 1}", service, []))
        return out

    def start_services(self, timeout_s: float | None = None) -> None:
        """Start every process and wait until each is ready. The default bound is 60 s plus
        50 ms per node (a fleet reports every node before it is ready)."""
        self.spawn_services()
        bound = timeout_s if timeout_s is not None else self.ready_timeout_s
        self.wait_ready(list(self.procs), bound)
        self.wait_nodes_placeable(bound)

    @property
    def ready_timeout_s(self) -> float:
        return 60.0 + 0.05 * len(self.cluster.nodes)

    def spawn_services(self) -> None:
        """Declare the bus (``bootstrap``, once), then start every service process without
        waiting for it (``wait_ready`` waits). Called from the main thread, the children also
        die with this process (``children``)."""
        self.bootstrap()
        if self.uses_fleet:
            self.cluster.dump(self.fleet_file)
        for name, service, extra in self.plan():
            safe = name.replace("@", "-").replace("#", "-")
            node = name.partition("@")[2]
            sp = ServiceProc(name, ["run", service, "--nats", self.url, *extra, *self.service_args.get(service, [])],
                             Path(self.workdir) / f"{safe}.ready", Path(self.workdir) / f"{safe}.log",
                             env=self.identity_env(service, (node,) if node else ()))
            self.procs[name] = sp
            self._spawn(sp)

    def _spawn(self, sp: ServiceProc) -> None:
        sp.ready_file.unlink(missing_ok=True)
        log = open(sp.log_path, "ab")  # noqa: SIM115 - handed to the child
        env = {**os.environ, **self.env, **sp.env}
        sp.proc = subprocess.Popen([sys.executable, "-m", "phalanx_cli.main", *sp.args, "--ready-file", str(sp.ready_file)],
                                   stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                   **popen_options())
        log.close()

    def wait_ready(self, names: list[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        pending = set(names)
        while pending:
            for name in list(pending):
                sp = self.procs[name]
                if sp.ready_file.exists():
                    pending.discard(name)
                elif sp.proc is not None and sp.proc.poll() is not None:
                    raise StackError(f"{name} exited with {sp.proc.returncode} before it was ready:\n{self.tail(name)}")
            if pending and time.monotonic() > deadline:
                raise StackError(f"not ready after {timeout_s}s: {sorted(pending)}\n"
                                 + "\n".join(self.tail(n) for n in sorted(pending)))
            time.sleep(0.05)

    def wait_nodes_placeable(self, timeout_s: float) -> None:
        """Wait until every placement process holds each node of the cluster file fresh in its
        cache (``phalanx_placement_nodes``): the agents' reports are stored when they are ready,
        but placement learns them from a watch, and a pod placed before would see a smaller
        cluster."""
        want = len(self.cluster.nodes)
        deadline = time.monotonic() + timeout_s
        for name, sp in self.procs.items():
            if sp.args[1] != "placement":
                continue
            seen = None
            while seen != want:
                seen = self._placement_fresh_nodes(sp)
                if seen == want:
                    break
                if time.monotonic() > deadline:
                    raise StackError(f"{name} holds {seen} fresh node(s) of {want} after {timeout_s}s:\n"
                                     + self.tail(name))
                time.sleep(0.05)

    @staticmethod
    def _placement_fresh_nodes(sp: ServiceProc) -> int | None:
        try:
            port = int(sp.ready_file.read_text().split()[1])
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                text = r.read().decode()
        except (OSError, ValueError, IndexError):
            return None
        try:
            fresh = exposition.value(text, "phalanx_placement_nodes", state="fresh")
        except ValueError:  # a page cut short: ask again
            return None
        return None if fresh is None else int(fresh)

    def tail(self, name: str, lines: int = 15) -> str:
        try:
            text = self.procs[name].log_path.read_text(errors="replace").splitlines()
        except OSError:
            return f"[{name}: no log]"
        return "\n".join(f"[{name}] {line}" for line in text[-lines:])

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        sp = self.procs[name]
        if sp.proc and sp.proc.poll() is None:
            sp.proc.send_signal(sig)
            sp.proc.wait(10)

    def restart(self, name: str, timeout_s: float = 60.0) -> None:
        self.kill(name)
        self._spawn(self.procs[name])
        self.wait_ready([name], timeout_s)

    def nats_exit_code(self) -> int | None:
        """The embedded nats-server's exit code once it has died; None while it runs (or when
        the stack uses an external server)."""
        proc = self.nats.proc if self.nats is not None else None
        return proc.poll() if proc is not None else None

    def restart_nats(self) -> None:
        """Start the embedded nats-server again on the same port and store, so every client
        reconnects and JetStream keeps its streams and buckets."""
        if self.nats is not None:
            self.nats.restart()

    def stop(self) -> dict[str, float]:
        """SIGTERM every service, give them ``STOP_GRACE_S`` together, SIGKILL what is left, then
        stop nats; returns seconds each took to exit."""
        took: dict[str, float] = {}
        started = time.monotonic()
        for sp in self.procs.values():
            if sp.proc and sp.proc.poll() is None:
                sp.proc.send_signal(signal.SIGTERM)
        for sp in self.procs.values():
            if sp.proc is None:
                continue
            try:
                sp.proc.wait(max(0.0, started + STOP_GRACE_S - time.monotonic()))
            except subprocess.TimeoutExpired:
                sp.proc.kill()
                sp.proc.wait(5)
            took[sp.name] = time.monotonic() - started
        if self.nats is not None:
            self.nats.close()
            self.nats = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        return took
