"""Connection, declarations, publishing and KV compare-and-set over NATS JetStream.

Called by every service at start (``Bus.connect`` then ``Bus.declare``) and by the CLI.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass

import msgspec
import nats
import nats.errors
import nats.js.errors
from opentelemetry import trace

from phalanx_bus import counting, msgid
from phalanx_bus import declare as D
from phalanx_bus.errors import BusError
from phalanx_bus.kv import Kv
from phalanx_proto import subjects as S
from phalanx_proto.events import encoder
from phalanx_telemetry import inject_headers, log, tracer, warn

KV_BUCKETS = {b.name: b.history for b in S.BUCKETS}
"""Bucket → history depth (from the bus table)."""


def destination_template(subject: str) -> str:
    """The low-cardinality form of a subject (OTel ``messaging.destination.template``, and the
    ``{destination}`` of messaging span names): ``phx.gang.placement.default.g`` →
    ``phx.gang.placement.{gang}``. These are the channel templates of the bus table, the same
    addresses as ``proto/asyncapi.yaml``; a subject of no channel is its own template."""
    channel = S.channel_of(subject)
    return channel.template if channel is not None else subject


ENV_CREDS = "PHALANX_NATS_CREDS"
ENV_CA = "PHALANX_NATS_CA"
ENV_CERT = "PHALANX_NATS_CERT"
ENV_KEY = "PHALANX_NATS_KEY"


@dataclass(frozen=True, slots=True)
class BusAuth:
    """Who the connection is and how it is encrypted: a NATS ``.creds`` file (user JWT + seed,
    mounted from a Secret) and TLS files (the CA that signed the server's certificate; a client
    certificate and key only where the server asks for one)."""

    creds: str | None = None
    ca: str | None = None
    cert: str | None = None
    key: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> BusAuth:
        """``PHALANX_NATS_CREDS``, ``PHALANX_NATS_CA``, ``PHALANX_NATS_CERT``, ``PHALANX_NATS_KEY``."""
        env = os.environ if environ is None else environ
        return cls(env.get(ENV_CREDS) or None, env.get(ENV_CA) or None, env.get(ENV_CERT) or None,
                   env.get(ENV_KEY) or None)

    def ssl_context(self) -> ssl.SSLContext | None:
        if not (self.ca or self.cert):
            return None
        ctx = ssl.create_default_context(cafile=self.ca)
        if self.cert:
            ctx.load_cert_chain(self.cert, self.key)
        return ctx

    def seed(self) -> str | None:
        """The credential's user seed (what this identity's message ids are keyed with), or None."""
        if not self.creds:
            return None
        from phalanx_bus.credentials import read_creds_seed

        return read_creds_seed(self.creds)

    def inbox_prefix(self) -> str:
        """``_INBOX.<user public key>`` with credentials (each identity may subscribe to its own
        inbox only, see ``phalanx_bus.permissions``), the NATS default without."""
        if not self.creds:
            return "_INBOX"
        from phalanx_bus.credentials import decode_jwt_claims, read_creds_jwt

        return f"_INBOX.{decode_jwt_claims(read_creds_jwt(self.creds))['sub']}"


class _SslEofNoise(logging.Filter):
    """Drops asyncio's "returning true from eof_received() has no effect when using ssl": logged
    each time a TLS server closes a nats-py connection, it says nothing the bus's own
    disconnect warning does not, and would break a CLI command's one-line output."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "eof_received() has no effect when using ssl" not in record.getMessage()


_SSL_EOF_NOISE = _SslEofNoise()


class _Refusal(asyncio.Event):
    why = ""


def _is_refusal(e: BaseException) -> bool:
    """The server (or its certificate) refused us: retrying with the same settings cannot help."""
    text = str(e).lower()
    return isinstance(e, nats.errors.AuthorizationError | ssl.SSLError) or "authorization violation" in text \
        or "certificate verify failed" in text or "secure connection required" in text


