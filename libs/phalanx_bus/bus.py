"""Connection, declarations, publishing and KV compare-and-set over NATS JetStream.

Called by every service at start (``Bus.connect`` then ``Bus.declare``) and by the CLI.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass

import anyio
import msgspec
import nats
import nats.errors
import nats.js.errors
from nats.js import api
from opentelemetry import trace

from phalanx_proto import subjects as S
from phalanx_proto.events import encoder
from phalanx_telemetry import inject_headers, log, tracer, warn


class BusError(RuntimeError):
    """The bus could not do what was asked (server unreachable past the retry budget, …)."""


class KvConflict(BusError):
    """A compare-and-set lost: the key changed since the revision that was read."""


@dataclass(frozen=True, slots=True)
class KvEntry:
    key: str
    value: bytes
    revision: int
    deleted: bool = False


StreamSpec = S.Stream
STREAMS = S.STREAMS
KV_BUCKETS = {b.name: b.history for b in S.BUCKETS}
"""Bucket → history depth (from the bus table)."""

DUPLICATE_WINDOW_S = 120.0


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

    def inbox_prefix(self) -> str:
        """``_INBOX.<user public key>`` with credentials (each identity may subscribe to its own
        inbox only, see ``phalanx_bus.permissions``), the NATS default without."""
        if not self.creds:
            return "_INBOX"
        from phalanx_bus.credentials import decode_jwt_claims, read_creds_jwt

        return f"_INBOX.{decode_jwt_claims(read_creds_jwt(self.creds))['sub']}"


async def _cas(write, conflict: str) -> int:
    """Await a KV write, mapping "wrong last sequence" (err_code 10071) to ``KvConflict``."""
    try:
        return await write
    except nats.js.errors.KeyWrongLastSequenceError as e:
        raise KvConflict(conflict) from e
    except nats.js.errors.APIError as e:
        if e.err_code == 10071:
            raise KvConflict(conflict) from e
        raise


class Kv:
    """Compare-and-set access to one KV bucket (style rule 7)."""

    def __init__(self, bus: Bus, bucket: str, handle) -> None:
        self._bus = bus
        self.bucket = bucket
        self._kv = handle

    async def get(self, key: str) -> KvEntry | None:
        try:
            e = await self._kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            return None
        if getattr(e, "operation", None) in ("DEL", "PURGE"):
            return None
        return KvEntry(key, e.value or b"", e.revision)  # nats-py reads an empty value as None

    async def tombstone(self, key: str) -> int:
        """The revision of the key's delete marker when its last value was deleted, else 0: what
        an atomic batch must expect as the key's last sequence to create it anew."""
        try:
            await self._kv.get(key)
        except nats.js.errors.KeyNotFoundError as e:
            entry = getattr(e, "entry", None)
            return entry.revision if entry is not None and getattr(e, "op", None) in ("DEL", "PURGE") else 0
        return 0

    async def create(self, key: str, value: bytes) -> int:
        """Create ``key``; raise ``KvConflict`` when it exists."""
        return await _cas(self._kv.create(key, value), f"{self.bucket}/{key} exists")

    async def update(self, key: str, value: bytes, *, last: int) -> int:
        """Write ``key`` only if its revision is still ``last``; raise ``KvConflict`` otherwise."""
        return await _cas(self._kv.update(key, value, last=last), f"{self.bucket}/{key} changed since revision {last}")

    async def put(self, key: str, value: bytes) -> int:
        return await self._kv.put(key, value)

    async def delete(self, key: str, *, last: int | None = None) -> None:
        try:
            await self._kv.delete(key, last=last)
        except nats.js.errors.KeyWrongLastSequenceError as e:
            raise KvConflict(f"{self.bucket}/{key} changed since revision {last}") from e
        except nats.js.errors.KeyNotFoundError:
            return

    async def keys(self, pattern: str = ">") -> list[str]:
        """Every key matching ``pattern`` (a subject pattern over keys, e.g. ``node-a.>``) with a
        message in the bucket (deleted keys included; ``get`` skips them).

        Read from the server's stream state (``subjects_filter``), not from a watcher: nats-py's
        watcher-based ``keys()`` can end early while keys are being written, and a snapshot
        that silently misses keys would make placement think nodes are gone.
        """
        import json

        prefix = f"$KV.{self.bucket}."
        out: list[str] = []
        offset = 0
        while True:
            req = json.dumps({"subjects_filter": f"{prefix}{pattern}", "offset": offset}).encode()
            msg = await self._bus.nc.request(f"$JS.API.STREAM.INFO.KV_{self.bucket}", req, timeout=5.0)
            resp = json.loads(msg.data)
            if "error" in resp:
                raise BusError(f"stream info for KV {self.bucket}: {resp['error']}")
            subjects = (resp.get("state") or {}).get("subjects") or {}
            out.extend(subj[len(prefix):] for subj in subjects)
            offset += len(subjects)
            total = resp.get("total", offset)
            if not subjects or offset >= total:
                return sorted(out)

    async def items(self, pattern: str = ">") -> list[KvEntry]:
        """Every live entry (of keys matching ``pattern``). Keys deleted between listing and
        reading are skipped."""
        out = []
        for k in await self.keys(pattern):
            e = await self.get(k)
            if e is not None:
                out.append(e)
        return out

    async def watch(self, keys: str = ">") -> AsyncIterator[KvEntry | None]:
        """Current values, then ``None`` once they are all delivered, then every change
        (deletions as entries with ``deleted=True``). Ends when the watcher is stopped."""
        watcher = await self._kv.watch(keys)
        try:
            async for e in watcher:
                if e is None:
                    yield None
                    continue
                deleted = getattr(e, "operation", None) in ("DEL", "PURGE")
                yield KvEntry(e.key, e.value or b"", e.revision, deleted)
        finally:
            with anyio.move_on_after(2, shield=True):  # a cancelled reader still unsubscribes
                try:
                    await watcher.stop()
                except Exception:  # noqa: BLE001 - the connection may already be gone
                    pass


