"""One message through a handler and the explicit ack ladder (style rule 6); ``consumer.py``
fetches and dispatches.

``decoded`` turns a message into its event, or records it on the dead letter stream and
terminates it: undecodable, or not allowed on its subject (``misaddressed``). ``handle`` runs
the handler in a span whose parent is the publisher's ``traceparent`` and settles the message:

* ``ack()`` once the handler returned (its side effect is durable by then);
* ``nak(delay)`` on ``TemporaryError`` and on an unexpected exception (with backoff);
* record + ``term()`` on ``PermanentError``;
* record + ``term()`` when ``TemporaryError`` or an unexpected exception happens on the
  message's **last delivery** (``num_delivered >= max_deliver``): nothing is dropped silently.

A ``GangBatch`` (several events of one publisher sharing a hop, docs/events.md "Batches") is
settled as one message after each event in it went through the handler on its own, in its own
span (the trace it carries), exactly as if it had come alone: ``Batch`` counts them down. An
event of a kind its channel does not carry is dead-lettered alone and the others go on; one
refused with ``PermanentError`` is dead-lettered alone; if any asks to be retried (or fails
unexpectedly) the whole batch is nak'ed with the longest delay asked, and those already handled
are handled again on redelivery (handlers are idempotent); on its last delivery the batch is
dead-lettered instead. Otherwise the batch is acked.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import msgspec
from opentelemetry import trace

from phalanx_bus.bus import Bus, destination_template
from phalanx_bus.deadletter import record_dead_letter
from phalanx_proto import subjects as S
from phalanx_proto.events import GangBatch
from phalanx_telemetry import extract_context, log, metrics, tracer, warn


class TemporaryError(Exception):
    """Try again later: the message is nak'ed with ``delay`` seconds."""

    def __init__(self, message: str, delay: float = 1.0) -> None:
        super().__init__(message)
        self.delay = delay