class Bus:
    """One NATS connection with JetStream; the process's handle on the bus."""

    def __init__(self, nc, service: str, msg_ids: msgid.MsgIds | None = None, *,
                 closing: dict | None = None, refusals: list[str] | None = None) -> None:
        """``closing``: set ``["yes"]`` by ``close`` so the connection's callbacks know a break is
        ours; ``refusals``: the list the connection's error callback appends the server's refusals
        to (``connect`` makes both before the connection exists, so it can pass them)."""
        self.nc = nc
        self._closing = closing if closing is not None else {}
        counting.count_sends(nc)
        self.js = nc.jetstream(timeout=5.0)
        self.service = service
        self.msg_id = msg_ids or msgid.MsgIds(None)
        """Idempotency key → this identity's ``Nats-Msg-Id`` (``phalanx_bus.msgid``)."""
        self._kv: dict[str, Kv] = {}
        self.refusals: list[str] = refusals if refusals is not None else []
        """The server's recent "Permissions Violation" errors on this connection, oldest first."""
        self.reconnects = 0
        """How many times this connection came back after a break (server restart, network)."""
        self._reconnected = asyncio.Event()

    def _note_reconnect(self) -> None:
        self.reconnects += 1
        event, self._reconnected = self._reconnected, asyncio.Event()
        event.set()

    async def wait_reconnect(self, seen: int) -> None:
        """Return once ``reconnects`` exceeds ``seen`` (at once if it already does): the
        connection broke and came back, so server-side state such as ephemeral consumers may
        be gone (``KvMirror`` re-lists its bucket then)."""
        while self.reconnects <= seen:
            await self._reconnected.wait()

    @classmethod
    async def connect(cls, url: str, *, service: str, auth: BusAuth | None = None,
                      connect_timeout_s: float = 30.0) -> Bus:
        """Connect, retrying until ``connect_timeout_s``; afterwards reconnect forever.

        ``auth`` defaults to ``BusAuth.from_env()``: in a pod, the credentials and CA mounted
        from Secrets; in the tests, the session's admin identity. ``url`` may list several
        servers separated by commas (a cluster). A refused credential is not retried.
        """
        auth = BusAuth.from_env() if auth is None else auth
        options: dict = {}
        if auth.creds:
            options["user_credentials"] = auth.creds
            options["inbox_prefix"] = auth.inbox_prefix()
        tls = auth.ssl_context()
        if tls is not None:
            options["tls"] = tls
            if _SSL_EOF_NOISE not in logging.getLogger("asyncio").filters:
                logging.getLogger("asyncio").addFilter(_SSL_EOF_NOISE)
        servers = [u.strip() for u in url.split(",") if u.strip()]

        closing = {"yes": False}
        made: dict[str, Bus] = {}

        async def on_disconnect() -> None:
            if not closing["yes"]:
                warn("nats disconnected", url=url)

        async def on_reconnect() -> None:
            log("nats reconnected", url=url)
            if "bus" in made:
                made["bus"]._note_reconnect()

        refusals: list[str] = []
        refusal = _Refusal()

        async def on_error(e: Exception) -> None:
            if "permissions violation" in str(e).lower():
                refusals.append(str(e))
                del refusals[:-100]
            elif _is_refusal(e):
                refusal.why = repr(e)
                refusal.set()
            if not isinstance(e, nats.errors.SlowConsumerError):
                warn("nats error", error=repr(e))

        loop = asyncio.get_running_loop()
        deadline = loop.time() + connect_timeout_s
        while True:
            refusals.clear()
            attempt = asyncio.ensure_future(nats.connect(
                servers, name=f"phalanx-{service}", max_reconnect_attempts=-1,
                reconnect_time_wait=0.5, connect_timeout=2, allow_reconnect=True,
                disconnected_cb=on_disconnect, reconnected_cb=on_reconnect, error_cb=on_error,
                **options,
            ))
            refused = asyncio.ensure_future(refusal.wait())
            done, _ = await asyncio.wait({attempt, refused}, timeout=max(0.5, deadline - loop.time()),
                                         return_when=asyncio.FIRST_COMPLETED)
            refused.cancel()
            if attempt not in done:
                attempt.cancel()
                await asyncio.gather(attempt, return_exceptions=True)
                if refusal.is_set():
                    raise BusError(f"NATS at {url} refused the connection: {refusal.why} (check --nats-creds/"
                                   f"--nats-ca or {ENV_CREDS}/{ENV_CA})")
                raise BusError(f"cannot connect to NATS at {url} within {connect_timeout_s:.0f}s")
            try:
                nc = attempt.result()
            except Exception as e:  # noqa: BLE001 - retried, then reported
                if _is_refusal(e):
                    raise BusError(f"NATS at {url} refused the connection: {e!r}") from e
                if loop.time() > deadline:
                    raise BusError(f"cannot connect to NATS at {url}: {e}") from e
                await asyncio.sleep(0.5)
                continue
            bus = cls(nc, service, msgid.MsgIds.from_seed(auth.seed()), closing=closing, refusals=refusals)
            made["bus"] = bus
            return bus

    async def close(self) -> None:
        self._closing["yes"] = True
        try:
            await self.nc.drain()
        except Exception:  # noqa: BLE001 - closing a broken connection
            await self.nc.close()

    async def declare(self, *, replicas: int = 1, simulator: bool = True) -> None:
        """Declare every stream, bucket and durable of the bus table (``phalanx_bus.declare``;
        admin identity only). Idempotent."""
        await D.declare(self, replicas=replicas, simulator=simulator)

    def forget_kv(self, bucket: str) -> None:
        """Drop the cached handle of ``bucket`` (its stream was just changed)."""
        self._kv.pop(bucket, None)

    async def kv(self, bucket: str, *, history: int | None = None) -> Kv:
        """The KV bucket. One missing from the server is created when this identity may (the
        admin, e.g. in tests; a bucket outside the bus table with ``history``); otherwise
        ``BusError`` says to declare it first."""
        if bucket in self._kv:
            return self._kv[bucket]
        try:
            handle = await self.js.key_value(bucket)
        except (nats.js.errors.BucketNotFoundError, nats.js.errors.NotFoundError):
            spec = S.BUCKET.get(bucket) or S.Bucket(bucket, history or 1, "outside the bus table", (), rollups=True)
            try:
                await D.declare_bucket(self, spec)
                handle = await self.js.key_value(bucket)
            except (nats.errors.TimeoutError, nats.js.errors.APIError) as e:
                raise BusError(f"KV bucket {bucket} is not declared and {self.service} may not create it: run "
                               "`phalanx bus init` with the admin identity") from e
        except nats.errors.TimeoutError as e:
            raise BusError(f"KV bucket {bucket}: no answer (is {self.service} allowed to read it?)") from e
        kv = Kv(self, bucket, handle)
        self._kv[bucket] = kv
        return kv

    async def publish(self, subject: str, event: msgspec.Struct, *, msg_id: str | None = None,
                      headers: dict[str, str] | None = None, retry_s: float = 20.0) -> int:
        """Publish ``event`` durably and return its stream sequence.

        The message id is ``msg_id`` (default: the event's idempotency key) as this identity
        signs it (``phalanx_bus.msgid``), so publishing the same command twice inside the
        duplicate window stores it once, and no other identity can pre-empt the id. Retries while the server is unreachable,
        up to ``retry_s``; then raises ``BusError``.
        """
        key = self.msg_id(msg_id if msg_id is not None else event.key())  # type: ignore[attr-defined]
        payload = encoder.encode(event)
        kind = event.__struct_config__.tag
        template = destination_template(subject)
        attributes = {
            "messaging.system": "nats", "messaging.operation.name": "publish", "messaging.operation.type": "send",
            "messaging.destination.name": subject, "messaging.destination.template": template,
            "messaging.message.id": key, "messaging.message.body.size": len(payload),
            "phalanx.event": str(kind), **self._server_attributes(),
        }
        if getattr(event, "gang_id", ""):
            attributes.update({"phalanx.gang": event.gang_id, "phalanx.attempt": event.attempt})  # type: ignore[attr-defined]
        with tracer().start_as_current_span(f"publish {template}", kind=trace.SpanKind.PRODUCER,
                                            attributes=attributes):
            hdrs = {"Nats-Msg-Id": key, "Phalanx-Kind": str(kind), **(headers or {})}
            inject_headers(hdrs)
            return await self.publish_raw(subject, payload, hdrs, retry_s=retry_s)

    async def publish_scheduled(self, subject: str, event: msgspec.Struct, *, at: float, target: str,
                                retry_s: float = 20.0) -> int:
        """Store ``event`` on ``subject`` as a JetStream scheduled message (nats-server 2.12+,
        stream with ``allow_msg_schedules``): the server publishes it to ``target`` at unix
        time ``at`` (whole seconds, rounded up), even if every client is down meanwhile.

        ``target`` must be a subject of the same stream (the server refuses others). A stream
        keeps one pending schedule per subject: publishing again on ``subject`` replaces it.
        """
        import datetime
        import math

        when = datetime.datetime.fromtimestamp(math.ceil(at), tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return await self.publish(subject, event, retry_s=retry_s,
                                  headers={"Nats-Schedule": f"@at {when}", "Nats-Schedule-Target": target})

    def _server_attributes(self) -> dict[str, object]:
        """``server.address``/``server.port`` of the NATS server this connection is on."""
        url = getattr(self.nc, "connected_url", None)
        if url is None or not url.hostname:
            return {}
        return {"server.address": url.hostname, "server.port": url.port or 4222}

    async def publish_raw(self, subject: str, payload: bytes, headers: dict[str, str] | None,
                          *, retry_s: float = 20.0) -> int:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + retry_s
        while True:
            try:
                ack = await self.js.publish(subject, payload, headers=headers, timeout=2.0)
                return ack.seq
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError,
                    nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError,
                    nats.errors.OutboundBufferLimitError, nats.js.errors.ServiceUnavailableError) as e:
                if loop.time() > deadline:
                    raise BusError(f"publish to {subject} failed: {e!r}") from e
                await asyncio.sleep(0.25)


