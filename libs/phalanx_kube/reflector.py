"""The Kubernetes adapter's one list/watch loop (client-go's Reflector, cut to what Phalanx
needs), shared by ``KubeCluster.watch_pods`` and ``KubeCluster.watch_node``.

``Reflector.changes()`` yields, for as long as it is iterated:

* ``Listed(items)`` after every list: every object the (paged) list returned, and the watch
  starts from the list's resourceVersion;
* ``Watched(type, obj)`` for each ``ADDED``/``MODIFIED``/``DELETED`` watch event; the watch asks
  for bookmarks, which only move the resourceVersion on (so a resumed watch starts near now).

The server ends each watch after a random 4-5 minutes; it is resumed from the last
resourceVersion seen. ``410 Gone`` (that resourceVersion is compacted away, as a status or as
an ``ERROR`` event) lists again. Any other failure — the API server away, a broken stream, an
``ERROR`` event, a watch that ends at once without an event — waits a jittered backoff (0.5 s
doubling to 10 s, ±25 %) and resumes from the last resourceVersion, or lists again when there
has been no list yet. What the caller makes of the objects (pod events, a node's state) is
the caller's; the reflector keeps no objects.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
import msgspec

from phalanx_telemetry import warn

WATCH_TIMEOUT_S = (240, 300)
"""The server ends each watch after a random time in this range; the reflector resumes it."""
PAGE = 500
BACKOFF_S = (0.5, 10.0)
"""First and longest pause after a failure."""

Call = Callable[..., Awaitable[tuple[int, Any]]]
"""``KubeCluster._call``: a raw API call, rate-limited, non-2xx raised."""
Acquire = Callable[[], Awaitable[None]]
"""Waits for the client-side rate limiter (a watch's start is a request too)."""


@dataclass(frozen=True, slots=True)
class Listed:
    items: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Watched:
    type: Literal["ADDED", "MODIFIED", "DELETED"]
    obj: dict[str, Any]


class Gone(Exception):
    """The watch's resourceVersion is too old (HTTP 410): list again."""


class Reflector:
    """List + watch of the objects ``method`` (a generated ``list_*`` call) returns with
    ``field_selector``; ``keep`` drops objects the caller never wants (a field selector cannot
    say everything)."""

    def __init__(self, what: str, method: Any, *, call: Call, acquire: Acquire, field_selector: str | None = None,
                 keep: Callable[[dict[str, Any]], bool] | None = None) -> None:
        self.what, self.method, self.field_selector = what, method, field_selector
        self._call, self._acquire, self._keep = call, acquire, keep

    async def changes(self) -> AsyncIterator[Listed | Watched]:
        """``Listed``/``Watched`` until cancelled (module docstring); never raises but for
        cancellation."""
        rv: str | None = None
        delay = BACKOFF_S[0]
        while True:
            try:
                if rv is None:
                    items, rv = await self.list()
                    yield Listed(items)
                started, seen = time.monotonic(), 0
                async with aclosing(self.watch(rv)) as events:
                    async for etype, obj in events:
                        delay, seen = BACKOFF_S[0], seen + 1
                        rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                        if etype == "ERROR":
                            if obj.get("code") == 410:
                                raise Gone()
                            raise ConnectionError(f"watch {self.what}: {obj.get('code')} {obj.get('message', obj)}")
                        if etype in ("ADDED", "MODIFIED", "DELETED") and (self._keep is None or self._keep(obj)):
                            yield Watched(etype, obj)
                if not seen and time.monotonic() - started < 1.0:
                    raise ConnectionError(f"watch {self.what} ended at once")  # back off, do not spin
            except asyncio.CancelledError:
                raise
            except Gone:
                rv = None
            except Exception as e:  # noqa: BLE001 - API server away or stream broken: back off, resume
                pause = delay * (0.75 + 0.5 * random.random())
                warn("watch failed", what=self.what, error=repr(e)[:300], retry_s=round(pause, 2))
                await asyncio.sleep(pause)
                delay = min(delay * 2, BACKOFF_S[1])

    async def list(self) -> tuple[list[dict[str, Any]], str]:
        """Every object, page by page, and the resourceVersion of the first page."""
        items: list[dict[str, Any]] = []
        token, rv = None, ""
        while True:
            kw: dict[str, Any] = {"limit": PAGE}
            if token:
                kw["_continue"] = token
            if self.field_selector:
                kw["field_selector"] = self.field_selector
            _, body = await self._call(f"list {self.what}", self.method, **kw)
            meta = body.get("metadata") or {}
            rv = rv or meta.get("resourceVersion", "")
            items += [o for o in body.get("items") or [] if self._keep is None or self._keep(o)]
            token = meta.get("continue")
            if not token:
                return items, rv

    async def watch(self, rv: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """One watch request from ``rv``: (type, object) until the server ends it."""
        server_timeout = random.randint(*WATCH_TIMEOUT_S)
        kw: dict[str, Any] = {"watch": True, "resource_version": rv, "allow_watch_bookmarks": True,
                              "timeout_seconds": server_timeout}
        if self.field_selector:
            kw["field_selector"] = self.field_selector
        await self._acquire()
        resp = await self.method(
            _preload_content=False, **kw,
            _request_timeout=aiohttp.ClientTimeout(sock_connect=10, sock_read=server_timeout + 30))
        try:
            if resp.status == 410:
                raise Gone()
            if resp.status != 200:
                raise ConnectionError(f"watch {self.what}: HTTP {resp.status}: {(await resp.read())[:200]!r}")
            buf = b""
            async for chunk in resp.content.iter_any():
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        ev = msgspec.json.decode(line)
                        yield ev.get("type", ""), ev.get("object") or {}
        finally:
            resp.release()
