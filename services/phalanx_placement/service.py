"""placement: decides where a gang goes and reserves it in the ledger (KV ``phx-ledger``).

For each ``PlacementRequested`` it builds a snapshot from ``phx-topology``,
``phx-heartbeat`` and ``phx-ledger``, asks the engine for a decision, commits the
reservations by compare-and-set on the revisions it read, and replies ``Placed`` or
``PlacementFailed``. A lost race (another replica changed a node) means: re-read, decide
again. Redelivery is safe: if the ledger already holds this gang's attempt, the same
``Placed`` is sent again without deciding.

Nothing is believed on its word (``checks.py``, docs/saga.md "Checks"): a request is carried
out only for the attempt and the members the gang's record in ``phx-gangs`` names; a release
frees exactly (gang, attempt, pod uid) and never a live member's reservation; an adoption
(the reconciler's repair for a pod bound without a reservation) only onto free GPUs. A bad
value in ``phx-ledger``, ``phx-topology`` or ``phx-heartbeat`` is skipped, counted and named
(``phalanx_bus.records``): its node is left out of decisions, the others go on.

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

from phalanx_bus import (
    Bus,
    Delivery,
    KvConflict,
    Record,
    TemporaryError,
    consume,
    enable_atomic,
    kv_atomic_write,
)
from phalanx_bus import records as R
from phalanx_engine.decide import default_profile, place_snapshot
from phalanx_engine.snapshot import Decision, NodeView, NoFit, Snapshot
from phalanx_placement import checks
from phalanx_placement.nodestate import GRACE_S, NodeStates
from phalanx_proto import subjects as S
from phalanx_proto.events import (
    AdoptRequested,
    Placed,
    PlacementFailed,
    PlacementRequested,
    Released,
    ReleaseRequested,
    encoder,
    gang_decoder,
)
from phalanx_proto.state import Allocation, GangState, NodeLedger, alloc_key
from phalanx_telemetry import allocation, log, metrics, refused, tracer, warn

DURABLE = "placement"


@dataclass(frozen=True)
class Config:
    heartbeat_stale_s: float = 15.0
    max_commit_retries: int = 20
    decide_delay_s: float = 0.0
    """Test only: sleep between reading the ledger and committing, to widen replica races."""
    node_state: str = "auto"
    """When a node without a reported Kubernetes state (``NodeKubeState``) takes nothing:
    ``auto`` once reports have flowed for ``node_state_grace_s``, or ``required``/``optional``
    (``nodestate.py``, docs/placement.md)."""
    node_state_grace_s: float = GRACE_S


class Placement:
    def __init__(self, bus: Bus, topo_kv, beat_kv, ledger_kv, config: Config, gangs_kv=None,
                 node_states: NodeStates | None = None) -> None:
        self.bus = bus
        self.topo_kv = topo_kv
        self.beat_kv = beat_kv
        self.ledger_kv = ledger_kv
        self.gangs_kv = gangs_kv
        self.config = config
        self.conflicts = 0
        self.unreadable_nodes: set[str] = set()
        """Nodes whose ledger entry is bad, as of the last ``ledgers()``: left out of decisions."""
        self.node_states = node_states
        self.profiles = {req: default_profile(require_node_state=req) for req in (False, True)}

    @property
    def profile(self):
        """The engine profile for the next decision (nodes without state refused or not)."""
        return self.profiles[self.node_states.required() if self.node_states is not None else False]

    async def ledgers(self) -> dict[str, tuple[NodeLedger, int]]:
        good, bad = await R.read_all(self.ledger_kv)
        self.unreadable_nodes = {b.key for b in bad}
        return {r.value.node: (r.value, r.revision) for r in good}

    async def gang_record(self, gang_id: str) -> GangState | R.BadEntry | None:
        if self.gangs_kv is None:
            self.gangs_kv = await self.bus.kv(S.KV_GANGS)
        rec = await R.read_one(self.gangs_kv, S.gang_key(gang_id))
        return rec.value if isinstance(rec, Record) else rec

    async def snapshot(self, gang_id: str, ledgers: dict[str, tuple[NodeLedger, int]]) -> Snapshot:
        beats = {r.value.node: r.value.at for r in (await R.read_all(self.beat_kv))[0]}
        now = time.time()
        nodes = []
        for r in (await R.read_all(self.topo_kv))[0]:
            rep = r.value
            if S.token(rep.node) in self.unreadable_nodes:
                continue  # its reservations are unknown: deciding on it could book a GPU twice
            ledger, rev = ledgers.get(rep.node, (NodeLedger(node=rep.node), 0))
            others = tuple(a.assignment for a in ledger.allocations.values() if a.gang_id != gang_id)
            nodes.append(NodeView(
                name=rep.node, topology=rep.topology, enabled=rep.enabled,
                fresh=now - beats.get(rep.node, 0.0) <= self.config.heartbeat_stale_s,
                tiers=rep.tiers, allocations=others, revision=rev,
                kube=self.node_states.of(rep.node) if self.node_states is not None else None))
        return Snapshot(nodes=tuple(sorted(nodes, key=lambda n: n.name)))

    async def on_command(self, event, delivery: Delivery) -> None:
        match event:
            case PlacementRequested():
                await self.on_request(event)
            case ReleaseRequested():
                await self.on_release(event)
            case AdoptRequested():
                await self.on_adopt(event)
            case _:
                warn("unexpected event on placement subject", kind=type(event).__name__)

    async def on_request(self, ev: PlacementRequested) -> None:
        record = await self.gang_record(ev.gang_id)
        if isinstance(record, R.BadEntry):
            refused("unreadable_record", str(record), gang=ev.gang_id, attempt=ev.attempt)
            return
        refusal = checks.check_request(record, ev)
        if refusal is not None:
            refused(refusal.rule, refusal.why, gang=ev.gang_id, attempt=ev.attempt, command="placement.requested")
            return
        for _ in range(self.config.max_commit_retries):
            ledgers = await self.ledgers()
            existing = _existing(ev, ledgers)
            if existing is not None:
                log("placement already committed, replying again", gang=ev.gang_id, attempt=ev.attempt)
                await self.bus.publish(S.placement_reply_subject(ev.gang_id), Placed(
                    gang_id=ev.gang_id, attempt=ev.attempt, assignments=existing))
                return
            refusal = checks.check_decide(record)
            if refusal is not None:
                refused(refusal.rule, refusal.why, gang=ev.gang_id, attempt=ev.attempt, command="placement.requested")
                return
            snap = await self.snapshot(ev.gang_id, ledgers)
            with tracer().start_as_current_span("placement.decide", attributes={
                    "phalanx.gang": ev.gang_id, "phalanx.attempt": ev.attempt,
                    "phalanx.members": len(ev.members)}) as span:
                started = time.perf_counter()
                result = place_snapshot(snap, ev.members, self.profile, avoid=ev.avoid_nodes)
                elapsed = time.perf_counter() - started
                _annotate_decision(span, result)
            elapsed_ms = elapsed * 1000
            metrics.PLACEMENT_DECISION_SECONDS.observe(
                elapsed, outcome="no_fit" if isinstance(result, NoFit) else "placed")
            if isinstance(result, NoFit):
                log("no fit", gang=ev.gang_id, attempt=ev.attempt, reason=result.summary, ms=round(elapsed_ms, 3))
                # Could it fit were the whole cluster empty (the filters say: only busy nodes kept
                # it out), and where? Those nodes are what the fairness gate keeps for this gang
                # should it starve (docs/saga.md, backfill).
                empty = (place_snapshot(Snapshot(nodes=tuple(_emptied(n) for n in snap.nodes)), ev.members,
                                        self.profile) if result.resolvable else None)
                fits_empty = isinstance(empty, Decision)
                await self.bus.publish(S.placement_reply_subject(ev.gang_id), PlacementFailed(
                    gang_id=ev.gang_id, attempt=ev.attempt, summary=result.summary, reasons=dict(result.reasons),
                    fits_empty_cluster=fits_empty, members=tuple(m.pod for m in ev.members),
                    reserve_nodes=tuple(sorted({a.node for a in empty.assignments})) if fits_empty else ()))
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
                assignments=";".join(f"{a.pod}@{a.node}:{','.join(map(str, a.gpus))}" for a in result.assignments),
                unchecked_nodes=",".join(result.unchecked))
            await self.bus.publish(S.placement_reply_subject(ev.gang_id), Placed(
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
        """Free exactly (gang, attempt, pod uid) for each pod named, after ``checks.check_release``.
        May be called more than once, and for a reservation that was never made (nothing to free)."""
        record = await self.gang_record(ev.gang_id)
        if isinstance(record, R.BadEntry):
            refused("unreadable_record", str(record), gang=ev.gang_id, attempt=ev.attempt)
            return
        refusal = checks.check_release(record, ev)
        if refusal is not None:
            refused(refusal.rule, refusal.why, gang=ev.gang_id, attempt=ev.attempt, command="release")
            return
        for _ in range(self.config.max_commit_retries):
            released, writes = 0, []
            for node, (ledger, rev) in (await self.ledgers()).items():
                kept = checks.release(ledger, ev)
                if kept is None:
                    continue
                released += len(ledger.allocations) - len(kept.allocations)
                writes.append((S.token(node), encoder.encode(kept), rev))
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
        await self.bus.publish(S.placement_reply_subject(ev.gang_id), Released(gang_id=ev.gang_id, attempt=ev.attempt, pods=ev.pods))

    async def on_adopt(self, ev: AdoptRequested) -> None:
        """Record a reservation for a pod found bound without one, if its GPUs are free there
        (``checks.adopt``); otherwise refuse and say why (the reconciler reports the pod)."""
        node = ev.assignment.node
        for _ in range(self.config.max_commit_retries):
            entry = await R.read_one(self.ledger_kv, S.token(node))
            topo = await R.read_one(self.topo_kv, S.token(node))
            if isinstance(entry, R.BadEntry):
                refused("unreadable_record", str(entry), gang=ev.gang_id, pod=str(ev.assignment.pod))
                return
            ledger, rev = (entry.value, entry.revision) if entry is not None else (NodeLedger(node=node), 0)
            report = topo.value if isinstance(topo, Record) else None
            out = checks.adopt(ledger, report.topology if report is not None and report.node == node else None, ev)
            if out is None:
                return
            if isinstance(out, checks.Refusal):
                refused(out.rule, out.why, gang=ev.gang_id, pod=str(ev.assignment.pod), command="adopt")
                return
            try:
                await kv_atomic_write(self.bus, S.KV_LEDGER, [(S.token(node), encoder.encode(out), rev)])
            except KvConflict:
                continue
            warn("reservation recorded for a bound pod", gang=ev.gang_id, attempt=ev.attempt,
                 pod=str(ev.assignment.pod), node=node, gpus=",".join(map(str, ev.assignment.gpus)), reason=ev.reason)
            return
        raise TemporaryError(f"node {node}: ledger kept changing during adoption", delay=0.5)


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
    node_states = NodeStates(bus, policy=config.node_state, grace_s=config.node_state_grace_s)
    async with anyio.create_task_group() as tg:
        await tg.start(node_states.run)
        await _serve(bus, config, node_states, task_status)


async def _serve(bus: Bus, config: Config, node_states: NodeStates, task_status) -> None:
    placement = Placement(bus, await bus.kv(S.KV_TOPOLOGY), await bus.kv(S.KV_HEARTBEAT),
                          await bus.kv(S.KV_LEDGER), config, await bus.kv(S.KV_GANGS), node_states)
    try:
        _record_allocation(await placement.snapshot("", await placement.ledgers()), ())
    except Exception as e:  # noqa: BLE001 - metrics never stop placement from starting
        warn("allocation metrics not computed at start", error=repr(e))
    await consume(bus, stream=S.CONSUMER[DURABLE].stream, durable=DURABLE, filter_subject=S.CONSUMER[DURABLE].filter,
                  decoder=gang_decoder, handler=placement.on_command, task_status=task_status)


def _emptied(node: NodeView) -> NodeView:
    """The node as it would be with no reservations (for "where would it go?")."""
    return dataclasses.replace(node, allocations=())
