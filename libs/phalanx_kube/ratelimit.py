"""Client-side rate limiting of Kubernetes API requests: what ``--kube-api-qps`` and
``--kube-api-burst`` mean.

kubernetes-asyncio has no client-side limiter (client-go has one, a token bucket behind every
REST client), so the adapter keeps its own, with client-go's meaning: up to ``burst`` requests
go out at once, then ``qps`` a second on average; a request over the budget waits its turn
(first come, first served). Every request counts, including the start of a watch (not its
stream). ``qps <= 0`` turns the limiter off. kube-scheduler's own defaults are 50 and 100.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_QPS = 50.0
DEFAULT_BURST = 100
WATCH_CONNECTIONS = 8
"""Connections kept beyond ``burst`` for long-lived watches."""


@dataclass(frozen=True)
class KubeClientSettings:
    """How hard the adapter may drive the API server."""

    qps: float = DEFAULT_QPS
    burst: int = DEFAULT_BURST
    connections: int = 0
    """HTTP connection pool size; 0 = ``burst`` plus ``WATCH_CONNECTIONS`` (a request in flight
    holds one connection, so a pool smaller than the burst would queue a burst on connections)."""

    def __post_init__(self) -> None:
        if not math.isfinite(self.qps):
            raise ValueError(f"kube API qps must be a finite number, not {self.qps!r}")
        if self.burst < 1:
            raise ValueError(f"kube API burst must be at least 1, not {self.burst!r}")
        if self.connections < 0:
            raise ValueError(f"kube API connections must be 0 (derived) or positive, not {self.connections!r}")

    @property
    def pool_size(self) -> int:
        return self.connections or self.burst + WATCH_CONNECTIONS

    def limiter(self) -> TokenBucket | None:
        return TokenBucket(self.qps, self.burst) if self.qps > 0 else None


class TokenBucket:
    """``burst`` tokens, refilled at ``qps`` a second; each request takes one.

    ``reserve()`` takes a token now and says how long the caller must wait for it: the count may
    go below zero, so callers queue in order (the reservation scheme of Go's ``x/time/rate``).
    """

    def __init__(self, qps: float, burst: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError(f"a token bucket needs qps > 0 and burst >= 1, not {qps!r} and {burst!r}")
        self.qps = qps
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()

    def reserve(self) -> float:
        """Take one token; seconds until it is the caller's (0 when one was left)."""
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.qps)
        self._at = now
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    def cancel(self) -> None:
        """Give back a reserved token whose request was abandoned before it went out."""
        self._tokens = min(float(self.burst), self._tokens + 1.0)

    async def acquire(self) -> None:
        """Wait for this request's turn."""
        delay = self.reserve()
        if delay <= 0:
            return
        try:
            await asyncio.sleep(delay)
        except asyncio.CancelledError:
            self.cancel()
            raise
