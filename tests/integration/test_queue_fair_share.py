"""Fair share that remembers, on the real stack (nats-server with auth and TLS, every service
its own process, 2 × 8 V100 simulated), placement keeping each queue's recent usage on the bus
with a half-life of 10 s (docs/queues.md, "Fair share that remembers").

Two queues with no quota and weight 1. Team a holds 7 GPUs and team b 9; each has a one-GPU
pod waiting; then one of team a's pods ends, and one GPU comes free. Who gets it is the order
of the queues' distance from their fair share: without a past, team a (6 of its share of 7
against 9 of 9) — and after team a held all 16 GPUs for two half-lives, team b (team a's
recent usage shrinks its share to 6 GPUs at most: 6 of 6 against 9 of 10). The same request
order, the same pods; the usage on the bus turns the order round. ``phalanx queues`` shows
the recent usage and the shares, and the decision log replays the orders it recorded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import anyio
import pytest

from hostile import cleaned_env, hostile_stack
from phalanx_proto import subjects as S
from phalanx_proto.kubeapi import QUEUE_LABEL
from stackutil import gang_states, gpu_pod, ref, replay_log, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

HALF_LIFE_S = 10.0
COORD = ["--queue-sync-s", "0.3", "--resync-s", "0.5", "--backoff-base-s", "6", "--backoff-max-s", "30",
         "--reconcile-s", "1"]
PLACEMENT = ["--usage-half-life-s", str(HALF_LIFE_S), "--usage-every-s", "0.25"]


def queue(name: str) -> dict:
    return {"apiVersion": "scheduling.phalanx.io/v1alpha1", "kind": "Queue", "metadata": {"name": name},
            "spec": {"resources": {"nvidia.com/gpu": {"quota": 0, "overQuotaWeight": 1}}}}


def pod(name: str, team: str) -> dict:
    p = gpu_pod(name, 1)
    p["metadata"]["labels"][QUEUE_LABEL] = team
    return p


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    yield from hostile_stack(tmp_path_factory.mktemp("fair-share"), COORD, service_args={"placement": PLACEMENT})


@pytest.fixture
async def env(stack):
    async for e in cleaned_env(stack):
        yield e


async def bound(sim, prefix: str) -> set[str]:
    return {p.name for p in await sim.list_pods() if p.name.startswith(prefix) and p.node_name}


async def contend(bus, sim, a: str, b: str) -> str:
    """Team a at 7 GPUs and team b at 9 (the cluster full), a one-GPU pod of each waiting (team
    a's first), then one of team a's pods deleted: the waiting pod that gets the GPU."""
    for name, team in ((f"{a}-wait", a), (f"{b}-wait", b)):
        await sim.apply_pod(pod(name, team))

        async def failed(name=name) -> bool:
            s = (await gang_states(bus)).get(f"default/{name}")
            return s is not None and s.phase == "backoff" and s.failures >= 1

        await wait_until(failed, 30, what=f"{name} waiting after a failed placement")
    await sim.delete_pod(ref(f"{a}-00"))

    async def winner() -> str | None:
        won = await bound(sim, f"{a}-wait") | await bound(sim, f"{b}-wait")
        return next(iter(won)) if won else None

    first = await wait_until(winner, 30, what="one waiting pod bound to the freed GPU")
    await anyio.sleep(1.0)
    assert await bound(sim, f"{a}-wait") | await bound(sim, f"{b}-wait") == {first}  # the other still waits
    return first


async def test_the_fair_share_turns_the_order_round_after_a_queue_used_the_cluster(env, stack):
    _, bus, sim = env
    for q in ("r1-a", "r1-b", "r2-a", "r2-b"):
        await sim.apply_queue(queue(q))
    await anyio.sleep(1.0)  # gang-coordinator has read them (--queue-sync-s 0.3)

    # Round 1, no past: team a 7, team b 9.
    for i in range(7):
        await sim.apply_pod(pod(f"r1-a-{i:02d}", "r1-a"))
    await wait_until(lambda: _count(bound(sim, "r1-a-0"), 7), 60, what="r1-a holding 7 GPUs")
    for i in range(9):
        await sim.apply_pod(pod(f"r1-b-{i:02d}", "r1-b"))
    await wait_until(lambda: _count(bound(sim, "r1-b-0"), 9), 60, what="r1-b holding 9 GPUs")
    assert await contend(bus, sim, "r1-a", "r1-b") == "r1-a-wait"
    for p in await sim.list_pods():
        await sim.delete_pod(ref(p.name))
    await wait_until(lambda: _none(sim), 60, what="round 1 gone")

    # Round 2: team a holds the whole cluster for two half-lives, then 7 of it; team b 9.
    for i in range(16):
        await sim.apply_pod(pod(f"r2-a-{i:02d}", "r2-a"))
    await wait_until(lambda: _count(bound(sim, "r2-a-"), 16), 60, what="r2-a holding the cluster")
    await anyio.sleep(2 * HALF_LIFE_S)
    for i in range(7, 16):
        await sim.delete_pod(ref(f"r2-a-{i:02d}"))
    await wait_until(lambda: _at_most(bound(sim, "r2-a-"), 7), 60, what="r2-a down to 7 GPUs")
    for i in range(9):
        await sim.apply_pod(pod(f"r2-b-{i:02d}", "r2-b"))
    await wait_until(lambda: _count(bound(sim, "r2-b-0"), 9), 60, what="r2-b holding 9 GPUs")
    assert await contend(bus, sim, "r2-a", "r2-b") == "r2-b-wait"

    rows = {r["queue"]: r for r in await anyio.to_thread.run_sync(lambda: _queues(stack))}
    assert rows["r2-a"]["recentGPUHours"] > rows["r2-b"]["recentGPUHours"] > 0
    assert rows["r2-b"]["fairShare"] > rows["r2-a"]["fairShare"], rows


async def test_the_decision_log_replays_the_fair_shares_it_recorded(stack):
    """Every cycle order placement recorded (the queues, units, recent-usage records and the
    time) gives the same fair shares again (``phalanx sim --replay``)."""
    code, log, err = await anyio.to_thread.run_sync(lambda: replay_log(stack, "--require", "10"))
    assert code == 0, (err, log.get("differences"))
    assert sum(r["queue_checks"] for r in log["replicas"]) >= 10


def _queues(stack) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "phalanx_cli.main", "queues", "--json", "--nats", stack.url],
                         capture_output=True, text=True, timeout=60, env={**os.environ, **stack.identity_env(S.READER)})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["queues"]


async def _count(names, n: int) -> bool:
    return len(await names) == n


async def _at_most(names, n: int) -> bool:
    return len(await names) <= n


async def _none(sim) -> bool:
    return not await sim.list_pods()
