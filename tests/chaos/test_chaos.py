"""Chaos: a seeded stream of gangs while services are SIGKILLed and nats-server restarts, and
while a hostile client poisons KV values and forges replies and commands.

Seed from ``PHALANX_CHAOS_SEED`` (default: a fresh one, printed). Asserts, against the real
processes: no GPU booked twice at any moment (the ledger is polled all along), every gang
ends scheduled or pending with a reason, once the workload is deleted no reservation is left
without a live pod, the reconciler's findings are all zero at the end, and every decision the
placement replicas logged replays to the same answer (``phalanx sim --replay``).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

import anyio
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from attacks import attack, cure, node_attack, streams_over_their_limits, wait_for_zero_findings  # noqa: E402

from hostile import scrape  # noqa: E402
from phalanx_localstack.stack import ClusterFile, Stack  # noqa: E402
from stackutil import (  # noqa: E402
    CLUSTER,
    audit_ledger,
    bound_pods,
    connect,
    gang_pod,
    gang_states,
    replay_log,
    seed_nodes,
    wait_until,
)

pytestmark = [pytest.mark.chaos, pytest.mark.anyio]

VICTIMS = ("gang-coordinator", "placement", "binder", "topology-discovery@v100-a", "mig-manager@v100-b")
COORD = ["--resync-s", "0.5", "--redrive-after-s", "2", "--backoff-base-s", "0.5", "--backoff-max-s", "3",
         "--default-timeout-s", "15", "--starve-after-s", "20", "--reconcile-s", "1"]
GANGS = 50
CHAOS_S = 60.0
MIN_KILLS = 10
"""Chaos goes on past ``CHAOS_S`` until this many kills (a loaded machine restarts slowly), at
most until ``3 * CHAOS_S``."""


async def test_chaos_kills_and_nats_restarts_never_double_book_or_lose_a_gang(tmp_path):
    seed = int(os.environ.get("PHALANX_CHAOS_SEED") or random.SystemRandom().randrange(1 << 30))
    print(f"chaos seed={seed}")
    rng = random.Random(seed)
    gangs = {}
    for g in range(GANGS):
        size, gpus = rng.choice([(1, 1), (1, 2), (1, 4), (2, 1), (2, 2), (2, 4), (3, 2), (2, 8)])
        gangs[f"g{g}"] = [(f"g{g}-{i}", gpus, size) for i in range(size)]
    stack = Stack(ClusterFile.load(CLUSTER), workdir=str(tmp_path / "stack"), service_args={"gang-coordinator": COORD})
    stack.start_nats()
    bus, sim = await connect(stack)
    counts = {"kills": 0, "nats_restarts": 0, "polls": 0, "finished": 0, "recreated": 0, "poisoned": 0, "forged": 0,
              "node attacks": 0}
    poisoned: list[tuple[str, str]] = []
    finished: set[str] = set()
    try:
        await seed_nodes(stack, sim)
        await anyio.to_thread.run_sync(stack.start_services)
        # Half the gangs are team-x's: a queue with a limit, whose usage record rides in the same
        # atomic batches as the reservations; the reconciler checks it equals the ledger at the end.
        await sim.apply_queue({"apiVersion": "scheduling.phalanx.io/v1alpha1", "kind": "Queue",
                               "metadata": {"name": "team-x"},
                               "spec": {"resources": {"nvidia.com/gpu": {"quota": 4, "limit": 10}}}})
        await anyio.sleep(2.5)
        started = time.monotonic()

        async def poll_ledger():
            while True:
                try:
                    await audit_ledger(bus)  # AssertionError on a GPU booked twice: not caught
                    counts["polls"] += 1
                except AssertionError:
                    raise
                except Exception:  # noqa: BLE001 - nats restarting
                    pass
                await anyio.sleep(0.05)

        chaos_done = anyio.Event()

        async def chaos():
            restarts_at = (CHAOS_S * 0.3, CHAOS_S * 0.7)
            while time.monotonic() - started < CHAOS_S or (
                    counts["kills"] < MIN_KILLS and time.monotonic() - started < 3 * CHAOS_S):
                await anyio.sleep(rng.uniform(2.0, 4.0))
                elapsed = time.monotonic() - started
                if counts["nats_restarts"] < len(restarts_at) and elapsed > restarts_at[counts["nats_restarts"]]:
                    await anyio.to_thread.run_sync(stack.nats.restart)
                    counts["nats_restarts"] += 1
                    continue
                victim = rng.choice(VICTIMS)
                await anyio.to_thread.run_sync(stack.kill, victim)
                await anyio.sleep(rng.uniform(0.2, 1.5))
                await anyio.to_thread.run_sync(stack.restart, victim)
                counts["kills"] += 1
            chaos_done.set()

        async def workload():
            """Submit gangs in a seeded order; finish (delete) scheduled ones after a while;
            recreate pods a rollback deleted, as their controller would."""
            order = list(gangs)
            done_at: dict[str, float] = {}
            while time.monotonic() - started < CHAOS_S + 5 or not chaos_done.is_set():
                try:
                    for _ in range(2):
                        if order:
                            for name, gpus, size in gangs[order.pop(0)]:
                                await sim.apply_pod(team(gang_pod(name, gpus, name.rsplit("-", 1)[0], size)))
                    bound = await bound_pods(sim)
                    present = {p.name for p in await sim.list_pods()}
                    now = time.monotonic()
                    for g, pods in gangs.items():
                        if g in finished:
                            continue
                        if all(f"default/{n}" in bound for n, _, _ in pods):
                            done_at.setdefault(g, now)
                            if now - done_at[g] > 3 and rng.random() < 0.5:
                                finished.add(g)
                                for n, _, _ in pods:
                                    await sim.delete_pod(_ref(n))
                        elif g not in order:
                            for n, gpus, size in pods:
                                if n not in present:
                                    await sim.apply_pod(team(gang_pod(n, gpus, g, size)))
                                    counts["recreated"] += 1
                except Exception:  # noqa: BLE001 - nats restarting; try again
                    pass
                await anyio.sleep(1.0)

        async def hostile():
            """Poison KV values and forge replies and commands all along (tests/chaos/attacks.py)."""
            while time.monotonic() - started < CHAOS_S:
                await anyio.sleep(rng.uniform(1.0, 3.0))
                try:
                    what = await attack(bus, sim, rng, poisoned)
                    counts["poisoned" if what == "poison" else "forged"] += 1
                except Exception:  # noqa: BLE001 - nats restarting; try again
                    pass

        async def hostile_node():
            """One node's own credentials (v100-a's agents) attacking all along: rows 1-5."""
            while time.monotonic() - started < CHAOS_S:
                await anyio.sleep(rng.uniform(1.0, 3.0))
                try:
                    await node_attack(stack, rng)
                    counts["node attacks"] += 1
                except AssertionError:
                    raise
                except Exception:  # noqa: BLE001 - nats restarting; try again
                    pass

        async with anyio.create_task_group() as tg:
            tg.start_soon(poll_ledger)
            tg.start_soon(chaos)
            tg.start_soon(hostile)
            tg.start_soon(hostile_node)
            await workload()

            async def settled():
                try:
                    states = await gang_states(bus)
                except Exception:  # noqa: BLE001
                    return None
                ok = all(s.phase == "scheduled" or (s.phase in ("waiting", "backoff") and (
                    s.reason or len(s.members) < s.min_member)) for s in states.values())
                return states if ok else None

            with anyio.fail_after(45):
                while (states := await settled()) is None:
                    await anyio.sleep(0.5)
            # Calm: with the chaos over, the gangs that fit the cluster must get scheduled.
            with anyio.move_on_after(20):
                while any(s.phase != "scheduled" for s in (await gang_states(bus)).values()):
                    await anyio.sleep(0.5)
            states = await settled() or states
            for s in sorted(states.values(), key=lambda s: s.created_at)[:5]:
                print(f"  {s.gang_id} {s.phase} attempt={s.attempt} reason={s.reason!r}")
            phases = {}
            for s in states.values():
                phases[s.phase] = phases.get(s.phase, 0) + 1
            counts["finished"] = len(finished)
            print(f"chaos seed={seed} gangs={GANGS} counts={counts} end_phases={phases} "
                  f"max_attempt={max((s.attempt for s in states.values()), default=0)}")

            for p in await sim.list_pods():
                await sim.delete_pod(p.ref)
            await cure(bus, poisoned)
            with anyio.fail_after(45):
                while await audit_ledger(bus) or await sim.list_pods():
                    await anyio.sleep(0.5)
            findings = await wait_for_zero_findings(stack, bus)
            over = await streams_over_their_limits(bus)

            async def every_node_placeable():
                m = await anyio.to_thread.run_sync(scrape, stack, "placement")
                nodes = {k.split('"')[1]: v for k, v in m.items() if k.startswith("phalanx_placement_nodes{")}
                return nodes if nodes == {"fresh": 2, "stale": 0, "invalid": 0} else None

            placeable = await wait_until(every_node_placeable, 30, what="every node placeable again")
            # Every decision any placement replica logged, through the kills and the restarts of
            # nats-server, decided again by the same engine, gives the same answer.
            code, log, err = await anyio.to_thread.run_sync(lambda: replay_log(stack, "--require", str(GANGS // 2)))
            print(f"replay: {log.get('replayed')} decisions of {len(log.get('replicas', ()))} placement replicas, "
                  f"{log.get('differ')} differ; " + "; ".join(
                      f"{r['replica']}: {r['records']} records, {r['bases']} bases, {r['gaps']} gaps, "
                      f"{r['not_replayable']} not replayable" for r in log.get("replicas", ())))
            for r in log.get("replicas", ()):
                for d in r.get("differences", ()):
                    print(f"  differs: {json.dumps(d)}")
            tg.cancel_scope.cancel()
        assert counts["kills"] >= MIN_KILLS and counts["nats_restarts"] >= 2 and counts["polls"] > 100
        assert counts["finished"] >= 10, counts
        assert counts["poisoned"] >= 3 and counts["forged"] >= 3, counts
        assert set(findings.values()) == {0}, findings
        assert counts["node attacks"] >= 3, counts
        assert over == [], over
        assert placeable == {"fresh": 2, "stale": 0, "invalid": 0}
        assert (code, log["differ"]) == (0, 0), err
    finally:
        await bus.close()
        stack.stop()


def team(pod: dict) -> dict:
    """Gangs with an odd number go to queue team-x."""
    gang = pod["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-name"]
    if int(gang.removeprefix("g")) % 2:
        pod["metadata"]["labels"]["scheduling.phalanx.io/queue"] = "team-x"
    return pod


def _ref(name):
    from phalanx_proto.events import PodRef

    return PodRef(namespace="default", name=name)
