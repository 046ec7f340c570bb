"""Two placement replicas racing never book a GPU twice: on a nearly full cluster of 2 nodes,
and on 1,000 simulated nodes (one node-fleet process), where both replicas' caches pick the
same tightest nodes and their compare-and-set commits collide. Both replicas' decision logs
replay to the same answers."""

from __future__ import annotations

import random

import anyio
import pytest

from phalanx_localstack.stack import ClusterFile, Stack
from phalanx_localstack.synthetic import synthetic_cluster
from phalanx_placement.testhooks import DECIDE_DELAY_ENV
from phalanx_proto import subjects as S
from phalanx_proto.kubeapi import QUEUE_LABEL
from phalanx_proto.kvrules import usage_decoder
from phalanx_proto.queues import GPU_UNITS, usage_key
from phalanx_rules.queues import expected_usage, held_by_queue
from stackutil import (
    CLUSTER,
    audit_ledger,
    bound_pods,
    connect,
    gang_states,
    gpu_pod,
    ledger,
    replay_log,
    seed_nodes,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]
DECIDE_DELAY_50MS = {DECIDE_DELAY_ENV: "0.05"}
"""placement's test hook: 50 ms between deciding and committing, so the replicas' races happen."""


async def test_two_placement_replicas_racing_never_double_book_and_do_conflict(tmp_path):
    stack = Stack(ClusterFile.load(CLUSTER), workdir=str(tmp_path / "stack"), replicas={"placement": 2},
                  env=DECIDE_DELAY_50MS)
    stack.start_nats()
    try:
        bus, sim = await connect(stack)
        await seed_nodes(stack, sim)
        await anyio.to_thread.run_sync(stack.start_services)
        rng = random.Random(7)
        sizes = [rng.choice([1, 1, 2, 3]) for _ in range(14)]
        audits = []

        async def audit_forever():
            while True:
                audits.append(await audit_ledger(bus))  # raises on any double booking
                await anyio.sleep(0.02)

        async with anyio.create_task_group() as tg:
            tg.start_soon(audit_forever)
            for i, n in enumerate(sizes):
                await sim.apply_pod(gpu_pod(f"r{i}", n))

            async def settled():
                states = await gang_states(bus)
                done = [s for s in states.values() if s.phase in ("scheduled", "backoff")]
                return states if len(done) == len(sizes) else None

            states = await wait_until(settled, 90)
            during = len(audits)  # audits while the replicas raced (how many depends on their speed)

            async def settled_audited():
                return len(audits) > during

            await wait_until(settled_audited, 30)  # and one of the settled state
            tg.cancel_scope.cancel()
        bound = await bound_pods(sim)
        used = [(node, g) for node, gpus in bound.values() for g in gpus]
        assert len(used) == len(set(used)) <= 16
        per_pod = await audit_ledger(bus)
        assert set(per_pod) == set(bound) and set(per_pod.values()) == {1}
        scheduled = {gid for gid, s in states.items() if s.phase == "scheduled"}
        assert {f"default/r{i}" for i in range(len(sizes))} - scheduled == {
            gid for gid, s in states.items() if s.phase == "backoff"}
        assert sum(n for i, n in enumerate(sizes) if f"default/r{i}" in scheduled) == len(used)
        assert during > 0
        logs = {p: stack.procs[p].log_path.read_text() for p in ("placement", "placement#2")}
        assert any("ledger conflict, deciding again" in text for text in logs.values())
        # Both replicas decided (which one wins a race is timing; a loser may lose them all).
        assert all("reserved" in text or "ledger conflict" in text for text in logs.values())
        assert any("reserved" in text for text in logs.values())
        await replays_to_the_same_answers(stack, len(sizes))
        await bus.close()
    finally:
        stack.stop()