async def _settle(what: str, attempt, timeout_s: float = 60.0) -> None:
    """Run a declaration until it succeeds: a JetStream cluster that has just started (or lost
    its meta leader) answers "no suitable peers" or 503 for a while, and two declarers racing
    see "already in use" once. ``BusError`` with the last answer after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            await attempt()
            return
        except (nats.js.errors.BadRequestError, nats.js.errors.ServiceUnavailableError,
                nats.errors.TimeoutError, nats.errors.NoRespondersError) as e:
            if loop.time() > deadline:
                raise BusError(f"cannot {what}: {e!r}") from e
            await asyncio.sleep(0.5)


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

    def __init__(self, nc, service: str) -> None:
        self.nc = nc
        self.js = nc.jetstream(timeout=5.0)
        self.service = service
        self._kv: dict[str, Kv] = {}
        self.refusals: list[str] = []
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
            bus = cls(nc, service)
            bus._closing = closing
            bus.refusals = refusals
            made["bus"] = bus
            return bus

    async def close(self) -> None:
        getattr(self, "_closing", {})["yes"] = True
        try:
            await self.nc.drain()
        except Exception:  # noqa: BLE001 - closing a broken connection
            await self.nc.close()

    async def declare(self, streams: Iterable[StreamSpec] = STREAMS, buckets: dict[str, int] | None = None,
                      *, replicas: int = 1) -> None:
        """Create or update the streams and KV buckets of the bus table (default) with
        ``replicas`` copies each. Needs the admin identity (``phalanx bus init``, the bootstrap
        Job, ``phalanx up``, the test fixtures); services only open what exists. Idempotent."""
        for spec in streams:
            await self.declare_stream(spec, replicas=replicas)
        if buckets is None:
            for b in S.BUCKETS:
                await self.declare_bucket(b.name, history=b.history, replicas=replicas, atomic=b.atomic)
        else:
            for name, history in buckets.items():
                await self.declare_bucket(name, history=history, replicas=replicas)

    async def declare_stream(self, spec: StreamSpec, *, replicas: int = 1) -> None:
        cfg = api.StreamConfig(
            name=spec.name, subjects=list(spec.subjects), storage=api.StorageType.FILE,
            retention=api.RetentionPolicy.LIMITS, max_age=spec.max_age_s,
            max_msgs_per_subject=spec.max_msgs_per_subject, duplicate_window=DUPLICATE_WINDOW_S,
            allow_msg_schedules=True if spec.allow_schedules else None, num_replicas=replicas,
        )
        await _settle(f"declare stream {spec.name}", lambda: self._put_stream(cfg))

    async def _put_stream(self, cfg: api.StreamConfig) -> None:
        try:
            await self.js.stream_info(cfg.name)
            await self.js.update_stream(cfg)
        except nats.js.errors.NotFoundError:
            await self.js.add_stream(cfg)

    async def declare_bucket(self, bucket: str, *, history: int = 1, replicas: int = 1, atomic: bool = False) -> Kv:
        """Create the KV bucket (direct gets on, so per-key read permissions work), or bring
        an existing one to ``replicas``, direct gets and, with ``atomic``, atomic batches."""
        async def create() -> None:
            try:
                await self.js.stream_info(f"KV_{bucket}")
            except nats.js.errors.NotFoundError:
                await self.js.create_key_value(bucket=bucket, history=history, replicas=replicas, direct=True)

        await _settle(f"declare KV bucket {bucket}", create)
        info = await self.js.stream_info(f"KV_{bucket}")
        cfg = info.config
        if (cfg.num_replicas or 1) != replicas or not cfg.allow_direct or (atomic and not cfg.allow_atomic):
            cfg.num_replicas, cfg.allow_direct = replicas, True
            cfg.allow_atomic = True if atomic or cfg.allow_atomic else None
            await self.js.update_stream(cfg)
        self._kv.pop(bucket, None)
        return await self.kv(bucket)

    async def kv(self, bucket: str, *, history: int | None = None) -> Kv:
        """The KV bucket. One missing from the server is created when this identity may (the
        admin, e.g. in tests); otherwise ``BusError`` says to declare it first."""
        if bucket in self._kv:
            return self._kv[bucket]
        try:
            handle = await self.js.key_value(bucket)
        except (nats.js.errors.BucketNotFoundError, nats.js.errors.NotFoundError):
            known = S.BUCKET.get(bucket)
            depth = history if history is not None else (known.history if known else 1)
            try:
                await self.declare_bucket(bucket, history=depth, atomic=bool(known and known.atomic))
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

        ``msg_id`` defaults to the event's idempotency key, so publishing the same command twice
        inside the duplicate window stores it once. Retries while the server is unreachable,
        up to ``retry_s``; then raises ``BusError``.
        """
        key = msg_id if msg_id is not None else event.key()  # type: ignore[attr-defined]
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


