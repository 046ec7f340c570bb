"""What a pod costs on the bus: messages each scheduler process sends to NATS per pod placed.

Counted by the processes themselves (``phalanx_bus_sent_total``: every client → server message,
each a write or a round trip) on placement, gang-coordinator and binder, from the pods' creation
to every gang ``scheduled``; the simulated cluster's own buckets (``phx-sim-*``, the stand-in for
the API server) are left out, as are the node agents and the periodic work of the services
(the reconciler's lease, the consumers' lag samples). What depends on time is held still so
that a loaded machine counts what a quiet one does: an attempt's announcement (``gang.admitted``
and its deadline, sent only for attempts still running after ``--announce-after-s``) and a
re-drive of a gang without progress (``--redrive-after-s``) are pushed beyond the test's
attempts, so the budget is the quick path's; each costs 2 events and 2 acks more when it
happens. The budget is set
from measurement (docs/scale.md, "Messages per pod"): a change that makes the saga chattier
fails here, with the table of what it sends.
"""

from __future__ import annotations

from collections import Counter

import anyio
import pytest

from hostile import scrape
from phalanx_localstack.stack import Stack
from phalanx_localstack.synthetic import synthetic_cluster
from stackutil import audit_ledger, connect, gang_pod, gang_states, gpu_pod, seed_nodes, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

SERVICES = ("placement", "gang-coordinator", "binder")
BACKGROUND = ("phx-leases",)
"""Periodic, not per pod: the reconciler's lease (as are the consumers' lag samples, kind ``api``)."""
SINGLES = 32
GANG = 64
BUDGET = {  # messages sent per pod, all three processes together, by kind; and the total
    # Measured 2026-12-06 (docs/scale.md, "Messages per pod"): single-pod gangs 2.1-2.4 events
    # (place, reserved, bind.pods and binds_done travel in per-replica batches; gang.scheduled
    # alone), 3 KV writes (2 gang-record writes: admitted+started, scheduled; 1 ledger write),
    # 1.1-1.3 acks, 1.2-1.6 fetches, 0.1 KV reads: 7.5-8.4 in all (19.6 before the references,
    # 14.5 before the batches, 8.8-9.5 while a reservation without MIG was also written into the
    # gang record); a 64-pod gang 0.56-0.66 in all (8.0 before). The margin is for attempts
    # retried after losing a race for their GPUs and for batches that happen to hold one event each.
    "single": {"event": 3.0, "kv_write": 3.25, "kv_read": 0.5, "ack": 1.75, "total": 10},
    "gang64": {"event": 0.25, "kv_write": 0.5, "kv_read": 0.25, "ack": 0.25, "total": 1.0},
}


def sent(stack: Stack) -> Counter:
    """(process, kind, target) → messages sent so far."""
    out: Counter = Counter()
    for proc in SERVICES:
        for sample, value in scrape(stack, proc).items():
            if sample.startswith("phalanx_bus_sent_total{"):
                labels = dict(kv.split("=", 1) for kv in sample[sample.index("{") + 1:-1].split(","))
                target, kind = labels["target"].strip('"'), labels["kind"].strip('"')
                if not target.startswith("phx-sim-") and target not in BACKGROUND and kind != "api":
                    out[(proc, kind, target)] += value
    return out


def table(delta: Counter, pods: int) -> str:
    rows = sorted(delta.items(), key=lambda kv: (-kv[1], kv[0]))
    return "\n".join(f"  {p:<17} {k:<9} {t:<22} {v / pods:8.2f}/pod" for (p, k, t), v in rows if v)


def per_kind(delta: Counter, pods: int) -> dict[str, float]:
    kinds: Counter = Counter()
    for (_, kind, _), v in delta.items():
        kinds[kind] += v
    out = {k: round(v / pods, 2) for k, v in kinds.items()}
    out["total"] = round(sum(kinds.values()) / pods, 2)
    return out


@pytest.fixture
def stack(tmp_path):
    s = Stack(synthetic_cluster("8x8v100"), workdir=str(tmp_path / "stack"), fleet=True,
              service_args={"node-fleet": ["--heartbeat-s", "30", "--label-refresh-s", "3600"],
                            "gang-coordinator": ["--announce-after-s", "60", "--redrive-after-s", "60"]})
    s.start_nats()
    yield s
    s.stop()


async def measure(stack, bus, sim, pods: list[dict], gangs: int) -> Counter:
    before = await anyio.to_thread.run_sync(sent, stack)
    async with anyio.create_task_group() as tg:
        for p in pods:
            tg.start_soon(sim.apply_pod, p)

    async def scheduled():
        states = await gang_states(bus)
        return len([s for s in states.values() if s.phase == "scheduled"]) >= gangs

    await wait_until(scheduled, 120, what="every gang scheduled")
    await anyio.sleep(1.0)  # the last acks and status events
    return await anyio.to_thread.run_sync(sent, stack) - before


async def test_a_pod_costs_at_most_its_budget_of_messages(stack):
    bus, sim = await connect(stack)
    try:
        await seed_nodes(stack, sim)
        await anyio.to_thread.run_sync(stack.start_services)
        await anyio.to_thread.run_sync(stack.wait_nodes_placeable, 60)
        single = await measure(stack, bus, sim, [gpu_pod(f"s{i}", 1) for i in range(SINGLES)], SINGLES)
        for p in await sim.list_pods():
            await sim.delete_pod(p.ref)
        await wait_until(lambda: _empty(bus), 60, what="every reservation released")
        gang = await measure(stack, bus, sim, [gang_pod(f"w{i}", 1, "big", GANG) for i in range(GANG)], 1)
        measured = {"single": per_kind(single, SINGLES), "gang64": per_kind(gang, GANG)}
        print(f"\nsingle-pod gangs ({SINGLES}):\n{table(single, SINGLES)}\n  {measured['single']}")
        print(f"one {GANG}-pod gang:\n{table(gang, GANG)}\n  {measured['gang64']}")
        over = {(w, k): (v, BUDGET[w].get(k)) for w, m in measured.items() for k, v in m.items()
                if k in BUDGET[w] and v > BUDGET[w][k]}
        assert over == {}, f"over budget (measured, budget): {over}"
    finally:
        await bus.close()


async def _empty(bus) -> bool:
    return not await audit_ledger(bus) and not await gang_states(bus)
