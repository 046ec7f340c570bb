"""Bad records isolated, nothing dropped silently, and a reconciler that proves the ledger matches
the cluster — against the real service processes (two gang-coordinator replicas, so the
reconciler's lease is exercised) and a real nats-server, with the ledger audited every 50 ms.

* a poisoned value in every shared bucket is skipped, counted and named (`phalanx doctor`,
  `phalanx explain`, `phalanx_kv_invalid_entries`) while everything else goes on;
* pods of an odd shape or with out-of-bounds annotation values are told why and hold nobody up;
* a release lost on the way (what a dead-lettered command leaves behind) is repaired;
* a pod bound without a reservation gets one if its GPUs are free, and is reported loudly if
  they are not — never booked twice;
* the reconciler's findings are back to zero at the end of each test.
"""

from __future__ import annotations

import json

import anyio
import msgspec
import pytest

from hostile import audited, cleaned_env, held, hostile_stack, phalanx, scheduled, scrape
from phalanx_proto import subjects as S
from phalanx_proto.events import Assignment, PodRef, encoder
from phalanx_proto.kubeapi import ASSIGNMENT_ANNOTATION
from phalanx_proto.state import RECONCILER_REPORT_KEY, NodeLedger, reconciler_report_decoder
from stackutil import CLUSTER, bound_pods, connect, gang_pod, gang_states, gpu_pod, ledger, ref, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

COORD = ["--resync-s", "0.5", "--redrive-after-s", "2", "--backoff-base-s", "0.5", "--backoff-max-s", "2",
         "--reconcile-s", "1"]
COORDINATORS = ("gang-coordinator", "gang-coordinator#2")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    yield from hostile_stack(tmp_path_factory.mktemp("records"), COORD, replicas={"gang-coordinator": 2})


@pytest.fixture
async def env(stack):
    async for e in cleaned_env(stack):
        yield e
        await wait_until(lambda: reconciler_healthy(stack), 60, what="reconciler findings back to zero")


async def report(bus):
    entry = await (await bus.kv(S.KV_LEASES)).get(RECONCILER_REPORT_KEY)
    return reconciler_report_decoder.decode(entry.value) if entry else None


async def fresh_report(bus, after: float):
    """The first reconciler report written after ``after``."""
    async def newer():
        r = await report(bus)
        return r if r is not None and r.at > after else None

    return await wait_until(newer, 30, what="a fresh reconciler report")


async def reconciler_healthy(stack) -> bool:
    """Exactly one coordinator holds the lease, and its findings are all zero."""
    metrics = [await anyio.to_thread.run_sync(scrape, stack, name) for name in COORDINATORS]
    leaders = [m for m in metrics if m.get("phalanx_reconciler_leader") == 1]
    if len(leaders) != 1:
        return False
    return all(v == 0 for k, v in leaders[0].items() if k.startswith("phalanx_reconciler_findings{"))


def doctor(stack) -> tuple[int, dict]:
    out = phalanx("doctor", "--nats", stack.url, "--json")
    return out.returncode, json.loads(out.stdout) if out.stdout else {}


POISON = {
    S.KV_LEDGER: ("v100-b", b'{"node": "v100-b", "allocations": {"x": {"gang_id": 1}}}'),
    S.KV_TOPOLOGY: ("ghost", b"\xff\xfe not json"),
    S.KV_HEARTBEAT: ("ghost", b"{}"),
    S.KV_GANGS: ("default.poisoned", b"[1, 2"),
    S.KV_MIG: ("ghost", b'{"node": "elsewhere", "instances": {}}'),
    S.KV_NODE_STATE: ("ghost", b'{"allocatable": {"cpu": -1}}'),
}


