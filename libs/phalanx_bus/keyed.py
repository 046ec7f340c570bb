"""Keyed work: jobs run concurrently across keys and one after another within a key.

``KeyedWork`` takes jobs tagged with a key (a gang, a subject). At most ``limit`` jobs are
admitted at a time, running or queued (``submit`` waits for room). Jobs with different keys
run at the same time; jobs with the same key run one at a time, in the order they were
submitted. Every job runs exactly once; a job that raises is reported to ``on_error`` and
never stops the jobs behind it.

The consumer loop uses it to handle messages of different gangs in parallel while keeping
one gang's messages in order (``consume(order_key=...)``); gang-coordinator's pod intake uses
it the same way for pod events.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anyio
import anyio.abc

Job = Callable[[], Awaitable[None]]


class KeyedWork:
    def __init__(self, tg: anyio.abc.TaskGroup, limit: int,
                 on_error: Callable[[BaseException, Any], None] | None = None) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        self._tg = tg
        self._slots = anyio.Semaphore(limit)
        self._queues: dict[str, deque[tuple[Job, Any]]] = {}
        self._idle = anyio.Event()
        self._idle.set()
        self._on_error = on_error

    @property
    def room(self) -> int:
        """Jobs that could be admitted now without waiting."""
        return self._slots.value

    async def wait_room(self) -> None:
        """Wait until at least one job could be admitted."""
        await self._slots.acquire()
        self._slots.release()

    async def submit(self, key: str, job: Job, item: Any = None) -> None:
        """Admit ``job`` under ``key`` once there is room (``item`` names it to ``queued`` and
        ``on_error``). Returns once admitted, not once run. With room, it returns without
        yielding to other tasks, so jobs submitted one after another all start before any of
        them runs on (binder's binds of a gang then meet at their node's fence write)."""
        try:
            self._slots.acquire_nowait()
        except anyio.WouldBlock:
            await self._slots.acquire()
        if self._idle.is_set():
            self._idle = anyio.Event()
        queue = self._queues.get(key)
        if queue is not None:
            queue.append((job, item))
            return
        self._queues[key] = deque([(job, item)])
        self._tg.start_soon(self._drain, key)

    def queued(self) -> Iterator[Any]:
        """The items of the jobs admitted and waiting behind another job of their key."""
        for queue in self._queues.values():
            for _, item in list(queue)[1:]:
                yield item

    async def idle(self) -> None:
        """Wait until every admitted job has run."""
        await self._idle.wait()

    async def _drain(self, key: str) -> None:
        queue = self._queues[key]
        while queue:
            job, item = queue[0]
            try:
                await job()
            except Exception as e:  # noqa: BLE001 - one job's failure never stops the ones behind it
                if self._on_error is not None:
                    self._on_error(e, item)
            finally:
                queue.popleft()
                self._slots.release()
        del self._queues[key]
        if not self._queues:
            self._idle.set()
