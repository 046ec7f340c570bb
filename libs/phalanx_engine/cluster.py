"""The engine's working state: a ``Cluster`` of usable nodes' scratch capacity (``NodeState``)
built from a ``Snapshot`` or changed node by node, the status of every node left out, and the
indexes a decision reads instead of scanning the nodes — free whole GPUs, free core levels,
room for a pod (``room_for``) and the network topology (``topology.Topology``, built on its
first read). ``decide`` reads it and never changes it; placement's cache, the simulator and the
preemption planner's ``Trials`` keep one and change it through ``put``/``upsert``/``remove``/
``assume``, which keep every index in step.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from phalanx_engine import gpu_plugins as gpu
from phalanx_engine import podaffinity
from phalanx_engine.candidates import checks_resources
from phalanx_engine.claims import usage_of
from phalanx_engine.dra import Usage
from phalanx_engine.framework import Member, Profile, node_error
from phalanx_engine.nodestate import NodeState
from phalanx_engine.snapshot import NodeView, Snapshot
from phalanx_engine.status import Status
from phalanx_engine.topology import Topology
from phalanx_proto.events import Assignment
from phalanx_proto.scheduling import CPU, MEMORY, PODS


@dataclass
class Cluster:
    """The engine's working state: usable nodes' scratch capacity, and the status of every
    node left out when it was built. Node state is kept per node (``nodes``), so one node
    can be replaced without touching the others (``put``)."""

    nodes: dict[str, NodeState]
    total: int
    excluded: dict[str, Status] = field(default_factory=dict)
    by_free: dict[int, set[str]] = field(default_factory=dict)
    """Free whole-GPU count → node names: lets one member skip nodes that cannot hold it."""
    by_core: dict[int, set[str]] = field(default_factory=dict)
    """Free core percent of a shareable GPU → names of nodes with such a GPU: a TDM share
    visits the tightest GPUs of the whole cluster first."""
    _levels: dict[str, frozenset[int]] = field(default_factory=dict, repr=False)
    _sorted: dict[tuple[bool, int], list[str]] = field(default_factory=dict, repr=False, compare=False)
    """``by_free`` (False, count) and ``by_core`` (True, level) buckets sorted, kept in step."""
    _room: dict[str, tuple[float, float, float]] = field(default_factory=dict, repr=False, compare=False)
    """Per node, the pods, CPU and memory ``NodeResourcesFit`` finds free (no Kubernetes state:
    unbounded): the single-member searches pass over the nodes it refuses in bulk."""
    _topology: Topology | None = field(default=None, init=False, repr=False, compare=False)
    _anti: dict[str, tuple[podaffinity.Placed, ...]] = field(default_factory=dict, repr=False, compare=False)
    """Per node with such pods, the pods there with required anti-affinity terms (every member
    is checked against them, ``affinity_pods``)."""
    _usage: Usage | None = field(default=None, init=False, repr=False, compare=False)
    """What DRA devices are in use across the usable nodes (``dra_usage``); dropped when a node
    with DRA pools or claims changes."""

    def __post_init__(self) -> None:
        self._usage = None
        for st in self.nodes.values():
            self._index(st)

    @property
    def topology(self) -> Topology:
        """Tier → domain → usable nodes, with each domain's free whole GPUs and capacity: the gang
        search, the preemption planner and the what-if probes read domains here, not by a scan.
        Built on the first read (a cluster that only ever places single pods never pays for
        it), then kept in step by ``_index``/``_unindex``."""
        if self._topology is None:
            self._topology = Topology()
            for st in self.nodes.values():
                self._topology.add(st)
        return self._topology

    def dra_usage(self) -> Usage:
        """The DRA devices, shares and counters in use: every usable node's pools (each pool
        once) and the claims its reservations hold (docs/dra.md). Built on the first read, kept
        until a node with DRA pools or claims changes."""
        if self._usage is None:
            self._usage = usage_of(self.nodes.values())
        return self._usage

    def _index(self, st: NodeState) -> None:
        if st.view.dra or st.claims:
            self._usage = None
        self._enter(False, len(st.free_whole()), st.name)
        levels = frozenset(100 - st.core.get(i, 0) for i, g in st.gpus.items()
                           if i not in st.whole and i not in st.mig_inst and not g.mig_enabled)
        self._levels[st.name] = levels
        for level in levels:
            self._enter(True, level, st.name)
        kube = st.view.kube
        self._room[st.name] = _UNBOUNDED if kube is None else (
            kube.allocatable.get(PODS, 0) - st.pods, kube.allocatable.get(CPU, 0) - st.requested.get(CPU, 0),
            kube.allocatable.get(MEMORY, 0) - st.requested.get(MEMORY, 0))
        anti = tuple(_placed(st, only_anti=True))
        if anti:
            self._anti[st.name] = anti
        if self._topology is not None:
            self._topology.add(st)

    def _unindex(self, st: NodeState) -> None:
        if st.view.dra or st.claims:
            self._usage = None
        self._leave(False, len(st.free_whole()), st.name)
        for level in self._levels.pop(st.name, ()):
            self._leave(True, level, st.name)
        self._room.pop(st.name, None)
        self._anti.pop(st.name, None)
        if self._topology is not None:
            self._topology.remove(st.name)

    def _enter(self, shares: bool, key: int, name: str) -> None:
        names = (self.by_core if shares else self.by_free).setdefault(key, set())
        ordered = self._sorted.get((shares, key))
        if ordered is not None and name not in names:
            bisect.insort(ordered, name)
        names.add(name)

    def _leave(self, shares: bool, key: int, name: str) -> None:
        names = (self.by_core if shares else self.by_free)[key]
        ordered = self._sorted.get((shares, key))
        if ordered is not None and name in names:
            del ordered[bisect.bisect_left(ordered, name)]
        names.discard(name)

    def _bucket(self, shares: bool, key: int, room: tuple[float, float] | None) -> Iterable[str]:
        """One bucket's names in order (a copy: the bucket may change while it is read); with
        ``room``, lazily, those with it (a search stops long before the end of a bucket)."""
        got = self._sorted.get((shares, key))
        if got is None:
            got = self._sorted[(shares, key)] = sorted((self.by_core if shares else self.by_free)[key])
        if room is None:
            return list(got)
        cpu, memory, free = room[0], room[1], self._room
        return (n for n in list(got) if (r := free[n])[0] >= 1 and r[1] >= cpu and r[2] >= memory)

    def tightest(self, need: int, room: tuple[float, float] | None = None) -> Iterator[str]:
        """Node names with at least ``need`` free whole GPUs, tightest first, lazily; with
        ``room`` (``room_for``), only those with a pod slot and that much CPU and memory free."""
        for count in sorted(c for c in self.by_free if c >= need):
            yield from self._bucket(False, count, room)

    def tightest_shares(self, core_pct: int, room: tuple[float, float] | None = None) -> Iterator[Iterable[str]]:
        """Per free-core level from ``core_pct`` up, the names of nodes with a shareable GPU
        that has exactly that much core free (a node may come at several levels); ``room``: as
        ``tightest``."""
        for level in sorted(c for c in self.by_core if c >= core_pct):
            yield self._bucket(True, level, room)

    def put(self, state: NodeState) -> None:
        """Replace (or add) one node's state and keep the indexes in step."""
        old = self.nodes.get(state.name)
        if old is not None:
            self._unindex(old)
        self.nodes[state.name] = state
        self._index(state)

    def copy(self) -> Cluster:
        """A scratch ``Cluster`` over the same node states, its indexes copied rather than
        rebuilt (the preemption planner's ``Trials``). The states are shared: change the copy
        with ``put``/``upsert``/``remove`` only (``assume`` changes a state in place, so both
        clusters would see it). Always a plain ``Cluster``, whatever this one is."""
        other = Cluster.__new__(Cluster)
        other.nodes, other.total, other.excluded = dict(self.nodes), self.total, dict(self.excluded)
        other.by_free = {k: set(v) for k, v in self.by_free.items()}
        other.by_core = {k: set(v) for k, v in self.by_core.items()}
        other._levels, other._room, other._anti = dict(self._levels), dict(self._room), dict(self._anti)
        other._sorted = {k: list(v) for k, v in self._sorted.items()}
        other._topology = None if self._topology is None else self._topology.copy()
        other._usage = self._usage
        return other

    def affinity_pods(self) -> podaffinity.Pods:
        """The pods of the usable nodes for pod (anti-)affinity and topology spread, and those
        nodes as spread's domains (``podaffinity.Pods``): the full lists are read only for a
        member with terms or constraints of its own."""
        states = list(self.nodes.values())
        return podaffinity.Pods(_everyone(states), tuple(p for ps in self._anti.values() for p in ps),
                                ((st.name, st.view.kube) for st in states if st.view.kube is not None))

    def has_pod_anti_affinity(self) -> bool:
        """Does any pod on a usable node carry required anti-affinity terms?"""
        return bool(self._anti)

    # -- a long-lived cluster (placement's cache keeps one and changes it node by node) --------
    def upsert(self, view: NodeView) -> None:
        """Add or replace one node from its view: usable nodes get fresh scratch state, the
        others move to ``excluded`` with their status (``total`` counts each node once)."""
        known = view.name in self.nodes or view.name in self.excluded
        why = gpu.node_usable(view)
        state = _state_or_status(view) if why is None else why
        if isinstance(state, NodeState):
            self.excluded.pop(view.name, None)
            self.put(state)
        else:
            self._drop_state(view.name)
            self.excluded[view.name] = state
        if not known:
            self.total += 1

    def remove(self, name: str) -> None:
        """Forget one node (its report is gone or unreadable); unknown names are ignored."""
        known = name in self.nodes or name in self.excluded
        self._drop_state(name)
        self.excluded.pop(name, None)
        if known:
            self.total -= 1

    def _drop_state(self, name: str) -> None:
        old = self.nodes.pop(name, None)
        if old is not None:
            self._unindex(old)

    def assume(self, assignments: Iterable[Assignment]) -> None:
        """Book decided assignments into this state (the node states change in place; the
        snapshot they were built from does not). Every assignment's node must be usable."""
        for a in assignments:
            st = self.nodes[a.node]
            self._unindex(st)
            st.take(a)
            self._index(st)

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot) -> Cluster:
        nodes, excluded = {}, {}
        for view in snapshot.nodes:
            why = gpu.node_usable(view)
            state = _state_or_status(view) if why is None else why
            if isinstance(state, NodeState):
                nodes[view.name] = state
            else:
                excluded[view.name] = state
        return cls(nodes=nodes, total=len(snapshot.nodes), excluded=excluded)


