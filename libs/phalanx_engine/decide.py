"""Topology-aware gang placement: the engine the placement service, the simulator and the
benchmarks call. Pure: a ``Cluster`` (scratch state built from a ``Snapshot``), a gang's
members and a ``Profile`` of plugins in; a ``Decision`` or a ``NoFit`` with every node's
status out.

Overview (docs/placement.md has the full objective):

1. **Usable nodes**: a node that is not enabled or whose heartbeat is stale is left out when
   the cluster is built, with its status.
2. **Single member**: candidate nodes are visited from the tightest (fewest free whole GPUs
   that still suffice) upwards; the profile's filters and the member kind's allocator run on
   each; the first ``CANDIDATES`` that fit (``PREFERRING_CANDIDATES`` for a member with
   preferences over other pods) are compared by the profile's scores (GPU set quality,
   preferred pod (anti-)affinity, soft spread, TDM tightness, best fit), then by name.
3. **Gang**: domains of the network tiers, smallest first (node, HyperNode, leaf switch,
   network-pod; the wider ones from the cluster's topology index); at each, the domain
   filters prune (free whole GPUs against the need), the rest are tried tightest first,
   packing members (largest first) onto the fewest nodes; the first domain that holds every
   member wins: all or nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Collection, Iterable, Iterator

from phalanx_engine import claims as dra_claims
from phalanx_engine import gpu_plugins as gpu
from phalanx_engine import podaffinity
from phalanx_engine.candidates import candidate, checks_resources
from phalanx_engine.claims import Claims, ComputeDomainClique
from phalanx_engine.cluster import Cluster, room_for
from phalanx_engine.explain import no_fit
from phalanx_engine.framework import (
    ALL_KINDS,
    Allocate,
    ClaimsStep,
    DomainFilter,
    Filter,
    Member,
    Profile,
    Score,
    collecting_node_errors,
)
from phalanx_engine.kube_plugins import kube_filters, kube_scores
from phalanx_engine.nodestate import NodeState
from phalanx_engine.packing import ShapeMix, StrandingScore
from phalanx_engine.snapshot import Decision, Snapshot
from phalanx_engine.status import NoFit, Status
from phalanx_engine.topology import TIER_NAMES, TIERS
from phalanx_proto.events import Assignment, MemberSpec, RequestKind

CANDIDATES = 8
"""Feasible nodes compared in detail for one member (bounds the decision time)."""
PREFERRING_CANDIDATES = 100
"""... for a member with preferences over other pods (preferred pod (anti-)affinity,
``ScheduleAnyway`` spread), whose best node may be far down the packing order (kube-scheduler
scores at least 100 feasible nodes too)."""
SHARE_CANDIDATES = 64
"""Feasible nodes at the tightest free-core level compared for one TDM share."""


def default_profile(*, require_node_state: bool = True, mix: ShapeMix | None = None) -> Profile:
    """The placement policy: kube-scheduler's filters in its order (the GPU filters where its
    NodeResourcesFit checks device resources), the allocator per request kind, and the scores
    GPU-set quality, preferred pod (anti-)affinity, soft spread, TDM tightness, best fit — in
    that order; members' ResourceClaims allocated
    by the claims step (docs/dra.md). ``require_node_state=False``
    lets nodes without a reported ``NodeKubeState`` through the Kubernetes filters unchecked
    (``Decision.unchecked`` names them). ``mix``: the workload FGD's fragmentation in the
    packing score is measured against (none: CPU stranding alone)."""
    # Each plugin is registered under its protocol's type: the type checker (make lint) holds
    # every one to its extension point here, as kube-scheduler's compiler holds its plugins.
    whole, tdm, migs = gpu.WholeGpus(), gpu.TdmShare(), gpu.MigSlice()
    *kube, refused = kube_filters(require_node_state)
    filters: tuple[Filter, ...] = (*kube, gpu.GpuPresent(), gpu.GpuVendor(), gpu.RdmaNic(), whole, tdm, migs, refused)
    allocators: dict[RequestKind, Allocate] = {RequestKind.WHOLE: whole, RequestKind.TDM: tdm, RequestKind.MIG: migs,
                                               RequestKind.NONE: gpu.NoGpu()}
    scores: tuple[Score, ...] = (gpu.GpuTopology(), *kube_scores(), gpu.TdmTightness(),
                                 StrandingScore(mix, kinds=ALL_KINDS), gpu.FewestFreeGpus())
    domain_filters: tuple[DomainFilter, ...] = (gpu.GangGpuCapacity(), ComputeDomainClique())
    claims: ClaimsStep = Claims()
    return Profile(filters=filters, allocators=allocators, scores=scores, domain_filters=domain_filters,
                   claims=claims)


DEFAULT_PROFILE = default_profile()


def _place_one(profile: Profile, states: dict[str, NodeState], member: Member,
               order: Iterable[str], avoid: Collection[str]) -> Assignment | None:
    """The best node for one member among ``order`` (tightest first) but ``avoid``; nothing is changed."""
    best = None
    seen = 0
    gate = checks_resources(profile, member)
    enough = PREFERRING_CANDIDATES if podaffinity.ranks_by_pods(member.spec) else CANDIDATES
    for name in order:
        if name in avoid:
            continue
        cand = candidate(profile, member, states[name], gate)
        if cand is None:
            continue
        if best is None or cand[0] > best[0]:
            best = cand
        seen += 1
        if seen >= enough:
            break
    return None if best is None else best[1]


def _place_share(profile: Profile, cluster: Cluster, member: Member, avoid: Collection[str]) -> Assignment | None:
    """A TDM share: free-core levels from the tightest up; every node at the first level where
    one fits is compared by the profile's scores (the tightest GPU anywhere wins, the node
    score decides among equally tight ones), at most ``SHARE_CANDIDATES`` of them."""
    best, seen, found = None, set(), 0
    gate = checks_resources(profile, member)
    for names in cluster.tightest_shares(member.spec.core_pct, room_for(profile, member)):
        for name in names:
            if name in seen or name in avoid:
                continue
            seen.add(name)
            cand = candidate(profile, member, cluster.nodes[name], gate)
            if cand is None:
                continue
            if best is None or cand[0] > best[0]:
                best = cand
            found += 1
            if found >= SHARE_CANDIDATES:
                return best[1]
        if best is not None:
            return best[1]
    return None


def decide(cluster: Cluster, members: tuple[MemberSpec, ...], profile: Profile = DEFAULT_PROFILE, *,
           explain: bool = True, avoid: Collection[str] = frozenset(), loosest: str = "netpod") -> Decision | NoFit:
    """Place every member or none. ``cluster`` is not modified. With ``explain=False`` a
    ``NoFit`` carries no per-node statuses (and says resolvable): for callers that only need
    the answer, such as a simulation placing thousands of pods.

    ``avoid``: nodes this decision must leave alone (kept for a gang ahead in the queue,
    docs/saga.md). The ``NoFit`` shows them as ``kept for a gang ahead in the queue`` where
    they would otherwise take the member, and they count for ``NoFit.resolvable``: they are
    busy, not unsuitable.

    ``loosest``: the widest network tier a gang may span (one of ``TIERS``); R8's rule, and the
    default, is one network-pod. The counterfactual probes (``whatif``) pass a tighter one.

    A node a plugin raises on is refused alone; the result names it, once (``node_errors``)."""
    with collecting_node_errors() as errors, _claims_trial(cluster, members), \
            podaffinity.trial(cluster.affinity_pods()):
        result = _decide(cluster, members, profile, explain, avoid, loosest)
    return dataclasses.replace(result, node_errors=tuple(dict.fromkeys(errors))) if errors else result


def decide_within(cluster: Cluster, members: tuple[MemberSpec, ...], profile: Profile = DEFAULT_PROFILE, *,
                  inside: Collection[str] | None, required: bool, avoid: Collection[str] = frozenset()) -> Decision | NoFit:
    """``decide`` on the nodes ``inside`` only (a repair's domain, or the nodes a restarted gang
    ran on); when that does not fit and the scope is not ``required``, on the whole cluster.
    ``inside`` None: the whole cluster. Placement decides so, and ``phalanx sim --replay``
    decides a logged decision so again."""
    if inside is None:
        return decide(cluster, members, profile, avoid=avoid)
    outside = frozenset(cluster.nodes) - frozenset(inside)
    result = decide(cluster, members, profile, avoid=frozenset(avoid) | outside)
    if isinstance(result, NoFit) and not required:
        result = decide(cluster, members, profile, avoid=avoid)
    return result


@contextlib.contextmanager
def _claims_trial(cluster: Cluster, members: tuple[MemberSpec, ...]) -> Iterator[None]:
    """The decision's DRA state (``claims.Trial``) when any member has ResourceClaims."""
    if not any(m.claims for m in members):
        yield
        return
    with dra_claims.trial(dra_claims.Trial(cluster.dra_usage().copy())):
        yield


