"""The durable pull-consumer loop: fetch, decode, hand each message to the ack ladder
(``phalanx_bus.handling``: ack, nak with backoff, dead letter; a ``GangBatch`` split into its
events).

Every dead letter carries the error and its origin in headers (``Phalanx-Error``,
``Phalanx-Original-Subject``, ``Phalanx-Original-Stream``, ``Phalanx-Cause``) and counts in
``phalanx_bus_dead_letters_total{consumer, cause}``, which ``deploy/prometheus/rules`` alerts
on. Copies are rate-limited per consumer (``phalanx_bus.deadletter``): a flood of junk on a
consumer's subjects is counted in full but stored only up to the rate. The consumer handles the
last delivery itself rather than listening to the server's ``MAX_DELIVERIES`` advisory: the
advisory is a core-NATS message nobody stores, so it is lost whenever no subscriber is up,
whereas the last delivery reaches a consumer like any other. A process that dies *during* a
message's last delivery still loses it; what such a message would have done is repaired by
gang-coordinator's reconciler (docs/saga.md, "The reconciler").

Handlers must be idempotent: JetStream delivers at least once.

``concurrency`` > 1 runs up to that many handlers at once (binder binds in parallel, as
kube-scheduler binds asynchronously). Each message still walks the ladder above on its own:
its handler's outcome acks, naks or terminates that message alone. The loop fetches only as
many messages as there are free slots, so no fetched message waits for a slot while its ack
wait runs. Messages then finish out of order: handlers must not depend on the order of
messages (binder's do not: each command names one pod). With ``order_key`` (a function of the
subject), messages whose subjects give the same key are handled one at a time in delivery
order (``phalanx_bus.keyed``), while other keys go on in parallel; a message waiting behind
its key tells the server it is in progress every third of the ack wait, so it is never
redelivered (and handled twice) while it waits. The events of a ``GangBatch`` join their
gang's line (``S.gang_key``, which ``order_key`` must give for a ``{gang}`` subject), so a
gang's replies stay in order whether they came alone or batched.

Metrics (``phalanx_telemetry.metrics``): handler time per consumer and kind, outcomes
(ack/nak/term), redeliveries, and the consumer's lag (``num_pending``), sampled every
``LAG_SAMPLE_S`` from the fetch loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import anyio
import msgspec
import nats.errors
import nats.js.errors

from phalanx_bus.bus import Bus
from phalanx_bus.declare import durable_config
from phalanx_bus.errors import BusError
from phalanx_bus.handling import (
    Batch,
    Delivery,
    PermanentError,
    TemporaryError,
    decoded,
    handle,
    misaddressed,
    not_carried,
)
from phalanx_bus.keyed import KeyedWork
from phalanx_proto import subjects as S
from phalanx_proto.events import GangBatch
from phalanx_telemetry import log, metrics, warn

__all__ = ["Delivery", "PermanentError", "TemporaryError", "consume", "misaddressed", "not_carried"]


Handler = Callable[[Any, Delivery], Awaitable[None]]

LAG_SAMPLE_S = 5.0
DURABLE_POLL_S = 1.0
"""How often a consumer whose durable another identity creates looks for it."""


async def _sample_lag(bus: Bus, stream: str, durable: str) -> None:
    """Record the consumer's lag; a failed sample keeps the previous value."""
    try:
        info = await bus.js.consumer_info(stream, durable)
    except Exception:  # noqa: BLE001 - metrics never break consumption
        return
    metrics.BUS_CONSUMER_PENDING.set(info.num_pending or 0, stream=stream, consumer=durable)
    metrics.BUS_CONSUMER_ACK_PENDING.set(info.num_ack_pending or 0, stream=stream, consumer=durable)


