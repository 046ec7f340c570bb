"""Reclaim keeps its contract when preemptors arrive together: on the real stack (nats-server
with auth and TLS, every service its own process, 2 × 8 V100 simulated) with **two placement
replicas** that wait 50 ms between deciding and committing, so that their plans overlap. Two
queues of quota 8: team-a borrows the whole cluster in one-GPU pods, then team-b's pods arrive
at once — a gang of 4 and six single pods, in the orders below. Each preemptor's plan counts the
nominations already in force (``preempt_rules.with_nominations``), and a nomination's batch
rewrites the usage records of the queues it moves GPUs between, so a replica that decided on a
view without the other's nomination loses the compare-and-set and decides again. team-b ends at
its quota (8) and team-a at its own (8), never beyond; the rest of team-b waits with the reason.
"""

from __future__ import annotations

import json

import anyio
import pytest

from hostile import audited, cleaned_env, hostile_stack
from phalanx_placement.testhooks import DECIDE_DELAY_ENV
from phalanx_proto.kubeapi import QUEUE_LABEL
from stackutil import gang_pod, gang_states, gpu_pod, ledger, replay_log, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

COORD = ["--queue-sync-s", "0.3", "--resync-s", "0.5", "--backoff-base-s", "0.5", "--backoff-max-s", "3",
         "--reconcile-s", "1"]


def queue(name: str, quota: int) -> dict:
    return {"apiVersion": "scheduling.phalanx.io/v1alpha1", "kind": "Queue", "metadata": {"name": name},
            "spec": {"resources": {"nvidia.com/gpu": {"quota": quota}}}}


def team(pod: dict, name: str) -> dict:
    pod["metadata"]["labels"][QUEUE_LABEL] = name
    return pod


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    yield from hostile_stack(tmp_path_factory.mktemp("reclaim-burst"), COORD, replicas={"placement": 2},
                             env={DECIDE_DELAY_ENV: "0.05"})


@pytest.fixture
async def env(stack):
    async for e in cleaned_env(stack):
        _, _, sim = e
        for q in (queue("team-a", 8), queue("team-b", 8)):
            await sim.apply_queue(q)
        await anyio.sleep(1.0)  # gang-coordinator has read them (--queue-sync-s 0.3)
        yield e


def b_gang() -> list[dict]:
    return [team(gang_pod(f"b-gang-{i}", 1, "b-gang", 4), "team-b") for i in range(4)]


def b_singles() -> list[dict]:
    return [team(gpu_pod(f"b-{i}", 1), "team-b") for i in range(6)]


ORDERS = [
    ("team-b's gang reclaims first, then six single pods arrive together", [b_gang, b_singles], 0.0),
    ("team-b's gang and its six single pods arrive together", [lambda: b_gang() + b_singles()], 0.0),
    ("ten single pods of team-b arrive 20 ms apart, so that both replicas decide some at once",
     [lambda: [team(gpu_pod(f"b-{i}", 1), "team-b") for i in range(10)]], 0.02),
]


@pytest.mark.parametrize(("name", "waves", "apart_s"), ORDERS, ids=[o[0] for o in ORDERS])
async def test_preemptors_arriving_together_reclaim_up_to_their_quota_and_never_below_the_others(env, name, waves,
                                                                                                 apart_s):
    _, bus, sim = env
    async with audited(bus):
        for i in range(16):
            await sim.apply_pod(team(gpu_pod(f"a-{i:02d}", 1), "team-a"))

        async def bound(prefix: str) -> int:
            return sum(1 for p in await sim.list_pods() if p.name.startswith(prefix) and p.node_name)

        await wait_until(lambda: _at_least(bound("a-"), 16), 60, what="team-a holding the whole cluster")
        for wave in waves:
            async with anyio.create_task_group() as tg:
                for pod in wave():
                    tg.start_soon(sim.apply_pod, pod)
                    await anyio.sleep(apart_s)
            if len(waves) > 1 and wave is b_gang:
                await wait_until(lambda: _at_least(bound("b-gang"), 4), 60, what="team-b's gang reclaimed 4 GPUs")

        async def settled() -> tuple | None:
            """(team-a's GPUs, team-b's, team-b's waiting gangs' sizes) once no nomination is in
            force, the cluster is full and every team-b pod is bound or a member of a gang that
            backs off (a pod not admitted yet is neither)."""
            if any(led.nominations for led in (await ledger(bus)).values()):
                return None
            pods = await sim.list_pods()
            held = {t: sum(1 for p in pods if p.name.startswith(f"{t}-") and p.node_name) for t in ("a", "b")}
            states = await gang_states(bus)
            waiting = [s for g, s in states.items() if "/b-" in g or g.endswith(":b-gang")]
            if held["a"] + held["b"] != 16 or any(s.phase not in ("scheduled", "backoff") for s in waiting):
                return None
            known = {m.pod.name for s in waiting for m in s.members}
            if any(p.name.startswith("b-") and not p.node_name and p.name not in known for p in pods):
                return None  # a team-b pod gang-coordinator has not admitted yet: not settled

            return held["a"], held["b"], sorted(len(s.members) for s in waiting if s.phase == "backoff")

        first = await wait_until(settled, 90, what="every team-b preemptor done or waiting")
        await anyio.sleep(3.0)  # what a late plan would still do, it has done by now
        a, b, waiting = await wait_until(settled, 30, what="still settled")
        assert (a, b, waiting) == first
        assert b <= 8 and a >= 8, (a, b)  # no quota passed by reclaim, none pushed below
        assert waiting and all(n > 8 - b for n in waiting), (b, waiting)  # what waits would pass team-b's quota
        if wave is b_singles:  # the gang of 4 first, then four of the six singles
            assert (a, b, waiting) == (8, 8, [1, 1])


