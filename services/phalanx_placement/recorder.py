"""placement's decision log (``phx.decisions.<replica>``, docs/whatif.md "Replay"): what each
engine decision read and what it came to, so ``phalanx sim --replay`` can decide it again.

What a decision reads that is not kept anywhere else is the cache's cluster at that moment
(its mirrors move on, and assumed commits are in no bucket). ``JournaledCluster`` notes every
node the cache puts into or takes out of its cluster, in order; ``Recorder.decided`` turns the
notes since the last decision into records (``phalanx_engine.recorded``: a node's topology and
Kubernetes state only when they changed), followed by the decision itself. Once per scheduling
cycle ``flush`` hands them to one sender task, which publishes them in order as
``DecisionsRecorded`` messages of at most ``MAX_RECORD_BYTES``, the cycles of a quarter second
together.

A log is only worth its gaps: a record that cannot be sent (the bus is down, the sender is
behind by ``MAX_PENDING`` cycles, placement stopping with records not yet sent, the journal grew past ``JOURNAL_MAX`` between two decisions)
makes the replica start again with a **base**, every node of its cluster from empty, and a
replay skips from a gap to the next base. A base is also written every ``base_every_s`` so the
bounded stream always holds one to start from. Recording never holds up a decision: a cycle
only appends to a list; encoding and publishing happen in the sender.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import anyio
import msgspec

from phalanx_bus import Bus, sender_id
from phalanx_engine.decide import Cluster
from phalanx_engine.recorded import Memory
from phalanx_engine.snapshot import Decision, NodeView, NoFit
from phalanx_proto import subjects as S
from phalanx_proto.events import (
    MemberSpec,
    RecordedDecision,
    RecordedNode,
    RecordedPreemption,
    RecordedQueueGate,
    encoder,
)
from phalanx_telemetry import warn

JOURNAL_MAX = 200_000
"""Node changes kept between two decisions before the journal is dropped for a base (an idle
replica whose nodes change for hours)."""
MAX_PENDING = 4096
"""Cycles waiting for the sender before the newest are dropped for a base."""
COALESCE_S = 0.25
"""The sender waits this long after a cycle's records for more, and sends them together."""
MAX_RECORD_BYTES = S.GANG_MESSAGE_MAX - 64 * S.KIB


@dataclass
class JournaledCluster(Cluster):
    """The engine's long-lived cluster, noting each node put in (its view) or taken out (its name)."""

    journal: list[NodeView | str] = field(default_factory=list)
    views: dict[str, NodeView] = field(default_factory=dict)
    overflowed: bool = False

    def upsert(self, view: NodeView) -> None:
        super().upsert(view)
        self.views[view.name] = view
        self._note(view)

    def remove(self, name: str) -> None:
        super().remove(name)
        if self.views.pop(name, None) is not None:
            self._note(name)

    def _note(self, change: NodeView | str) -> None:
        if len(self.journal) >= JOURNAL_MAX:
            self.journal.clear()
            self.overflowed = True
        self.journal.append(change)

    def restart_journal(self) -> None:
        """A base was taken: the journal starts again from here."""
        self.journal.clear()
        self.overflowed = False

    def in_order(self) -> list[NodeView]:
        """Every node's view in the order that rebuilds this cluster from empty (usable nodes as
        the engine holds them, then the others)."""
        names = [*self.nodes, *(n for n in self.excluded if n not in self.nodes)]
        return [self.views[n] for n in names if n in self.views]


