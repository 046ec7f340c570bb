"""Two placement replicas racing to preempt never evict for the same GPUs twice: on the real
stack (nats-server with auth and TLS, every service its own process, 2 × 8 V100 simulated,
placement with two replicas and 50 ms between deciding and committing so that their plans
overlap), two high-priority pods arrive at once on a cluster full of low-priority gangs. Each
replica's first plan takes the same cheapest victim; one nomination wins the compare-and-set,
the other replica decides again without the gang already promised, so exactly two victims —
the two of lowest priority — are evicted, each once, and both preemptors bind."""

from __future__ import annotations

import json

import anyio
import pytest

from hostile import audited, hostile_stack, scrape
from phalanx_placement.testhooks import DECIDE_DELAY_ENV
from phalanx_proto import subjects as S
from phalanx_proto.kubeapi import ASSIGNMENT_ANNOTATION
from phalanx_proto.state import Nomination, ledger_decoder
from stackutil import connect, gang_pod, ledger, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

COORD = ["--resync-s", "0.5", "--backoff-base-s", "1", "--backoff-max-s", "5", "--reconcile-s", "1"]
LOW = {"lo-1": 1, "lo-2": 2, "lo-3": 3, "lo-4": 4}
"""Four 4-GPU gangs fill the 16 GPUs, priorities 1 to 4."""


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    yield from hostile_stack(tmp_path_factory.mktemp("preemption-race"), COORD, replicas={"placement": 2},
                             env={DECIDE_DELAY_ENV: "0.05"})


def placed(pods) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {p.name: (p.node_name, tuple(sorted(json.loads(p.annotations[ASSIGNMENT_ANNOTATION])["gpus"])))
            for p in pods if p.node_name}


async def test_two_replicas_racing_to_preempt_evict_the_two_cheapest_gangs_once_each(stack):
    bus, sim = await connect(stack)
    try:
        async with audited(bus):
            for gang, prio in LOW.items():
                await sim.apply_pod(gang_pod(f"{gang}-0", 4, gang, 1, priority=prio))

            async def filled():
                got = placed(await sim.list_pods())
                return got if len(got) == len(LOW) else None

            before = await wait_until(filled, 60, what="the low-priority gangs bound")
            seen: list[Nomination] = []

            async def follow() -> None:
                async for entry in (await bus.kv(S.KV_LEDGER)).watch("*"):
                    if entry is not None and not entry.deleted and entry.value:
                        led = ledger_decoder.decode(entry.value)
                        seen.extend(n for n in led.nominations.values() if n not in seen)

            async with anyio.create_task_group() as tg:
                tg.start_soon(follow)
                await anyio.sleep(0.5)  # the watch is listed
                async with anyio.create_task_group() as both:  # the two preemptors at once
                    for name in ("hi-a-0", "hi-b-0"):
                        both.start_soon(sim.apply_pod, gang_pod(name, 4, name[:4], 1, priority=10))

                async def both_bound():
                    got = placed(await sim.list_pods())
                    return got if {"hi-a-0", "hi-b-0"} <= set(got) else None

                after = await wait_until(both_bound, 90, what="both preemptors bound")
                await anyio.sleep(0.5)  # the watch has seen the last writes
                tg.cancel_scope.cancel()
        # exactly the two lowest-priority gangs were evicted; the others run where they ran
        assert sorted(after) == ["hi-a-0", "hi-b-0", "lo-3-0", "lo-4-0"]
        assert {n: after[n] for n in ("lo-3-0", "lo-4-0")} == {n: before[n] for n in ("lo-3-0", "lo-4-0")}
        # each preemptor took the GPUs of one victim, not the same ones
        assert sorted([after["hi-a-0"], after["hi-b-0"]]) == sorted([before["lo-1-0"], before["lo-2-0"]])
        # no two preemptors' nominations in force ever named the same victim or the same GPUs
        firsts: dict[str, set[str]] = {}
        for n in seen:
            firsts.setdefault(n.gang_id, set()).update(n.victims)
        assert set(firsts) == {"default/JobSet:hi-a", "default/JobSet:hi-b"}, seen
        assert not firsts["default/JobSet:hi-a"] & firsts["default/JobSet:hi-b"], firsts
        assert set().union(*firsts.values()) == {"default/JobSet:lo-1", "default/JobSet:lo-2"}, firsts
        assert not any(led.nominations for led in (await ledger(bus)).values())
        # one eviction per victim pod, by whichever binder; two preemptions planned in all
        binder = await anyio.to_thread.run_sync(scrape, stack, "binder")
        assert binder.get('phalanx_evictions_total{result="evicted"}') == 2
        counted = [await anyio.to_thread.run_sync(scrape, stack, name) for name in ("placement", "placement#2")]
        assert sum(c.get('phalanx_preemptions_total{rule="priority"}', 0) for c in counted) == 2
    finally:
        await bus.close()
