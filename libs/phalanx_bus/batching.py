"""Sending gang events that share a hop as ``GangBatch`` messages (docs/events.md, "Batches").

``BatchSender(bus, subject, sender)`` has one task (``run``) that publishes what callers of
``send`` handed it: everything waiting when it is free goes out as one message, in the order it
was sent, so a burst (a scheduling cycle's answers) becomes a few messages while a lone event
goes out at once — no timer, no added wait when idle. ``send`` returns once the batch carrying
its event is stored (or raises what the publish raised), so a caller acks the command it
answers only after its answer is durable, as with a plain ``publish``.

Each event has its own ``publish`` producer span in the caller's trace, open until its batch is
stored, and is encoded once with that span's ``traceparent``, so its handler's span is the
child of this publish as if the event had travelled alone; the batch's own publish span links
to the events' spans. A batch holds at most ``max_events`` events and about
``max_bytes`` (an event larger than that alone goes alone). The message id digests the events'
keys: publishing the same batch again inside the duplicate window stores it once.
"""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass, field

import anyio
import msgspec
from opentelemetry import trace

from phalanx_bus.bus import Bus, destination_template
from phalanx_bus.errors import BusError
from phalanx_proto import subjects as S
from phalanx_proto.events import MAX_BATCH_EVENTS, Carried, GangEvent, batch_key, encoder
from phalanx_telemetry import inject_headers, tracer

MAX_BATCH_BYTES = S.GANG_MESSAGE_MAX // 4
"""A batch stops growing past this size (well inside the stream's message limit)."""


def sender_id() -> str:
    """This process as one subject token: its pod (or host) name, pid and a random part."""
    host = os.environ.get("POD_NAME") or socket.gethostname()
    return S.token(f"{host}-{os.getpid()}-{secrets.token_hex(3)}")


class _Batch(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="gang.batch", tag_field="kind"):
    """``GangBatch`` with its events already encoded (the same bytes)."""

    sender: str
    events: tuple[msgspec.Raw, ...]


@dataclass(eq=False)
class _Waiting:
    raw: msgspec.Raw
    key: str
    span: trace.SpanContext
    done: anyio.Event = field(default_factory=anyio.Event)
    error: BaseException | None = None
    batch_id: str = ""


class BatchSender:
    def __init__(self, bus: Bus, subject: str, sender: str, *, max_events: int = MAX_BATCH_EVENTS,
                 max_bytes: int = MAX_BATCH_BYTES) -> None:
        self.bus, self.subject, self.sender = bus, subject, sender
        self.max_events, self.max_bytes = max_events, max_bytes
        self._waiting: list[_Waiting] = []
        self._ready = anyio.Event()
        self.batches = 0
        """Messages published so far (for tests and the log)."""

    async def send(self, event: GangEvent) -> None:
        """Hand ``event`` to the sender and return once it is stored; raises the publish's error."""
        template = destination_template(self.subject)
        attributes = {"messaging.system": "nats", "messaging.operation.name": "publish",
                      "messaging.operation.type": "send", "messaging.destination.name": self.subject,
                      "messaging.destination.template": template, "phalanx.event": str(event.__struct_config__.tag)}
        if getattr(event, "gang_id", ""):
            attributes.update({"phalanx.gang": event.gang_id, "phalanx.attempt": event.attempt})
        with tracer().start_as_current_span(f"publish {template}", kind=trace.SpanKind.PRODUCER,
                                            attributes=attributes) as span:
            headers: dict[str, str] = {}
            inject_headers(headers)
            carried = Carried(event=event, traceparent=headers.get("traceparent", ""))  # type: ignore[arg-type]
            w = _Waiting(msgspec.Raw(encoder.encode(carried)), event.key(), span.get_span_context())
            self._waiting.append(w)
            self._ready.set()
            await w.done.wait()
            if w.error is not None:
                raise w.error
            span.set_attribute("messaging.message.id", w.batch_id)

    def _take(self) -> list[_Waiting]:
        """The longest prefix of what waits within the bounds (at least one event)."""
        size = 0
        for n, w in enumerate(self._waiting):
            size += len(w.raw) + 1
            if n and (n >= self.max_events or size > self.max_bytes):
                break
        else:
            n = len(self._waiting)
        taken, self._waiting = self._waiting[:n], self._waiting[n:]
        return taken

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Publish what waits, batch after batch, until cancelled (then fail what is left)."""
        task_status.started()
        try:
            while True:
                if not self._waiting:
                    self._ready = anyio.Event()
                    await self._ready.wait()
                taken = self._take()
                try:
                    await self._publish(taken)
                except Exception as e:  # noqa: BLE001 - each caller gets the error (its command is retried)
                    for w in taken:
                        w.error = e
                for w in taken:
                    w.done.set()
        finally:
            for w in self._waiting:
                w.error = BusError(f"the batch sender of {self.subject} stopped before sending this event")
                w.done.set()

    async def _publish(self, taken: list[_Waiting]) -> None:
        payload = encoder.encode(_Batch(sender=self.sender, events=tuple(w.raw for w in taken)))
        key = self.bus.msg_id(batch_key(self.sender, (w.key for w in taken)))
        template = destination_template(self.subject)
        with tracer().start_as_current_span(f"publish {template}", kind=trace.SpanKind.PRODUCER, attributes={
                "messaging.system": "nats", "messaging.operation.name": "publish",
                "messaging.operation.type": "send", "messaging.destination.name": self.subject,
                "messaging.destination.template": template, "messaging.message.id": key,
                "messaging.message.body.size": len(payload), "messaging.batch.message_count": len(taken),
                "phalanx.event": "gang.batch"}, links=[trace.Link(w.span) for w in taken]):
            await self.bus.publish_raw(self.subject, payload, {"Nats-Msg-Id": key, "Phalanx-Kind": "gang.batch"})
        self.batches += 1
        for w in taken:
            w.batch_id = key

