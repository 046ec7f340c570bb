"""Which DRA devices one node can use: from every pool's ResourceSlices (``DraPool``) and the
node's name and labels, the pools that reach the node, whether each is complete and valid, and
its devices in the order upstream's first-fit search visits them. Called by the caller of
``phalanx_engine.dra.allocate`` (placement), once per node and pool snapshot: the result
(``NodeDevices``) also keeps what selectors said of each device, so keep it while the pools do
not change.

The rules are ``GatherPools`` of upstream's structured allocator (Kubernetes 1.36, incubating):

1. A slice is relevant to the node when it has shared counters (always), or its node name is the
   node's, or it is for all nodes, or its node selector (one term) matches the node's labels and
   ``metadata.name``, or, with per-device node selection, any of its devices' does. A slice that
   says none of these is ignored.
2. Per pool (driver, pool name) only the relevant slices of the highest generation count.
3. The pool is complete when it has ``resourceSliceCount`` slices of that generation; when the
   relevant ones are too few, all its slices are looked at: a newer generation anywhere makes the
   pool obsolete (dropped), else the pool is complete only if the generation has enough slices
   in all. An incomplete pool gives no devices.
4. A pool is invalid (gives no devices) when two of its device slices for the node name the same
   device, two counter sets have one name, or a device (in any slice of the generation) uses a
   counter set or counter the pool does not have.
5. Pools go by (driver, pool name), those with devices that have binding conditions last;
   slices by name; devices in the slice's order. Devices in counter slices are not allocatable;
   with per-device node selection a device the node does not match is left out.

A pool whose slices gang-coordinator could not read (``DraPool.problem``) and that has slices
for the node is invalid with that reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from phalanx_engine.matching import term_matches
from phalanx_kubeobjects import quantity
from phalanx_proto.dra import CapacityPolicy, Device, DeviceToleration, DraPool, NodeSelection, Slice
from phalanx_proto.scheduling import NodeSelectorTerm

if TYPE_CHECKING:
    from phalanx_engine.dra.celenv import DeviceInput

MAX_MEMO = 512
"""Per-request answers one node keeps (distinct selector/toleration combinations)."""
DeviceKey = tuple[str, str, str]
"""(driver, pool, device): a device in every index of this package."""
CounterKey = tuple[str, str]
"""(counter set, counter) inside one pool."""


class CapacityView:
    """One capacity of a device, parsed: its value and request policy in nanos."""

    __slots__ = ("value", "default", "valid_values", "min", "max", "step")

    def __init__(self, value: int, policy: CapacityPolicy | None) -> None:
        self.value = value
        p = policy or CapacityPolicy()
        self.default = nanos(p.default) if p.default else None
        self.valid_values = tuple(nanos(v) for v in p.valid_values)
        r = p.valid_range
        self.min = nanos(r.min) if r is not None else None
        self.max = nanos(r.max) if r is not None and r.max else None
        self.step = nanos(r.step) if r is not None and r.step else None

    @property
    def has_policy(self) -> bool:
        return self.default is not None or bool(self.valid_values) or self.min is not None


class Candidate:
    """One device the node can use, with what the search needs of it precomputed. ``order`` is
    its place in upstream's visiting order on this node; ``cel`` is filled by the allocator."""

    __slots__ = ("key", "device", "slice", "node_name", "node_selector", "consumes", "capacity", "order",
                 "cel")

    def __init__(self, key: DeviceKey, device: Device, slice_: Slice, order: int) -> None:
        self.key = key
        self.device = device
        self.slice = slice_.name
        nodes = device.nodes if slice_.per_device_nodes and device.nodes is not None else slice_.nodes
        self.node_name = nodes.node_name
        self.node_selector: NodeSelectorTerm | None = nodes.node_selector
        self.consumes: tuple[tuple[CounterKey, int], ...] = tuple(
            ((use.counter_set, name), nanos(value)) for use in device.consumes_counters
            for name, value in use.counters.items())
        self.capacity = {name: CapacityView(nanos(c.value), c.request_policy) for name, c in device.capacity.items()}
        self.order = order
        self.cel: DeviceInput | None = None

    @property
    def name(self) -> str:
        return self.key[2]

    def tolerated_by(self, tolerations: Iterable[DeviceToleration]) -> bool:
        """Is every ``NoSchedule``/``NoExecute`` taint of the device tolerated (``None`` and
        unknown effects never block)? A toleration matches a taint as a pod's does a node's:
        an empty effect or key matches any, ``Exists`` any value, ``Equal`` the same value."""
        for taint in self.device.taints:
            if taint.effect in ("NoSchedule", "NoExecute") and not any(
                    (not t.effect or t.effect == taint.effect) and (not t.key or t.key == taint.key)
                    and (t.operator == "Exists" or (t.operator == "Equal" and t.value == taint.value))
                    for t in tolerations):
                return False
        return True

    @property
    def node_local(self) -> bool:
        """Allocated, it ties a claim to this node (a node name, or ``bindsToNode``)."""
        return bool(self.node_name) or self.device.binds_to_node