def _decide(cluster: Cluster, members: tuple[MemberSpec, ...], profile: Profile, explain: bool,
            avoid: Collection[str], loosest: str) -> Decision | NoFit:
    if not members:
        return Decision(assignments=())
    avoid = frozenset(avoid)
    gang = [Member.of(m) for m in members]
    if dra_claims.compute_domains(gang):
        # One NVLink clique: the gang path from the clique tier, whatever its size.
        tighter = TIERS[min(TIERS.index(loosest), TIERS.index("hypernode"))]
        return _decide_gang(profile, cluster, gang, explain, avoid, tighter, first="hypernode")
    if len(gang) == 1:
        m = gang[0]
        if m.kind is RequestKind.TDM:
            got = _place_share(profile, cluster, m, avoid)
        else:
            got = _place_one(profile, cluster.nodes, m, cluster.tightest(m.units, room_for(profile, m)), avoid)
        if got is None:
            return _no_fit(profile, cluster, gang, avoid=avoid) if explain else NoFit(total_nodes=cluster.total)
        return _decision(cluster, (got,))
    return _decide_gang(profile, cluster, gang, explain, avoid, loosest)


def _decision(cluster: Cluster, assignments: tuple[Assignment, ...]) -> Decision:
    unchecked = sorted({a.node for a in assignments if cluster.nodes[a.node].view.kube is None})
    return Decision(assignments=assignments, unchecked=tuple(unchecked))


