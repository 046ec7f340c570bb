"""The run's events in virtual time: (time, kind, sequence, gang) in the order they are handled.

Kinds at one instant: ends, then arrivals, then retries; within a kind, the order they were
entered. The arrivals are known before the run and entered first, in arrival order (stable: at
one instant, in the order submitted), so they wait in a list beside the heap instead of in it:
a week of the trace is millions of arrivals, and a heap that deep makes every push and pop of
the ends and retries slower. ``take`` merges the two by (time, kind, sequence), the order one
heap of everything would give.
"""

from __future__ import annotations

import heapq

END, ARRIVE, RETRY = 0, 1, 2
"""Event kinds, in the order they are handled at one instant."""

Event = tuple[float, int, int, str]


class Agenda:
    def __init__(self) -> None:
        self._heap: list[Event] = []
        self._arrivals: list[Event] = []
        self._next = 0
        """The first arrival not taken."""
        self._seq = 0
        self.changes = 0
        """Arrivals and ends not taken yet (without any, only retries are left)."""

    def arrive(self, t: float, gang_id: str) -> None:
        """Enter an arrival: before any other event, in arrival order."""
        assert not self._heap and (not self._arrivals or self._arrivals[-1][0] <= t)
        self._seq += 1
        self.changes += 1
        self._arrivals.append((t, ARRIVE, self._seq, gang_id))

    def push(self, t: float, kind: int, gang_id: str) -> int:
        """Enter an end or a retry; its sequence number."""
        self._seq += 1
        self.changes += kind != RETRY
        heapq.heappush(self._heap, (t, kind, self._seq, gang_id))
        return self._seq

    def first(self) -> float | None:
        """The time of the next event (None: none is left)."""
        if self._next < len(self._arrivals):
            t = self._arrivals[self._next][0]
            return min(t, self._heap[0][0]) if self._heap else t
        return self._heap[0][0] if self._heap else None

    def take(self, t: float) -> Event | None:
        """The next event if it is due at ``t``, taken (None: nothing more is due then)."""
        arrival = self._arrivals[self._next] if self._next < len(self._arrivals) else None
        if self._heap and self._heap[0][0] == t and (arrival is None or self._heap[0] < arrival):
            event = heapq.heappop(self._heap)
        elif arrival is not None and arrival[0] == t:
            self._next += 1
            event = arrival
        else:
            return None
        self.changes -= event[1] != RETRY
        return event