class PermanentError(Exception):
    """This message can never succeed: it is recorded on the dead letter stream and terminated."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """What a handler may know about the message besides the event."""

    subject: str
    num_delivered: int
    stream_seq: int
    headers: dict[str, str]
    _msg: Any

    async def in_progress(self) -> None:
        """Tell the server the handler is still working (resets the ack wait)."""
        await self._msg.in_progress()


RETRY_BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0)


def misaddressed(subject: str, event: Any) -> str:
    """Why ``event`` may not travel on ``subject`` per the bus table, or ``""``: its kind is
    not one of the channel's (a binder reply claiming to be ``Reserved``), or its ``node`` or
    ``gang_id`` is not the one the subject names (one node's agent speaking for another).
    Subject permissions decide who may publish on a channel; this decides what they may say."""
    channel = S.channel_of(subject)
    kind = event.__struct_config__.tag
    if channel is None:
        return f"subject {subject} is no channel of the bus table"
    if kind not in channel.kinds:
        return f"kind {kind!r} is not allowed on {channel.template} (allowed: {', '.join(channel.kinds)})"
    node = getattr(event, "node", None)
    if "{node}" in channel.template and node is not None and S.render(channel.template, node=node) != subject:
        return f"node {node!r} of the event is not the node of subject {subject}"
    gang = getattr(event, "gang_id", None)
    if "{gang}" in channel.template and gang and S.render(channel.template, gang=gang) != subject:
        return f"gang {gang!r} of the event is not the gang of subject {subject}"
    return ""


def not_carried(subject: str, event: Any) -> str:
    """Why ``event`` may not travel inside a batch on ``subject``, or ``""``: its kind is not
    one the channel's batches carry."""
    channel = S.channel_of(subject)
    kind = event.__struct_config__.tag
    carries = channel.carries if channel is not None else ()
    if kind not in carries:
        return (f"kind {kind!r} of gang {getattr(event, 'gang_id', '')!r} is not carried by batches on "
                f"{channel.template if channel else subject} (carried: {', '.join(carries) or 'none'})")
    return ""


async def decoded(bus: Bus, stream: str, durable: str, decoder, msg) -> Any | None:
    """The message's event, or None once it was dead-lettered and terminated (undecodable, or
    not allowed on its subject)."""
    seq = msg.metadata.sequence.stream
    try:
        event = decoder.decode(msg.data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        warn("undecodable message terminated", consumer=durable, subject=msg.subject, seq=seq, error=str(e))
        await record_dead_letter(bus, stream, durable, msg, f"undecodable: {e}", "undecodable")
        await msg.term()
        metrics.BUS_MESSAGES.inc(consumer=durable, kind="undecodable", outcome="term")
        return None
    refused = misaddressed(msg.subject, event)
    if refused:
        kind = event.__struct_config__.tag
        warn("event not allowed on its subject terminated", consumer=durable, subject=msg.subject, kind=kind,
             seq=seq, error=refused)
        await record_dead_letter(bus, stream, durable, msg, f"misaddressed: {refused}", "misaddressed")
        await msg.term()
        metrics.BUS_MESSAGES.inc(consumer=durable, kind=kind, outcome="term")
        return None
    return event


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a handler came to: ``ack``, ``retry`` (after ``delay``) or ``refused`` (permanently)."""

    kind: str
    delay: float = 0.0
    error: str = ""


async def invoke(handler, event, msg, durable: str, stream: str, headers: dict[str, str],
                 max_deliver: int) -> Outcome:
    """Run ``handler`` on ``event`` in a consumer span that continues ``headers``' trace."""
    meta = msg.metadata
    kind = event.__struct_config__.tag
    last = meta.num_delivered >= max_deliver
    delivery = Delivery(msg.subject, meta.num_delivered, meta.sequence.stream, headers, msg)
    if meta.num_delivered > 1:
        metrics.BUS_REDELIVERIES.inc(consumer=durable, kind=kind)
    template = destination_template(msg.subject)
    with tracer().start_as_current_span(
        f"process {template}", context=extract_context(headers), kind=trace.SpanKind.CONSUMER,
        attributes={
            "messaging.system": "nats", "messaging.operation.name": "process",
            "messaging.operation.type": "process", "messaging.destination.name": msg.subject,
            "messaging.destination.template": template, "messaging.consumer.group.name": durable,
            "messaging.message.id": (msg.headers or {}).get("Nats-Msg-Id", ""),
            "messaging.message.body.size": len(msg.data),
            "messaging.nats.message.delivery_count": meta.num_delivered,
            "messaging.nats.message.stream_sequence": meta.sequence.stream, "messaging.nats.stream.name": stream,
            "phalanx.event": str(kind),
            "phalanx.gang": getattr(event, "gang_id", ""), "phalanx.attempt": getattr(event, "attempt", 0),
        },
    ) as span:
        try:
            await handler(event, delivery)
        except TemporaryError as e:
            span.set_attribute("phalanx.outcome", "dead_letter" if last else "retry")
            warn("handler asked to retry", consumer=durable, kind=kind, error=str(e), delay=e.delay)
            return Outcome("retry", e.delay, str(e))
        except PermanentError as e:
            span.set_attribute("phalanx.outcome", "terminated")
            warn("handler refused message", consumer=durable, kind=kind, error=str(e))
            return Outcome("refused", error=f"permanent: {e}")
        except Exception as e:  # noqa: BLE001 - an unexpected failure is retried with backoff
            span.record_exception(e)
            span.set_status(trace.Status(trace.StatusCode.ERROR, str(e)))
            span.set_attribute("error.type", type(e).__qualname__)
            span.set_attribute("phalanx.outcome", "dead_letter" if last else "retry")
            delay = RETRY_BACKOFF_S[min(meta.num_delivered, len(RETRY_BACKOFF_S)) - 1]
            log("handler failed, will retry", level=40, exc_info=True, consumer=durable, kind=kind, delay=delay)
            return Outcome("retry", delay, f"{type(e).__qualname__}: {e}")
        span.set_attribute("phalanx.outcome", "ack")
        return Outcome("ack")


async def settle(bus: Bus, stream: str, durable: str, kind: str, msg, outcome: Outcome, started: float,
                 max_deliver: int) -> None:
    """Ack, nak or dead-letter the message as ``outcome`` says (a retry on its last delivery
    is dead-lettered)."""
    if outcome.kind == "ack":
        await msg.ack()
        _observe(durable, kind, "ack", started)
    elif outcome.kind == "refused":
        await record_dead_letter(bus, stream, durable, msg, outcome.error, "permanent")
        await msg.term()
        _observe(durable, kind, "term", started)
    elif msg.metadata.num_delivered >= max_deliver:
        n = msg.metadata.num_delivered
        log("message failed on its last delivery, dead-lettered", level=40, consumer=durable, kind=kind,
            subject=msg.subject, seq=msg.metadata.sequence.stream, deliveries=n, error=outcome.error)
        await record_dead_letter(bus, stream, durable, msg, f"failed on all {n} deliveries: {outcome.error}",
                                 "exhausted")
        await msg.term()
        _observe(durable, kind, "term", started)
    else:
        await msg.nak(delay=outcome.delay)
        _observe(durable, kind, "nak", started)


async def handle(bus: Bus, stream: str, durable: str, handler, event, msg, max_deliver: int) -> None:
    """One message that is not a batch: handler, then its ack, nak or dead letter."""
    started = time.monotonic()
    kind = event.__struct_config__.tag
    outcome = await invoke(handler, event, msg, durable, stream, dict(msg.headers or {}), max_deliver)
    metrics.BUS_EVENTS.inc(consumer=durable, kind=kind, outcome=_EVENT_OUTCOME[outcome.kind])
    await settle(bus, stream, durable, kind, msg, outcome, started, max_deliver)
    if outcome.kind == "ack":
        log("handled", level=10, consumer=durable, kind=kind, gang=getattr(event, "gang_id", ""),
            ms=round((time.monotonic() - started) * 1000, 2))


class Batch:
    """A ``GangBatch`` being handled: each event is one job (``item``); the last to finish
    settles the message."""

    def __init__(self, bus: Bus, stream: str, durable: str, handler, batch: GangBatch, msg, max_deliver: int) -> None:
        self.bus, self.stream, self.durable, self.handler = bus, stream, durable, handler
        self.batch, self.msg, self.max_deliver = batch, msg, max_deliver
        self.left = len(batch.events)
        self.retry: Outcome | None = None
        self.started = time.monotonic()

    async def refuse(self, index: int, why: str) -> None:
        """Dead-letter event ``index`` alone (not carried on this channel) and count it done."""
        warn("event not carried on its batch's subject skipped", consumer=self.durable, subject=self.msg.subject,
             index=index, error=why)
        await record_dead_letter(self.bus, self.stream, self.durable, self.msg,
                                 f"misaddressed: event {index} of the batch: {why}", "misaddressed")
        metrics.BUS_EVENTS.inc(consumer=self.durable, kind=self.batch.events[index].event.__struct_config__.tag,
                               outcome="term")
        await self._done()

    async def item(self, index: int) -> None:
        """Handle event ``index`` as if it came alone, then count it done."""
        carried = self.batch.events[index]
        headers = {"traceparent": carried.traceparent} if carried.traceparent else {}
        outcome = await invoke(self.handler, carried.event, self.msg, self.durable, self.stream, headers,
                               self.max_deliver)
        if outcome.kind == "refused":
            gang = carried.event.gang_id
            await record_dead_letter(self.bus, self.stream, self.durable, self.msg,
                                     f"event {index} of the batch (gang {gang}): {outcome.error}", "permanent")
        elif outcome.kind == "retry" and (self.retry is None or outcome.delay > self.retry.delay):
            self.retry = outcome
        metrics.BUS_EVENTS.inc(consumer=self.durable, kind=carried.event.__struct_config__.tag,
                               outcome=_EVENT_OUTCOME[outcome.kind])
        await self._done()

    async def _done(self) -> None:
        self.left -= 1
        if self.left == 0:
            await settle(self.bus, self.stream, self.durable, "gang.batch", self.msg, self.retry or Outcome("ack"),
                         self.started, self.max_deliver)


_EVENT_OUTCOME = {"ack": "ack", "retry": "nak", "refused": "term"}


def _observe(durable: str, kind: str, outcome: str, started: float) -> None:
    metrics.BUS_HANDLER_SECONDS.observe(time.monotonic() - started, consumer=durable, kind=kind)
    metrics.BUS_MESSAGES.inc(consumer=durable, kind=kind, outcome=outcome)
