"""The DRA allocator against brute force (``phalanx_engine.dra.allocate``): on small random pools
(at most 6 devices with random attributes, taints, counters and shared capacity, some in use) and
random claims (1-3 requests: counts, All, firstAvailable, tolerations, capacity, admin access,
matchAttribute/distinctAttribute), it finds an allocation exactly when trying every assignment
finds one, and every allocation it returns passes a validity check written here from the rules
(not from the allocator's code). Both the first-fit and the ranked order are checked.

``PHALANX_DRA_EXAMPLES`` sets the number of inputs (default 1500; ``make fuzz``'s profile takes
ten times as many).
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field

import msgspec
from hypothesis import event, given, settings
from hypothesis import strategies as st

from phalanx_engine.dra import Allocation, Ranking, Refusal, Usage, allocate, gather
from phalanx_proto.dra import (
    AttrValue,
    Capacity,
    CapacityPolicy,
    CapacityRange,
    ClaimSpec,
    CounterSet,
    CounterUse,
    Device,
    DeviceClassRef,
    DeviceConstraint,
    DeviceRequest,
    DeviceTaint,
    DeviceToleration,
    DraPool,
    ExactRequest,
    InUse,
    NodeSelection,
    Slice,
)
from phalanx_proto.topology import Gpu, NodeTopology

DRIVER = "d.example.com"
G = 10**9
_fuzzing = os.environ.get("PHALANX_FUZZ_PROFILE") == "fuzz"
EXAMPLES = int(os.environ.get("PHALANX_DRA_EXAMPLES") or (15000 if _fuzzing else 1500))

# Selectors as CEL text and as the Python the checker uses.
SELECTORS = {
    "any": ("true", lambda d: True),
    "kind-a": (f"device.attributes['{DRIVER}'].kind == 'a'", lambda d: d.kind == "a"),
    "num>=1": (f"has(device.attributes['{DRIVER}'].num) && device.attributes['{DRIVER}'].num >= 1",
               lambda d: d.num is not None and d.num >= 1),
    "not-b": (f"device.attributes['{DRIVER}'].kind != 'b'", lambda d: d.kind != "b"),
}
TOLERATIONS = {
    "all": DeviceToleration(operator="Exists"),
    "k1": DeviceToleration(key="k1", operator="Exists"),
    "k2=v:NoSchedule": DeviceToleration(key="k2", operator="Equal", value="v", effect="NoSchedule"),
}
BW_DEFAULT, BW_MAX, BW_VALUE = 2, 3, 4


@dataclass(frozen=True)
class Dev:
    name: str
    pool: str
    kind: str
    num: int | None
    taint: tuple[str, str, str] | None  # key, value, effect
    counter: int  # units of counter "c" of set "cs" it uses (0: none)
    shared: bool  # allowMultipleAllocations, capacity "bw"
    held: str | int | None  # in use: "excl", a share's bandwidth, or None


@dataclass(frozen=True)
class Alt:
    name: str  # "" for exactly
    selector: str
    all: bool
    count: int
    tolerations: tuple[str, ...]
    admin: bool
    bw: int | None


@dataclass(frozen=True)
class Req:
    name: str
    alts: tuple[Alt, ...]
    first_available: bool


@dataclass(frozen=True)
class Con:
    attribute: str  # "kind" or "num"
    distinct: bool
    requests: tuple[str, ...]


@dataclass(frozen=True)
class Cl:
    name: str
    requests: tuple[Req, ...]
    constraints: tuple[Con, ...]


@dataclass
class World:
    devices: list[Dev]
    caps: dict[str, int]  # pool -> capacity of counter "c"
    claims: list[Cl]
    pools: list[DraPool] = field(default_factory=list)


# --- generation ------------------------------------------------------------------------------------

@st.composite
def devices(draw) -> list[Dev]:
    n = draw(st.sampled_from([1, 2, 3, 4, 4, 5, 5, 6, 6, 6]))
    out = []
    for i in range(n):
        shared = draw(st.integers(0, 2)) == 0
        held = draw(st.sampled_from([None, None, 1, 2, 3])) if shared else draw(
            st.sampled_from([None, None, None, None, None, "excl"]))
        out.append(Dev(
            name=f"dev{i}", pool=draw(st.sampled_from(["p1", "p1", "p2"])), kind=draw(st.sampled_from(["a", "b"])),
            num=draw(st.sampled_from([0, 1, 2, 0, 1, 2, None])),
            taint=draw(st.sampled_from([None] * 6 + [("k1", "", "NoSchedule"), ("k2", "v", "NoSchedule"),
                                                     ("k2", "w", "NoExecute"), ("k1", "", "None")])),
            counter=draw(st.sampled_from([0, 0, 0, 1, 1, 2])), shared=shared, held=held))
    return out


@st.composite
def alts(draw, name: str) -> Alt:
    every = draw(st.integers(0, 7)) == 0
    return Alt(name=name, selector=draw(st.sampled_from(["any", "any", *sorted(SELECTORS)])), all=every,
               count=1 if every else draw(st.integers(1, 2)),
               tolerations=tuple(draw(st.lists(st.sampled_from(sorted(TOLERATIONS)), max_size=2, unique=True))),
               admin=draw(st.integers(0, 9)) == 0 and not name,
               bw=draw(st.sampled_from([None] * 12 + [1, 2, 3, 4])))


@st.composite
def worlds(draw) -> World:
    devs = draw(devices())
    caps = {p: draw(st.integers(1, 4)) for p in ("p1", "p2")}
    n_requests = draw(st.integers(1, 3))
    n_claims = draw(st.integers(1, min(2, n_requests)))
    split = sorted(draw(st.lists(st.integers(1, n_requests - 1), min_size=n_claims - 1, max_size=n_claims - 1,
                                 unique=True))) if n_claims > 1 else []
    bounds = [0, *split, n_requests]
    claims = []
    for ci in range(n_claims):
        reqs = []
        for ri in range(bounds[ci + 1] - bounds[ci]):
            fa = draw(st.integers(0, 3)) == 0
            alt_list = tuple(draw(alts(f"s{k}" if fa else "")) for k in range(2 if fa else 1))
            reqs.append(Req(name=f"r{ri}", alts=alt_list, first_available=fa))
        cons = []
        if draw(st.integers(0, 3)) == 0:
            names = [r.name for r in reqs]
            scope = draw(st.lists(st.sampled_from(names + [f"{r.name}/s0" for r in reqs if r.first_available]),
                                  max_size=2, unique=True))
            cons.append(Con(attribute=draw(st.sampled_from(["kind", "num"])), distinct=draw(st.booleans()),
                            requests=tuple(scope)))
        claims.append(Cl(name=f"c{ci}", requests=tuple(reqs), constraints=tuple(cons)))
    world = World(devs, caps, claims)
    world.pools = to_pools(world)
    return world


def to_pools(w: World) -> list[DraPool]:
    out = []
    for p in ("p1", "p2"):
        mine = [d for d in w.devices if d.pool == p]
        if not mine:
            continue
        devices_ = tuple(to_device(d) for d in mine)
        slices = [Slice(name=f"{p}-d", slice_count=2, nodes=NodeSelection(node_name="n1"), devices=devices_),
                  Slice(name=f"{p}-c", slice_count=2, nodes=NodeSelection(node_name="n1"), shared_counters=(
                      CounterSet(name="cs", counters={"c": str(w.caps[p])}),))]
        in_use = []
        for d in mine:
            if d.held == "excl":
                in_use.append(InUse(device=d.name, claim="o/held/u"))
            elif d.held is not None:
                in_use.append(InUse(device=d.name, claim="o/held/u", share_id="s", consumed={"bw": str(d.held)}))
        out.append(DraPool(driver=DRIVER, pool=p, slices=tuple(slices), in_use=tuple(in_use)))
    return out


def to_device(d: Dev) -> Device:
    attrs = {"kind": AttrValue(string=d.kind)}
    if d.num is not None:
        attrs["num"] = AttrValue(int_=d.num)
    if d.num == 2:  # a GPU of the ranking topology, joined by UUID
        attrs["uuid"] = AttrValue(string=f"GPU-{d.name}")
    return Device(
        name=d.name, attributes=attrs,
        capacity={"bw": Capacity(value=str(BW_VALUE), request_policy=CapacityPolicy(
            default=str(BW_DEFAULT), valid_range=CapacityRange(min="1", max=str(BW_MAX), step="1")))} if d.shared else {},
        consumes_counters=(CounterUse(counter_set="cs", counters={"c": str(d.counter)}),) if d.counter else (),
        taints=(DeviceTaint(key=d.taint[0], value=d.taint[1], effect=d.taint[2]),) if d.taint else (),  # type: ignore[arg-type]
        allow_multiple_allocations=d.shared)


def to_claims(w: World) -> list[ClaimSpec]:
    cls = DeviceClassRef(name="d", selectors=(f"device.driver == '{DRIVER}'",))

    def exact(a: Alt) -> ExactRequest:
        return ExactRequest(name=a.name, device_class=cls, selectors=(SELECTORS[a.selector][0],),
                            allocation_mode="All" if a.all else "ExactCount", count=a.count, admin_access=a.admin,
                            tolerations=tuple(TOLERATIONS[t] for t in a.tolerations),
                            capacity={"bw": str(a.bw)} if a.bw is not None else {})

    return [ClaimSpec(namespace="ns", name=c.name, uid=f"u-{c.name}", requests=tuple(
        DeviceRequest(name=r.name, first_available=tuple(exact(a) for a in r.alts)) if r.first_available
        else DeviceRequest(name=r.name, exactly=exact(r.alts[0])) for r in c.requests),
        constraints=tuple(DeviceConstraint(requests=k.requests, **{
            "distinct_attribute" if k.distinct else "match_attribute": f"{DRIVER}/{k.attribute}"}) for k in c.constraints))
        for c in w.claims]


# --- the checker: the rules, written from the API's description -------------------------------------

Choice = tuple[int, tuple[str, ...]]  # (alternative, device names) for one request


def tolerated(d: Dev, a: Alt) -> bool:
    if d.taint is None or d.taint[2] not in ("NoSchedule", "NoExecute"):
        return True
    key, value, effect = d.taint
    for name in a.tolerations:
        t = TOLERATIONS[name]
        if (not t.effect or t.effect == effect) and (not t.key or t.key == key) and \
                (t.operator == "Exists" or t.value == value):
            return True
    return False


def bandwidth(a: Alt) -> int:
    return BW_DEFAULT if a.bw is None else max(a.bw, 1)


def capacity_ok(d: Dev, a: Alt, held: int) -> bool:
    """The request can take its bandwidth from ``d`` when ``held`` is already taken."""
    if not d.shared:
        return a.bw is None
    amount = bandwidth(a)
    return amount <= BW_MAX and held + amount <= BW_VALUE


def held_bw(d: Dev) -> int:
    return d.held if isinstance(d.held, int) else 0


def all_set(w: World, a: Alt) -> tuple[str, ...]:
    return tuple(d.name for d in w.devices
                 if SELECTORS[a.selector][1](d) and capacity_ok(d, a, held_bw(d)))


def locally_ok(w: World, a: Alt, names: tuple[str, ...]) -> bool:
    by = {d.name: d for d in w.devices}
    if a.all:
        if not names or sorted(names) != sorted(all_set(w, a)):
            return False
    elif len(names) != a.count or len(set(names)) != len(names):
        return False
    return all(SELECTORS[a.selector][1](by[n]) and tolerated(by[n], a) and capacity_ok(by[n], a, 0) for n in names)


def valid(w: World, assignment: list[list[Choice]]) -> bool:
    """Is this whole assignment (per claim, per request) allowed?"""
    by = {d.name: d for d in w.devices}
    picks = []  # (claim, request, full name, alt, device) in search order
    for c, choices in zip(w.claims, assignment, strict=True):
        if len(choices) != len(c.requests):
            return False
        for r, (ai, names) in zip(c.requests, choices, strict=True):
            a = r.alts[ai]
            if not locally_ok(w, a, names):
                return False
            full = f"{r.name}/{a.name}" if a.name else r.name
            picks += [(c.name, r.name, full, a, by[n]) for n in names]
    for c in w.claims:
        if sum(1 for p in picks if p[0] == c.name) > 32:
            return False
    # Taken devices: in use without a share, or picked earlier in this pod.
    for i, (claim, _, _, a, d) in enumerate(picks):
        if not a.admin and d.held == "excl":
            return False
        if d.shared:
            continue
        for (earlier_claim, _, _, _, e) in picks[:i]:
            if e.name == d.name and not (a.admin and earlier_claim != claim):
                return False
    # Shared capacity: what shares hold plus what this pod takes.
    for d in w.devices:
        if d.shared:
            taken = held_bw(d) + sum(bandwidth(a) for (_, _, _, a, e) in picks if e.name == d.name)
            if taken > BW_VALUE:
                return False
    # Counters: each allocated device counts once.
    for pool, cap in w.caps.items():
        in_use = {d.name for d in w.devices if d.pool == pool and d.held is not None}
        new = {p[4].name for p in picks if p[4].pool == pool} - in_use
        if any(by[n].counter for n in new):
            if sum(by[n].counter for n in in_use | new) > cap:
                return False
    # Constraints, per claim.
    for c in w.claims:
        for k in c.constraints:
            scope = [p[4] for p in picks if p[0] == c.name and (not k.requests or p[1] in k.requests or p[2] in k.requests)]
            values = [getattr(d, k.attribute) for d in scope]
            if any(v is None for v in values):
                return False
            if k.distinct and len(set(values)) != len(values):
                return False
            if not k.distinct and len(set(values)) > 1:
                return False
    return True


def brute_force(w: World) -> bool:
    """Does any assignment pass ``valid``? Every request's choices, each filtered by the checks
    that concern it alone, then every combination of them."""
    names = [d.name for d in w.devices]
    per_request: list[list[Choice]] = []
    shape = []
    for c in w.claims:
        shape.append(len(c.requests))
        for r in c.requests:
            options: list[Choice] = []
            for ai, a in enumerate(r.alts):
                sets = [all_set(w, a)] if a.all else list(itertools.combinations(names, a.count))
                options += [(ai, s) for s in sets if locally_ok(w, a, s)]
            if not options:
                return False
            per_request.append(options)
    for combo in itertools.product(*per_request):
        assignment, at = [], 0
        for n in shape:
            assignment.append(list(combo[at:at + n]))
            at += n
        if valid(w, assignment):
            return True
    return False


def assignment_of(w: World, got: Allocation) -> list[list[Choice]]:
    out = []
    for c, allocated in zip(w.claims, got.claims, strict=True):
        choices = []
        for r in c.requests:
            mine = [d for d in allocated.allocation.devices if d.request.split("/")[0] == r.name]
            sub = mine[0].request.partition("/")[2] if mine else ""
            ai = next((i for i, a in enumerate(r.alts) if a.name == sub), 0)
            choices.append((ai, tuple(d.device for d in mine)))
        out.append(choices)
    return out


TOPOLOGY = NodeTopology(node="n1", gpus=tuple(Gpu(index=i, name=f"GPU{i}", uuid=f"GPU-dev{i}") for i in range(6)),
                        relations={f"GPU{i}": {f"GPU{j}": ("NV2" if (i ^ j) == 1 else "SYS") for j in range(6) if j != i}
                                   for i in range(6)})


@settings(max_examples=EXAMPLES, deadline=None)
@given(world=worlds())
def test_the_allocator_finds_an_allocation_exactly_when_brute_force_does(world: World) -> None:
    exists = brute_force(world)
    event("an allocation exists" if exists else "no allocation exists")
    claims = to_claims(world)
    for ranking in (None, Ranking(TOPOLOGY)):
        got = allocate(claims, gather(world.pools, "n1"), Usage(world.pools), ranking)
        if isinstance(got, Refusal):
            assert not exists, (got, world)
            assert got.message in ("cannot allocate all claims", "invalid resource pools were encountered") or \
                "because a claim constraint would not be satisfied" in got.message, got
        else:
            assert exists, (got, world)
            assignment = assignment_of(world, got)
            assert valid(world, assignment), (assignment, world)
            assert msgspec.json.decode(msgspec.json.encode(got), type=Allocation) == got
