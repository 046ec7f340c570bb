"""Allocating one pod's ResourceClaims on one node: upstream's structured allocator (Kubernetes
1.36, the incubating one a default cluster runs) as a pure function, with the device order
chosen by ``phalanx_engine.dra.rank``. Called by placement for each (member, node) it considers.

``allocate(claims, devices, usage, ranking)`` returns an ``Allocation`` (every claim's
``ClaimAllocated``) or a ``Refusal``. It never changes ``usage``: the caller adds an allocation
it keeps (``usage.add_allocated(result.claims)``) before allocating for the next member.

The search (``_Search``): claims in order (an extended-resource claim last), each claim's
requests in order, for ``firstAvailable`` the subrequests in order (the first that leads to a
full solution wins), then the devices of the request. For ``ExactCount`` every combination of
candidate devices is tried, depth-first, backing out of any choice that leaves no solution, so
a solution is found whenever one exists; ``All`` takes every device the request selects, each
of which must be allocatable. A device is allocatable for a request when:

1. it is not taken (a normal request: not allocated without a share, not picked by this pod;
   admin access: not picked by the same claim);
2. the DeviceClass's selectors and then the request's hold (CEL; an error stops everything);
3. its taints (``NoSchedule``/``NoExecute``) are tolerated by the request;
4. the request's capacity fits (``phalanx_engine.dra.capacity``);
5. a device not yet allocated leaves its pool's counters non-negative;
6. the claim's constraints admit it (``phalanx_engine.dra.constraints``);

and a claim holds at most 32 devices.

Where Phalanx departs from upstream, on purpose: every candidate device of a request is
evaluated when the search first reaches the request (upstream stops at the first that fits), so
a selector that errors on any device of the node is reported the same whatever the device
order; an ``All`` device refused by a constraint only ends that branch of the search (upstream
aborts with an error; Phalanx reports that error only when no solution exists); counters taken
by a choice the search backs out of are returned (upstream keeps some, which can hide
solutions); a device counts its counters once however many picks hold it; only the counters
the device uses are checked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import msgspec

from phalanx_engine.dra import constraints as cons
from phalanx_engine.dra import refusal as why
from phalanx_engine.dra.capacity import fit
from phalanx_engine.dra.celenv import ENV, CelEnv, CelError, CelRuntimeError
from phalanx_engine.dra.diagnose import explain
from phalanx_engine.dra.pools import Candidate, NodeDevices, nanos
from phalanx_engine.dra.rank import Ranking
from phalanx_engine.dra.refusal import Fatal, Refusal
from phalanx_engine.dra.results import Pick, claim_allocation
from phalanx_engine.dra.usage import Usage
from phalanx_engine.matching import term_matches
from phalanx_proto.dra import MAX_RESULTS, ClaimAllocated, ClaimSpec, ExactRequest, PodClaim

MAX_STEPS = 200_000
"""Device picks one ``allocate`` call tries at most (about a second of CPU)."""


class Allocation(msgspec.Struct, frozen=True, kw_only=True):
    """The pod's claims on ``node``, in the order given: newly allocated ones
    (``allocated=True``) and ones already allocated before (their allocation, unchanged).
    ``gpus``: the topology GPUs (indices) any of them uses."""

    node: str
    claims: tuple[ClaimAllocated, ...]
    gpus: tuple[int, ...] = ()


class Alt:
    """One way to satisfy a request: its ``exactly`` or one of its subrequests."""

    __slots__ = ("request", "full_name", "spec", "asked", "all", "devices", "need")

    def __init__(self, request: str, sub: str, spec: ExactRequest) -> None:
        self.request = request
        self.full_name = f"{request}/{sub}" if sub else request
        self.spec = spec
        self.asked = {k: nanos(v) for k, v in spec.capacity.items()}
        self.all = spec.allocation_mode == "All"
        self.devices: tuple[Candidate, ...] | None = None
        """ExactCount: the candidates (selected, tolerated, capacity possible), found when the
        search first reaches the request; All: every device, found before the search."""
        self.need = spec.count


class ClaimState:
    """One claim being allocated: its alternatives per request and what is picked so far."""

    __slots__ = ("index", "position", "pod_claim", "spec", "alts", "constraints", "picks", "chosen")

    def __init__(self, index: int, pod_claim: str, spec: ClaimSpec) -> None:
        self.index, self.pod_claim, self.spec = index, pod_claim, spec
        self.position = 0
        """Its place in the search (claims needing allocation, extended-resource claim last)."""
        self.alts = [[Alt(r.name, "", r.exactly)] if r.exactly is not None
                     else [Alt(r.name, s.name, s) for s in r.first_available] for r in spec.requests]
        self.constraints = [cons.Constraint(c) for c in spec.constraints]
        self.picks: list[Pick] = []
        self.chosen: list[Alt | None] = [None] * len(spec.requests)

    @property
    def ref(self) -> str:
        return f"{self.spec.namespace}/{self.spec.name}"


def allocate(claims: Sequence[PodClaim | ClaimSpec], devices: NodeDevices, usage: Usage,
             ranking: Ranking | None = None, *, env: CelEnv = ENV, max_steps: int = MAX_STEPS) -> Allocation | Refusal:
    """Allocate every claim of one pod on ``devices.node``, or say why not (module docstring).
    ``ranking`` None: upstream's first-fit order and no GPU indices. A search that tries more
    than ``max_steps`` device picks stops with upstream's timeout error (``node N: timed out
    trying to allocate devices``; upstream bounds the search by time, 10 s by default).

    Reads ``usage``, never changes it. Writes caches into ``devices`` (what selectors said of
    each device) and ``ranking`` (each device's GPU): not for concurrent use from several
    threads. Raises nothing for any input the API server accepts; a ``Refusal`` with ``error``
    set is kube-scheduler's Error."""
    pod = [(c.name, c.claim) if isinstance(c, PodClaim) else ("", c) for c in claims]
    todo = sorted((i for i, (_, c) in enumerate(pod) if c.allocation is None), key=lambda i: pod[i][1].extended)
    for i in todo:
        missing = _missing_class(pod[i][1])
        if missing is not None:
            return missing
    for _, c in pod:
        if c.allocation is not None and c.allocation.node_selector is not None and not any(
                term_matches(t, devices.labels, devices.node) for t in c.allocation.node_selector):
            return why.unschedulable(why.RefusalCode.NOT_ON_NODE, why.NOT_ON_NODE, claim=f"{c.namespace}/{c.name}",
                                     detail=f"claim {c.namespace}/{c.name} is allocated for other nodes")
    search = _Search(devices, usage, ranking, env, [ClaimState(i, *pod[i]) for i in todo], max_steps)
    try:
        search.prepare()
        found = search.claim(0)
    except Fatal as f:
        return f.refusal
    except RecursionError:
        return why.error(f"node {devices.node}: too many devices to search")
    if not found:
        search.steps_left = 1 << 62  # explaining tries each device once more
        return search.constraint_error or explain(search)
    return search.allocation(pod)


def _missing_class(claim: ClaimSpec) -> Refusal | None:
    for r in claim.requests:
        alts = [(r.name, r.exactly)] if r.exactly is not None else [(f"{r.name}/{s.name}", s) for s in r.first_available]
        for name, spec in alts:
            if spec.device_class.missing:
                return why.unschedulable(why.RefusalCode.CLASS_MISSING,
                                         f"request {name}: device class {spec.device_class.name} does not exist",
                                         claim=f"{claim.namespace}/{claim.name}", request=name)
    return None


class _Search:
    """The depth-first search over one pod's claims on one node, and its scratch state."""

    def __init__(self, devices: NodeDevices, usage: Usage, ranking: Ranking | None, env: CelEnv,
                 claims: list[ClaimState], max_steps: int) -> None:
        self.devices, self.usage, self.ranking, self.env = devices, usage, ranking, env
        self.steps_left = max_steps
        self.claims = claims
        for position, c in enumerate(claims):
            c.position = position
        self.pools = {(p.driver, p.pool): p for p in devices.pools}
        self.picked: dict[tuple, list[int]] = {}
        self.giving: dict[tuple, dict[str, int]] = {}
        self.active: dict[tuple, int] = {}
        self.counting: dict[tuple[str, str], dict[tuple[str, str], int]] = {}
        self.left: dict[tuple[str, str], dict[tuple[str, str], int]] = {}
        self.constraint_error: Refusal | None = None

    # --- before searching --------------------------------------------------------------------

    def prepare(self) -> None:
        """Upstream's checks before the search, in its order, and each request's devices."""
        for c in self.claims:
            least = 0
            for alts in c.alts:
                for alt in alts:
                    if alt.all:
                        self._all_devices(c, alt)
                least += min(a.need for a in alts)
            if least > MAX_RESULTS:
                raise Fatal(why.error(f"claim {c.ref}: number of requested devices {least} exceeds the claim "
                                       f"limit of {MAX_RESULTS}", claim=c.ref))
            for i, k in enumerate(c.constraints):
                if not k.attribute:
                    raise Fatal(why.error(f"claim {c.ref}, constraint #{i}: empty constraint (unsupported "
                                           "constraint type?)", claim=c.ref))

    def selected(self, c: ClaimState, alt: Alt, *, class_only: bool = False) -> tuple[Candidate, ...]:
        """The node's devices the class's and the request's selectors pick (cached per node);
        ``class_only``: the class's alone."""
        cls = alt.spec.device_class
        selectors = () if class_only else alt.spec.selectors
        key = ("selected", cls.name, cls.selectors, selectors)
        hit = self.devices.memo.get(key)
        if hit is None:
            hit = self._select(cls.selectors, selectors)
            self.devices.remember(key, hit)
        if isinstance(hit, tuple) and hit and hit[0] == "error":
            _, by_class, index, stage, text = hit
            where = f"class {cls.name}" if by_class else f"claim {c.ref}"
            raise Fatal(why.error(f"{where}: selector #{index}: CEL {stage} error: {text}", claim=c.ref,
                                   request=alt.full_name))
        return hit

    def _select(self, class_selectors: tuple[str, ...], selectors: tuple[str, ...]) -> tuple:
        compiled = []
        for by_class, texts in ((True, class_selectors), (False, selectors)):
            for i, text in enumerate(texts):
                try:
                    compiled.append((by_class, i, self.env.compile(text)))
                except CelError as e:
                    return ("error", by_class, i, "compile", str(e))
        out = []
        for d in self.devices.candidates:
            if d.cel is None:
                d.cel = self.env.device_input(d.key[0], d.device)
            cel = d.cel
            for by_class, i, sel in compiled:
                try:
                    if not self.env.matches(sel, cel):
                        break
                except CelRuntimeError as e:
                    return ("error", by_class, i, "runtime", str(e))
            else:
                out.append(d)
        return tuple(out)

    def candidates(self, c: ClaimState, alt: Alt) -> tuple[Candidate, ...]:
        """``selected`` less the devices whose taints the request does not tolerate or whose
        capacity can never give what it asks (cached per node)."""
        spec = alt.spec
        key = ("usable", spec.device_class.name, spec.device_class.selectors, spec.selectors, spec.tolerations,
               tuple(sorted(alt.asked.items())))
        hit = self.devices.memo.get(key)
        if hit is None:
            hit = tuple(d for d in self.selected(c, alt)
                        if d.tolerated_by(spec.tolerations) and fit(d, alt.asked, None, None) is not None)
            self.devices.remember(key, hit)
        return hit

    def _all_devices(self, c: ClaimState, alt: Alt) -> None:
        for p in self.devices.pools:
            state = "currently being updated" if p.incomplete else "currently invalid" if p.invalid else ""
            if state:
                name = alt.full_name.rpartition("/")[2]
                raise Fatal(why.error(f"claim {c.ref}, request {name}: asks for all devices, but resource pool "
                                       f"{p.name} is {state}", claim=c.ref, request=alt.full_name))
        alt.devices = tuple(d for d in self.selected(c, alt) if fit(
            d, alt.asked, self.usage.shared(d.key) if d.device.allow_multiple_allocations else None, None) is not None)
        alt.need = len(alt.devices)

    # --- the search ------------------------------------------------------------------------

    def claim(self, ci: int) -> bool:
        return ci == len(self.claims) or self.request(self.claims[ci], 0)

    def request(self, c: ClaimState, ri: int) -> bool:
        if ri == len(c.alts):
            return self.claim(c.position + 1)
        for alt in c.alts[ri]:
            if alt.need == 0 or len(c.picks) + alt.need > MAX_RESULTS:
                continue
            c.chosen[ri] = alt
            if self._alt(c, ri, alt):
                return True
        c.chosen[ri] = None
        return False

    def _alt(self, c: ClaimState, ri: int, alt: Alt) -> bool:
        def more() -> bool:
            return self.request(c, ri + 1)

        if alt.devices is None:
            alt.devices = self.candidates(c, alt)
        devices = alt.devices
        if alt.all:
            return self._together(c, alt, range(len(devices)), devices, more, must=True)
        if self.ranking is not None and self.ranking.ranks(devices):
            free = [d for d in devices if self._allowed(c, alt, d, False) is not None]
            orders = self.ranking.orders(free, alt.need)
            if orders is not None:
                return any(self._together(c, alt, combo, free, more) for combo in orders)
        return self._slots(c, alt, devices, 0, alt.need, more)

    def _slots(self, c: ClaimState, alt: Alt, devices: tuple[Candidate, ...], start: int, left: int,
               more: Callable[[], bool]) -> bool:
        """Upstream's order: combinations of the request's devices, in device order."""
        if left == 0:
            return more()
        for i in range(start, len(devices) - left + 1):
            pick = self._take(c, alt, devices[i])
            if pick is None:
                continue
            if self._slots(c, alt, devices, i + 1, left - 1, more):
                return True
            self._give_back(c, pick)
        return False

    def _together(self, c: ClaimState, alt: Alt, positions: Iterable[int], devices: Sequence[Candidate],
                  more: Callable[[], bool], *, must: bool = False) -> bool:
        taken: list[Pick] = []
        for pos in positions:
            pick = self._take(c, alt, devices[pos], must=must)
            if pick is None:
                break
            taken.append(pick)
        else:
            if more():
                return True
        for pick in reversed(taken):
            self._give_back(c, pick)
        return False

    def could(self, c: ClaimState, alt: Alt, d: Candidate) -> bool:
        """Could ``d`` be picked for ``alt`` now (nothing changes)?"""
        pick = self._take(c, alt, d)
        if pick is not None:
            self._give_back(c, pick)
        return pick is not None

    def _allowed(self, c: ClaimState, alt: Alt, d: Candidate, must: bool) -> tuple[dict[str, int] | None, bool] | None:
        """Rules 1, 3 (for All), 4 and 5 for ``d`` now: None, or (capacity a shared device
        gives, whether the pick makes the device allocated)."""
        key, spec = d.key, alt.spec
        shared = d.device.allow_multiple_allocations
        holders = self.picked.get(key)
        if spec.admin_access:
            if not shared and holders and c.index in holders:
                return None
        elif holders or self.usage.exclusive(key):
            return None
        if must and not d.tolerated_by(spec.tolerations):
            return None
        consumed = None
        if shared:
            consumed = fit(d, alt.asked, self.usage.shared(key), self.giving.get(key))
            if consumed is None:
                return None
        activate = not self.active.get(key) and not self.usage.allocated(key)
        if activate and d.consumes and not self._counters_fit(d):
            return None
        return consumed, activate

    def _take(self, c: ClaimState, alt: Alt, d: Candidate, *, must: bool = False) -> Pick | None:
        """Pick ``d`` for ``alt`` if every rule allows it, updating the scratch state."""
        self.steps_left -= 1
        if self.steps_left < 0:
            raise Fatal(why.error(f"node {self.devices.node}: timed out trying to allocate devices"))
        allowed = self._allowed(c, alt, d, must)
        if allowed is None:
            return None
        consumed, activate = allowed
        key, spec = d.key, alt.spec
        added = cons.add(c.constraints, d, alt.request, alt.full_name)
        if added is None:
            if must and self.constraint_error is None:
                self.constraint_error = why.error(
                    f"claim {c.ref}, request {alt.full_name.rpartition('/')[2]}: cannot add device "
                    f"{'/'.join(key)} because a claim constraint would not be satisfied",
                    claim=c.ref, request=alt.full_name)
            return None
        if activate and d.consumes:
            used = self.counting.setdefault(key[:2], {})
            for ck, v in d.consumes:
                used[ck] = used.get(ck, 0) + v
        if consumed is None:
            self.picked.setdefault(key, []).append(c.index)
        else:
            giving = self.giving.setdefault(key, {})
            for name, v in consumed.items():
                giving[name] = giving.get(name, 0) + v
        self.active[key] = self.active.get(key, 0) + 1
        pick = Pick(alt.request, alt.full_name, spec, d, consumed, activate, added)
        c.picks.append(pick)
        return pick

    def _counters_fit(self, d: Candidate) -> bool:
        pool = d.key[:2]
        left = self.left.get(pool)
        if left is None:
            left = self.left[pool] = {}
        trying = self.counting.get(pool) or {}
        for ck, v in d.consumes:
            have = left.get(ck)
            if have is None:  # what the counter holds less what usage takes, once per search
                have = left[ck] = self.pools[pool].counters.get(ck, 0) - self.usage.counters(*pool).get(ck, 0)
            if have - trying.get(ck, 0) < v:
                return False
        return True

    def _give_back(self, c: ClaimState, pick: Pick) -> None:
        d = pick.device
        key = d.key
        c.picks.pop()
        cons.remove(pick.constraints or [])
        self.active[key] -= 1
        if pick.consumed is None:
            self.picked[key].pop()
        else:
            giving = self.giving[key]
            for name, v in pick.consumed.items():
                giving[name] -= v
        if pick.activated and d.consumes:
            used = self.counting[key[:2]]
            for ck, v in d.consumes:
                used[ck] -= v

    # --- the answer -----------------------------------------------------------------------------

    def allocation(self, pod: list[tuple[str, ClaimSpec]]) -> Allocation:
        done = {c.index: c for c in self.claims}
        by_key = self.devices.by_key
        out = []
        every: set[int] = set()
        for i, (pod_claim, spec) in enumerate(pod):
            state = done.get(i)
            if state is None:
                assert spec.allocation is not None
                allocation, allocated = spec.allocation, False
                used = [by_key[k] for r in allocation.devices if (k := (r.driver, r.pool, r.device)) in by_key]
            else:
                chosen = [a for a in state.chosen if a is not None]
                allocation = claim_allocation(spec, state.picks, [a.spec for a in chosen],
                                              [a.full_name for a in chosen], self.devices.node)
                allocated = True
                used = [p.device for p in state.picks]
            gpus = self.ranking.gpus(used) if self.ranking is not None else ()
            every.update(gpus)
            out.append(ClaimAllocated(claim=spec.key, pod_claim=pod_claim, allocation=allocation,
                                      allocated=allocated, extended=spec.extended, gpus=gpus))
        return Allocation(node=self.devices.node, claims=tuple(out), gpus=tuple(sorted(every)))
