"""gang-coordinator's notifier (services/phalanx_gang_coordinator/notify.py): handing a notice
in never waits for the API server; each pod's calls go one sequence at a time, the latest
condition wins, events keep their order (the newest few), and a condition equal to the one last
set is not set again."""

from __future__ import annotations

import anyio
import pytest

from phalanx_gang_coordinator.notify import MAX_EVENTS, Notifier
from phalanx_kube.port import Pod
from phalanx_proto.events import PodRef

pytestmark = pytest.mark.anyio

A, B = PodRef(namespace="t", name="a", uid="ua"), PodRef(namespace="t", name="b", uid="ub")


class SlowCluster:
    """Records every call; a call blocks until ``gate`` is set."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []
        self.gate = anyio.Event()
        self.in_flight: dict[str, int] = {}
        self.most_at_once: dict[str, int] = {}

    async def _call(self, kind: str, ref: PodRef, text: str) -> None:
        self.in_flight[ref.name] = self.in_flight.get(ref.name, 0) + 1
        self.most_at_once[ref.name] = max(self.most_at_once.get(ref.name, 0), self.in_flight[ref.name])
        try:
            await self.gate.wait()
            self.calls.append((kind, ref.name, text))
        finally:
            self.in_flight[ref.name] -= 1

    async def record_event(self, ref, *, reason: str, message: str, type: str = "Normal") -> None:
        await self._call("event", ref, f"{reason}: {message}")

    async def set_scheduled_condition(self, ref, *, status: bool, reason: str, message: str) -> None:
        await self._call("condition", ref, message)


async def run_until_drained(notifier: Notifier, cluster: SlowCluster, hand_in) -> None:
    async with anyio.create_task_group() as tg:
        await tg.start(notifier.run)
        hand_in()
        await anyio.sleep(0.01)  # the workers took the first notices and wait on the API server
        hand_in_later(notifier)
        cluster.gate.set()
        with anyio.fail_after(5):
            await notifier.drained()
        tg.cancel_scope.cancel()


def hand_in_later(notifier: Notifier) -> None:
    """Newer notices for pod a while its first ones are in flight."""
    notifier.tell((A,), "FailedScheduling", "attempt 2")
    notifier.tell((A,), "FailedScheduling", "attempt 3")


async def test_handing_a_notice_in_returns_at_once_and_the_calls_follow_in_order_per_pod():
    cluster = SlowCluster()
    notifier = Notifier(cluster)
    notifier.tell((A, B), "FailedScheduling", "attempt 1")  # synchronous: it cannot wait for the API
    assert notifier.waiting == 2 and cluster.calls == []
    await run_until_drained(notifier, cluster, lambda: None)
    a_calls = [c for c in cluster.calls if c[1] == "a"]
    assert a_calls == [("event", "a", "FailedScheduling: attempt 1"), ("condition", "a", "attempt 1"),
                       ("event", "a", "FailedScheduling: attempt 2"), ("event", "a", "FailedScheduling: attempt 3"),
                       ("condition", "a", "attempt 3")]  # attempt 2's condition was replaced before it went
    assert [c for c in cluster.calls if c[1] == "b"] == [("event", "b", "FailedScheduling: attempt 1"),
                                                         ("condition", "b", "attempt 1")]
    assert cluster.most_at_once == {"a": 1, "b": 1}


async def test_a_condition_equal_to_the_one_set_last_is_not_set_again_and_events_are_bounded():
    cluster = SlowCluster()
    cluster.gate.set()
    notifier = Notifier(cluster)
    async with anyio.create_task_group() as tg:
        await tg.start(notifier.run)
        notifier.condition(A, "waiting")
        with anyio.fail_after(5):
            await notifier.drained()
        notifier.condition(A, "waiting")
        for i in range(MAX_EVENTS + 3):
            notifier.event(B, "FailedScheduling", f"try {i}")
        with anyio.fail_after(5):
            await notifier.drained()
        tg.cancel_scope.cancel()
    assert [c for c in cluster.calls if c[1] == "a"] == [("condition", "a", "waiting")]
    sent = [c[2] for c in cluster.calls if c[1] == "b"]
    assert sent[-MAX_EVENTS:] == [f"FailedScheduling: try {i}" for i in range(3, MAX_EVENTS + 3)]


async def test_once_tells_a_pod_whose_condition_says_something_else_and_not_one_that_says_it_already():
    cluster = SlowCluster()
    cluster.gate.set()
    notifier = Notifier(cluster)
    said = Pod(namespace="t", name="a", uid="ua", raw={"status": {"conditions": [
        {"type": "PodScheduled", "status": "False", "message": "invalid request"}]}})
    notifier.once(said, "FailedScheduling", "invalid request")
    assert notifier.waiting == 0
    notifier.once(said, "FailedScheduling", "another reason")
    assert notifier.waiting == 1


async def test_a_failing_api_call_is_logged_and_the_next_pod_is_served():
    class Broken(SlowCluster):
        async def record_event(self, ref, **kw) -> None:
            if ref.name == "a":
                raise RuntimeError("the API server is away")
            await super().record_event(ref, **kw)

    cluster = Broken()
    cluster.gate.set()
    notifier = Notifier(cluster, workers=1)
    async with anyio.create_task_group() as tg:
        await tg.start(notifier.run)
        notifier.tell((A, B), "FailedScheduling", "x")
        with anyio.fail_after(5):
            await notifier.drained()
        tg.cancel_scope.cancel()
    assert cluster.calls == [("condition", "a", "x"), ("event", "b", "FailedScheduling: x"), ("condition", "b", "x")]
