"""Dead letters: a message a consumer gives up on (it does not decode, its handler refused it
for good, or it failed on its last delivery) is counted in ``phalanx_bus_dead_letters_total``
and copied to the dead-letter stream ``PHX_DLQ`` (``phx.dlq.<stream>.<consumer>``) with the
error and its origin in headers (``Phalanx-Error``, ``Phalanx-Cause``,
``Phalanx-Original-Subject``, ``Phalanx-Original-Stream``). Copies are rate-limited per
consumer, so a flood of junk on a consumer's subjects is counted in full
(``phalanx_bus_dead_letters_dropped_total``) but cannot fill the stream with copies of itself.
Called by ``phalanx_bus.consumer``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from phalanx_bus.bus import Bus
from phalanx_proto import subjects as S
from phalanx_telemetry import metrics

DLQ_RATE = 10.0
"""Dead letters stored per second per consumer, on average."""
DLQ_BURST = 100
"""Dead letters a consumer may store at once before the rate applies."""


class _TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self._clock = rate, burst, clock
        self._tokens, self._at = float(burst), clock()

    def take(self) -> bool:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


_budget: dict[str, _TokenBucket] = {}


async def record_dead_letter(bus: Bus, stream: str, durable: str, msg, error: str, cause: str) -> None:
    """Count ``msg`` as a dead letter of ``durable`` (``cause``: undecodable, permanent,
    exhausted) and, within the consumer's budget, copy it to ``PHX_DLQ`` with ``error`` and its
    origin in headers; beyond the budget it is counted as dropped."""
    metrics.BUS_DEAD_LETTERS.inc(consumer=durable, cause=cause)
    budget = _budget.setdefault(durable, _TokenBucket(DLQ_RATE, DLQ_BURST))
    if not budget.take():
        metrics.BUS_DEAD_LETTERS_DROPPED.inc(consumer=durable, cause=cause)
        return
    headers = {
        "Phalanx-Error": error[:1000],
        "Phalanx-Cause": cause,
        "Phalanx-Original-Subject": msg.subject[:1000],
        "Phalanx-Original-Stream": stream,
        "Nats-Msg-Id": bus.msg_id(f"dlq:{stream}:{durable}:{msg.metadata.sequence.stream}"),
    }
    await bus.publish_raw(S.dead_letter_subject(stream, durable), msg.data, headers)