_UNBOUNDED = (math.inf, math.inf, math.inf)


def _placed(st: NodeState, only_anti: bool = False) -> Iterator[podaffinity.Placed]:
    kube = st.view.kube
    labels = kube.labels if kube is not None else {}
    for r in st.running:
        if r.anti_affinity or not only_anti:
            yield podaffinity.Placed(labels, r.namespace, r.labels, r.anti_affinity, unread=bool(r.unread),
                                     node=st.name, terminating=r.terminating)


def _everyone(states: list[NodeState]) -> Iterator[podaffinity.Placed]:
    for st in states:
        yield from _placed(st)


def room_for(profile: Profile, member: Member) -> tuple[float, float] | None:
    """The CPU and memory a node must have free for ``member``, when the profile runs
    ``NodeResourcesFit`` on it (a node without them, or without a pod slot, is refused by some
    filter); None when it does not."""
    if not checks_resources(profile, member):
        return None
    asks = member.spec.requests
    cpu, memory = (q if (q := asks.get(r, 0)) > 0 else -math.inf for r in (CPU, MEMORY))
    return cpu, memory


def _state_or_status(view: NodeView) -> NodeState | Status:
    """The node's scratch state, or its ``node_error`` status when its view cannot be built
    into one (a report that passed the wire rules but holds what the engine did not expect)."""
    try:
        return NodeState(view)
    except Exception as e:  # noqa: BLE001 - isolated to the node
        return node_error(view.name, e)
