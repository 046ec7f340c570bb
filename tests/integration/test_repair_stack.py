"""A running gang that loses nodes is repaired inside its domain (docs/repair.md), on the real
stack: nats-server, every service its own process (the node agents as one ``node-fleet``), the
simulated cluster. The one e2e case (tests/e2e/test_repair_e2e.py) shows a node loss on the real
API server with the real Job controller; these show the rest on the simulated cluster, where the
test itself is the workload's controller: it recreates every member pod that is deleted, under a
new name and the same gang label, as a Job or JobSet controller does.

The cluster: seven nodes of 4 GPUs in one network-pod, each its own HyperNode: five on leaf
switch ``leaf-a``, two on ``leaf-b``. The gang: six pods of 2 GPUs (12 GPUs, 3 nodes); only
leaf-a holds it, so it runs there with two nodes to spare. A node fails as a dead machine looks
to the scheduler: its Ready condition turns False and it gains an untolerated ``NoExecute``
taint. Each test heals the nodes it broke, so the next starts on the same seven.
"""

from __future__ import annotations

import copy
import itertools
import json
import time
from pathlib import Path

import anyio
import pytest
import yaml

from hostile import audited, cleaned_env, hostile_stack
from phalanx_proto import subjects as S
from phalanx_proto.events import topology_decoder
from phalanx_proto.kubeapi import ASSIGNMENT_ANNOTATION, QUEUE_LABEL, SIM_UNHEALTHY_GPUS
from phalanx_proto.state import node_kube_state_decoder
from stackutil import gang_pod, gang_states, gpu_pod, ref, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

TOPOLOGY_4GPU = Path(__file__).resolve().parents[2] / "examples" / "topology" / "pcie-4xL40S-handwritten.yaml"
LEAVES = {**{f"rp-a{i}": "leaf-a" for i in range(5)}, **{f"rp-b{i}": "leaf-b" for i in range(2)}}
GANG, SIZE = "train", 6
"""The gang's name: each test its own (``_own_gang``), so no test reads another's pods' events."""
_tests = itertools.count(1)
COORD = ["--resync-s", "0.5", "--backoff-base-s", "0.5", "--backoff-max-s", "2", "--reconcile-s", "1",
         "--repair-scan-s", "0.3"]
FLEET = ["--state-refresh-s", "0.3"]
"""The node agents look at the nodes every 0.3 s (a changed node is reported within that and the
reporter's 0.5 s debounce), the coordinator at its running gangs' nodes every 0.3 s."""