class PoolView:
    """One pool as this node sees it. ``incomplete``/``invalid`` pools have no candidates;
    ``counters`` is what its counter sets hold (nanos)."""

    __slots__ = ("driver", "pool", "generation", "candidates", "incomplete", "invalid", "counters")

    def __init__(self, driver: str, pool: str, generation: int, *, candidates: tuple[Candidate, ...] = (),
                 incomplete: bool = False, invalid: str = "", counters: dict[CounterKey, int] | None = None) -> None:
        self.driver, self.pool, self.generation = driver, pool, generation
        self.candidates = candidates
        self.incomplete, self.invalid = incomplete, invalid
        self.counters = counters or {}

    @property
    def name(self) -> str:
        return f"{self.driver}/{self.pool}"


class NodeDevices:
    """Every pool relevant to one node, in search order, and their usable devices. ``memo`` is
    the allocator's cache of per-request answers that do not depend on usage."""

    __slots__ = ("node", "labels", "pools", "candidates", "by_key", "memo")

    def __init__(self, node: str, labels: Mapping[str, str], pools: tuple[PoolView, ...]) -> None:
        self.node = node
        self.labels = dict(labels)
        self.pools = pools
        self.candidates = tuple(c for p in pools for c in p.candidates)
        self.by_key = {c.key: c for c in self.candidates}
        self.memo: dict = {}

    def remember(self, key: object, value: object) -> None:
        """Keep a per-request answer in ``memo`` (the oldest goes beyond ``MAX_MEMO``)."""
        self.memo[key] = value
        if len(self.memo) > MAX_MEMO:
            del self.memo[next(iter(self.memo))]


def gather(pools: Iterable[DraPool], node: str, labels: Mapping[str, str] | None = None) -> NodeDevices:
    """The pools and devices ``node`` (with ``labels``) can use, by the module's rules."""
    labels = labels or {}
    views: list[tuple[bool, PoolView]] = []
    for p in pools:
        view = _pool_view(p, node, labels)
        if view is not None:
            binding = any(c.device.binding_conditions for c in view.candidates)
            views.append((binding, view))
    views.sort(key=lambda bv: (bv[0], bv[1].driver, bv[1].pool))
    order = 0
    for _, view in views:
        for c in view.candidates:
            c.order = order
            order += 1
    return NodeDevices(node, labels, tuple(v for _, v in views))


def newest_devices(pool: DraPool) -> dict[str, Device]:
    """The devices of the pool's newest generation by name (the first of a repeated name), for
    counting the counters of devices in use anywhere in the pool."""
    if not pool.slices:
        return {}
    gen = max(s.generation for s in pool.slices)
    out: dict[str, Device] = {}
    for s in sorted(pool.slices, key=lambda s: s.name):
        if s.generation == gen and not s.shared_counters:
            for d in s.devices:
                out.setdefault(d.name, d)
    return out


