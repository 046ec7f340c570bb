"""The one structured-concurrency shape every service runs in (style rule 8).

``serve(name, body)`` sets up logs and tracing, runs ``body(task_status=...)`` inside a task
group, exposes ``/healthz`` and ``/readyz`` (ready only once ``body`` has reported started,
i.e. its consumers are live) and ``/metrics`` (Prometheus text format, from
``phalanx_telemetry.metrics.REGISTRY``), writes the optional ready file, and turns SIGTERM/SIGINT into
cancellation so the process exits within a few seconds.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import anyio.abc

from phalanx_telemetry import log, setup_logging, setup_tracing
from phalanx_telemetry.metrics import CONTENT_TYPE, REGISTRY

Body = Callable[..., Awaitable[None]]

SHUTDOWN_GRACE_S = 3.0


class Health:
    """Readiness flag plus a tiny HTTP endpoint for Kubernetes probes and Prometheus scrapes."""

    def __init__(self) -> None:
        self.ready = False
        self.port = 0

    async def serve(self, host: str, port: int, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        listener = await anyio.create_tcp_listener(local_host=host, local_port=port)
        self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
        task_status.started()
        async with listener:
            await listener.serve(self._handle)

    async def _handle(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            try:
                with anyio.fail_after(2):
                    request = await stream.receive(4096)
            except (TimeoutError, anyio.EndOfStream, anyio.BrokenResourceError):
                return
            path = request.split(b" ", 2)[1].decode(errors="replace") if b" " in request else "/"
            path = path.split("?", 1)[0]
            content_type = b"text/plain; charset=utf-8"
            if path == "/metrics":
                status, body, content_type = b"200 OK", REGISTRY.render().encode(), CONTENT_TYPE.encode()
            else:
                ok = path == "/healthz" or (path == "/readyz" and self.ready)
                body = b"ok\n" if ok else b"not ready\n"
                status = b"200 OK" if ok else (b"404 Not Found" if path not in ("/healthz", "/readyz") else b"503 Service Unavailable")
            try:
                await stream.send(b"HTTP/1.1 " + status + b"\r\nContent-Type: " + content_type + b"\r\nContent-Length: " + str(len(body)).encode()
                                  + b"\r\nConnection: close\r\n\r\n" + body)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass


def serve(name: str, body: Body, *, health_addr: str = "127.0.0.1:0", ready_file: str | None = None) -> int:
    """Run a service until SIGTERM/SIGINT; return the exit code."""
    setup_logging(name)
    provider = setup_tracing(name)
    host, _, port = health_addr.rpartition(":")
    health = Health()

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            async def watch_signals() -> None:
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for signum in signals:
                        log("stopping", signal=signal.Signals(signum).name)
                        tg.cancel_scope.cancel()
                        return

            tg.start_soon(watch_signals)
            await tg.start(health.serve, host or "127.0.0.1", int(port or 0))
            await tg.start(body)
            health.ready = True
            if ready_file:
                tmp = f"{ready_file}.tmp"
                Path(tmp).write_text(f"{os.getpid()} {health.port}\n")
                os.replace(tmp, ready_file)
            log("ready", pid=os.getpid(), health_port=health.port)

    try:
        anyio.run(main)
    finally:
        provider.force_flush(int(SHUTDOWN_GRACE_S * 1000))
        provider.shutdown()
        if ready_file:
            Path(ready_file).unlink(missing_ok=True)
    log("stopped")
    return 0
