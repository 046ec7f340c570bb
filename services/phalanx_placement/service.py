"""placement: decides where a gang goes and reserves it in the ledger (KV ``phx-ledger``).

For each ``PlacementRequested`` it builds a snapshot from ``phx-topology``,
``phx-heartbeat`` and ``phx-ledger``, asks the engine for a decision, commits the
reservations by compare-and-set on the revisions it read, and replies ``Placed`` or
``PlacementFailed``. A lost race (another replica changed a node) means: re-read, decide
again. Redelivery is safe: if the ledger already holds this gang's attempt, the same
``Placed`` is sent again without deciding.

Metrics: decision time, ledger conflicts, and after every commit and release the GPUs,
core % and memory allocated by node, model and mode plus fragmentation
(``phalanx_telemetry.allocation``). Spans ``placement.decide`` and ``placement.commit`` carry
the gang, attempt, nodes, GPU ids, RDMA level and the failure reason.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import anyio
import msgspec

from phalanx_bus import Bus, Delivery, KvConflict, TemporaryError, consume, enable_atomic, kv_atomic_write
from phalanx_engine.decide import place_snapshot
from phalanx_engine.snapshot import Decision, NodeView, NoFit, Snapshot
from phalanx_proto import subjects as S
from phalanx_proto.events import (
    NodeHeartbeat,
    NodeTopologyReported,
    Placed,
    PlacementFailed,
    PlacementRequested,
    Released,
    ReleaseRequested,
    encoder,
    gang_decoder,
)
from phalanx_proto.state import Allocation, NodeLedger, alloc_key, ledger_decoder
from phalanx_telemetry import allocation, log, metrics, tracer, warn

DURABLE = "placement"
_beat_decoder = msgspec.json.Decoder(NodeHeartbeat)
_report_decoder = msgspec.json.Decoder(NodeTopologyReported)


@dataclass(frozen=True)
class Config:
    heartbeat_stale_s: float = 15.0
    max_commit_retries: int = 20
    decide_delay_s: float = 0.0
    """Test only: sleep between reading the ledger and committing, to widen replica races."""


class Placement:
    def __init__(self, bus: Bus, topo_kv, beat_kv, ledger_kv, config: Config) -> None:
        self.bus = bus
        self.topo_kv = topo_kv
        self.beat_kv = beat_kv
        self.ledger_kv = ledger_kv
        self.config = config
        self.conflicts = 0

    async def ledgers(self) -> dict[str, tuple[NodeLedger, int]]:
        out = {}
        for e in await self.ledger_kv.items():
            ledger = ledger_decoder.decode(e.value)
            out[ledger.node] = (ledger, e.revision)
        return out

    async def snapshot(self, gang_id: str, ledgers: dict[str, tuple[NodeLedger, int]]) -> Snapshot:
        beats = {}
        for e in await self.beat_kv.items():
            hb = _beat_decoder.decode(e.value)
            beats[hb.node] = hb.at
        now = time.time()
        nodes = []
        for e in await self.topo_kv.items():
            rep = _report_decoder.decode(e.value)
            ledger, rev = ledgers.get(rep.node, (NodeLedger(node=rep.node), 0))
            others = tuple(a.assignment for a in ledger.allocations.values() if a.gang_id != gang_id)
            nodes.append(NodeView(
                name=rep.node, topology=rep.topology, enabled=rep.enabled,
                fresh=now - beats.get(rep.node, 0.0) <= self.config.heartbeat_stale_s,
                tiers=rep.tiers, allocations=others, revision=rev))
        return Snapshot(nodes=tuple(sorted(nodes, key=lambda n: n.name)))

    async def on_command(self, event, delivery: Delivery) -> None:
        match event:
            case PlacementRequested():
                await self.on_request(event)
            case ReleaseRequested():
                await self.on_release(event)
            case _:
                warn("unexpected event on placement subject", kind=type(event).__name__)

    async def on_request(self, ev: PlacementRequested) -> None:
        for _ in range(self.config.max_commit_retries):
            ledgers = await self.ledgers()
            existing = _existing(ev, ledgers)
            if existing is not None:
                log("placement already committed, replying again", gang=ev.gang_id, attempt=ev.attempt)
                await self.bus.publish(S.coord_subject(ev.gang_id), Placed(
                    gang_id=ev.gang_id, attempt=ev.attempt, assignments=existing))
                return
            snap = await self.snapshot(ev.gang_id, ledgers)
            with tracer().start_as_current_span("placement.decide", attributes={
                    "phalanx.gang": ev.gang_id, "phalanx.attempt": ev.attempt,
                    "phalanx.members": len(ev.members)}) as span:
                started = time.perf_counter()
                result = place_snapshot(snap, ev.members)
                elapsed = time.perf_counter() - started
                _annotate_decision(span, result)
            elapsed_ms = elapsed * 1000
            metrics.PLACEMENT_DECISION_SECONDS.observe(
                elapsed, outcome="no_fit" if isinstance(result, NoFit) else "placed")
            if isinstance(result, NoFit):
                log("no fit", gang=ev.gang_id, attempt=ev.attempt, reason=result.summary, ms=round(elapsed_ms, 3))
                empty = Snapshot(nodes=tuple(_emptied(n) for n in snap.nodes))
                fits_empty = isinstance(place_snapshot(empty, ev.members), Decision)
                await self.bus.publish(S.coord_subject(ev.gang_id), PlacementFailed(
                    gang_id=ev.gang_id, attempt=ev.attempt, summary=result.summary, reasons=dict(result.reasons),
                    fits_empty_cluster=fits_empty))
                return
            if self.config.decide_delay_s:
                await anyio.sleep(self.config.decide_delay_s)
            try:
                with tracer().start_as_current_span("placement.commit", attributes={
                        "phalanx.gang": ev.gang_id, "phalanx.attempt": ev.attempt,
                        "k8s.node.name": sorted({a.node for a in result.assignments})}) as span:
                    try:
                        await self.commit(ev, result, ledgers)
                    except KvConflict:
                        span.set_attribute("phalanx.outcome", "conflict")
                        raise
                    span.set_attribute("phalanx.outcome", "committed")
            except KvConflict as e:
                self.conflicts += 1
                metrics.LEDGER_COMMIT_CONFLICTS.inc()
                log("ledger conflict, deciding again", gang=ev.gang_id, error=str(e), conflicts=self.conflicts)
                continue
            _record_allocation(snap, result.assignments)
            log("reserved", gang=ev.gang_id, attempt=ev.attempt, ms=round(elapsed_ms, 3),
                assignments=";".join(f"{a.pod}@{a.node}:{','.join(map(str, a.gpus))}" for a in result.assignments))
            await self.bus.publish(S.coord_subject(ev.gang_id), Placed(
                gang_id=ev.gang_id, attempt=ev.attempt, assignments=result.assignments))
            return
        raise TemporaryError(f"gang {ev.gang_id}: ledger kept changing", delay=0.5)

    async def commit(self, ev: PlacementRequested, decision: Decision,
                     ledgers: dict[str, tuple[NodeLedger, int]]) -> None:
        """Write the reservations of every touched node in one JetStream atomic batch, each
        write expecting the ledger revision the decision read: all nodes or none, and a
        concurrent writer on any of them fails the whole batch (``KvConflict``).

        Allocations this gang holds from earlier attempts are replaced.
        """
        members = {alloc_key(m.pod) for m in ev.members}
        by_node: dict[str, list] = {}
        for a in decision.assignments:
            by_node.setdefault(a.node, []).append(a)
        # Nodes where the gang held something but gets nothing now: clear those too.
        for node, (ledger, _) in ledgers.items():
            if node not in by_node and any(a.gang_id == ev.gang_id for a in ledger.allocations.values()):
                by_node[node] = []
        writes = []
        for node, assignments in sorted(by_node.items()):
            ledger, rev = ledgers.get(node, (NodeLedger(node=node), 0))
            allocs = {k: v for k, v in ledger.allocations.items()
                      if not (v.gang_id == ev.gang_id or k in members)}
            for a in assignments:
                allocs[alloc_key(a.pod)] = Allocation(gang_id=ev.gang_id, attempt=ev.attempt, assignment=a)
            writes.append((S.token(node), encoder.encode(NodeLedger(node=node, allocations=allocs)), rev))
        await kv_atomic_write(self.bus, S.KV_LEDGER, writes)

    async def on_release(self, ev: ReleaseRequested) -> None:
        pods = {alloc_key(p) for p in ev.pods}
        for _ in range(self.config.max_commit_retries):
            released, writes = 0, []
            for node, (ledger, rev) in (await self.ledgers()).items():
                keep = {k: v for k, v in ledger.allocations.items()
                        if not (v.gang_id == ev.gang_id and v.attempt <= ev.attempt and (not pods or k in pods))}
                if len(keep) == len(ledger.allocations):
                    continue
                released += len(ledger.allocations) - len(keep)
                writes.append((S.token(node), encoder.encode(NodeLedger(node=node, allocations=keep)), rev))
            try:
                await kv_atomic_write(self.bus, S.KV_LEDGER, writes)
                break
            except KvConflict:
                continue
        else:
            raise TemporaryError(f"gang {ev.gang_id}: ledger kept changing during release", delay=0.5)
        log("released", gang=ev.gang_id, attempt=ev.attempt, reason=ev.reason, allocations=released)
        if released:
            _record_allocation(await self.snapshot("", await self.ledgers()), ())
        await self.bus.publish(S.coord_subject(ev.gang_id), Released(gang_id=ev.gang_id, attempt=ev.attempt, pods=ev.pods))


def _annotate_decision(span, result) -> None:
    """Span attributes of a decision: where it went, or why nothing fits."""
    if isinstance(result, NoFit):
        span.set_attribute("phalanx.outcome", "no_fit")
        span.set_attribute("phalanx.failure_reason", result.summary)
        return
    span.set_attribute("phalanx.outcome", "placed")
    span.set_attribute("k8s.node.name", sorted({a.node for a in result.assignments}))
    span.set_attribute("phalanx.gpus", [f"{a.node}:{','.join(map(str, a.gpus))}" for a in result.assignments])
    levels = sorted({a.rdma_level for a in result.assignments if a.rdma_level})
    if levels:
        span.set_attribute("phalanx.rdma_level", levels)


def _record_allocation(snap: Snapshot, placed: tuple) -> None:
    """Allocation gauges from the snapshot's reservations (other gangs) plus ``placed``."""
    allocation.record(allocation.NodeAllocation(
        node=n.name, topology=n.topology, enabled=n.enabled,
        assignments=n.allocations + tuple(a for a in placed if a.node == n.name)) for n in snap.nodes)