def _domains(profile: Profile, cluster: Cluster, tier: str, need: int, members: list[Member],
             avoid: frozenset[str]) -> Iterator[list[NodeState]]:
    """The domains of ``tier`` the domain filters pass, fewest free whole GPUs first, then by
    name; one-node domains lazily from the free-GPU index (in that order, without nodes too
    small for the gang): a gang that fits on one node costs the nodes tried, not the cluster.
    Wider domains come from the topology index, ordered by its sums (less the avoided nodes');
    when the profile runs ``GangGpuCapacity`` the domains it would refuse (fewer free than
    ``need``) are passed over on the sums alone, and only the domains reached are listed."""
    def allowed(ns: list[NodeState]) -> bool:
        return all(f.filter_domain(members, ns) is None for f in profile.domain_filters)

    if tier == "node":
        for name in cluster.tightest(need):
            if name not in avoid and allowed(ns := [cluster.nodes[name]]):
                yield ns
        return
    floor = need if any(type(f) is gpu.GangGpuCapacity for f in profile.domain_filters) else 0
    ranked = sorted((free, d) for d, (free, _) in cluster.topology.sums(tier, avoid).items() if free >= floor)
    domains = cluster.topology.domains(tier)
    for _, d in ranked:
        if allowed(ns := [cluster.nodes[n] for n in domains[d] if n not in avoid]):
            yield ns


