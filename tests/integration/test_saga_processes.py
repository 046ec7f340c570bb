"""The saga through the five real service processes and a real nats-server.

The tests that only submit pods share one started stack (``running``: afterwards each deletes
every pod and waits until nothing is reserved and no gang is left, ``hostile.cleaned_env``);
the ones that stop or kill a service start a stack of their own.
"""

from __future__ import annotations

import anyio
import pytest

from hostile import cleaned_env
from phalanx_localstack.stack import ClusterFile, Stack
from stackutil import (
    CLUSTER,
    audit_ledger,
    bound_pods,
    connect,
    gang_states,
    gpu_pod,
    ref,
    seed_nodes,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


@pytest.fixture
def stack(tmp_path):
    s = Stack(ClusterFile.load(CLUSTER), workdir=str(tmp_path / "stack"))
    s.start_nats()
    yield s
    s.stop()


async def start(stack):
    bus, sim = await connect(stack)
    await seed_nodes(stack, sim)
    await anyio.to_thread.run_sync(stack.start_services)
    return bus, sim


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    """A started stack, shared by the tests that leave every service running."""
    s = Stack(ClusterFile.load(CLUSTER), workdir=str(tmp_path_factory.mktemp("saga") / "stack"))
    s.start_nats()
    try:
        async def started() -> None:
            bus, _ = await start(s)
            await bus.close()

        anyio.run(started)
        yield s
    finally:
        s.stop()


@pytest.fixture
async def env(running):
    """(bus, sim) on the shared stack, emptied afterwards."""
    async for _, bus, sim in cleaned_env(running):
        yield bus, sim


async def test_one_whole_gpu_pod_goes_admit_place_bind_scheduled(env):
    bus, sim = env
    await sim.apply_pod(gpu_pod("whole-card-demo", 1, scheduler="lj-runtimekit-scheduler"))
    bound = await wait_until(lambda: bound_pods(sim), 30)
    assert bound == {"default/whole-card-demo": ("v100-a", (0,))}
    states = await wait_until(lambda: _scheduled(bus), 15)
    assert [(s.gang_id, s.phase, s.attempt) for s in states.values()] == [("default/whole-card-demo", "scheduled", 1)]
    assert await audit_ledger(bus) == {"default/whole-card-demo": 1}
    events = await sim.list_events(ref("whole-card-demo"))
    assert [e.reason for e in events] == ["Scheduled"]
    assert "to v100-a (GPUs 0)" in events[0].message


async def _scheduled(bus):
    states = await gang_states(bus)
    return states if states and all(s.phase == "scheduled" for s in states.values()) else None


async def test_a_pod_for_another_scheduler_is_left_alone(env):
    bus, sim = env
    await sim.apply_pod(gpu_pod("not-ours", 1, scheduler="default-scheduler"))
    await sim.apply_pod(gpu_pod("ours", 1))
    await wait_until(lambda: bound_pods(sim), 30)
    assert (await sim.get_pod(ref("not-ours"))).node_name == ""
    assert list(await gang_states(bus)) == ["default/ours"]


async def test_an_invalid_pod_gets_a_warning_event_and_is_never_bound(env):
    bus, sim = env
    await sim.apply_pod(gpu_pod("zero-gpus", 0))

    async def warned():
        return await sim.list_events(ref("zero-gpus"))

    events = await wait_until(warned, 30)
    assert [(e.reason, e.type) for e in events] == [("FailedScheduling", "Warning")]
    assert "resources.limits[nvidia.com/gpu] = '0': nvidia.com/gpu is a number of whole GPUs and must be at least 1" in events[0].message
    async def conditioned():  # the event and the condition are two writes: the event may come first
        pod = await sim.get_pod(ref("zero-gpus"))
        cond = [c for c in (pod.raw.get("status") or {}).get("conditions", []) if c["type"] == "PodScheduled"]
        return (pod, cond) if cond else None

    pod, cond = await wait_until(conditioned, 30, what="the PodScheduled condition")
    assert pod.node_name == ""
    assert cond[0]["status"] == "False" and "must be at least 1" in cond[0]["message"]
    assert await audit_ledger(bus) == {}


async def test_a_pod_too_big_for_any_node_waits_with_the_kube_scheduler_style_reason(env):
    bus, sim = env
    await sim.apply_pod(gpu_pod("too-big", 9))

    async def pending():
        s = (await gang_states(bus)).get("default/too-big")
        return s if s is not None and s.phase == "backoff" else None

    state = await wait_until(pending, 30)
    assert state.reason == ("0/2 nodes are available: 2 insufficient free GPUs; "
                            "would start with 8 GPUs per member instead of 9 GPUs")  # docs/whatif.md
    events = await sim.list_events(ref("too-big"))
    assert events[0].reason == "FailedScheduling"
    assert events[0].message.startswith("0/2 nodes are available: 2 insufficient free GPUs; would start with 8 "
                                        "GPUs per member instead of 9 GPUs (attempt 1)")


async def test_every_service_exits_cleanly_within_five_seconds_of_sigterm(stack):
    bus, sim = await start(stack)
    await bus.close()
    procs = dict(stack.procs)
    took = stack.stop()
    assert set(took) == set(procs)
    assert max(took.values()) < 5.0, took
    assert {name: sp.proc.returncode for name, sp in procs.items()} == {name: 0 for name in procs}


@pytest.mark.parametrize("victim", ["gang-coordinator", "placement", "binder", "topology-discovery@v100-a",
                                    "mig-manager@v100-a"])
async def test_a_service_killed_mid_saga_and_restarted_loses_no_pod_and_books_nothing_twice(stack, victim):
    bus, sim = await start(stack)
    try:
        names = [f"p{i}" for i in range(6)]
        for i, name in enumerate(names):
            await sim.apply_pod(gpu_pod(name, 1 + i % 3))
            if i == 2:
                await anyio.to_thread.run_sync(stack.kill, victim)
        await anyio.to_thread.run_sync(stack.restart, victim)

        async def all_bound():
            b = await bound_pods(sim)
            return b if len(b) == len(names) else None

        bound = await wait_until(all_bound, 60)
        per_pod = await audit_ledger(bus)
        assert per_pod == {f"default/{n}": 1 for n in names}
        used = [(node, g) for node, gpus in bound.values() for g in gpus]
        assert len(used) == len(set(used)) == sum(1 + i % 3 for i in range(6))
        states = await wait_until(lambda: _scheduled(bus), 20)
        assert {s.gang_id: s.attempt for s in states.values()} == {f"default/{n}": 1 for n in names}
        for n in names:
            assert [e.reason for e in await sim.list_events(ref(n))] == ["Scheduled"]
    finally:
        await bus.close()