def selection_matches(nodes: NodeSelection, node: str, labels: Mapping[str, str]) -> bool:
    """A node name, all nodes, or a one-term node selector against the node."""
    if nodes.node_name:
        return nodes.node_name == node
    if nodes.all_nodes:
        return True
    if nodes.node_selector is not None:
        return term_matches(nodes.node_selector, labels, node)
    return False


def nanos(text: str) -> int:
    """A quantity the API server accepted, in nanos (a value that does not parse counts as 0:
    the API server never lets one through)."""
    parsed = quantity.parse(text, "")
    return parsed.nanos if isinstance(parsed, quantity.Quantity) else 0


# --- internals ------------------------------------------------------------------------------------


def _says_nodes(nodes: NodeSelection) -> bool:
    return bool(nodes.node_name) or nodes.all_nodes or nodes.node_selector is not None


def _relevant(s: Slice, node: str, labels: Mapping[str, str]) -> bool:
    if s.shared_counters:
        return True
    if _says_nodes(s.nodes):
        return selection_matches(s.nodes, node, labels)
    if s.per_device_nodes:
        return any(d.nodes is not None and selection_matches(d.nodes, node, labels) for d in s.devices)
    return False


def _pool_view(p: DraPool, node: str, labels: Mapping[str, str]) -> PoolView | None:
    relevant = [s for s in p.slices if _relevant(s, node, labels)]
    if not relevant:
        return None
    gen = max(s.generation for s in relevant)
    chosen = [s for s in relevant if s.generation == gen]
    want = chosen[0].slice_count
    if p.problem:
        return PoolView(p.driver, p.pool, gen, invalid=p.problem)
    others: list[Slice] = []
    if len(chosen) != want:
        if any(s.generation > gen for s in p.slices):
            return None  # obsolete: the driver is replacing this generation
        all_of_gen = [s for s in p.slices if s.generation == gen]
        if len(all_of_gen) != want:
            return PoolView(p.driver, p.pool, gen, incomplete=True)
        names = {s.name for s in chosen}
        others = [s for s in all_of_gen if s.name not in names]
    chosen.sort(key=lambda s: s.name)
    device_slices = [s for s in chosen if not s.shared_counters]
    invalid = _invalid(chosen, device_slices, others)
    if isinstance(invalid, str):
        return PoolView(p.driver, p.pool, gen, invalid=invalid)
    candidates = tuple(
        Candidate((p.driver, p.pool, d.name), d, s, 0)
        for s in device_slices for d in s.devices
        if not s.per_device_nodes or (d.nodes is not None and selection_matches(d.nodes, node, labels)))
    return PoolView(p.driver, p.pool, gen, candidates=candidates, counters=invalid)


def _invalid(chosen: list[Slice], device_slices: list[Slice], others: list[Slice]) -> str | dict[CounterKey, int]:
    """Why the pool is invalid, or its counters."""
    seen: set[str] = set()
    for s in device_slices:
        for d in s.devices:
            if d.name in seen:
                return f"duplicate device name {d.name}"
            seen.add(d.name)
    counters: dict[CounterKey, int] = {}
    sets: dict[str, set[str]] = {}
    for s in chosen:
        for cs in s.shared_counters:
            if cs.name in sets:
                return f"duplicate counter set name {cs.name}"
            sets[cs.name] = set(cs.counters)
            for name, value in cs.counters.items():
                counters[(cs.name, name)] = nanos(value)
    for s in [*chosen, *others]:
        for d in s.devices:
            for use in d.consumes_counters:
                if use.counter_set not in sets:
                    return f"counter set {use.counter_set} not found"
                for name in use.counters:
                    if name not in sets[use.counter_set]:
                        return f"counter {name} not found in counter set {use.counter_set}"
    return counters