async def test_a_poisoned_value_in_every_bucket_is_skipped_named_and_holds_nothing_else_up(env):
    stack, bus, sim = env
    async with audited(bus):
        for bucket, (key, value) in POISON.items():
            await (await bus.kv(bucket)).put(key, value)
        try:
            # Placement leaves v100-b out (its reservations are unknown): one GPU fits on v100-a,
            # eight do not fit anywhere it may look; the key "ghost", whose agent's records are all
            # bad, counts as a node whose report is invalid.
            _, ok = await scheduled(bus, sim, "ok-1")
            assert [a.node for a in await held(bus, ok)] == ["v100-a"]
            await sim.apply_pod(gpu_pod("big-1", 8))

            async def pending():
                s = (await gang_states(bus)).get("default/big-1")
                return s if s is not None and s.phase == "backoff" else None

            assert (await wait_until(pending, 30)).reason == \
                ("0/2 nodes are available: 1 insufficient free GPUs, 1 node report invalid; would start if 1 GPU "
                 "free on node v100-a (held by gang default/ok-1)")  # no answer on the nodes it may not look at
            # A gang whose record is unreadable is told so; nobody else is held up by it.
            poisoned = await sim.apply_pod(gpu_pod("poisoned", 1))

            async def told():
                return [e for e in await sim.list_events(poisoned.ref) if "cannot be read" in e.message]

            (event,) = await wait_until(told, 30)
            assert "gang default/poisoned: its record cannot be read" in event.message and "phalanx doctor" in event.message
            _, ok2 = await scheduled(bus, sim, "ok-2")
            assert (await sim.get_pod(poisoned.ref)).node_name == ""

            explained = phalanx("explain", "default/ok-1", "--nats", stack.url, "--json")
            assert explained.returncode == 0, explained.stderr
            doc = json.loads(explained.stdout)
            assert doc["status"] == "bound" and doc["gang"]["id"] == "default/ok-1"
            assert [r.split(" (")[0] for r in doc["unreadable_records"]] == ["phx-gangs/default.poisoned"]

            rc, doc = doctor(stack)
            assert rc == 1
            assert {b: [x["key"] for x in v["bad"]] for b, v in doc["kv"].items() if v["bad"]} == {
                b: [k] for b, (k, _) in POISON.items()}
            assert "undecodable" in doc["kv"][S.KV_GANGS]["bad"][0]["error"]
            assert "key 'ghost' does not match node 'elsewhere'" in doc["kv"][S.KV_MIG]["bad"][0]["error"]
            text = phalanx("doctor", "--nats", stack.url)
            assert text.returncode == 1 and "phx-ledger/v100-b (revision" in text.stdout

            placement = await anyio.to_thread.run_sync(scrape, stack, "placement")
            assert placement['phalanx_kv_invalid_entries{bucket="phx-ledger"}'] == 1
            assert placement['phalanx_kv_invalid_entries{bucket="phx-topology"}'] == 1
            assert placement['phalanx_kv_invalid_entries{bucket="phx-node-state"}'] == 1
        finally:
            for bucket, (key, _) in POISON.items():
                await (await bus.kv(bucket)).delete(key)

        async def healthy():
            rc, _ = await anyio.to_thread.run_sync(doctor, stack)
            return rc == 0

        await wait_until(healthy, 60, interval=1.0, what="doctor healthy once the poison is gone")
        node, _ = await wait_until(lambda: _bound(sim, "default/big-1"), 45)
        assert node == "v100-b"


async def test_pods_of_an_odd_shape_or_with_values_out_of_bounds_are_told_why_and_hold_nobody_up(env):
    stack, bus, sim = env
    async with audited(bus):
        odd = gpu_pod("odd-shape", 1)
        odd["spec"]["containers"] = "not a list"
        huge_timeout = gpu_pod("huge-timeout", 1)
        huge_timeout["metadata"]["annotations"] = {"phalanx.io/gang-timeout-seconds": "250000000000"}
        huge_gang = gang_pod("huge-gang", 1, "huge", 99999)
        for p in (odd, huge_timeout, huge_gang):
            await sim.apply_pod(p)
        await scheduled(bus, sim, "normal-2")
        expected = {
            "odd-shape": "spec.containers = 'not a list': a pod needs at least one container",
            "huge-timeout": "the gang timeout is a whole number of seconds: must be at most 604800",
            "huge-gang": "min-member is the number of pods in the gang: must be at most 10000",
        }
        for name, rule in expected.items():
            async def warned(name=name, rule=rule):
                return [e for e in await sim.list_events(ref(name)) if rule in e.message and e.type == "Warning"]

            await wait_until(warned, 30, what=f"{name} told")
        assert set(await gang_states(bus)) == {"default/normal-2"}