class Recorder:
    """Turns the cache's cluster changes and the cycle's decisions into the replica's log."""

    def __init__(self, bus: Bus, cluster: JournaledCluster, *, enabled: bool = True, base_every_s: float = 300.0,
                 replica: str | None = None, clock=time.monotonic, coalesce_s: float = COALESCE_S) -> None:
        self.bus = bus
        self.cluster = cluster
        self.enabled = enabled
        self.base_every_s = base_every_s
        self.replica = replica or sender_id()
        self.subject = S.render(S.CHANNEL["placementDecisions"].template, replica=self.replica)
        self.clock = clock
        self.coalesce_s = coalesce_s
        self._memory = Memory()
        self._items: list[RecordedNode | RecordedDecision] = []
        self._base = True
        self._needs_base = True
        self._based_at = clock()
        self._seq = 0
        self._send, self._receive = anyio.create_memory_object_stream[tuple[bool, float, list]](MAX_PENDING)
        self.sent = 0
        """Records published (for tests and the log)."""

    def decided(self, gang_id: str, attempt: int, members: tuple[MemberSpec, ...], *, node_state_required: bool,
                avoid: frozenset[str] | tuple[str, ...], result: Decision | NoFit | None,
                queue: RecordedQueueGate | None = None, within: frozenset[str] = frozenset(),
                within_required: bool = False) -> None:
        """One decision on ``cluster`` as it is now: the changes since the last one, then it — the
        engine's answer (None: the queue refused it before the engine was asked), what the
        queue rules read and said (``queue``), and the nodes it was confined to or tried first
        (``within``, ``within_required``: a repair's domain, a restarted gang's)."""
        if not self.enabled:
            self.cluster.journal.clear()
            return
        if self._needs_base or self.cluster.overflowed or self.clock() - self._based_at > self.base_every_s:
            self._start_base()
        else:
            for change in self.cluster.journal:
                self._items.append(self._memory.removed(change) if isinstance(change, str)
                                   else self._memory.record(change))
        self.cluster.journal.clear()
        placed = result.assignments if isinstance(result, Decision) else ()
        self._items.append(RecordedDecision(
            gang_id=gang_id, attempt=attempt, members=members, node_state_required=node_state_required,
            avoid=tuple(sorted(avoid)), within=tuple(sorted(within)), within_required=within_required and bool(within),
            placed=placed, no_fit=result.summary if isinstance(result, NoFit) else "",
            engine=result is not None, queue=queue))

    def planned(self, preemption: RecordedPreemption | None) -> None:
        """What the preemption planner read and answered for the decision just recorded."""
        if not self.enabled or preemption is None or not self._items:
            return
        last = self._items[-1]
        if isinstance(last, RecordedDecision):
            self._items[-1] = msgspec.structs.replace(last, preemption=preemption)

    def _start_base(self) -> None:
        """Send what this cycle recorded so far, then write every node from empty."""
        self.flush()
        self._memory.clear()
        self._items.extend(self._memory.record(v) for v in self.cluster.in_order())
        self.cluster.restart_journal()
        self._base, self._needs_base, self._based_at = True, False, self.clock()

    def flush(self) -> None:
        """End of a cycle: hand its records to the sender (never waits)."""
        if not self._items:
            return
        batch, base = self._items, self._base
        self._items, self._base = [], False
        try:
            self._send.send_nowait((base, time.time(), batch))
        except anyio.WouldBlock:
            warn("decision log behind; starting again from a base", subject=self.subject)
            self._needs_base = True

    async def run(self) -> None:
        """Publish what ``flush`` hands over, in order, until cancelled: the cycles of up to
        ``coalesce_s`` in one record (fewer messages, and a decision's own commit and reply go
        out first). After a failure, the cycles already handed over are dropped until the base
        that follows."""
        dropping = False
        async with self._receive:
            async for first in self._receive:
                await anyio.sleep(self.coalesce_s)
                batches = [first]
                while True:
                    try:
                        batches.append(self._receive.receive_nowait())
                    except anyio.WouldBlock:
                        break
                for base, at, items in _merged(batches):
                    if dropping and not base:
                        continue
                    dropping = False
                    try:
                        for record in self._records(base, at, items):
                            await self.bus.publish(self.subject, record, retry_s=2.0)
                            self.sent += 1
                    except Exception as e:  # noqa: BLE001 - the log never stops placement
                        warn("decision log record not stored; starting again from a base", error=repr(e))
                        dropping, self._needs_base = True, True

    def _records(self, base: bool, at: float, items: list) -> list[_Record]:
        """The batch as records of at most ``MAX_RECORD_BYTES`` each (a base's first only is
        ``base``), each item encoded once."""
        out: list[_Record] = []
        chunk: list[msgspec.Raw] = []
        size = 0
        for item in items:
            raw = msgspec.Raw(encoder.encode(item))
            if chunk and size + len(raw) > MAX_RECORD_BYTES:
                out.append(self._record(base and not out, at, chunk))
                chunk, size = [], 0
            chunk.append(raw)
            size += len(raw)
        out.append(self._record(base and not out, at, chunk))
        return out

    def _record(self, base: bool, at: float, items: list[msgspec.Raw]) -> _Record:
        self._seq += 1
        return _Record(replica=self.replica, seq=self._seq, at=at, base=base, items=tuple(items))


class _Record(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="decisions.recorded",
              tag_field="kind"):
    """``DecisionsRecorded`` as the sender writes it: the same JSON, its items already encoded."""

    replica: str
    seq: int = 1
    at: float = 0.0
    base: bool = False
    items: tuple[msgspec.Raw, ...] = ()

    def key(self) -> str:
        return f"decisions.recorded:{self.replica}:{self.seq}"


def _merged(batches: list[tuple[bool, float, list]]) -> list[tuple[bool, float, list]]:
    """Consecutive cycles as one batch each run of them; a base starts a new one."""
    out: list[tuple[bool, float, list]] = []
    for base, at, items in batches:
        if out and not base:
            out[-1] = (out[-1][0], at, out[-1][2] + items)
        else:
            out.append((base, at, list(items)))
    return out
