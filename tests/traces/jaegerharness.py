"""A real trace receiver for the tests: the Jaeger v2 binary built by ``tools/traces/build.sh``.

``Jaeger.start(workdir)`` writes a config that listens on 127.0.0.1 free ports only (OTLP/HTTP
receiver, query HTTP and gRPC), keeps traces in memory, and waits until the query API answers.
``traces(service, ...)`` and ``trace(trace_id)`` read Jaeger's query API
(``/api/traces``), and ``Span`` is one span of its answer with its service name resolved.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "tools" / "traces" / "build.sh"

CONFIG = """\
# Written by tests/traces/jaegerharness.py: loopback only, traces in memory, no self-telemetry.
service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: []
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_storage:
    backends:
      mem:
        memory:
          max_traces: 100000
  jaeger_query:
    storage:
      traces: mem
    enable_tracing: false
    http:
      endpoint: 127.0.0.1:{query_port}
    grpc:
      endpoint: 127.0.0.1:{query_grpc_port}
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:{otlp_port}
exporters:
  jaeger_storage_exporter:
    trace_storage: mem
"""


class JaegerMissing(RuntimeError):
    pass


def bin_dir() -> Path:
    """The cache dir ``tools/traces/build.sh`` builds into (the script only prints it)."""
    out = subprocess.run(["bash", str(BUILD), "--print-bin-dir"], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip().splitlines()[-1])


def find_jaeger() -> Path:
    d = bin_dir()
    binary = d / "jaeger"
    if not (d / ".build-complete").is_file() or not os.access(binary, os.X_OK):
        raise JaegerMissing(
            f"the trace receiver is not built: {binary} is missing.\n"
            f"Build it (about 5 minutes cold on 2 cores, needs Go >= 1.26 and the module proxy) with:\n"
            f"    bash tools/traces/build.sh\n"
            f"(`make test` runs that before pytest; PHALANX_TRACES_CACHE moves the cache.)")
    return binary


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Span:
    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    service: str
    tags: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.tags.get("span.kind", "internal"))

    def __repr__(self) -> str:  # short, for assertion messages
        return f"<{self.service}: {self.name} ({self.kind}) {self.span_id}>"


@dataclass
class Trace:
    trace_id: str
    spans: list[Span] = field(default_factory=list)

    def by_id(self) -> dict[str, Span]:
        return {s.span_id: s for s in self.spans}

    def parent(self, span: Span) -> Span | None:
        return self.by_id().get(span.parent_id or "")

    def ancestors(self, span: Span) -> list[Span]:
        out, seen, cur = [], set(), self.parent(span)
        while cur is not None and cur.span_id not in seen:
            out.append(cur)
            seen.add(cur.span_id)
            cur = self.parent(cur)
        return out

    def find(self, **want: Any) -> list[Span]:
        """Spans whose name/service/kind and tags equal ``want`` (tag names with dots as keys of
        a dict passed as ``tags=``)."""
        tags = want.pop("tags", {})
        out = []
        for s in self.spans:
            if any(getattr(s, k) != v for k, v in want.items()):
                continue
            if any(s.tags.get(k) != v for k, v in tags.items()):
                continue
            out.append(s)
        return out

    def outline(self) -> str:
        """The trace as an indented tree, for failure messages."""
        children: dict[str | None, list[Span]] = {}
        ids = {s.span_id for s in self.spans}
        for s in self.spans:
            children.setdefault(s.parent_id if s.parent_id in ids else None, []).append(s)
        lines: list[str] = []

        def walk(parent: str | None, depth: int) -> None:
            for s in children.get(parent, []):
                lines.append("  " * depth + repr(s))
                walk(s.span_id, depth + 1)
        walk(None, 0)
        return "\n".join(lines)


def _decode_tag(tag: dict[str, Any]) -> Any:
    value = tag.get("value")
    if tag.get("type") == "string" and isinstance(value, str) and value.startswith("["):
        try:
            return json.loads(value)  # OTel array attributes arrive as JSON text in the v1 API
        except ValueError:
            return value
    return value


def _parse(doc: dict[str, Any]) -> Trace:
    processes = {pid: p.get("serviceName", "") for pid, p in (doc.get("processes") or {}).items()}
    spans = []
    for s in doc.get("spans") or []:
        parent = next((r["spanID"] for r in s.get("references") or [] if r.get("refType") == "CHILD_OF"), None)
        spans.append(Span(trace_id=s["traceID"], span_id=s["spanID"], parent_id=parent, name=s["operationName"],
                          service=processes.get(s.get("processID"), ""),
                          tags={t["key"]: _decode_tag(t) for t in s.get("tags") or []}))
    return Trace(trace_id=doc.get("traceID", ""), spans=spans)


class Jaeger:
    """One Jaeger process. ``otlp_endpoint`` is what ``OTEL_EXPORTER_OTLP_ENDPOINT`` takes."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = Path(workdir)
        self.binary = find_jaeger()
        self.otlp_port = free_port()
        self.query_port = free_port()
        self.query_grpc_port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def otlp_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.otlp_port}"

    @property
    def query_url(self) -> str:
        return f"http://127.0.0.1:{self.query_port}"

    def start(self, timeout_s: float = 30.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "jaeger.yaml"
        config.write_text(CONFIG.format(otlp_port=self.otlp_port, query_port=self.query_port,
                                        query_grpc_port=self.query_grpc_port))
        log = open(self.workdir / "jaeger.log", "wb")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen([str(self.binary), "--config", f"file:{config}"], stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + timeout_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jaeger exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                self.get("/api/services")
                with socket.create_connection(("127.0.0.1", self.otlp_port), timeout=0.5):
                    return
            except OSError as e:
                last = e
            time.sleep(0.1)
        raise RuntimeError(f"jaeger not ready after {timeout_s}s ({last}):\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join((self.workdir / "jaeger.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "[no jaeger log]"

    def get(self, path: str, **params: Any) -> dict[str, Any]:
        query = ("?" + urllib.parse.urlencode(params)) if params else ""
        with urllib.request.urlopen(f"{self.query_url}{path}{query}", timeout=5) as r:
            return json.loads(r.read())

    def services(self) -> list[str]:
        return sorted(self.get("/api/services").get("data") or [])

    def traces(self, service: str, *, operation: str | None = None, tags: dict[str, Any] | None = None,
               limit: int = 50) -> list[Trace]:
        params: dict[str, Any] = {"service": service, "limit": limit, "lookback": "1h"}
        if operation:
            params["operation"] = operation
        if tags:
            params["tags"] = json.dumps({k: str(v) for k, v in tags.items()})
        return [_parse(t) for t in self.get("/api/traces", **params).get("data") or []]

    def trace(self, trace_id: str) -> Trace:
        docs = self.get(f"/api/traces/{trace_id}").get("data") or []
        return _parse(docs[0]) if docs else Trace(trace_id=trace_id)