def _decide_gang(profile: Profile, cluster: Cluster, members: list[Member], explain: bool,
                 avoid: frozenset[str], loosest: str = "netpod", first: str = "node") -> Decision | NoFit:
    need = sum(m.units for m in members)
    tried_any = False
    order = {m.spec.pod: i for i, m in enumerate(members)}
    for level in range(dra_claims.alternatives(members)):
        # Level 0: every firstAvailable request as its pod prefers; a gang that does not fit so
        # is tried with every member's such requests from their next alternative on, and so on
        # (a gang of two each preferring a whole node fits as two halves: kubernetes#138765).
        trying = members if level == 0 else [Member.of(dra_claims.from_alternative(m.spec, level)) for m in members]
        ordered = sorted(trying, key=lambda m: (-m.units, -m.spec.gpus, str(m.spec.pod)))
        for tier in TIERS[TIERS.index(first):TIERS.index(loosest) + 1]:
            for domain in _domains(profile, cluster, tier, need, trying, avoid):
                tried_any = True
                got = _pack(profile, domain, ordered)
                if got is not None:
                    return _decision(cluster, tuple(sorted(got, key=lambda a: order[a.pod])))
    if not explain:
        return NoFit(total_nodes=cluster.total)
    where = TIER_NAMES[loosest]
    if need or not any(m.spec.claims for m in members):
        detail = (f"gang of {len(members)} members needs {need} whole GPU(s) in one {where}"
                  + ("" if tried_any else f"; no {where} has that many free"))
    else:
        detail = f"gang of {len(members)} members needs its ResourceClaims' devices in one {where}"
    if dra_claims.compute_domains(members):
        detail += " hosting no other ComputeDomain"
    return _no_fit(profile, cluster, members, detail, avoid)


def _no_fit(profile: Profile, cluster: Cluster, members: list[Member], detail: str = "",
            avoid: frozenset[str] = frozenset()) -> NoFit:
    netpods = cluster.topology.domains("netpod").values()
    return no_fit(profile, cluster.nodes, cluster.excluded, cluster.total, members, netpods, detail, avoid)


def _pack(profile: Profile, nodes: list[NodeState], members: list[Member]) -> list[Assignment] | None:
    """Members onto the fewest nodes of one domain, or None."""
    order = sorted(nodes, key=lambda s: (-len(s.free_whole()), s.name))
    outer = dra_claims.current()
    with contextlib.nullcontext() if outer is None else dra_claims.trial(outer.copy()) as t:
        got = _pack_in(profile, order, members)
        if got is not None and t is not None and outer is not None:
            outer.usage, outer.decided = t.usage, t.decided
        return got


def _pack_in(profile: Profile, order: list[NodeState], members: list[Member]) -> list[Assignment] | None:
    mark = podaffinity.mark()
    got = _pack_members(profile, order, members)
    if got is None:
        podaffinity.forget(mark)
    return got


def _pack_members(profile: Profile, order: list[NodeState], members: list[Member]) -> list[Assignment] | None:
    states: dict[str, NodeState] = {}
    start: dict[bytes, int] = {}
    """Per member shape, the first node that may still take it: a node that refused a shape
    refuses it for the rest of the pack (the pack only ever takes capacity). Not for a member
    pod (anti-)affinity may refuse nodes for: that verdict depends on the members placed so
    far and on the member's labels, which its shape leaves out."""
    out = []
    for m in members:
        placed = None
        skip = not podaffinity.relevant(m.spec)
        for i in range(start.get(m.shape, 0) if skip else 0, len(order)):
            base = order[i]
            st = states.get(base.name)
            if st is None:
                st = states[base.name] = base.copy()
            got = profile.evaluate(m, st)
            if not isinstance(got, Status):
                placed = got
                st.take(got)
                dra_claims.book(got)
                podaffinity.book(got, st.view.kube.labels if st.view.kube is not None else {})
                if skip:
                    start[m.shape] = i
                break
        if placed is None:
            return None
        out.append(placed)
    return out


def place_snapshot(snapshot: Snapshot, members: tuple[MemberSpec, ...], profile: Profile = DEFAULT_PROFILE, *,
                   avoid: Collection[str] = frozenset()) -> Decision | NoFit:
    """One-shot convenience: build the scratch state and decide (``avoid``: as ``decide``)."""
    return decide(Cluster.from_snapshot(snapshot), members, profile, avoid=avoid)
