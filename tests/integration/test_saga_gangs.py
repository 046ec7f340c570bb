"""Gang saga guarantees through the real service processes: no gang deadlock, the deadline
(a JetStream scheduled message) rolls an attempt back even across a coordinator restart,
rollback releases everything, and a starving large gang gets its turn."""

from __future__ import annotations

import time

import anyio
import pytest

from phalanx_localstack.stack import ClusterFile, Stack
from stackutil import (
    CLUSTER,
    audit_ledger,
    bound_pods,
    connect,
    gang_pod,
    gang_states,
    partial_gangs,
    ref,
    seed_nodes,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

FAST = ["--resync-s", "0.5", "--redrive-after-s", "2", "--backoff-base-s", "0.5", "--backoff-max-s", "2"]


async def start(tmp_path, coord_args=(), **kw):
    stack = Stack(ClusterFile.load(CLUSTER), workdir=str(tmp_path / "stack"),
                  service_args={"gang-coordinator": [*FAST, *coord_args]}, **kw)
    stack.start_nats()
    bus, sim = await connect(stack)
    await seed_nodes(stack, sim)
    await anyio.to_thread.run_sync(stack.start_services)
    return stack, bus, sim


async def phase_of(bus, gang_id):
    s = (await gang_states(bus)).get(gang_id)
    return s.phase if s else None


async def test_two_gangs_each_over_half_the_cluster_never_hold_halves_of_it(tmp_path):
    stack, bus, sim = await start(tmp_path)
    try:
        partial_seen = []

        async def audit_forever():
            while True:
                partial_seen.extend(await partial_gangs(bus, await gang_states(bus)))
                await anyio.sleep(0.05)

        async with anyio.create_task_group() as tg:
            tg.start_soon(audit_forever)
            for i in range(3):  # interleaved: a0 b0 a1 b1 a2 b2; each gang is 3 x 4 = 12 of 16 GPUs
                await sim.apply_pod(gang_pod(f"a{i}", 4, "a", 3))
                await sim.apply_pod(gang_pod(f"b{i}", 4, "b", 3))

            async def settled():
                st = await gang_states(bus)
                phases = sorted(s.phase for s in st.values())
                return st if phases == ["backoff", "scheduled"] else None

            states = await wait_until(settled, 60)
            await anyio.sleep(3)  # a few more retries of the loser
            tg.cancel_scope.cancel()
        winner = next(g for g, s in states.items() if s.phase == "scheduled")
        loser = next(g for g in states if g != winner)
        letter = winner.rsplit(":", 1)[1]
        assert set(await bound_pods(sim)) == {f"default/{letter}{i}" for i in range(3)}
        assert await audit_ledger(bus) == {f"default/{letter}{i}": 1 for i in range(3)}
        assert partial_seen == []
        assert await phase_of(bus, loser) == "backoff"
        reason = (await gang_states(bus))[loser].reason
        assert "nodes are available" in reason
    finally:
        await bus.close()
        stack.stop()


async def test_binder_down_the_deadline_rolls_back_and_releases_then_the_gang_schedules(tmp_path):
    stack, bus, sim = await start(tmp_path, ["--default-timeout-s", "4"])
    try:
        await anyio.to_thread.run_sync(stack.kill, "binder")
        for i in range(2):
            await sim.apply_pod(gang_pod(f"t{i}", 2, "t", 2))

        async def reserved():
            return await audit_ledger(bus) or None

        assert set(await wait_until(reserved, 30)) == {"default/t0", "default/t1"}

        async def rolled_back():
            s = (await gang_states(bus)).get("default/JobSet:t")
            return s if s is not None and s.failures >= 1 and s.phase in ("backoff", "placing") else None

        state = await wait_until(rolled_back, 30)
        assert "not every member was ready within" in state.reason

        async def told():  # the pod's event follows the state write: wait for it, boundedly
            return any("not every member was ready within" in e.message and "(attempt 1)" in e.message
                       for e in await sim.list_events(ref("t0")))

        assert await wait_until(told, 30)

        # With binder still down every attempt is rolled back and gives its reservation back.
        async def released_between_attempts():
            s = (await gang_states(bus))["default/JobSet:t"]
            return s.phase == "backoff" and not await audit_ledger(bus)

        await wait_until(released_between_attempts, 30)
        await anyio.to_thread.run_sync(stack.restart, "binder")

        async def scheduled():
            s = (await gang_states(bus))["default/JobSet:t"]
            return s if s.phase == "scheduled" else None

        state = await wait_until(scheduled, 60)
        assert state.attempt >= 2
        bound = await bound_pods(sim)
        assert set(bound) == {"default/t0", "default/t1"}
        assert await audit_ledger(bus) == {"default/t0": 1, "default/t1": 1}
    finally:
        await bus.close()
        stack.stop()


async def test_the_deadline_fires_even_if_the_coordinator_was_killed_and_restarted_meanwhile(tmp_path):
    stack, bus, sim = await start(tmp_path, ["--default-timeout-s", "60"])
    try:
        await anyio.to_thread.run_sync(stack.kill, "binder")
        await sim.apply_pod(gang_pod("d0", 1, "d", 1, annotations={"phalanx.io/gang-timeout-seconds": "5"}))

        async def placed():
            # Placed and not bound (binder is down): without MIG the record stays placing while
            # the ledger holds the reservation and the bind waits for binder.
            s = (await gang_states(bus)).get("default/JobSet:d")
            held = await audit_ledger(bus)
            return s if s is not None and s.phase == "placing" and held.get("default/d0") == 1 else None

        s = await wait_until(placed, 30)
        assert s.attempt == 1 and s.timeout_s == 5.0
        await anyio.to_thread.run_sync(stack.kill, "gang-coordinator")
        await anyio.sleep(max(0.0, s.attempt_started_at + 6 - time.time()))  # the deadline passes while it is down
        await anyio.to_thread.run_sync(stack.restart, "gang-coordinator")

        async def rolled_back():
            st = (await gang_states(bus))["default/JobSet:d"]
            return st if st.failures >= 1 else None

        st = await wait_until(rolled_back, 20)
        assert st.reason == "not every member was ready within 5 s"
        log = stack.procs["gang-coordinator"].log_path.read_text()
        assert "deadline fired" in log
    finally:
        await bus.close()
        stack.stop()


async def test_a_large_gang_is_not_starved_by_a_stream_of_small_ones(tmp_path):
    # 16 GPUs. Small single-pod gangs of 4 GPUs keep arriving and finishing; a 2 x 8 gang needs
    # the whole cluster. After --starve-after-s the big gang holds the later ones back.
    stack, bus, sim = await start(tmp_path, ["--starve-after-s", "4"])
    try:
        for i in range(4):
            await sim.apply_pod(gang_pod(f"s{i}", 4, f"s{i}", 1))
        await wait_until(lambda: _count_bound(sim, 4), 30)
        for i in range(2):
            await sim.apply_pod(gang_pod(f"big{i}", 8, "big", 2))
        n = 4
        deadline = time.monotonic() + 60
        big_scheduled = None
        while time.monotonic() < deadline:
            # One small gang finishes, another arrives: without fairness they would keep the
            # cluster busy forever.
            bound = await bound_pods(sim)
            if {"default/big0", "default/big1"} <= set(bound):
                big_scheduled = time.monotonic()
                break
            small = sorted(p for p in bound if p.startswith("default/s"))
            if small:
                await sim.delete_pod(ref(small[0].split("/")[1]))
            await sim.apply_pod(gang_pod(f"s{n}", 4, f"s{n}", 1))
            n += 1
            await anyio.sleep(1.0)
        assert big_scheduled is not None, f"big gang starved; states: {await gang_states(bus)}"
        assert await phase_of(bus, "default/JobSet:big") == "scheduled"
        # big needs both nodes, so every node is kept for it: the small gangs behind it are told.
        told = [i for i in range(4, n) for e in await sim.list_events(ref(f"s{i}"))
                if "kept for a gang ahead in the queue" in e.message and "behind default/JobSet:big" in e.message]
        assert told, "no small gang was told it waits behind big"
    finally:
        await bus.close()
        stack.stop()


async def _count_bound(sim, n):
    return len(await bound_pods(sim)) >= n


async def test_behind_a_starving_gang_others_still_run_where_they_cannot_delay_it(tmp_path):
    # 16 GPUs. s0 takes a whole node; s1 half of the other. big (8 GPUs) cannot fit until s0
    # ends, and starves. A new 4-GPU gang must not freeze behind it: it fits on the half node
    # big's placement does not need, so it runs (backfill); then s0 ends and big gets its node.
    stack, bus, sim = await start(tmp_path, ["--starve-after-s", "3"])
    try:
        await sim.apply_pod(gang_pod("s0", 8, "s0", 1))
        await wait_until(lambda: _count_bound(sim, 1), 30)
        await sim.apply_pod(gang_pod("s1", 4, "s1", 1))
        await wait_until(lambda: _count_bound(sim, 2), 30)
        await sim.apply_pod(gang_pod("big0", 8, "big", 1))

        async def starving():
            s = (await gang_states(bus)).get("default/JobSet:big")
            return s if s is not None and s.reserve_nodes and time.time() - s.created_at > 4 else None

        head = await wait_until(starving, 30)
        s0_node = (await bound_pods(sim))["default/s0"][0]
        assert head.reserve_nodes == (s0_node,)  # where big would go on the empty cluster: s0's node
        await sim.apply_pod(gang_pod("late0", 4, "late", 1))

        async def late_bound():
            return (await bound_pods(sim)).get("default/late0")

        node, _ = await wait_until(late_bound, 30)
        assert node != s0_node and await phase_of(bus, "default/JobSet:big") != "scheduled"
        late = (await gang_states(bus))["default/JobSet:late"]
        assert late.avoid_nodes == (s0_node,) and late.avoid_for == "default/JobSet:big"
        await sim.delete_pod(ref("s0"))

        async def big_bound():
            return (await bound_pods(sim)).get("default/big0")

        node, _ = await wait_until(big_bound, 30)
        assert node == s0_node
    finally:
        await bus.close()
        stack.stop()


def _said(pod) -> str | None:
    return next((c.get("message") for c in (pod.raw.get("status") or {}).get("conditions") or []
                 if c.get("type") == "PodScheduled"), None) if pod is not None else None


async def test_an_incomplete_gang_tells_its_pods_why_they_wait_and_a_complete_one_writes_nothing_before_binding(
        tmp_path):
    stack, bus, sim = await start(tmp_path)
    try:
        for i in range(2):  # "short" has 2 of its 3 members; "whole" arrives complete
            await sim.apply_pod(gang_pod(f"short{i}", 1, "short", 3))
        for i in range(2):
            await sim.apply_pod(gang_pod(f"whole{i}", 1, "whole", 2))

        async def told():
            said = [_said(await sim.get_pod(ref(f"short{i}"))) for i in range(2)]
            return said if all(said) else None

        assert await wait_until(told, 60) == ["gang incomplete: 2/3 members present"] * 2
        async def whole_bound():
            return {"default/whole0", "default/whole1"} <= (await bound_pods(sim)).keys()

        await wait_until(whole_bound, 60)
        assert [(_said(await sim.get_pod(ref(f"whole{i}"))) or "").startswith("gang incomplete")
                for i in range(2)] == [False, False]
        events = [e.reason for i in range(2) for e in await sim.list_events(ref(f"short{i}"))]
        assert "Scheduled" not in events
    finally:
        await bus.close()
        stack.stop()
