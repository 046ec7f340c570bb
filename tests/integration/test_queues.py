"""Queues on the real stack (nats-server with auth and TLS, every service its own process, the
simulated cluster of 2 × 8 V100): a queue at its limit waits with the queue named; an idle
cluster lets a queue borrow; a queue below its quota gets freed GPUs before one above it; a
pod naming a queue it may not use is told why; a queue's usage always equals what the ledger
holds for it; two placement replicas racing never push a queue past its limit.
"""

from __future__ import annotations

import anyio
import msgspec
import pytest

from hostile import cleaned_env, hostile_stack
from phalanx_bus import read_all
from phalanx_proto import subjects as S
from phalanx_proto.events import PodRef
from phalanx_proto.kubeapi import QUEUE_LABEL
from phalanx_proto.kvrules import usage_decoder
from phalanx_proto.queues import GPU_UNITS, usage_key
from phalanx_rules.queues import expected_usage, held_by_queue
from stackutil import audit_ledger, gang_states, gpu_pod, ledger, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

COORD = ["--queue-sync-s", "0.3", "--resync-s", "0.5", "--backoff-base-s", "1", "--backoff-max-s", "30",
         "--reconcile-s", "1"]


def queue(name: str, quota: float, limit: float | None = None, **spec) -> dict:
    gpu = {"quota": quota, **({"limit": limit} if limit is not None else {})}
    return {"apiVersion": "scheduling.phalanx.io/v1alpha1", "kind": "Queue", "metadata": {"name": name},
            "spec": {"resources": {"nvidia.com/gpu": gpu}, **spec}}


def team_pod(name: str, gpus: int, team: str, namespace: str = "default") -> dict:
    pod = gpu_pod(name, gpus, labels={QUEUE_LABEL: team})
    pod["metadata"]["namespace"] = namespace
    return pod


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    yield from hostile_stack(tmp_path_factory.mktemp("queues"), COORD)


@pytest.fixture
async def env(stack):
    async for e in cleaned_env(stack):
        _, _, sim = e
        # team-a never reclaims: these tests are about order and limits; taking borrowed GPUs
        # back from running gangs is preemption's (test_preemption.py, the e2e tests).
        for q in (queue("team-a", 8, 8, preemption={"reclaim": "Never"}), queue("team-b", 8),
                  queue("team-c", 4, namespaceSelector={"matchLabels": {"team": "c"}})):
            await sim.apply_queue(q)
        await anyio.sleep(1.0)  # the coordinator has read them (--queue-sync-s 0.3)
        yield e


async def usage(bus, q: str) -> float:
    """GPUs queue ``q`` holds: its usage record where it has a limit, else what the ledger says."""
    entry = await (await bus.kv(S.KV_LEDGER)).get(usage_key(q))
    if entry is not None:
        return usage_decoder.decode(entry.value).allocated / GPU_UNITS
    return held_by_queue((await ledger(bus)).values()).get(q, 0) / GPU_UNITS


async def phase(bus, gang: str, *phases: str):
    async def there():
        s = (await gang_states(bus)).get(gang)
        return s if s is not None and s.phase in phases else None

    return await wait_until(there, 60, what=f"{gang} {phases}")


async def usage_matches_the_ledger(bus, limited=("team-a",)) -> None:
    kv = await bus.kv(S.KV_LEDGER)
    records, _ = await read_all(kv, pattern="queue.*")
    have = {r.value.queue: dict(r.value.charges) for r in records if r.value.charges}
    want = expected_usage((await ledger(bus)).values())
    assert have == {q: c for q, c in want.items() if q in limited}


async def test_a_queue_at_its_limit_waits_with_the_queue_named(env):
    stack, bus, sim = env
    await sim.apply_pod(team_pod("a-full", 8, "team-a"))
    await phase(bus, "default/a-full", "scheduled")
    await sim.apply_pod(team_pod("a-more", 4, "team-a"))
    state = await phase(bus, "default/a-more", "backoff")
    assert state.reason.startswith(
        "0/8 GPUs available to queue team-a: at its limit 8 (allocated 8, this gang needs 4)"), state.reason
    events = await sim.list_events(PodRef(namespace="default", name="a-more"))
    assert any("at its limit 8" in e.message for e in events)
    assert await usage(bus, "team-a") == 8.0
    await usage_matches_the_ledger(bus)