async def consume(
    bus: Bus,
    *,
    stream: str,
    durable: str,
    filter_subject: str,
    decoder: msgspec.json.Decoder,
    handler: Handler,
    ack_wait_s: float = 10.0,
    max_deliver: int = 50,
    batch: int = 16,
    concurrency: int = 1,
    order_key: Callable[[str], str] | None = None,
    create: bool = True,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run the consumer until cancelled. Reports started once the durable is bound.
    ``concurrency``: handlers in flight at once (1: one message after another);
    ``order_key``: subject → key; messages of one key are handled one at a time, in order;
    ``create``: create the durable when it is missing (an identity that may: the admin in
    tests; a service binds to the durable ``phalanx bus init`` declared), else wait for its
    creator to make it (a node's MIG consumer, made by gang-coordinator)."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, not {concurrency}")
    config = durable_config(S.Consumer(durable, stream, filter_subject, "", (), ack_wait_s=ack_wait_s,
                                       max_deliver=max_deliver))
    if not create:
        await _wait_for_durable(bus, stream, durable)
    sub = await _subscribe(bus, stream, durable, filter_subject, config)
    log("consumer live", stream=stream, consumer=durable, subject=filter_subject)
    task_status.started()
    lag_sampled = 0.0

    def failed(e: BaseException, msg) -> None:  # an ack lost with the connection: redelivered later
        warn("message outcome not delivered", consumer=durable, error=repr(e)[:300])

    try:
        async with anyio.create_task_group() as in_flight:
            work = KeyedWork(in_flight, concurrency, on_error=failed) if concurrency > 1 else None
            if work is not None:
                in_flight.start_soon(_keep_queued_alive, work, ack_wait_s)
            while True:
                if time.monotonic() - lag_sampled >= LAG_SAMPLE_S:
                    lag_sampled = time.monotonic()
                    await _sample_lag(bus, stream, durable)
                room = batch
                if work is not None:
                    await work.wait_room()  # fetch only once a slot is free
                    room = min(batch, work.room)
                sub, msgs = await _fetch(bus, sub, stream, durable, filter_subject, config, room)
                for msg in msgs:
                    event = await decoded(bus, stream, durable, decoder, msg)
                    if isinstance(event, GangBatch):
                        await _submit_batch(Batch(bus, stream, durable, handler, event, msg, max_deliver), work,
                                            ordered=order_key is not None)
                    elif event is not None and work is None:
                        await handle(bus, stream, durable, handler, event, msg, max_deliver)
                    elif event is not None:
                        key = order_key(msg.subject) if order_key is not None else f"#{msg.metadata.sequence.stream}"
                        await work.submit(key, partial(handle, bus, stream, durable, handler, event, msg,
                                                       max_deliver), msg)
    finally:
        with anyio.move_on_after(1, shield=True):
            try:
                await sub.unsubscribe()
            except Exception:  # noqa: BLE001 - connection already gone at shutdown
                pass


async def _keep_queued_alive(work: KeyedWork, ack_wait_s: float) -> None:
    """Every third of the ack wait, reset the ack timer of each message waiting behind its key."""
    while True:
        await anyio.sleep(ack_wait_s / 3)
        for msg in list(work.queued()):
            try:
                await msg.in_progress()
            except Exception as e:  # noqa: BLE001 - the connection is away; the handler's ack decides
                warn("in-progress not delivered", error=repr(e)[:300])


async def _fetch(bus: Bus, sub, stream: str, durable: str, filter_subject: str, config, room: int):
    """(subscription to use next, up to ``room`` messages); nothing when none came within a
    second or the fetch failed (the subscription is re-bound when the server lost it)."""
    try:
        return sub, await sub.fetch(room, timeout=1.0)
    except (nats.errors.TimeoutError, TimeoutError):
        return sub, []  # nothing to fetch (nats-py raises either type)
    except (nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError,
            nats.js.errors.ServiceUnavailableError, nats.errors.NoRespondersError,
            nats.js.errors.APIError) as e:
        warn("fetch failed, retrying", consumer=durable, error=repr(e))
        await asyncio.sleep(0.5)
        return await _resubscribe(bus, sub, stream, durable, filter_subject, config), []
    except Exception as e:  # noqa: BLE001 - a consumer must outlive odd client errors
        warn("fetch failed unexpectedly, retrying", consumer=durable, error=repr(e))
        await asyncio.sleep(0.5)
        return sub, []


async def _wait_for_durable(bus: Bus, stream: str, durable: str) -> None:
    """Return once durable ``durable`` exists (its creator makes it; told once in the log)."""
    told = False
    while True:
        try:
            await bus.js.consumer_info(stream, durable)
            return
        except nats.js.errors.NotFoundError:
            if not told:
                log("waiting for the durable consumer to be created", stream=stream, consumer=durable)
                told = True
        except (nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError, nats.errors.NoRespondersError,
                nats.errors.ConnectionReconnectingError, nats.errors.ConnectionClosedError) as e:
            warn("consumer lookup failed, retrying", consumer=durable, error=repr(e)[:200])
        await asyncio.sleep(DURABLE_POLL_S)


async def _subscribe(bus: Bus, stream: str, durable: str, filter_subject: str, config):
    """Bind to the durable; create it (through the subject that names it and its filter) when
    it is missing and this identity may. An identity that may not is told to declare it."""
    while True:
        seen = len(bus.refusals)
        try:
            return await bus.js.pull_subscribe(filter_subject, durable=durable, stream=stream, config=config)
        except nats.js.errors.NotFoundError as e:
            raise BusError(f"stream {stream} is not declared: run `phalanx bus init` with the admin identity") from e
        except (nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError,
                nats.errors.NoRespondersError, nats.errors.ConnectionReconnectingError) as e:
            if any("consumer.create" in r.lower() for r in bus.refusals[seen:]):
                raise BusError(f"durable consumer {durable} on {stream} is not declared and {bus.service} may not "
                               "create it: run `phalanx bus init` with the admin identity") from e
            warn("subscribe failed, retrying", consumer=durable, error=repr(e))
            await asyncio.sleep(0.5)


async def _resubscribe(bus: Bus, sub, stream: str, durable: str, filter_subject: str, config):
    """After a server restart the consumer may need re-binding; cheap when nothing changed."""
    if bus.nc.is_connected:
        try:
            await bus.js.consumer_info(stream, durable)
            return sub
        except Exception:  # noqa: BLE001 - re-create below
            pass
        try:
            await sub.unsubscribe()
        except Exception:  # noqa: BLE001
            pass
        return await _subscribe(bus, stream, durable, filter_subject, config)
    return sub


async def _submit_batch(batch: Batch, work: KeyedWork | None, *, ordered: bool) -> None:
    """Each event of the batch as its own job, in its gang's line when the consumer keeps
    order; an event of a kind the channel's batches do not carry is refused alone."""
    seq = batch.msg.metadata.sequence.stream
    for i, carried in enumerate(batch.batch.events):
        why = not_carried(batch.msg.subject, carried.event)
        if why:
            await batch.refuse(i, why)
        elif work is None:
            await batch.item(i)
        else:
            key = S.gang_key(carried.event.gang_id) if ordered else f"#{seq}.{i}"
            await work.submit(key, partial(batch.item, i), batch.msg)
