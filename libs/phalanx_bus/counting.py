"""Count what a process sends to NATS, by kind and target (``phalanx_bus_sent_total``).

Every client → server message goes through the connection's ``publish``: a JetStream publish
and a KV write (a request to a stream subject), a KV read and any other JetStream API call (a
request to ``$JS.API.…``), an ack (a publish to the reply subject ``$JS.ACK.…``), a pull
consumer's fetch. ``count_sends`` wraps that one method, so the count is what went on the wire,
whoever in the process sent it. The per-pod message budget test
(``tests/integration/test_message_budget.py``) and ``bench/scale.py`` read it.
"""

from __future__ import annotations

from phalanx_telemetry.metrics import BUS_SENT


def classify(subject: str) -> tuple[str, str]:
    """(kind, target) of a message sent to ``subject``."""
    if subject.startswith("phx."):
        parts = subject.split(".", 3)
        return "event", ".".join(parts[:3] if parts[1:2] in (["gang"], ["deadline"]) else parts[:2])
    if subject.startswith("$KV."):
        return "kv_write", subject.split(".", 2)[1]
    if subject.startswith("$JS.ACK."):
        return "ack", subject.split(".", 3)[2]
    if subject.startswith("$JS.API."):
        rest = subject[len("$JS.API."):]
        for prefix, kind in (("DIRECT.GET.", "kv_read"), ("STREAM.MSG.GET.", "kv_read"),
                             ("CONSUMER.MSG.NEXT.", "fetch")):
            if rest.startswith(prefix):
                target = rest[len(prefix):].split(".", 1)[0]
                return kind, target.removeprefix("KV_")
        return "api", ".".join(t for t in rest.split(".")[:2] if t.isupper())
    if subject.startswith("$JS.FC."):
        return "api", "FC"
    return "other", subject.split(".", 1)[0]


def count_sends(nc) -> None:
    """Wrap ``nc.publish`` (once) so that every message it sends is counted."""
    if getattr(nc, "_phalanx_counted", False):
        return
    send = nc.publish

    async def counted(subject: str, payload: bytes = b"", reply: str = "", headers=None) -> None:
        kind, target = classify(subject)
        BUS_SENT.inc(kind=kind, target=target)
        await send(subject, payload, reply, headers)

    nc.publish = counted
    nc._phalanx_counted = True