async def test_two_placement_replicas_on_a_thousand_fleet_nodes_never_double_book(tmp_path):
    stack = Stack(synthetic_cluster("1000x8v100"), workdir=str(tmp_path / "stack"), replicas={"placement": 2},
                  fleet=True, env={DECIDE_DELAY_ENV: "0.02"}, service_args={
                      "placement": ["--heartbeat-stale-s", "120"],
                      "node-fleet": ["--heartbeat-s", "20", "--label-refresh-s", "3600"]})
    stack.start_nats()
    try:
        bus, sim = await connect(stack)
        await seed_nodes(stack, sim)
        await anyio.to_thread.run_sync(stack.start_services)
        topo = await bus.kv(S.KV_TOPOLOGY)

        async def all_reported():
            return len(await topo.keys()) >= 1000

        await wait_until(all_reported, 180, what="1,000 topology reports")
        rng = random.Random(11)
        sizes = [rng.choice([1, 1, 2, 4, 8]) for _ in range(40)]
        async with anyio.create_task_group() as tg:
            for i, n in enumerate(sizes):
                tg.start_soon(sim.apply_pod, gpu_pod(f"k{i}", n))

        async def settled():
            states = await gang_states(bus)
            done = [s for s in states.values() if s.phase == "scheduled"]
            return states if len(done) == len(sizes) else None

        await wait_until(settled, 240, what="every pod scheduled")
        bound = await bound_pods(sim)
        used = [(node, g) for node, gpus in bound.values() for g in gpus]
        assert len(used) == len(set(used)) == sum(sizes)
        per_pod = await audit_ledger(bus)  # raises on any GPU booked twice
        assert set(per_pod) == set(bound) and set(per_pod.values()) == {1}
        logs = {p: stack.procs[p].log_path.read_text() for p in ("placement", "placement#2")}
        assert all("reserved" in text or "ledger conflict" in text for text in logs.values())
        assert any("ledger conflict, deciding again" in text for text in logs.values())
        await replays_to_the_same_answers(stack, len(sizes))
        await bus.close()
    finally:
        stack.stop()


async def test_two_placement_replicas_racing_never_push_a_queue_past_its_limit(tmp_path):
    """Every pod is in team-r (limit 6 GPUs) on a cluster of 16 free GPUs: the replicas race for
    the queue's usage record as for the nodes, and at no poll does the ledger hold more than 6
    GPUs for team-r; what it holds is exactly what the usage record says."""
    stack = Stack(ClusterFile.load(CLUSTER), workdir=str(tmp_path / "stack"), replicas={"placement": 2},
                  env=DECIDE_DELAY_50MS, service_args={"gang-coordinator": ["--queue-sync-s", "0.3"]})
    stack.start_nats()
    try:
        bus, sim = await connect(stack)
        await seed_nodes(stack, sim)
        await anyio.to_thread.run_sync(stack.start_services)
        await sim.apply_queue({"apiVersion": "scheduling.phalanx.io/v1alpha1", "kind": "Queue",
                               "metadata": {"name": "team-r"},
                               "spec": {"resources": {"nvidia.com/gpu": {"quota": 2, "limit": 6}}}})
        queues = await bus.kv(S.KV_QUEUES)
        await wait_until(lambda: _has(queues, "team-r"), 10)
        await anyio.sleep(1.0)
        rng = random.Random(13)
        sizes = [rng.choice([1, 1, 2, 3]) for _ in range(12)]
        held_at_polls: list[int] = []

        async def audit_forever():
            while True:
                await audit_ledger(bus)  # raises on any double booking
                held = held_by_queue((await ledger(bus)).values()).get("team-r", 0)
                assert held <= 6 * GPU_UNITS, f"team-r holds {held / GPU_UNITS} GPUs, past its limit of 6"
                held_at_polls.append(held)
                await anyio.sleep(0.02)

        async with anyio.create_task_group() as tg:
            tg.start_soon(audit_forever)
            for i, n in enumerate(sizes):
                await sim.apply_pod(gpu_pod(f"q{i}", n, labels={QUEUE_LABEL: "team-r"}))

            async def settled():
                states = await gang_states(bus)
                done = [s for s in states.values() if s.phase in ("scheduled", "backoff")]
                return states if len(done) == len(sizes) else None

            states = await wait_until(settled, 90)
            await anyio.sleep(1.0)
            tg.cancel_scope.cancel()
        scheduled = [n for i, n in enumerate(sizes) if states[f"default/q{i}"].phase == "scheduled"]
        assert sum(scheduled) <= 6 and max(held_at_polls) <= 6 * GPU_UNITS
        assert any("at its limit 6" in s.reason for s in states.values() if s.phase == "backoff")
        record = usage_decoder.decode((await (await bus.kv(S.KV_LEDGER)).get(usage_key("team-r"))).value)
        assert record.charges == expected_usage((await ledger(bus)).values())["team-r"]
        assert record.allocated == sum(scheduled) * GPU_UNITS
        await bus.close()
    finally:
        stack.stop()


async def _has(kv, key: str) -> bool:
    return key in await kv.keys()


async def replays_to_the_same_answers(stack: Stack, at_least: int) -> None:
    """Both replicas' decision logs, the decisions whose commit lost the race included, replay
    to the same answers (``phalanx sim --replay``)."""
    code, log, err = await anyio.to_thread.run_sync(lambda: replay_log(stack, "--require", str(at_least)))
    assert (code, log["differ"], len(log["replicas"])) == (0, 0, 2), (err, log)
    assert all(r["gaps"] == r["not_replayable"] == 0 for r in log["replicas"]), log