async def _to_placement(bus) -> int:
    """Messages waiting in the gang stream on placement's subjects (alone or in batches)."""
    info = await bus.js.stream_info(S.STREAM_GANG, subjects_filter=S.CHANNEL["gangPlacementBatch"].template.replace("{replica}", ">"))
    return sum((info.state.subjects or {}).values())


async def test_a_release_lost_on_the_way_is_repaired_by_the_reconciler(env):
    stack, bus, sim = env
    async with audited(bus):
        pod, _ = await scheduled(bus, sim, "lost-3")
        await anyio.to_thread.run_sync(stack.kill, "placement")
        try:
            before = await _to_placement(bus)
            await sim.delete_pod(pod.ref)

            async def forgotten_and_release_sent():
                # The member is dropped from the record first, then its release is published:
                # purge only once it is in the stream, or it would reach placement after all.
                return "default/lost-3" not in await gang_states(bus) and await _to_placement(bus) > before

            await wait_until(forgotten_and_release_sent, 30)
            # The release the coordinator published never arrives (what a dead-lettered command leaves).
            # It travels alone or in a replica's batch: both are purged (placement is down, so
            # nothing else waits for it there).
            await bus.js.purge_stream(S.STREAM_GANG, subject=S.placement_subject("default/lost-3"))
            await bus.js.purge_stream(S.STREAM_GANG,
                                      subject=S.CHANNEL["gangPlacementBatch"].template.replace("{replica}", "*"))
            assert "default/lost-3" in {str(a.assignment.pod) for led in (await ledger(bus)).values()
                                        for a in led.allocations.values()}
        finally:
            await anyio.to_thread.run_sync(stack.restart, "placement")

        async def released():
            return not any(led.allocations for led in (await ledger(bus)).values())

        await wait_until(released, 30, what="the reconciler releases the leaked reservation")
        repairs = [await anyio.to_thread.run_sync(scrape, stack, name) for name in COORDINATORS]
        assert sum(m.get('phalanx_reconciler_repairs_total{action="release"}', 0) for m in repairs) >= 1
        log = stack.procs["placement"].log_path.read_text()
        assert 'gang=default/lost-3 attempt=1 reason="reconciler: reservation_without_pod" allocations=1' in log


async def test_a_bound_pod_without_a_reservation_gets_one_if_its_gpus_are_free_and_is_rolled_back_if_not(env):
    stack, bus, sim = env
    async with audited(bus):
        adoptee = await bound_without_reservation(sim, "adoptee-4", "v100-b", (5,))

        async def adopted():
            led = (await ledger(bus)).get("v100-b")
            return [a for a in led.allocations.values() if a.assignment.pod == adoptee] if led else None

        (alloc,) = await wait_until(adopted, 30, what="adoptee's reservation recorded")
        assert alloc.adopted and alloc.assignment.gpus == (5,) and alloc.gang_id == "default/adoptee-4"

        # A second pod bound onto the adoptee's GPU later: two pods share a GPU, and the one bound
        # later is rolled back (deleted, told why); the reservation never changes hands.
        intruder = await bound_without_reservation(sim, "intruder-4", "v100-b", (5,))

        async def rolled_back():
            return await sim.get_pod(intruder) is None

        await wait_until(rolled_back, 45, what="intruder rolled back")
        (event,) = [e for e in await sim.list_events(intruder) if e.reason == "PhalanxDoubleBooked"]
        assert "shares GPU(s) on v100-b with default/adoptee-4, which was bound to them first" in event.message
        repairs = [await anyio.to_thread.run_sync(scrape, stack, name) for name in COORDINATORS]
        assert sum(m.get('phalanx_reconciler_repairs_total{action="evict"}', 0) for m in repairs) == 1
        (kept,) = await wait_until(adopted, 5)
        assert kept == alloc
        await sim.delete_pod(adoptee)

        async def given_back():
            led = (await ledger(bus)).get("v100-b")
            return led is None or not led.allocations

        await wait_until(given_back, 30, what="the adopted reservation released once its pod is gone")


async def _bound(sim, key):
    return (await bound_pods(sim)).get(key)