async def enable_atomic(bus: Bus, bucket: str) -> None:
    """Check that a KV bucket's stream allows JetStream atomic batch publish (nats-server
    2.12+), turning it on when this identity may (``Bus.declare`` does it for the table's
    atomic buckets); ``BusError`` when it is off and cannot be turned on."""
    await bus.kv(bucket)
    info = await bus.js.stream_info(f"KV_{bucket}")
    if getattr(info.config, "allow_atomic", False):
        return
    try:
        await bus.declare_bucket(bucket, history=info.config.max_msgs_per_subject or 1,
                                 replicas=info.config.num_replicas or 1, atomic=True)
    except (nats.errors.TimeoutError, nats.js.errors.APIError) as e:
        raise BusError(f"KV bucket {bucket} does not allow atomic batches: run `phalanx bus init`") from e


async def kv_atomic_write(bus: Bus, bucket: str, writes: list[tuple[str, bytes, int]], *,
                          timeout_s: float = 5.0) -> int:
    """Write several KV keys in one JetStream atomic batch: all or none.

    Each write is ``(key, value, expected_revision)`` (0: the key must have no value — never
    written, or deleted: a deleted key's delete marker is looked up and expected). Any stale
    revision fails the whole batch with ``KvConflict`` and changes nothing. Returns the stream
    sequence of the last write. The server refuses batches over 1,000 messages.
    """
    import json
    import uuid

    if not writes:
        return 0
    if len(writes) > 1000:
        raise BusError(f"atomic batch of {len(writes)} writes exceeds the server limit of 1000")
    if any(expected == 0 for _, _, expected in writes):
        kv = await bus.kv(bucket)
        writes = [(key, value, expected or await kv.tombstone(key)) for key, value, expected in writes]
    batch_id = uuid.uuid4().hex
    last = len(writes)
    for n, (key, value, expected) in enumerate(writes, start=1):
        headers = {"Nats-Batch-Id": batch_id, "Nats-Batch-Sequence": str(n),
                   "Nats-Expected-Last-Subject-Sequence": str(expected)}
        subject = f"$KV.{bucket}.{key}"
        if n < last:
            await bus.nc.publish(subject, value, headers=headers)
            continue
        headers["Nats-Batch-Commit"] = "1"
        try:
            reply = await bus.nc.request(subject, value, headers=headers, timeout=timeout_s)
        except nats.errors.TimeoutError as e:
            raise BusError(f"atomic batch {batch_id} on {bucket}: no reply to commit") from e
        ack = json.loads(reply.data or b"{}")
        err = ack.get("error")
        if err:
            if err.get("err_code") == 10071:
                raise KvConflict(f"{bucket}: {err.get('description', 'wrong last sequence')}")
            raise BusError(f"atomic batch on {bucket} refused: {err}")
        return int(ack.get("seq", 0))
    return 0