async def test_the_decision_log_of_the_bursts_replays_to_the_same_queue_answers_plans_and_placements(stack):
    """After the bursts above, both placement replicas' decision logs are read back: every
    decision — its queue rules (limit, borrowing), its engine answer and its preemption plan —
    decides again to what was logged (``phalanx sim --replay``)."""
    code, log, err = await anyio.to_thread.run_sync(lambda: replay_log(stack, "--require", "20"))
    assert code == 0, (err, json.dumps([r.get("differences") for r in log.get("replicas", ())])[:6000])
    replicas = log["replicas"]
    assert sum(r["queue_checks"] for r in replicas) >= 20 and sum(r["plans"] for r in replicas) >= 4, replicas


async def _at_least(count, n: int) -> bool:
    return (await count) >= n


async def test_two_replicas_reclaims_on_different_nodes_between_the_same_queues_do_not_both_commit(nats_private):
    """Two replicas, each on the same view, nominate for a team-b pod by reclaiming a different
    team-a gang on a different node: their node ledgers do not overlap, so only the queues' usage
    records the nomination's batch rewrites (``PlacementQueues.reclaim_fence``) make the second
    batch lose its compare-and-set; the same batch without them would have committed."""
    import msgspec

    from phalanx_bus import Bus, KvConflict, enable_atomic, kv_atomic_write
    from phalanx_engine.preempt import Plan, Victim
    from phalanx_engine.snapshot import Decision
    from phalanx_placement import preempting
    from phalanx_placement.cache import ClusterCache
    from phalanx_placement.queues import PlacementQueues
    from phalanx_proto import subjects as S
    from phalanx_proto.events import Assignment, MemberSpec, PodRef, encoder
    from phalanx_proto.queues import GPU_UNITS, QueueSpec, queue_key
    from phalanx_proto.state import Allocation, NodeLedger, alloc_key
    from phalanx_rules.preemption import preemptor_of

    bus = await Bus.connect(nats_private.url, service="test")
    await bus.declare()
    await enable_atomic(bus, S.KV_LEDGER)
    queues = await bus.kv(S.KV_QUEUES)
    for name in ("team-a", "team-b"):
        await queues.put(queue_key(name), encoder.encode(QueueSpec(name=name, quota=8 * GPU_UNITS)))
    ledger_kv = await bus.kv(S.KV_LEDGER)

    def ref(name: str) -> PodRef:
        return PodRef(namespace="ns", name=name, uid=f"uid-{name}")

    for node in ("n1", "n2"):  # team-a holds both nodes, a gang per node
        a = Assignment(pod=ref(f"a-{node}"), node=node, gpus=tuple(range(8)))
        led = NodeLedger(node=node, allocations={alloc_key(a.pod): Allocation(
            gang_id=f"ns/a-{node}", attempt=1, assignment=a, queues=("team-a",))})
        await ledger_kv.put(S.token(node), encoder.encode(led))
    replicas = [ClusterCache(bus, stale_s=30.0) for _ in range(2)]
    batches = []
    async with anyio.create_task_group() as tg:
        for cache in replicas:
            await tg.start(cache.run)
        for cache, node in zip(replicas, ("n1", "n2"), strict=True):
            cache.refresh()
            victim = Victim(gang_id=f"ns/a-{node}", queue="team-a", priority=0, rule="reclaim", units=8 * GPU_UNITS,
                            pods=(ref(f"a-{node}"),))
            b = MemberSpec(pod=ref(f"b-{node}"), gpus=1, queue="team-b")
            plan = Plan(victims=(victim,), units=8 * GPU_UNITS,
                        placement=Decision(assignments=(Assignment(pod=b.pod, node=node, gpus=(0,)),)))
            preemptor = preemptor_of(f"ns/b-{node}", (b,), "team-b")
            writes = preempting.nominate(cache.ledger_of, S.token, cache.gang_keys(f"ns/b-{node}"), f"ns/b-{node}",
                                         1, plan, preemptor, expires_at=cache.clock() + 60, now=cache.clock())
            fence = PlacementQueues(cache).reclaim_fence("team-b", plan.victims)
            assert sorted(fence) == ["queue.team-a", "queue.team-b"]
            # decided and assumed at once, as a scheduling cycle does: the batch expects what it read
            batches.append((cache, writes, cache.assume({**writes, **fence})))
        (first, _, first_commit), (second, second_writes, second_commit) = batches
        await kv_atomic_write(bus, S.KV_LEDGER, await first.expected(first_commit))
        with pytest.raises(KvConflict):
            await kv_atomic_write(bus, S.KV_LEDGER, await second.expected(second_commit))
        second.forget(second_commit)
        # the same nomination without the queues' records touches only n2, which nobody changed
        commit = second.assume(second_writes)
        await kv_atomic_write(bus, S.KV_LEDGER, await second.expected(commit))
        tg.cancel_scope.cancel()
    assert msgspec.json.decode((await ledger_kv.get("queue.team-b")).value) == {"queue": "team-b"}
    await bus.close()