async def test_an_idle_cluster_lets_a_queue_borrow_and_a_queue_below_its_quota_goes_first(env):
    stack, bus, sim = env
    for name in ("b-1", "b-2"):  # team-b's quota is 8: the second pod borrows idle GPUs
        await sim.apply_pod(team_pod(name, 8, "team-b"))
        await phase(bus, f"default/{name}", "scheduled")
    assert await usage(bus, "team-b") == 16.0
    await sim.apply_pod(team_pod("b-3", 8, "team-b"))  # arrives first, and would borrow
    await phase(bus, "default/b-3", "backoff")
    await sim.apply_pod(team_pod("a-1", 8, "team-a"))  # below its quota
    await phase(bus, "default/a-1", "backoff")
    async with anyio.create_task_group() as tg:
        tg.start_soon(audit_ledger, bus)
        await sim.delete_pod(PodRef(namespace="default", name="b-1"))
    await phase(bus, "default/a-1", "scheduled")
    b3 = (await gang_states(bus))["default/b-3"]
    assert b3.phase != "scheduled", "the queue above its quota took the freed GPUs"
    assert await usage(bus, "team-a") == 8.0 and await usage(bus, "team-b") == 8.0
    await usage_matches_the_ledger(bus)


@pytest.mark.parametrize(("case", "pod", "message"), [
    ("a queue that does not exist", team_pod("q-missing", 1, "nope"), "queue nope does not exist"),
    ("a queue whose namespaceSelector leaves the pod's namespace out", team_pod("q-foreign", 1, "team-c"),
     "queue team-c does not admit pods of namespace default"),
])
async def test_a_pod_naming_a_queue_it_may_not_use_is_told_why_and_not_admitted(env, case, pod, message):
    stack, bus, sim = env
    await sim.apply_pod(pod)

    async def told():
        events = await sim.list_events(PodRef(namespace="default", name=pod["metadata"]["name"]))
        return [e for e in events if e.reason == "FailedScheduling"]

    (event,) = await wait_until(told, 30)
    assert event.message.startswith(message), event.message
    assert f"default/{pod['metadata']['name']}" not in await gang_states(bus)


async def test_a_namespace_the_selector_admits_places_its_pods_in_the_queue(env):
    stack, bus, sim = env
    await sim.apply_namespace("team-c-ns", {"team": "c", QUEUE_LABEL: "team-c"})
    await anyio.sleep(1.0)
    await sim.apply_pod(team_pod("c-1", 2, "", namespace="team-c-ns") | {"metadata": {
        "name": "c-1", "namespace": "team-c-ns", "labels": {}}})
    await phase(bus, "team-c-ns/c-1", "scheduled")
    assert await usage(bus, "team-c") == 2.0


async def test_a_gang_whose_members_name_different_queues_waits_with_that_reason(env):
    stack, bus, sim = env
    for i, team in enumerate(("team-a", "team-b")):
        pod = team_pod(f"mixed-{i}", 1, team)
        pod["metadata"]["labels"] |= {"jobset.sigs.k8s.io/jobset-name": "mixed", "aliyun.com/min-member": "2"}
        await sim.apply_pod(pod)

    async def held():
        s = (await gang_states(bus)).get("default/JobSet:mixed")
        return s if s is not None and "different queues" in s.reason else None

    s = await wait_until(held, 30)
    assert s.attempt == 0 and "team-a, team-b" in s.reason


def test_the_queue_tree_is_refused_in_the_spec_a_problem_names():
    from phalanx_kubeobjects.queuespec import queue_from_object

    spec = queue_from_object(msgspec.json.decode(msgspec.json.encode(queue("bad", 9, 4))))
    assert spec.problem == "spec.resources[nvidia.com/gpu]: quota must not exceed limit"


async def test_a_gang_at_its_queues_limit_preempts_a_lower_priority_gang_of_its_queue_to_get_under_it(env):
    stack, bus, sim = env
    low = team_pod("a-low", 8, "team-a")
    low["spec"]["priority"] = 1
    await sim.apply_pod(low)
    await phase(bus, "default/a-low", "scheduled")
    high = team_pod("a-high", 4, "team-a")
    high["spec"]["priority"] = 10
    await sim.apply_pod(high)
    # the cluster has 8 GPUs free, but team-a's limit is 8: a-low (priority 1) goes, whole
    await phase(bus, "default/a-high", "scheduled")
    assert {p.name for p in await sim.list_pods()} == {"a-high"}
    events = await sim.list_events(PodRef(namespace="default", name="a-low"))
    assert any(e.reason == "Preempted" and "default/a-high" in e.message for e in events), events
    assert await usage(bus, "team-a") == 4.0
    await usage_matches_the_ledger(bus)
    # a gang of lower priority (0) may not take a-high's GPUs: it waits at the limit, as before
    await sim.apply_pod(team_pod("a-later", 8, "team-a"))
    later = await phase(bus, "default/a-later", "backoff")
    assert "at its limit 8" in later.reason, later.reason
    assert {p.name: bool(p.node_name) for p in await sim.list_pods()} == {"a-high": True, "a-later": False}
