"""The hostile client of the chaos run: it poisons KV values and forges replies and commands,
picked by the run's seeded random generator, while services are killed and nats restarts.

Poison goes under keys of nodes and gangs that do not exist, except one kind that poisons a
real node's ledger entry for a moment (by compare-and-set, so no write is lost) and then puts
the value back: meanwhile placement leaves the node out and binder refuses binds there, and
whatever a release could not do on it the reconciler repairs afterwards. Forged messages carry
fresh message ids (a replay after the duplicate window).
"""

from __future__ import annotations

import time
import urllib.request
import uuid

import anyio
import msgspec

from phalanx_bus import KvConflict
from phalanx_proto import subjects as S
from phalanx_proto.events import (
    BindFailure,
    BindPods,
    BindsDone,
    MemberSpec,
    PlaceRequested,
    PodRef,
    ReleaseRequested,
    Reserved,
    batch_of,
    uid_digest,
)
from phalanx_proto.state import RECONCILER_REPORT_KEY, reconciler_report_decoder
from phalanx_telemetry import exposition
from stackutil import gang_states, ledger

GHOSTS = {S.KV_LEDGER: "ghost-node-{n}", S.KV_TOPOLOGY: "ghost-node-{n}", S.KV_HEARTBEAT: "ghost-node-{n}",
          S.KV_GANGS: "default.ghost-gang-{n}", S.KV_MIG: "ghost-node-{n}"}
GARBAGE = (b"{", b"\xff\xfe", b"[]", b'{"node": 7}', b"null", b'{"gang_id": "x", "attempt": -3}')
KINDS = ("poison", "poison", "poison-node", "placed", "bound", "release", "bind", "request")


async def attack(bus, sim, rng, poisoned: list[tuple[str, str]]) -> str:
    """One attack; returns ``poison`` or ``forge``."""
    kind = rng.choice(KINDS)
    if kind == "poison":
        bucket = rng.choice(sorted(GHOSTS))
        key = GHOSTS[bucket].format(n=len(poisoned))
        await (await bus.kv(bucket)).put(key, rng.choice(GARBAGE))
        poisoned.append((bucket, key))
        return "poison"
    if kind == "poison-node":
        await poison_a_node_for_a_moment(bus, rng)
        return "poison"
    states = list((await gang_states(bus)).values())
    if not states:
        return "forge"
    s = rng.choice(states)
    match kind:
        case "placed":
            digest = uid_digest(m.pod for m in s.members) if rng.random() < 0.5 else uuid.uuid4().hex[:16]
            await forge(bus, S.placement_answers_subject("forger"), batch_of("forger", Reserved(
                gang_id=s.gang_id, attempt=s.attempt + rng.randint(0, 2) or 1, members_digest=digest)))
        case "bound":
            bound = [p for p in await sim.list_pods() if p.node_name]
            if bound:
                p = rng.choice(bound)
                await forge(bus, S.binder_answers_subject("forger"), batch_of("forger", BindsDone(
                    gang_id=s.gang_id, attempt=max(1, s.attempt), bound=(p.ref,) if rng.random() < 0.5 else (),
                    failed=() if rng.random() < 0.5 else (BindFailure(pod=p.ref, reason="forged"),))))
        case "release":
            allocs = [a for led in (await ledger(bus)).values() for a in led.allocations.values()]
            if allocs:
                a = rng.choice(allocs)
                attempt = a.attempt if rng.random() < 0.5 else max(1, a.attempt - 1)
                await forge(bus, S.placement_subject(a.gang_id), ReleaseRequested(
                    gang_id=a.gang_id, attempt=attempt, reason="forged", pods=(a.assignment.pod,)))
        case "bind":
            pending = [p for p in await sim.list_pods() if not p.node_name]
            if pending:
                p = rng.choice(pending)
                await forge(bus, S.binder_subject(s.gang_id), BindPods(
                    gang_id=s.gang_id, attempt=max(1, s.attempt), pods=(p.ref,)))
        case "request":
            phantom = MemberSpec(pod=PodRef(namespace="default", name="phantom", uid=uuid.uuid4().hex), gpus=8)
            await forge(bus, S.placement_subject(s.gang_id), PlaceRequested(
                gang_id=s.gang_id, attempt=max(1, s.attempt),
                members_digest=uid_digest([*(m.pod for m in s.members), phantom.pod])))
    return "forge"


async def forge(bus, subject: str, event) -> None:
    await bus.publish(subject, event, msg_id=f"forged-{uuid.uuid4().hex}")


async def poison_a_node_for_a_moment(bus, rng) -> None:
    """Replace a real node's ledger value by garbage for about two seconds, then put it back —
    both by compare-and-set, so a write that came in between is never overwritten."""
    kv = await bus.kv(S.KV_LEDGER)
    node = rng.choice(("v100-a", "v100-b"))
    entry = await kv.get(S.token(node))
    if entry is None:
        return
    try:
        rev = await kv.update(entry.key, rng.choice(GARBAGE), last=entry.revision)
    except KvConflict:
        return
    await anyio.sleep(rng.uniform(1.0, 3.0))
    try:
        await kv.update(entry.key, entry.value, last=rev)
    except KvConflict:
        pass  # nobody writes a node whose ledger cannot be read; should it happen, the audit says so