def _emptied(node: NodeView) -> NodeView:
    """The node as it would be with no reservations (for "could this ever fit?")."""
    return dataclasses.replace(node, allocations=())


def _existing(ev: PlacementRequested, ledgers) -> tuple | None:
    """The assignments already committed for exactly this gang attempt, if all are there."""
    found = {}
    for ledger, _ in ledgers.values():
        for alloc in ledger.allocations.values():
            if alloc.gang_id == ev.gang_id and alloc.attempt == ev.attempt:
                found[alloc_key(alloc.assignment.pod)] = alloc.assignment
    wanted = [alloc_key(m.pod) for m in ev.members]
    if wanted and all(k in found for k in wanted):
        return tuple(found[k] for k in wanted)
    return None


async def run(bus: Bus, config: Config = Config(), *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
    """Run placement until cancelled; ready once its durable consumer is live."""
    await enable_atomic(bus, S.KV_LEDGER)
    placement = Placement(bus, await bus.kv(S.KV_TOPOLOGY), await bus.kv(S.KV_HEARTBEAT),
                          await bus.kv(S.KV_LEDGER), config)
    try:
        _record_allocation(await placement.snapshot("", await placement.ledgers()), ())
    except Exception as e:  # noqa: BLE001 - metrics never stop placement from starting
        warn("allocation metrics not computed at start", error=repr(e))
    await consume(bus, stream=S.STREAM_GANG, durable=DURABLE, filter_subject="phx.gang.placement.>",
                  decoder=gang_decoder, handler=placement.on_command, task_status=task_status)
