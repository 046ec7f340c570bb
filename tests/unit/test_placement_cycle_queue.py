"""Placement's request queue: a cycle takes what waits, highest priority first, then by
arrival, at most its bound; a redelivery waits for the first delivery of its attempt."""

from __future__ import annotations

import anyio
import pytest

from phalanx_placement.cycle_queue import RequestQueue, Waiting
from phalanx_proto.events import PlaceRequested

pytestmark = pytest.mark.anyio


def request(gang: str, attempt: int = 1) -> PlaceRequested:
    return PlaceRequested(gang_id=f"t/{gang}", attempt=attempt)


@pytest.mark.parametrize("arrivals, limit, expected_first, expected_next", [
    ([("a", 0), ("b", 0), ("c", 0)], 8, ["a", "b", "c"], []),
    ([("a", 0), ("b", 5), ("c", 0), ("d", 5)], 8, ["b", "d", "a", "c"], []),
    ([("a", 0), ("b", 1), ("c", 2)], 2, ["c", "b"], ["a"]),
], ids=["equal priority keeps arrival order", "higher priority first, then arrival",
        "the bound leaves the rest for the next cycle"])
async def test_a_cycle_takes_by_priority_then_arrival_up_to_its_bound(arrivals, limit, expected_first, expected_next):
    q = RequestQueue()
    for k, (gang, priority) in enumerate(arrivals):
        q.put(Waiting(ev=request(gang), priority=priority, arrival=k))
    first = [w.ev.gang_id[2:] for w in await q.take(limit)]
    rest = [w.ev.gang_id[2:] for w in await q.take(limit)] if len(q) else []
    assert (first, rest) == (expected_first, expected_next)


async def test_a_request_put_back_after_a_lost_commit_goes_before_later_arrivals():
    q = RequestQueue()
    early = Waiting(ev=request("early"), priority=0, arrival=0)
    q.put(Waiting(ev=request("late"), priority=0, arrival=1))
    q.put(early)
    assert [w.ev.gang_id for w in await q.take(8)] == ["t/early", "t/late"]


async def test_submit_returns_the_outcome_and_a_redelivery_waits_for_the_first():
    q = RequestQueue()
    order = []

    async def submit(tag: str) -> None:
        try:
            await q.submit(request("g"), 0)
            order.append((tag, "ok"))
        except RuntimeError as e:
            order.append((tag, str(e)))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(submit, "first")
            tg.start_soon(submit, "again")
            (w,) = await q.take(8)
            await anyio.sleep(0.05)
            assert len(q) == 0, "the redelivery is not queued while the first is in a cycle"
            w.finish(RuntimeError("ledger kept changing"))
            (w2,) = await q.take(8)
            w2.finish()
    assert order == [("first", "ledger kept changing"), ("again", "ok")]
