"""The open preemption's fast path, crashed between its steps (docs/preemption.md, "The attempt
stays open"), on the real stack (nats-server with auth and TLS, every service its own process,
2 × 8 V100 simulated, the ledger audited every 50 ms: never a GPU booked twice).

* placement killed after the compare-and-set that turned the nomination into the preemptor's
  reservation and before its ``Reserved``: the ledger holds every member; restarted, it (or
  gang-coordinator's re-drive) answers again and the preemptor binds to the nominated GPUs, at
  the same attempt;
* two placement replicas promoting the same nomination at once (a test hook holds each
  promotion 2 s between building and committing it, longer than their passes' period): one
  compare-and-set wins, the other replica finds the reservation there and answers nothing.
"""

from __future__ import annotations

import json

import anyio
import pytest

from hostile import audited, cleaned_env, hostile_stack, scrape
from phalanx_placement.testhooks import EXIT_AFTER_PROMOTION_ENV, PROMOTE_DELAY_ENV
from phalanx_proto.kubeapi import ASSIGNMENT_ANNOTATION
from stackutil import audit_ledger, gang_pod, gang_states, ledger, ref, wait_until
from test_preemption import COORD, fill

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


@pytest.fixture(scope="module")
def crashing(tmp_path_factory):
    work = tmp_path_factory.mktemp("preemption-crash")
    yield from hostile_stack(work, COORD, env={EXIT_AFTER_PROMOTION_ENV: str(work / "placement-exited")})


@pytest.fixture
async def crash_env(crashing):
    async for e in cleaned_env(crashing):
        yield e


@pytest.fixture(scope="module")
def racing(tmp_path_factory):
    yield from hostile_stack(tmp_path_factory.mktemp("promotion-race"), COORD, replicas={"placement": 2},
                             env={PROMOTE_DELAY_ENV: "2"})


@pytest.fixture
async def race_env(racing):
    async for e in cleaned_env(racing):
        yield e


async def preemptor_bound(sim):
    pod = await sim.get_pod(ref("hi-0"))
    return pod if pod is not None and pod.node_name else None


async def check_preemptor(bus, sim, pod, before) -> None:
    """hi-0 holds exactly the GPUs lo-x held, once, at the attempt that nominated them; lo-y
    runs on; no nomination is left."""
    victim = before["lo-x-0"][0]
    assert (pod.node_name, sorted(json.loads(pod.annotations[ASSIGNMENT_ANNOTATION])["gpus"])) == (
        victim, list(range(8)))
    assert {p.name for p in await sim.list_pods()} == {"lo-y-0", "lo-y-1", "hi-0"}
    per_pod = await audit_ledger(bus)
    assert per_pod["default/hi-0"] == 1
    held = [a for led in (await ledger(bus)).values() for a in led.allocations.values()
            if a.gang_id == "default/JobSet:hi"]
    assert [a.attempt for a in held] == [1]
    assert not any(led.nominations for led in (await ledger(bus)).values())

    async def scheduled():
        s = (await gang_states(bus)).get("default/JobSet:hi")
        return s if s is not None and s.phase == "scheduled" else None

    state = await wait_until(scheduled, 30, what="the preemptor's record scheduled")
    assert state.attempt == 1  # the attempt stayed open through everything


async def test_a_placement_killed_between_the_promotions_commit_and_its_reply_still_binds_the_preemptor(crash_env):
    stack, bus, sim = crash_env
    async with audited(bus):
        before = await fill(sim)
        await sim.apply_pod(gang_pod("hi-0", 8, "hi", 1, priority=10))

        async def exited():
            return stack.procs["placement"].proc.poll() is not None or None

        await wait_until(exited, 60, what="placement exiting after the promotion's commit")
        assert (stack.procs["placement"].log_path.parent / "placement-exited").exists()
        held = [a for led in (await ledger(bus)).values() for a in led.allocations.values()
                if a.gang_id == "default/JobSet:hi"]
        assert [(a.attempt, a.assignment.node) for a in held] == [(1, before["lo-x-0"][0])]  # committed, unanswered
        await anyio.to_thread.run_sync(stack.restart, "placement")
        pod = await wait_until(lambda: preemptor_bound(sim), 60, what="the preemptor bound after the restart")
    await check_preemptor(bus, sim, pod, before)


async def test_two_replicas_promoting_the_same_nomination_reserve_it_once(race_env):
    stack, bus, sim = race_env
    async with audited(bus):
        before = await fill(sim)
        await sim.apply_pod(gang_pod("hi-0", 8, "hi", 1, priority=10))
        pod = await wait_until(lambda: preemptor_bound(sim), 90, what="the preemptor bound")
    await check_preemptor(bus, sim, pod, before)
    # both built the promotion; the one that lost the compare-and-set (it may still be holding
    # its own a moment after the preemptor bound) built again and found it done
    logs = [stack.procs[name].log_path for name in ("placement", "placement#2")]

    async def lost_one():
        texts = [p.read_text() for p in logs]
        return sum(t.count('what="gang default/JobSet:hi: promoting its nomination"') for t in texts) >= 1 or None

    await wait_until(lost_one, 15, what="the other replica's promotion losing its compare-and-set")
    await anyio.sleep(1.5)  # its next passes: nothing more to promote
    counted = [await anyio.to_thread.run_sync(scrape, stack, name) for name in ("placement", "placement#2")]
    assert sum(c.get("phalanx_preemptions_promoted_total", 0) for c in counted) == 1
    assert sum(c.get("phalanx_ledger_commit_conflicts_total", 0) for c in counted) >= 1
    assert sum(p.read_text().count("event=promoted") for p in logs) == 1