async def cure(bus, poisoned: list[tuple[str, str]]) -> None:
    """Delete every ghost value the run left."""
    for bucket, key in poisoned:
        await (await bus.kv(bucket)).delete(key)


async def wait_for_zero_findings(stack, bus, timeout_s: float = 60.0) -> dict[str, int]:
    """Wait until the reconciler's report (written after now) and its metrics show no finding;
    returns the report's findings (all zero), or raises on timeout."""
    since = time.time()
    last: dict[str, int] = {}
    with anyio.fail_after(timeout_s):
        while True:
            entry = await (await bus.kv(S.KV_LEASES)).get(RECONCILER_REPORT_KEY)
            report = reconciler_report_decoder.decode(entry.value) if entry else None
            if report is not None and report.at > since:
                last = dict(report.findings)
                metrics = await anyio.to_thread.run_sync(_scrape, stack, "gang-coordinator")
                gauges = [v for k, v in metrics.items() if k.startswith("phalanx_reconciler_findings{")]
                if gauges and set(gauges) == {0} and set(last.values()) == {0}:
                    return last
            await anyio.sleep(1.0)


def _scrape(stack, name: str) -> dict[str, float]:
    port = int(stack.procs[name].ready_file.read_text().split()[1])
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return exposition.samples(text)




# --- a node's own credential (rows 1-5 of the inside-attacks issue) -----------------------------

NODE_ATTACKS = ("broken report", "rollup", "pre-empted ids", "flood", "future beat")


async def node_attack(stack, rng, node: str = "v100-a") -> str:
    """One attack with ``node``'s own agent credentials, using only what they allow: its own
    keys, its own reply and dead-letter subjects. Its real agent rewrites what it owns on its
    next beat, so a broken report or a future beat makes the node invalid for a moment, never
    unschedulable for good. Returns the attack's name."""
    from hostile import as_identity
    from phalanx_proto.events import (
        MigPrepareRequested,
        NodeHeartbeat,
        NodeTopologyReported,
        encoder,
    )
    from phalanx_topology_discovery.service import topology_from_file

    kind = rng.choice(NODE_ATTACKS)
    agent = await as_identity(stack, S.TOPOLOGY_DISCOVERY, (node,))
    mig = await as_identity(stack, S.MIG_MANAGER, (node,))
    try:
        match kind:
            case "broken report":
                spec = next(n for n in stack.cluster.nodes if n.name == node)
                topo = topology_from_file(spec.topology_file, node, gpu_model=spec.gpu_model,
                                          gpu_memory_mib=spec.gpu_memory_mib)
                links = {a: {b: r for b, r in row.items() if {a, b} != {"GPU0", "GPU1"}}
                         for a, row in topo.relations.items()}
                broken = msgspec.structs.replace(topo, relations=links)
                await agent.js.publish(f"$KV.{S.KV_TOPOLOGY}.{S.token(node)}",
                                       encoder.encode(NodeTopologyReported(node=node, topology=broken)))
            case "rollup":
                try:
                    await agent.js.publish(f"$KV.{S.KV_NODE_STATE}.{S.token(node)}", b"{}",
                                           headers={"Nats-Rollup": "all"}, timeout=5)
                    raise AssertionError("a rollup header was accepted")
                except Exception as e:  # noqa: BLE001 - the refusal is the point
                    if "rollup not permitted" not in str(e):
                        raise
            case "pre-empted ids":
                for _ in range(5):
                    pod = PodRef(namespace="default", name=f"g{rng.randrange(50)}-0", uid=uuid.uuid4().hex)
                    for msg_id in (PlaceRequested(gang_id=f"default/g{rng.randrange(50)}", attempt=1,
                                                  members_digest=uid_digest([pod])).key(),
                                   MigPrepareRequested(node="v100-b", gang_id="default/g0", pod=pod).key()):
                        await mig.js.publish(S.node_reply_subject(node), b"junk", headers={"Nats-Msg-Id": msg_id})
            case "flood":
                chunk = b"x" * (S.NODE_MESSAGE_MAX - 512)
                for i in range(1500):
                    await mig.nc.publish(S.node_reply_subject(node), chunk)
                    await mig.nc.publish(S.dead_letter_subject(S.STREAM_NODE, f"mig-manager-{node}"), chunk)
                    if i % 200 == 0:
                        await mig.nc.flush()
                await mig.nc.flush()
            case "future beat":
                await agent.js.publish(f"$KV.{S.KV_HEARTBEAT}.{S.token(node)}",
                                       encoder.encode(NodeHeartbeat(node=node, at=time.time() + 1e9)))
    finally:
        await agent.close()
        await mig.close()
    return kind


async def streams_over_their_limits(bus) -> list[str]:
    """Every stream (and each subject of one with a per-subject limit) holding more than the bus
    table allows: must be empty."""
    over = []
    for spec in S.STREAMS:
        info = await bus.js.stream_info(spec.name, subjects_filter=">" if spec.max_msgs_per_subject > 0 else None)
        if info.state.bytes > spec.max_bytes:
            over.append(f"{spec.name}: {info.state.bytes} bytes > {spec.max_bytes}")
        for subject, n in (info.state.subjects or {}).items():
            if spec.max_msgs_per_subject > 0 and n > spec.max_msgs_per_subject:
                over.append(f"{spec.name} {subject}: {n} messages > {spec.max_msgs_per_subject}")
    return over