async def tail(bus: Bus, subject: str, decoder: msgspec.json.Decoder,
               on_subscribed: Callable[[], object] | None = None) -> AsyncIterator[tuple[str, object]]:
    """Live events on ``subject`` (core subscription, nothing durable): ``(subject, event)``.
    Undecodable messages are yielded as ``(subject, DecodeFailure)``. ``on_subscribed`` is called
    once the server has the subscription (nothing published after that is missed)."""
    seen = len(bus.refusals)
    sub = await bus.nc.subscribe(subject)
    await bus.nc.flush()
    await asyncio.sleep(0.2)  # a refusal (-ERR) may trail the flush's PONG slightly
    if any(f'"{subject.lower()}"' in r.lower() for r in bus.refusals[seen:]):
        await sub.unsubscribe()
        raise BusError(f"the server refused a subscription to {subject} for this identity")
    if on_subscribed is not None:
        on_subscribed()
    try:
        async for msg in sub.messages:
            try:
                yield msg.subject, decoder.decode(msg.data)
            except (msgspec.DecodeError, msgspec.ValidationError) as e:
                yield msg.subject, DecodeFailure(str(e), msg.data)
    finally:
        try:
            await sub.unsubscribe()
        except Exception:  # noqa: BLE001 - connection already closed
            pass


@dataclass(frozen=True, slots=True)
class DecodeFailure:
    error: str
    data: bytes