@pytest.fixture(scope="module")
def cluster_file(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("repair-cluster")
    nodes = [{"name": name, "topology": str(TOPOLOGY_4GPU), "labels": {
        "lj_runtimekit_enable": "true", "phalanx.io/hypernode": f"hn-{name}", "phalanx.io/leaf-switch": leaf,
        "phalanx.io/network-pod": "np-1"}} for name, leaf in LEAVES.items()]
    path = work / "cluster.yaml"
    path.write_text(yaml.safe_dump({"nodes": nodes}))
    return path


@pytest.fixture(scope="module")
def stack(tmp_path_factory, cluster_file):
    yield from hostile_stack(tmp_path_factory.mktemp("repair"), COORD, cluster=cluster_file, fleet=True,
                             service_args={"node-fleet": FLEET})


@pytest.fixture(autouse=True)
def _own_gang():
    global GANG
    GANG = f"train{next(_tests)}"


@pytest.fixture
async def env(stack):
    async for e in cleaned_env(stack):
        _, bus, sim = e
        originals = {n.name: copy.deepcopy(n.raw) for n in await sim.list_nodes()}
        try:
            yield e
        finally:
            for name, raw in originals.items():  # heal what the test broke
                current = await sim.get_node(name)
                if current is None or current.raw != raw:
                    await sim.apply_node(raw)
            await wait_until(lambda b=bus: _all_healthy(b), 30, what="every node reported Ready and untainted again")


async def _all_healthy(bus) -> bool:
    kv = await bus.kv(S.KV_NODE_STATE)
    for name in LEAVES:
        entry = await kv.get(S.token(name))
        if entry is None:
            return False
        state = node_kube_state_decoder.decode(entry.value)
        if state.ready != "True" or state.taints:
            return False
    return True


class Controller:
    """What a Job or JobSet controller does for the gang: keeps one pod per index, making a new
    one (a new name, the same gang label and min-member) whenever the index's pod is gone."""

    def __init__(self, sim, labels: dict[str, str] | None = None, priority: int | None = None) -> None:
        self.sim = sim
        self.labels = labels or {}
        self.priority = priority
        self.current = {i: f"{GANG}-{i}" for i in range(SIZE)}
        self.made = 0

    def pod(self, name: str) -> dict:
        p = gang_pod(name, 2, GANG, SIZE, priority=self.priority)
        p["metadata"]["labels"].update(self.labels)
        p["spec"]["tolerations"] = []  # the test's failure taint is tolerated by nobody
        return p

    async def start(self) -> None:
        for name in self.current.values():
            await self.sim.apply_pod(self.pod(name))

    async def run(self) -> None:
        while True:
            names = {p.name for p in await self.sim.list_pods()}
            for i, name in self.current.items():
                if name not in names:
                    self.made += 1
                    self.current[i] = f"{GANG}-{i}-r{self.made}"
                    await self.sim.apply_pod(self.pod(self.current[i]))
            await anyio.sleep(0.1)


async def members(sim) -> dict[str, tuple[str, str, tuple[int, ...]]]:
    """The gang's pods that are bound: name → (uid, node, GPUs)."""
    out = {}
    for p in await sim.list_pods():
        if p.name.startswith(f"{GANG}-") and p.node_name:
            out[p.name] = (p.uid, p.node_name, tuple(json.loads(p.annotations[ASSIGNMENT_ANNOTATION])["gpus"]))
    return out


async def all_bound(sim, without: set[str] = frozenset()):
    """Every index's pod bound, none on a node of ``without``: their placements, else None."""
    pods = await members(sim)
    live = {p.name for p in await sim.list_pods() if p.name.startswith(f"{GANG}-")}
    if len(pods) == SIZE and live == set(pods) and not {n for _, n, _ in pods.values()} & without:
        return pods
    return None


async def fail_node(sim, name: str) -> None:
    """A dead machine as the scheduler sees it: Ready=False and an untolerated NoExecute taint."""
    raw = copy.deepcopy((await sim.get_node(name)).raw)
    raw.setdefault("spec", {})["taints"] = [{"key": "phalanx.test/failed", "effect": "NoExecute"}]
    raw.setdefault("status", {})["conditions"] = [
        {"type": "Ready", "status": "False", "reason": "KubeletDown", "message": "test: the node died"}]
    await sim.apply_node(raw)


async def fail_and_rebind(bus, sim, ctl: Controller, broken: str) -> dict:
    """Fail node ``broken`` while the controller recreates what goes, the ledger audited
    throughout; the members once every one is bound again off that node."""
    async with audited(bus), anyio.create_task_group() as tg:
        tg.start_soon(ctl.run)
        await fail_node(sim, broken)
        now = await wait_until(lambda: all_bound(sim, {broken}), 45, what="the replacements bound")
        tg.cancel_scope.cancel()
    return now


async def reasons(sim, name: str) -> list[tuple[str, str]]:
    return [(e.reason, e.message) for e in await sim.list_events(ref(name))]


async def started(bus, sim, ctl: Controller) -> dict:
    await ctl.start()
    first = await wait_until(lambda: all_bound(sim), 30, what="the gang bound")
    nodes = {n for _, n, _ in first.values()}
    assert {LEAVES[n] for n in nodes} == {"leaf-a"} and len(nodes) == 3, first

    await repaired_record(bus)
    return first


async def repaired_record(bus) -> None:
    """Wait until the gang's record says scheduled with no repair open: the pods are bound in
    the cluster a moment before gang-coordinator has read the binds and written the record."""
    async def scheduled():
        s = await gang(bus)
        return s is not None and s.phase == "scheduled" and s.repair is None

    try:
        await wait_until(scheduled, 15, what="the gang's record scheduled with no repair open")
    except TimeoutError:
        raise AssertionError(f"the gang's record did not come to scheduled with no repair open: {await gang(bus)}") from None


async def gang(bus):
    """The gang's record (its id is the JobSet label's: ``default/<kind>:train``)."""
    states = [s for gid, s in (await gang_states(bus)).items() if gid.rsplit(":", 1)[-1] == GANG]
    assert len(states) <= 1, states
    return states[0] if states else None


def survivors_of(first: dict, broken: set[str]) -> dict:
    return {name: v for name, v in first.items() if v[1] not in broken}


async def block_spares(sim, first: dict, *, priority: int | None = None) -> list[str]:
    """A 4-GPU pod of another workload on each of leaf-a's spare nodes: no room left in the leaf."""
    used = {n for _, n, _ in first.values()}
    spares = sorted(n for n, leaf in LEAVES.items() if leaf == "leaf-a" and n not in used)
    await block(sim, {f"blocker-{i}": node for i, node in enumerate(spares)}, priority=priority)
    return spares


async def block(sim, where: dict[str, str], *, priority: int | None = None) -> None:
    """A 4-GPU pod (of ``priority``) of another workload on each node: pod name → node."""
    for name, node in where.items():
        p = gpu_pod(name, 4)
        p["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
        if priority is not None:
            p["spec"]["priority"] = priority
        await sim.apply_pod(p)

    async def placed():
        bound = {p.name: p.node_name for p in await sim.list_pods()}
        return all(bound.get(name) == node for name, node in where.items())

    await wait_until(placed, 30, what=f"the blockers on {', '.join(sorted(set(where.values())))}")


async def test_two_nodes_lost_at_once_are_one_repair_in_the_leaf_and_the_survivors_stay(env):
    _, bus, sim = env
    ctl = Controller(sim)
    first = await started(bus, sim, ctl)
    broken = set(sorted({n for _, n, _ in first.values()})[:2])
    survivors = survivors_of(first, broken)
    assert len(survivors) == 2
    async with audited(bus), anyio.create_task_group() as tg:
        tg.start_soon(ctl.run)
        t0 = time.monotonic()
        for n in broken:
            await fail_node(sim, n)
        now = await wait_until(lambda: all_bound(sim, broken), 45, what="every member bound again off the lost nodes")
        took = time.monotonic() - t0
        tg.cancel_scope.cancel()
    assert {k: v for k, v in now.items() if k in survivors} == survivors  # same pods, nodes and GPUs
    new = {k: v for k, v in now.items() if k not in survivors}
    assert len(new) == 4 and ctl.made == 4
    assert {LEAVES[n] for _, n, _ in new.values()} == {"leaf-a"}, new
    used = [(n, g) for _, n, gpus in now.values() for g in gpus]
    assert len(used) == len(set(used)) == 12
    await repaired_record(bus)
    got = await wait_until(lambda: _reason(sim, next(iter(survivors)), "GangRepaired"), 10, what="GangRepaired")
    assert "inside leaf leaf-a after losing 4 member(s)" in got, got  # one repair for both nodes
    assert any(r == "GangRepairing" for r, _ in await reasons(sim, next(iter(survivors))))
    assert not await restarted(sim, now)
    print(f"two nodes lost: every member bound again {took:.1f}s after the failure")


async def restarted(sim, pods) -> list[str]:
    """The pods of ``pods`` told their gang was restarted whole."""
    return [name for name in pods if any(r == "GangRestarted" for r, _ in await reasons(sim, name))]


async def _reason(sim, pod: str, reason: str) -> str | None:
    return next((m for r, m in await reasons(sim, pod) if r == reason), None)


async def test_with_no_room_in_its_leaf_policy_widen_binds_the_replacements_one_tier_up(env):
    _, bus, sim = env
    ctl = Controller(sim, {"phalanx.io/repair-policy": "widen"})
    first = await started(bus, sim, ctl)
    await block_spares(sim, first)
    broken = sorted({n for _, n, _ in first.values()})[0]
    survivors = survivors_of(first, {broken})
    now = await fail_and_rebind(bus, sim, ctl, broken)
    assert {k: v for k, v in now.items() if k in survivors} == survivors
    new = {k: v for k, v in now.items() if k not in survivors}
    assert len(new) == 2 and {LEAVES[n] for _, n, _ in new.values()} == {"leaf-b"}, new
    got = await wait_until(lambda: _reason(sim, next(iter(survivors)), "GangRepaired"), 10, what="GangRepaired")
    assert "inside netpod np-1" in got, got
    assert not await restarted(sim, now)


async def test_with_no_room_in_its_leaf_policy_wait_keeps_the_replacements_pending_until_room_is_freed(env):
    _, bus, sim = env
    ctl = Controller(sim, {"phalanx.io/repair-policy": "wait"})
    first = await started(bus, sim, ctl)
    spares = await block_spares(sim, first)
    broken = sorted({n for _, n, _ in first.values()})[0]
    survivors = survivors_of(first, {broken})
    async with audited(bus), anyio.create_task_group() as tg:
        tg.start_soon(ctl.run)
        await fail_node(sim, broken)

        async def refused():
            pods = [p for p in await sim.list_pods() if p.name.startswith(f"{GANG}-") and p.name not in survivors]
            told = [c.get("message", "") for p in pods for c in (p.raw.get("status") or {}).get("conditions", [])
                    if c.get("type") == "PodScheduled" and c.get("status") == "False"]
            return len(pods) == 2 and not any(p.node_name for p in pods) and len(told) == 2 and all(
                "repair: no room for 2 replacement(s) inside the gang's leaf switch leaf-a" in m for m in told)

        await wait_until(refused, 30, what="the replacements to wait in leaf-a, told why")
        s = await gang(bus)
        assert s.repair is not None and s.repair.policy == "wait"
        assert {k: v for k, v in (await members(sim)).items()} == survivors  # nothing else moved meanwhile
        for i in range(len(spares)):
            await sim.delete_pod(ref(f"blocker-{i}"))
        now = await wait_until(lambda: all_bound(sim, {broken}), 30, what="the replacements bound once room was freed")
        tg.cancel_scope.cancel()
    assert {k: v for k, v in now.items() if k in survivors} == survivors
    new = {k: v for k, v in now.items() if k not in survivors}
    assert len(new) == 2 and {LEAVES[n] for _, n, _ in new.values()} == {"leaf-a"}, new
    assert not await restarted(sim, now)



async def test_with_no_room_in_its_leaf_a_repair_preempts_lower_priority_pods_in_the_leaf_only(env):
    """Preemption for a repair is confined to its domain (docs/repair.md): leaf-a's spares held by
    pods of priority 10, leaf-b's two nodes by pods of priority 0 (cheaper victims, and room the
    unconfined planner would take); the gang (priority 100, policy ``wait``) loses a node. One
    leaf-a blocker is evicted and the replacements are bound in its place; nothing in leaf-b
    moves."""
    _, bus, sim = env
    ctl = Controller(sim, {"phalanx.io/repair-policy": "wait"}, priority=100)
    first = await started(bus, sim, ctl)
    spares = await block_spares(sim, first, priority=10)
    outside = {f"outside-{i}": n for i, n in enumerate(sorted(n for n, leaf in LEAVES.items() if leaf == "leaf-b"))}
    await block(sim, outside, priority=0)
    before = {p.name: (p.uid, p.node_name) for p in await sim.list_pods() if p.name in outside}
    broken = sorted({n for _, n, _ in first.values()})[0]
    survivors = survivors_of(first, {broken})
    async with audited(bus), anyio.create_task_group() as tg:
        tg.start_soon(ctl.run)
        await fail_node(sim, broken)
        now = await wait_until(lambda: all_bound(sim, {broken}), 30, what="the replacements bound after preempting")
        tg.cancel_scope.cancel()
    assert {k: v for k, v in now.items() if k in survivors} == survivors
    new = {k: v for k, v in now.items() if k not in survivors}
    assert len(new) == 2 and len({n for _, n, _ in new.values()}) == 1, new
    (landed,) = {n for _, n, _ in new.values()}
    assert landed in spares, new
    pods = {p.name: (p.uid, p.node_name) for p in await sim.list_pods()}
    evicted = {f"blocker-{i}" for i, n in enumerate(spares) if n == landed}
    assert {f"blocker-{i}": pods.get(f"blocker-{i}", (None, None))[1] for i in range(len(spares))} == {
        f"blocker-{i}": None if f"blocker-{i}" in evicted else n for i, n in enumerate(spares)}
    assert {name: pods.get(name) for name in outside} == before  # nothing outside leaf-a evicted
    await repaired_record(bus)
    assert not await restarted(sim, now)


async def test_a_coordinator_killed_between_the_repairs_steps_and_restarted_completes_the_repair(env):
    """The repair's steps are each in the gang's record first (docs/repair.md): killed once the
    failure is recorded, its pod deleted and the repair attempt refused for want of room (policy
    ``wait``), and started again after room was freed while it was down, gang-coordinator carries
    the repair on from the record: the replacement lands in the leaf, the survivors stay."""
    stack, bus, sim = env
    ctl = Controller(sim, {"phalanx.io/repair-policy": "wait"})
    first = await started(bus, sim, ctl)
    spares = await block_spares(sim, first)
    broken = sorted({n for _, n, _ in first.values()})[0]
    survivors = survivors_of(first, {broken})
    async with audited(bus), anyio.create_task_group() as tg:
        tg.start_soon(ctl.run)
        await fail_node(sim, broken)

        async def waiting():
            s = await gang(bus)
            return s is not None and s.repair is not None and s.repair.attempts >= 1 and s.phase == "backoff" and ctl.made == 2

        await wait_until(waiting, 30, what="the repair recorded, its pods deleted and its first attempt refused")
        await anyio.to_thread.run_sync(stack.kill, "gang-coordinator")
        for i in range(len(spares)):
            await sim.delete_pod(ref(f"blocker-{i}"))
        await anyio.sleep(1.0)  # nothing binds the replacements while the coordinator is down
        assert {k: v for k, v in (await members(sim)).items()} == survivors
        await anyio.to_thread.run_sync(stack.restart, "gang-coordinator")
        now = await wait_until(lambda: all_bound(sim, {broken}), 30, what="the replacements bound after the restart")
        tg.cancel_scope.cancel()
    assert {k: v for k, v in now.items() if k in survivors} == survivors
    new = {k: v for k, v in now.items() if k not in survivors}
    assert len(new) == 2 and {LEAVES[n] for _, n, _ in new.values()} == {"leaf-a"}, new
    await repaired_record(bus)
    got = await wait_until(lambda: _reason(sim, next(iter(survivors)), "GangRepaired"), 10, what="GangRepaired")
    assert "inside leaf leaf-a" in got, got
    assert not await restarted(sim, now)


async def test_a_coordinator_killed_as_soon_as_the_failure_is_recorded_and_restarted_completes_the_repair(env):
    """Killed the moment the gang's record shows the repair (before or just after the failed
    pod's deletion: a scan records, then deletes), the restarted gang-coordinator deletes a
    failed pod still there (the failure is recorded already) and places the replacements."""
    stack, bus, sim = env
    ctl = Controller(sim)
    first = await started(bus, sim, ctl)
    broken = sorted({n for _, n, _ in first.values()})[0]
    survivors = survivors_of(first, {broken})
    async with audited(bus), anyio.create_task_group() as tg:
        tg.start_soon(ctl.run)
        await fail_node(sim, broken)

        async def recorded():
            s = await gang(bus)
            return s is not None and s.repair is not None

        await wait_until(recorded, 30, interval=0.01, what="the failure recorded")
        await anyio.to_thread.run_sync(stack.kill, "gang-coordinator")
        await anyio.to_thread.run_sync(stack.restart, "gang-coordinator")
        now = await wait_until(lambda: all_bound(sim, {broken}), 30, what="the replacements bound after the restart")
        tg.cancel_scope.cancel()
    assert {k: v for k, v in now.items() if k in survivors} == survivors
    new = {k: v for k, v in now.items() if k not in survivors}
    assert len(new) == 2 and {LEAVES[n] for _, n, _ in new.values()} == {"leaf-a"}, new
    assert ctl.made == 2
    await repaired_record(bus)
    assert not await restarted(sim, now)


async def mark_unhealthy(sim, name: str, gpus: str) -> None:
    """The node's GPUs ``gpus`` fail as NVML would report them: the simulated source, the Node's
    ``sim.phalanx.io/unhealthy-gpus`` annotation ("" heals them)."""
    raw = copy.deepcopy((await sim.get_node(name)).raw)
    annotations = raw.setdefault("metadata", {}).setdefault("annotations", {})
    if gpus:
        annotations[SIM_UNHEALTHY_GPUS] = gpus
    else:
        annotations.pop(SIM_UNHEALTHY_GPUS, None)
    await sim.apply_node(raw)


async def reported_unhealthy(bus, name: str) -> tuple[int, ...]:
    entry = await (await bus.kv(S.KV_TOPOLOGY)).get(S.token(name))
    return topology_decoder.decode(entry.value).unhealthy


async def test_a_member_whose_gpu_turns_unhealthy_is_repaired_in_the_leaf_and_no_new_work_gets_the_gpu(env):
    """One GPU of one member fails (topology-discovery reports it, docs/repair.md "Failure
    signals"): that member alone is deleted and its replacement bound inside the leaf, not on
    the GPU; the other five keep their GPUs, the healthy ones of the same node included. Then a
    pod pinned to that node does not get the unhealthy GPU: two GPUs do not fit there (one
    healthy GPU free, the refusal names the unhealthy one), one GPU does, the healthy one."""
    _, bus, sim = env
    ctl = Controller(sim)
    first = await started(bus, sim, ctl)
    victim = sorted(first)[0]
    _, sick_node, victim_gpus = first[victim]
    bad = victim_gpus[0]
    survivors = {k: v for k, v in first.items() if k != victim}
    try:
        async with audited(bus), anyio.create_task_group() as tg:
            tg.start_soon(ctl.run)
            t0 = time.monotonic()
            await mark_unhealthy(sim, sick_node, str(bad))

            async def replaced():
                now = await all_bound(sim)
                return now if now is not None and victim not in now else None

            now = await wait_until(replaced, 30, what="the member on the unhealthy GPU replaced and bound")
            took = time.monotonic() - t0
            tg.cancel_scope.cancel()
        assert await reported_unhealthy(bus, sick_node) == (bad,)
        assert {k: v for k, v in now.items() if k in survivors} == survivors  # the other five stay, as they were
        new = {k: v for k, v in now.items() if k not in survivors}
        assert len(new) == 1 and ctl.made == 1, new
        (_, node, gpus), = new.values()
        assert LEAVES[node] == "leaf-a" and (sick_node, bad) not in {(node, g) for g in gpus}, new
        used = [(n, g) for _, n, gs in now.values() for g in gs]
        assert len(used) == len(set(used)) == 12 and (sick_node, bad) not in used
        await repaired_record(bus)
        told = [m for r, m in await reasons(sim, next(iter(survivors))) if r == "GangRepairing"]
        assert any(f"{victim} on {sick_node} (GPU {bad} reported unhealthy)" in m for m in told), told
        got = await wait_until(lambda: _reason(sim, next(iter(survivors)), "GangRepaired"), 10, what="GangRepaired")
        assert "inside leaf leaf-a after losing 1 member(s)" in got, got
        assert not await restarted(sim, now)

        # New work: the sick node has one survivor (2 GPUs), the unhealthy GPU and one healthy GPU free.
        held = {g for _, n, gs in now.values() if n == sick_node for g in gs}
        healthy_free = sorted(set(range(4)) - held - {bad})
        assert len(held) == 2 and len(healthy_free) == 1, (held, bad)
        two = gpu_pod("probe-two", 2)
        two["spec"]["nodeSelector"] = {"kubernetes.io/hostname": sick_node}
        await sim.apply_pod(two)

        async def refused():
            p = await sim.get_pod(ref("probe-two"))
            msgs = [c.get("message", "") for c in (p.raw.get("status") or {}).get("conditions", [])
                    if c.get("type") == "PodScheduled" and c.get("status") == "False"] if p else []
            return msgs[0] if msgs and not p.node_name else None

        told = await wait_until(refused, 15, what="the two-GPU pod refused on the sick node")
        assert "1 GPU reported unhealthy" in told, told
        one = gpu_pod("probe-one", 1)
        one["spec"]["nodeSelector"] = {"kubernetes.io/hostname": sick_node}
        await sim.apply_pod(one)

        async def bound():
            p = await sim.get_pod(ref("probe-one"))
            return p if p is not None and p.node_name else None

        p = await wait_until(bound, 15, what="the one-GPU pod bound on the sick node")
        assert tuple(json.loads(p.annotations[ASSIGNMENT_ANNOTATION])["gpus"]) == tuple(healthy_free)
        assert (await sim.get_pod(ref("probe-two"))).node_name == ""
        print(f"GPU unhealthy: the member replaced and bound {took:.1f}s after the annotation")
    finally:
        await mark_unhealthy(sim, sick_node, "")
        await wait_until(lambda: _healed(bus, sick_node), 15, what="the GPU reported healthy again")


async def _healed(bus, name: str) -> bool:
    return await reported_unhealthy(bus, name) == ()


async def test_a_queues_repair_reserve_keeps_a_node_from_another_queue_and_the_repair_lands_on_it(env):
    """``spec.repairReserve`` on the running stack (docs/queues.md, "Spare capacity for
    repairs"): team-a keeps 4 GPUs per leaf where its gang runs. Another queue's four whole-node
    pods find four free nodes but bind on three, the fourth told which node is held back; then
    a node of the gang fails and its replacements are bound on the node that was kept."""
    _, bus, sim = env
    queues = ({"apiVersion": "scheduling.phalanx.io/v1alpha1", "kind": "Queue", "metadata": {"name": "team-a"},
               "spec": {"resources": {"nvidia.com/gpu": {"quota": 20}}, "repairReserve": {"tier": "leaf", "gpus": 4}}},
              {"apiVersion": "scheduling.phalanx.io/v1alpha1", "kind": "Queue", "metadata": {"name": "team-b"},
               "spec": {"resources": {"nvidia.com/gpu": {"quota": 8}}}})
    for q in queues:
        await sim.apply_queue(q)
    try:
        await anyio.sleep(2.5)  # gang-coordinator and placement have read them (--queue-sync-s: 2 s)
        ctl = Controller(sim, {QUEUE_LABEL: "team-a"})
        first = await started(bus, sim, ctl)
        used = {n for _, n, _ in first.values()}
        spares = sorted(n for n, leaf in LEAVES.items() if leaf == "leaf-a" and n not in used)
        for i in range(4):
            p = gpu_pod(f"other-{i}", 4, labels={QUEUE_LABEL: "team-b"})
            p["spec"]["tolerations"] = []
            await sim.apply_pod(p)

        async def three_bound_one_told():
            pods = [p for p in await sim.list_pods() if p.name.startswith("other-")]
            waiting = [p for p in pods if not p.node_name]
            told = [c.get("message", "") for p in waiting for c in (p.raw.get("status") or {}).get("conditions", [])
                    if c.get("type") == "PodScheduled" and c.get("status") == "False"]
            ok = len(pods) == 4 and len(waiting) == 1 and told and \
                "held back as spare capacity for queue team-a's repairs" in told[0]
            return ({p.node_name for p in pods if p.node_name}, told[0]) if ok else None

        taken, why = await wait_until(three_bound_one_told, 30, what="team-b's pods on three nodes, the fourth told why")
        [kept] = [n for n in spares if n not in taken]
        assert f"held back as spare capacity for queue team-a's repairs (4 GPUs per leaf switch): {kept};" in why, why
        broken = sorted(used)[0]
        survivors = survivors_of(first, {broken})
        now = await fail_and_rebind(bus, sim, ctl, broken)
        assert {k: v for k, v in now.items() if k in survivors} == survivors
        assert {n for k, (_, n, _) in now.items() if k not in survivors} == {kept}
    finally:
        for q in queues:
            await sim.delete_queue(q["metadata"]["name"])
