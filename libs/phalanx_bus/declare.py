"""Declaring the bus: the streams, KV buckets and durable consumers of the bus table, with
their limits (admin identity only: ``phalanx bus init``, the bootstrap Job, ``phalanx up``,
the test fixtures; services only open what exists).

What each declaration guarantees (docs/security.md, "Storage limits"):

* **streams**: ``max_bytes`` (old messages go first), ``max_msg_size`` (the server refuses a
  larger message), ``max_msgs_per_subject`` where one publisher owns a subject, and no rollup
  headers;
* **KV buckets**: the same, with ``max_value_size``; rollup headers off (``Nats-Rollup`` on one
  key would otherwise erase every key of the bucket: nothing of Phalanx purges a key), direct
  gets on (per-key read grants), atomic batches where the table says;
* **durable consumers**: pull consumers only, created here with the table's filter, ack wait
  and delivery limit (``durable_config``); a service binds to its durable and never creates it
  (gang-coordinator creates each node's MIG consumer: ``declare_consumer``).

Every call is idempotent: an existing stream, bucket or consumer is brought to the table's
settings.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

import nats.errors
import nats.js.errors
from nats.js import api

from phalanx_bus.errors import BusError
from phalanx_bus.kv import Kv
from phalanx_proto import subjects as S


class Bus(Protocol):
    """What declaring needs of the bus (``phalanx_bus.bus.Bus`` is one): its JetStream context
    and its buckets' ``Kv`` (forgotten once a bucket's configuration changed)."""

    js: Any

    async def kv(self, bucket: str, **kw: Any) -> Kv: ...

    def forget_kv(self, bucket: str) -> None: ...

DUPLICATE_WINDOW_S = 120.0
MAX_ACK_PENDING = 1000


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


async def declare(bus: Bus, *, replicas: int = 1, simulator: bool = True) -> None:
    """Every stream, bucket and admin-created durable of the bus table, ``replicas`` copies
    each (``simulator``: also the simulated cluster's buckets and the node fleet's durable)."""
    for spec in S.STREAMS:
        await declare_stream(bus, spec, replicas=replicas)
    for b in S.BUCKETS:
        if simulator or not b.simulator_only:
            await declare_bucket(bus, b, replicas=replicas)
    for c in S.CONSUMERS:
        if c.creator == S.ADMIN and (simulator or c.identity != S.NODE_FLEET):
            await declare_consumer(bus, c)


async def declare_stream(bus: Bus, spec: S.Stream, *, replicas: int = 1) -> None:
    cfg = api.StreamConfig(
        name=spec.name, subjects=list(spec.subjects), storage=api.StorageType.FILE,
        retention=api.RetentionPolicy.LIMITS, discard=api.DiscardPolicy.OLD, max_age=spec.max_age_s,
        max_bytes=spec.max_bytes, max_msg_size=spec.max_msg_size, max_msgs_per_subject=spec.max_msgs_per_subject,
        duplicate_window=DUPLICATE_WINDOW_S, allow_rollup_hdrs=False,
        allow_msg_schedules=True if spec.allow_schedules else None, num_replicas=replicas,
    )
    await _settle(f"declare stream {spec.name}", lambda: _put_stream(bus, cfg))


async def _put_stream(bus: Bus, cfg: api.StreamConfig) -> None:
    try:
        await bus.js.stream_info(cfg.name)
        await bus.js.update_stream(cfg)
    except nats.js.errors.NotFoundError:
        await bus.js.add_stream(cfg)


async def declare_bucket(bus: Bus, bucket: S.Bucket, *, replicas: int = 1) -> Kv:
    """Create the KV bucket, or bring an existing one to the table's settings (the bucket's
    stream is updated after ``create_key_value``, which knows neither atomic batches nor
    rollups)."""
    stream = f"KV_{bucket.name}"

    async def create() -> None:
        try:
            await bus.js.stream_info(stream)
        except nats.js.errors.NotFoundError:
            await bus.js.create_key_value(bucket=bucket.name, history=bucket.history, replicas=replicas, direct=True,
                                          max_bytes=bucket.max_bytes, max_value_size=bucket.max_value_size)

    await _settle(f"declare KV bucket {bucket.name}", create)
    cfg = (await bus.js.stream_info(stream)).config
    wanted = {"num_replicas": replicas, "allow_direct": True, "allow_rollup_hdrs": bucket.rollups,
              "max_bytes": bucket.max_bytes, "max_msg_size": bucket.max_value_size,
              "allow_atomic": True if bucket.atomic else cfg.allow_atomic}
    if any(getattr(cfg, k) != v for k, v in wanted.items()):
        for k, v in wanted.items():
            setattr(cfg, k, v)
        await _settle(f"update KV bucket {bucket.name}", lambda: bus.js.update_stream(cfg))
    bus.forget_kv(bucket.name)
    return await bus.kv(bucket.name)


def durable_config(c: S.Consumer) -> api.ConsumerConfig:
    """The pull consumer ``c`` (no deliver subject), as its creator declares it and its
    identity binds to it."""
    return api.ConsumerConfig(
        name=c.durable, durable_name=c.durable, ack_policy=api.AckPolicy.EXPLICIT, ack_wait=c.ack_wait_s,
        max_deliver=c.max_deliver, filter_subject=c.filter, deliver_policy=api.DeliverPolicy.ALL,
        max_ack_pending=MAX_ACK_PENDING,
    )


async def declare_consumer(bus: Bus, c: S.Consumer) -> None:
    """Create durable ``c`` if it does not exist (idempotent; an existing one is left as it is)."""
    async def create() -> None:
        try:
            await bus.js.consumer_info(c.stream, c.durable)
        except nats.js.errors.NotFoundError:
            await bus.js.add_consumer(c.stream, durable_config(c))

    await _settle(f"declare consumer {c.durable}", create)


async def enable_atomic(bus: Bus, bucket: str) -> None:
    """Check that a KV bucket's stream allows JetStream atomic batch publish (nats-server
    2.12+), turning it on when this identity may (``declare`` does it for the table's atomic
    buckets); ``BusError`` when it is off and cannot be turned on."""
    await bus.kv(bucket)
    info = await bus.js.stream_info(f"KV_{bucket}")
    if getattr(info.config, "allow_atomic", False):
        return
    try:
        await declare_bucket(bus, S.BUCKET[bucket], replicas=info.config.num_replicas or 1)
    except (nats.errors.TimeoutError, nats.js.errors.APIError, BusError) as e:
        raise BusError(f"KV bucket {bucket} does not allow atomic batches: run `phalanx bus init`") from e
