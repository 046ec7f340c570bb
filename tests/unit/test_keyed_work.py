"""KeyedWork: concurrent across keys, one at a time and in order within a key, each job once."""

from __future__ import annotations

import anyio
import pytest

from phalanx_bus import KeyedWork

pytestmark = pytest.mark.anyio


async def test_jobs_of_one_key_run_in_order_one_at_a_time_while_other_keys_run_alongside():
    active: dict[str, int] = {}
    runs: list[tuple[str, int]] = []
    peak_keys = 0

    def job(key: str, n: int):
        async def run() -> None:
            nonlocal peak_keys
            active[key] = active.get(key, 0) + 1
            peak_keys = max(peak_keys, len([k for k, v in active.items() if v]))
            runs.append((key, n, active[key]))
            await anyio.sleep(0.01)
            active[key] -= 1
        return run

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            work = KeyedWork(tg, 4)
            for n in range(5):
                for key in ("a", "b", "c"):
                    await work.submit(key, job(key, n))
            await work.idle()
    assert [(k, n) for k, n, _ in runs if k == "a"] == [("a", n) for n in range(5)]
    assert sorted((k, n) for k, n, _ in runs) == sorted((k, n) for k in "abc" for n in range(5))
    assert {depth for _, _, depth in runs} == {1}
    assert peak_keys > 1


async def test_a_failing_job_is_reported_and_the_jobs_behind_it_still_run():
    ran, errors = [], []

    async def boom() -> None:
        raise RuntimeError("boom")

    async def fine() -> None:
        ran.append("fine")

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            work = KeyedWork(tg, 2, on_error=lambda e, item: errors.append((str(e), item)))
            await work.submit("k", boom, "first")
            await work.submit("k", fine, "second")
            await work.idle()
    assert (ran, errors) == (["fine"], [("boom", "first")])


def test_a_limit_below_one_is_refused_naming_it():
    with pytest.raises(ValueError, match="limit must be at least 1, not 0"):
        KeyedWork(None, 0)  # type: ignore[arg-type]
