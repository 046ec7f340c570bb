"""Chaos on a three-server JetStream cluster: while gangs flow through the saga, the leader of
``KV_phx-ledger`` and then the leader of ``PHX_GANG`` are SIGKILLed and restarted (one server
of three down at a time, R3 streams and buckets, auth and TLS on). Nothing is double-booked at
any poll (a poll runs every 0.1 s; each kill waits for one since the last restart, and the
settled state is polled too), every gang (all fit the cluster) ends scheduled with all its pods bound, and once the
pods are deleted no reservation is left.

Seed from ``PHALANX_CHAOS_SEED`` (default: a fresh one, printed)."""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

import anyio
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

from phalanx_bus import Bus  # noqa: E402
from phalanx_kube.kvcluster import KvCluster  # noqa: E402
from phalanx_localstack.natsserver import NatsCluster  # noqa: E402
from phalanx_localstack.stack import ClusterFile, Stack  # noqa: E402
from phalanx_proto import subjects as S  # noqa: E402
from stackutil import CLUSTER, audit_ledger, bound_pods, gang_pod, gang_states, seed_nodes  # noqa: E402

pytestmark = [pytest.mark.chaos, pytest.mark.anyio]

COORD = ["--resync-s", "0.5", "--redrive-after-s", "2", "--backoff-base-s", "0.5", "--backoff-max-s", "3",
         "--default-timeout-s", "20"]
GANGS = 8
"""Each gang needs at most 2 of the cluster's 16 GPUs: all of them fit, so all must end scheduled."""
KILLS = ((4.0, f"KV_{S.KV_LEDGER}"), (11.0, S.STREAM_GANG))
"""(seconds into the run, the stream whose leader is killed)."""
DOWN_S = 4.0


async def test_killing_the_stream_leaders_of_a_three_server_cluster_loses_and_double_books_nothing(tmp_path):
    seed = int(os.environ.get("PHALANX_CHAOS_SEED") or random.SystemRandom().randrange(1 << 30))
    print(f"cluster chaos seed={seed}")
    rng = random.Random(seed)
    gangs = {f"c{g}": rng.choice([(1, 1), (1, 2), (2, 1)]) for g in range(GANGS)}
    cluster = NatsCluster(tmp_path / "cluster", 3)
    cluster.start()
    stack = Stack(ClusterFile.load(CLUSTER), nats_url=cluster.url, workdir=str(tmp_path / "stack"),
                  service_args={"gang-coordinator": COORD}, bus_replicas=3)
    killed: list[tuple[str, str]] = []
    counts = {"polls": 0}
    bus = None
    try:
        await anyio.to_thread.run_sync(stack.bootstrap)
        bus = await Bus.connect(cluster.url, service="test")
        sim = await KvCluster.open(bus)
        await seed_nodes(stack, sim)
        await anyio.to_thread.run_sync(stack.start_services)
        started = time.monotonic()

        async def poll_ledger():
            while True:
                try:
                    await audit_ledger(bus)  # AssertionError on a GPU booked twice: not caught
                    counts["polls"] += 1
                except AssertionError:
                    raise
                except Exception:  # noqa: BLE001 - a leader election in progress
                    pass
                await anyio.sleep(0.1)

        async def audited_since(mark: int) -> None:
            """Until the poller has audited the ledger at least once more than ``mark``."""
            with anyio.fail_after(60):
                while counts["polls"] <= mark:
                    await anyio.sleep(0.1)

        async def chaos():
            mark = 0
            for at, stream in KILLS:
                await anyio.sleep(max(0.0, started + at - time.monotonic()))
                await audited_since(mark)  # an audit of the state this kill interrupts
                leader = (await bus.js.stream_info(stream)).cluster.leader
                victim = cluster.server(leader)
                await anyio.to_thread.run_sync(lambda v=victim: v.stop(kill=True))
                killed.append((stream, leader))
                await anyio.sleep(DOWN_S)
                await anyio.to_thread.run_sync(victim.start)
                mark = counts["polls"]

        async def workload():
            for g, (size, gpus) in gangs.items():
                for i in range(size):
                    await _retry(lambda g=g, i=i, size=size, gpus=gpus: sim.apply_pod(gang_pod(f"{g}-{i}", gpus, g, size)))
                await anyio.sleep(1.5)

        async with anyio.create_task_group() as tg:
            tg.start_soon(poll_ledger)
            tg.start_soon(chaos)
            await workload()
            while len(killed) < len(KILLS):
                await anyio.sleep(0.5)
            await anyio.to_thread.run_sync(cluster.wait_healthy)

            async def settled():
                states = await gang_states(bus)
                return states if len(states) == GANGS and all(s.phase == "scheduled" for s in states.values()) else None

            try:  # an attempt cut by a kill may wait out its deadline and a backoff: bounded, generously
                with anyio.fail_after(240):
                    while (states := await _retry(settled)) is None:
                        await anyio.sleep(0.5)
            except TimeoutError:
                left = {g: (s.phase, s.attempt, s.reason[:120]) for g, s in (await _retry(lambda: gang_states(bus))).items()
                        if s.phase != "scheduled"}
                raise AssertionError(f"gangs not scheduled 240 s after the last kill: {left}") from None
            phases = {p: sum(1 for s in states.values() if s.phase == p) for p in {s.phase for s in states.values()}}
            bound = await _retry(lambda: bound_pods(sim))
            await audited_since(counts["polls"] + 2)  # audits of the settled state too
            print(f"cluster chaos seed={seed} killed={killed} polls={counts['polls']} phases={phases} bound={len(bound)}")
            for p in await _retry(sim.list_pods):
                await _retry(lambda p=p: sim.delete_pod(p.ref))
            with anyio.fail_after(60):
                while await _retry(lambda: audit_ledger(bus)) or await _retry(sim.list_pods):
                    await anyio.sleep(0.5)
            tg.cancel_scope.cancel()
        assert [s for s, _ in killed] == [s for _, s in KILLS]
        assert (phases, len(bound)) == ({"scheduled": GANGS}, sum(size for size, _ in gangs.values()))
    finally:
        if bus is not None:
            await bus.close()
        stack.stop()
        cluster.close()


async def _retry(call, timeout: float = 30.0):
    """``call()`` until it does not fail for a leader election."""
    with anyio.fail_after(timeout):
        while True:
            try:
                return await call()
            except AssertionError:
                raise
            except Exception:  # noqa: BLE001 - NoResponders/timeouts while a leader is elected
                await anyio.sleep(0.3)
