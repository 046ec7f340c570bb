"""Helpers for the hostile tiers of the integration suite: one stack per module, a ledger
audited every 50 ms, forged messages with fresh ids, waiting until consumers are drained, and
a record of what must not change."""

from __future__ import annotations

import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio

from phalanx_bus import Bus, BusAuth
from phalanx_kube.kvcluster import KV_PODS, KvCluster
from phalanx_localstack.stack import ClusterFile, Stack
from phalanx_proto import subjects as S
from phalanx_proto.state import alloc_key
from phalanx_telemetry import exposition
from stackutil import CLUSTER, audit_ledger, connect, gang_states, gpu_pod, ledger, seed_nodes, wait_until


def hostile_stack(workdir, coordinator_args, cluster=CLUSTER, service_args=None, **stack_kw):
    """A started stack on ``cluster`` (the demo's by default); stopped when the generator ends."""
    s = Stack(ClusterFile.load(cluster), workdir=str(workdir),
              service_args={"gang-coordinator": coordinator_args, **(service_args or {})}, **stack_kw)
    s.start_nats()

    async def seed() -> None:
        bus, sim = await connect(s)
        try:
            await seed_nodes(s, sim)
        finally:
            await bus.close()

    anyio.run(seed)
    s.start_services()
    yield s
    s.stop()


async def cleaned_env(stack):
    """(stack, bus, sim); every pod of the simulated cluster is deleted afterwards and the test
    waits until nothing is reserved and no gang is left."""
    bus, sim = await connect(stack)
    try:
        yield stack, bus, sim
        pods = await bus.kv(KV_PODS)
        for entry in await pods.items():
            await pods.delete(entry.key)
        await wait_until(lambda: _empty(bus, sim), 60, what="cluster empty")
    finally:
        await bus.close()


@asynccontextmanager
async def audited(bus: Bus):
    """Audit the ledger every 50 ms while the body runs: a GPU booked twice at any poll fails."""
    failures: list[str] = []

    async def poll():
        while True:
            try:
                await audit_ledger(bus)
            except AssertionError as e:
                failures.append(str(e))
            await anyio.sleep(0.05)

    async with anyio.create_task_group() as tg:
        tg.start_soon(poll)
        yield
        tg.cancel_scope.cancel()
    assert failures == [], failures[:3]


async def _empty(bus, sim) -> bool:
    return not await audit_ledger(bus) and not await sim.list_pods() and not await gang_states(bus)


async def forge(bus: Bus, subject: str, event) -> None:
    """Publish ``event`` as an attacker (or a replay after the duplicate window) would: a fresh
    message id, so the server's de-duplication does not drop it."""
    await bus.publish(subject, event, msg_id=f"forged-{uuid.uuid4().hex}")


async def drained(bus: Bus, *durables: str) -> None:
    """Wait until the named consumers of PHX_GANG have handled and acknowledged everything."""
    async def idle():
        for d in durables:
            info = await bus.js.consumer_info(S.STREAM_GANG, d)
            if info.num_pending or info.num_ack_pending:
                return False
        return True

    await wait_until(idle, 30, what=f"{durables} drained")
    await anyio.sleep(0.3)


async def scheduled(bus: Bus, sim: KvCluster, name: str):
    """Submit a one-GPU pod and wait until its gang is scheduled; its (pod, gang state)."""
    pod = await sim.apply_pod(gpu_pod(name, 1))

    async def done():
        s = (await gang_states(bus)).get(f"default/{name}")
        return s if s is not None and s.phase == "scheduled" else None

    return pod, await wait_until(done, 45, what=f"{name} scheduled")


async def held(bus: Bus, state) -> tuple:
    """The assignments the ledger holds for the gang's current attempt, in member order (the
    ledger is their one home)."""
    by_key = {k: a.assignment for led in (await ledger(bus)).values() for k, a in led.allocations.items()
              if (a.gang_id, a.attempt) == (state.gang_id, state.attempt)}
    return tuple(by_key[alloc_key(m.pod)] for m in state.members if alloc_key(m.pod) in by_key)


async def record(bus: Bus, sim: KvCluster):
    """What must not change: every allocation, every bound pod, every gang's phase and attempt."""
    allocations = {(node, k): v for node, led in (await ledger(bus)).items() for k, v in led.allocations.items()}
    gangs = {g: (s.phase, s.attempt, s.bound) for g, s in (await gang_states(bus)).items()}
    pods = {(p.namespace, p.name, p.uid): p.node_name for p in await sim.list_pods()}
    return allocations, gangs, pods




def scrape(stack: Stack, name: str) -> dict[str, float]:
    """``/metrics`` of one stack process as ``{sample with labels: value}``."""
    import urllib.request

    port = int(stack.procs[name].ready_file.read_text().split()[1])
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return exposition.samples(text)


def phalanx(*args: str, timeout: float = 60):
    """Run the ``phalanx`` command as a user does; the CompletedProcess."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "phalanx_cli.main", *args], capture_output=True, text=True,
                          timeout=timeout)


@dataclass(frozen=True)
class Forgery:
    """A message an attacker publishes on ``subject`` (or, with ``subscribe``, a subscription)."""

    subject: str
    payload: bytes = b""
    subscribe: bool = False
    headers: dict[str, str] | None = None


async def as_identity(stack: Stack, identity: str, nodes: tuple[str, ...] = ()) -> Bus:
    """A connection with ``identity``'s real credential (a node agent's names its node)."""
    return await Bus.connect(stack.url, service=f"attacker-{identity}",
                             auth=BusAuth.from_env(stack.identity_env(identity, nodes)), connect_timeout_s=15)


async def attempt(bus: Bus, forgery: Forgery) -> str:
    """``refused`` when the server rejects the publish or subscription, else what happened."""
    seen = len(bus.refusals)
    if forgery.subscribe:
        sub = await bus.nc.subscribe(forgery.subject)
        await bus.nc.flush()
    else:
        sub = await bus.nc.subscribe(bus.nc.new_inbox(), max_msgs=1)
        await bus.nc.publish(forgery.subject, forgery.payload, reply=sub.subject, headers=forgery.headers)
        await bus.nc.flush()
    def refused() -> bool:
        return any(f'"{forgery.subject.lower()}"' in r.lower() for r in bus.refusals[seen:])

    try:
        with anyio.move_on_after(3):  # the refusal usually arrives before the flush returns, not always
            while not refused():
                try:
                    msg = await sub.next_msg(timeout=0.05)
                    return f"accepted: {msg.data[:200]!r}"
                except TimeoutError:
                    continue
            return "refused"
        return "accepted without an answer"
    except Exception as e:  # noqa: BLE001 - reported as the outcome
        return f"accepted, then {e!r}"
    finally:
        await sub.unsubscribe()
