"""``phalanx sim --replay``: decide placement's recorded decisions again and say which differ
(docs/whatif.md, "Replay").

Each placement replica logs its cluster's changes and its engine decisions in order
(``DecisionsRecorded`` on ``phx.decisions.<replica>``, written by
``services/phalanx_placement/recorder.py``). ``Replay`` rebuilds each replica's cluster from a
base record, applies the changes as they come, and asks the engine the same question with the
same profile: the same members, the same nodes to avoid. The answer must be the recorded one,
to the GPU (``Decision.assignments``) or to the word (``NoFit.summary``).

A replica's log read from the middle, or after a gap (records lost, ``seq`` not one more than
the last), cannot be rebuilt until its next base: its decisions until then are counted as not
replayable, never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from phalanx_engine.decide import Cluster, decide, default_profile
from phalanx_engine.recorded import Memory
from phalanx_engine.snapshot import Decision
from phalanx_proto.events import Assignment, DecisionsRecorded, RecordedDecision, RecordedNode


@dataclass(frozen=True)
class Difference:
    """A decision the engine now makes otherwise than the log says it made."""

    replica: str
    seq: int
    at: float
    gang_id: str
    attempt: int
    recorded: str
    replayed: str


@dataclass
class ReplicaReplay:
    """One replica's log as far as it was read, and what its replay found."""

    replica: str
    records: int = 0
    first_seq: int = 0
    last_seq: int = 0
    bases: int = 0
    gaps: int = 0
    decisions: int = 0
    agree: int = 0
    not_replayable: int = 0
    first_at: float = 0.0
    last_at: float = 0.0
    differences: list[Difference] = field(default_factory=list)
    _cluster: Cluster | None = None
    _memory: Memory = field(default_factory=Memory)

    def feed(self, record: DecisionsRecorded, *, since: float = 0.0) -> None:
        """Apply one record; decisions of cycles before unix time ``since`` are applied but not compared."""
        if self.records and record.seq != self.last_seq + 1:
            self.gaps += 1
            self._cluster = None
        self.records += 1
        self.first_seq = self.first_seq or record.seq
        self.last_seq = record.seq
        if record.base:
            self.bases += 1
            self._cluster = Cluster(nodes={}, total=0)
            self._memory.clear()
        for item in record.items:
            if isinstance(item, RecordedNode):
                self._apply(item)
            elif record.at >= since:
                self.first_at = self.first_at or record.at
                self.last_at = record.at
                self._decide(record, item)

    def _apply(self, item: RecordedNode) -> None:
        if self._cluster is None:
            return
        if item.removed:
            self._cluster.remove(item.name)
            self._memory.forget(item.name)
            return
        try:
            view = self._memory.view(item)
        except KeyError:  # "same as before" of a node this replay never saw: not from a base
            self._cluster = None
            return
        self._cluster.upsert(view)

    def _decide(self, record: DecisionsRecorded, item: RecordedDecision) -> None:
        self.decisions += 1
        if self._cluster is None:
            self.not_replayable += 1
            return
        result = decide(self._cluster, item.members, _profile(item.node_state_required), avoid=item.avoid)
        now = (result.assignments, "") if isinstance(result, Decision) else ((), result.summary)
        if now == (item.placed, item.no_fit):
            self.agree += 1
        else:
            self.differences.append(Difference(self.replica, record.seq, record.at, item.gang_id, item.attempt,
                                               recorded=_words(item.placed, item.no_fit), replayed=_words(*now)))


class Replay:
    """Every replica's replay, fed records in each replica's order."""

    def __init__(self, *, since: float = 0.0) -> None:
        self.since = since
        self.replicas: dict[str, ReplicaReplay] = {}

    def feed(self, record: DecisionsRecorded) -> None:
        self.replicas.setdefault(record.replica, ReplicaReplay(record.replica)).feed(record, since=self.since)

    @property
    def decisions(self) -> int:
        return sum(r.decisions - r.not_replayable for r in self.replicas.values())

    @property
    def differences(self) -> list[Difference]:
        return [d for r in self.replicas.values() for d in r.differences]


_PROFILES = {}


def _profile(node_state_required: bool):
    if node_state_required not in _PROFILES:
        _PROFILES[node_state_required] = default_profile(require_node_state=node_state_required)
    return _PROFILES[node_state_required]


def _words(placed: tuple[Assignment, ...], no_fit: str) -> str:
    """A decision in words: every member's node and GPUs (all of an assignment that has more),
    or why nothing fits."""
    if not placed:
        return f"no fit: {no_fit}"
    return "placed " + "; ".join(f"{a.pod.namespace}/{a.pod.name} -> {a.node} {list(a.gpus)}"
                                 + ("" if a == Assignment(pod=a.pod, node=a.node, gpus=a.gpus) else f" ({a})")
                                 for a in placed)