async def bound_without_reservation(sim, name: str, node: str, gpus: tuple[int, ...]) -> PodRef:
    """A Phalanx pod bound to ``node`` with an assignment annotation but no reservation (what a
    lost reservation, or a bind by someone else, leaves)."""
    pod = gpu_pod(name, len(gpus))
    pod["spec"]["nodeName"] = node
    a = Assignment(pod=PodRef(namespace="default", name=name), node=node, gpus=gpus)
    pod["metadata"]["annotations"] = {ASSIGNMENT_ANNOTATION: encoder.encode(a).decode()}
    return (await sim.apply_pod(pod)).ref


async def test_exactly_one_coordinator_replica_holds_the_reconciler_lease(stack):
    assert await reconciler_healthy(stack)
    owners = {(await report_of(stack)).owner}
    leaders = [name for name in COORDINATORS
               if (await anyio.to_thread.run_sync(scrape, stack, name)).get("phalanx_reconciler_leader") == 1]
    assert len(leaders) == 1
    leader = leaders[0]
    await anyio.to_thread.run_sync(stack.kill, leader)
    try:
        # The other replica takes the lease once it expires (10 s) and reports.
        async def taken_over():
            r = await report_of(stack)
            return r if r.owner not in owners else None

        await wait_until(taken_over, 60, what="the other replica reconciles")
    finally:
        await anyio.to_thread.run_sync(stack.restart, leader)
    await wait_until(lambda: reconciler_healthy(stack), 60)


async def report_of(stack):
    bus, _ = await connect(stack)
    try:
        return await report(bus)
    finally:
        await bus.close()


async def test_a_mig_instance_whose_reservation_vanished_is_not_destroyed_while_its_pod_runs(tmp_path):
    """The reservation of a running MIG pod disappears from the ledger (written over by hand, as a
    lost write would leave it). mig-manager would destroy the instance as an orphan after its grace;
    the reconciler records the pod's reservation again first, so the instance stays."""
    import yaml

    root = CLUSTER.parents[2]
    grace_s = 8
    gen = hostile_stack(tmp_path, COORD, cluster=root / "examples" / "clusters" / "mig-a100.yaml",
                        service_args={"mig-manager": ["--reconcile-s", "1", "--orphan-grace-s", str(grace_s)]})
    mig_stack = await anyio.to_thread.run_sync(next, gen)
    bus, sim = await connect(mig_stack)
    try:
        async with audited(bus):
            await sim.apply_pod(yaml.safe_load((root / "examples" / "pods" / "mig-demo.yaml").read_text()))
            node, _ = await wait_until(lambda: _bound(sim, "default/mig-demo"), 60)
            kv = await bus.kv(S.KV_LEDGER)
            entry = await kv.get(S.token(node))
            before = msgspec.json.decode(entry.value, type=NodeLedger)
            (key, alloc), = before.allocations.items()
            await kv.update(S.token(node), encoder.encode(NodeLedger(node=node)), last=entry.revision)

            async def readopted():
                led = (await ledger(bus)).get(node)
                a = led.allocations.get(key) if led else None
                return a if a is not None and a.adopted else None

            again = await wait_until(readopted, 30, what="the reservation recorded again")
            assert (again.assignment.gpus, again.assignment.mig_profile, again.assignment.mig_start) == (
                alloc.assignment.gpus, alloc.assignment.mig_profile, alloc.assignment.mig_start)
            await anyio.sleep(grace_s + 3)  # past mig-manager's grace, several of its passes
            records = await (await bus.kv(S.KV_MIG)).items()
            assert [r["pod"]["name"] for e in records for r in msgspec.json.decode(e.value).get("instances", {}).values()] \
                == ["mig-demo"]
            log = mig_stack.procs[f"mig-manager@{node}"].log_path.read_text()
            assert "orphan mig instance destroyed" not in log
    finally:
        await bus.close()
        await anyio.to_thread.run_sync(lambda: next(gen, None))


def test_doctor_says_when_the_bus_cannot_be_reached():
    out = phalanx("doctor", "--nats", "nats://127.0.0.1:9", "--timeout", "1")
    assert out.returncode == 2 and "NATS at nats://127.0.0.1:9" in out.stderr and len(out.stderr.splitlines()) == 1
