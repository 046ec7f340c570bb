"""The requests waiting for placement's next scheduling cycle.

A consumer handler ``submit``s a ``PlaceRequested`` and waits for its outcome; the cycle
``take``s what is waiting — at most a bound — highest priority first, then in arrival order,
and finishes each one (or puts it back, after a lost compare-and-set, ahead of later
arrivals of its priority).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio

from phalanx_proto.events import MemberSpec, PlaceRequested


@dataclass(eq=False)
class Waiting:
    ev: PlaceRequested
    priority: int
    arrival: int
    tries: int = 0
    members: tuple[MemberSpec, ...] = ()
    """The attempt's members, as the gang's record names them (set by the cycle's check)."""
    context: object = None
    """The trace context the request arrived in (its spans and reply continue that trace)."""
    error: BaseException | None = None
    done: anyio.Event = field(default_factory=anyio.Event)

    def finish(self, error: BaseException | None = None) -> None:
        self.error = error
        self.done.set()

    @property
    def order(self) -> tuple[int, int]:
        return (-self.priority, self.arrival)


class RequestQueue:
    def __init__(self) -> None:
        self._waiting: list[Waiting] = []
        self._arrivals = itertools.count()
        self._ready = anyio.Event()
        self._inflight: dict[tuple[str, int], Waiting] = {}

    def __len__(self) -> int:
        return len(self._waiting)

    async def submit(self, ev: PlaceRequested, priority: int, context: object = None) -> None:
        """Queue ``ev`` and return once a cycle has finished it (raising what it failed with).
        A second delivery of an attempt still in a cycle waits for the first, then goes on."""
        key = (ev.gang_id, ev.attempt)
        while (ahead := self._inflight.get(key)) is not None:
            await ahead.done.wait()
        w = Waiting(ev=ev, priority=priority, arrival=next(self._arrivals), context=context)
        self._inflight[key] = w
        try:
            self.put(w)
            await w.done.wait()
        finally:
            del self._inflight[key]
        if w.error is not None:
            raise w.error

    def put(self, w: Waiting) -> None:
        self._waiting.append(w)
        self._ready.set()

    async def take(self, limit: int, rank: Callable[[Waiting], float] | None = None) -> list[Waiting]:
        """Wait for at least one request; return up to ``limit``: the lowest ``rank`` (its queue's
        distance from its fair share) first, then highest priority, then oldest."""
        while not self._waiting:
            self._ready = anyio.Event()
            await self._ready.wait()
        self._waiting.sort(key=(lambda w: (rank(w), w.order)) if rank is not None else (lambda w: w.order))
        batch, self._waiting = self._waiting[:limit], self._waiting[limit:]
        return batch
