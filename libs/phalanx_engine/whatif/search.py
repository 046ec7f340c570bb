"""The what-if probes that search for their smallest change: ``wait`` (which running
gangs must finish), ``model``, ``smaller`` and ``fewer``. Each step of a search is a decision
by the engine (``Probing.decide``), so an answer is always a placement that fits.

Minimal means, per probe (docs/whatif.md):

* ``wait``: in the domain chosen, no gang of the answer can stay: the gang does not fit with
  any one of them kept (every holder was tried, unless the budget or ``MAX_TRIM`` cut the trim:
  then ``minimal=False``). Domains are network-pods (a single pod: the nodes it could
  use), at most ``MAX_DOMAINS`` of them (twice as many nodes), fewest GPUs short first; the answer is the domain needing the fewest
  GPUs freed, then the fewest gangs.
* ``smaller``: for one request dimension, the largest value that fits, with one step more
  refused; ``fewer``: the most members that fit, with one more refused (binary searches, whose
  bounds are both decided).
* ``model``: the first other value of the GPU-model label the gang pins, most free GPUs first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import msgspec

from phalanx_engine import podaffinity
from phalanx_engine.framework import Member
from phalanx_engine.snapshot import Decision
from phalanx_engine.status import Status
from phalanx_engine.topology import TIER_NAMES, TIERS
from phalanx_engine.whatif.probing import Probing, busy_gpus, holders, names_text, where
from phalanx_proto.events import MemberSpec, PodRef, RequestKind
from phalanx_proto.kubeapi import GPU_MODEL_LABELS
from phalanx_proto.scheduling import CPU, MEMORY
from phalanx_proto.whatif import Answer, Holder

MAX_DOMAINS = 4
"""Domains the wait probe searches (the fewest GPUs short first)."""
MAX_TRIM = 32
"""Holders the wait probe tries to keep, the largest first; beyond, the answer is not proved minimal."""
STEPS = {CPU: 100, MEMORY: 128 << 20}
"""Search granularity of a request: 0.1 CPU, 128 MiB; every other resource by one."""


def largest_fitting(fits: Callable[[int], bool], low: int, high: int) -> int | None:
    """The largest v in [low, high) with fits(v), ``high`` being known not to fit; None when
    even ``low`` does not. Assumes fits is monotone (what is smaller fits more easily); the
    answer v fits and v + 1 (or ``high``) was decided not to."""
    lo, hi = low - 1, high
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo if lo >= low else None


# --- wait -----------------------------------------------------------------------------------


def probe_wait(p: Probing) -> list[Answer]:
    """Which GPUs must be free, and which running gangs hold them (module docstring): tiers
    from the tightest whose domains can hold the gang at all (a single pod: nodes) up to the
    loosest the gang may span, the first tier with an answer wins. Domains are ranked on the
    topology index's sums (less the avoided nodes'), without a pass over the nodes."""
    single = len(p.members) == 1
    need = sum(m.gpus for m in p.members if m.kind is RequestKind.WHOLE)
    first = Member.of(p.members[0])
    avoid = p.ctx.avoid
    for tier in ("node",) if single else TIERS[:TIERS.index(p.ctx.loosest) + 1]:
        domains = p.cluster.topology.domains(tier)
        ranked = sorted((max(0, need - free), d) for d, (free, capacity) in p.cluster.topology.sums(tier, avoid).items()
                        if capacity >= need)
        best: Answer | None = None
        tried = 0
        for short, d in ranked:
            if tried >= (2 * MAX_DOMAINS if single else MAX_DOMAINS) or (best is not None and best.gpus <= short):
                break  # no domain further down can need fewer GPUs freed than it lacks
            names = sorted(n for n in domains[d] if n not in avoid)
            if single and not _could(p, first, names[0]):
                continue  # a node the member can never use (a taint, a selector, too few GPUs)
            tried += 1
            got = _release_in(p, names)
            if got is not None and (best is None or (got.gpus, len(got.holders)) < (best.gpus, len(best.holders))):
                best = got
        if best is not None:
            return [best]
    return []


def _could(p: Probing, member: Member, name: str) -> bool:
    with podaffinity.trial(p.cluster.affinity_pods()):
        got = p.profile.evaluate(member, p.cluster.nodes[name])
    return not isinstance(got, Status) or got.resolvable


def _release_in(p: Probing, names: list[str]) -> Answer | None:
    """The fewest gangs holding capacity in one domain whose end lets the gang fit there."""
    by_node: dict[str, list[str]] = {}
    pods_of: dict[str, set[PodRef]] = {}
    for n in names:
        for a in p.cluster.nodes[n].view.allocations:
            g = p.holder(a.pod).gang_id
            by_node.setdefault(n, []).append(g)
            pods_of.setdefault(g, set()).add(a.pod)
    if not pods_of:
        return None  # nothing runs here: waiting cannot help in this domain

    def release(gangs: Iterable[str]) -> frozenset[PodRef]:
        return frozenset(pod for g in gangs for pod in pods_of[g])

    if p.decide(p.members, p.released(names, release(pods_of))) is None:
        return None  # even with every gang here gone it does not fit
    def busy(n: str) -> int:
        st = p.cluster.nodes[n]
        return len(st.gpus) - len(st.free_whole())

    order = sorted(names, key=lambda n: (busy(n), n))  # nearly free nodes first

    def prefix(k: int) -> set[str]:
        return {g for n in order[:k] for g in by_node.get(n, ())}

    k = largest_fitting(lambda k: p.decide(p.members, p.released(names, release(prefix(k)))) is None,
                        0, len(order))
    if k is None:
        return None  # it fits here as things are: what holds it back is not capacity
    chosen = prefix(k + 1)
    held = {g: sum(len(a.gpus) for n in names for a in p.cluster.nodes[n].view.allocations if a.pod in pods_of[g])
            for g in chosen}
    tried = sorted(chosen, key=lambda g: (-held[g], g))
    for g in tried[:MAX_TRIM]:
        if p.decide(p.members, p.released(names, release(chosen - {g}))) is not None:
            chosen = chosen - {g}
    fits = p.decide(p.members, p.released(names, release(chosen)))
    assert fits is not None, "releasing a superset of a fitting release must fit"
    pods = release(chosen)
    found = holders(p, pods, fits.assignments)
    gpus = busy_gpus(p.cluster, fits.assignments)
    at = where(p, fits)
    place = (f"on node {at['domain']}" if at["tier"] == "node"
             else f"in {TIER_NAMES.get(at['tier'], 'the cluster')} {at['domain']}".rstrip())
    if gpus:
        text = f"would start if {gpus} GPU{'s' if gpus != 1 else ''} free {place} (held by {_gangs(found)})"
    else:
        text = f"would start once {_gangs(found)} end{'s' if len(found) == 1 else ''} (what it needs {place})"
    return Answer(probe="wait", text=text, starts=p.queue_lets(p.members), gpus=gpus, holders=found,
                  minimal=len(tried) <= MAX_TRIM, assignments=fits.assignments, **at)


def _gangs(holders: tuple[Holder, ...]) -> str:
    return f"gang{'s' if len(holders) != 1 else ''} {names_text(holders)}"


# --- model ----------------------------------------------------------------------------------


def probe_model(p: Probing) -> list[Answer]:
    """Another value of a GPU-model label the gang's node selector pins (``GPU_MODEL_LABELS``)."""
    for key in GPU_MODEL_LABELS:
        asked = {m.node_selector[key] for m in p.members if key in m.node_selector}
        if not asked:
            continue
        free: dict[str, int] = {}
        for st in p.cluster.nodes.values():
            value = st.view.kube.labels.get(key) if st.view.kube is not None else None
            if value is not None and value not in asked:
                free[value] = free.get(value, 0) + len(st.free_whole())
        for value in sorted(free, key=lambda v: (-free[v], v)):
            members = tuple(msgspec.structs.replace(m, node_selector={**m.node_selector, key: value})
                            if key in m.node_selector else m for m in p.members)
            fits = p.starts(members)
            if fits is not None:
                was = ", ".join(sorted(asked))
                return [Answer(probe="model", text=f"would start on {key}={value} (it asks for {was})",
                               change=f"{key}={value}", assignments=fits.assignments, **where(p, fits))]
    return []


# --- smaller --------------------------------------------------------------------------------


def _dimensions(members: tuple[MemberSpec, ...]) -> list[tuple[str, int, int, int]]:
    """(dimension, largest value asked, smallest value allowed, step) of what can shrink."""
    out = []
    whole = [m.gpus for m in members if m.kind is RequestKind.WHOLE]
    if whole and max(whole) > 1:
        out.append(("gpus", max(whole), 1, 1))
    tdm = [m for m in members if m.kind is RequestKind.TDM]
    if tdm and max(m.core_pct for m in tdm) > 1:
        out.append(("core_pct", max(m.core_pct for m in tdm), 1, 1))
    if tdm and max(m.memory_mib for m in tdm) > 128:
        out.append(("memory_mib", max(m.memory_mib for m in tdm), 128, 128))
    for r in sorted({r for m in members for r in m.requests}):
        most = max(m.requests.get(r, 0) for m in members)
        if most > 0:
            out.append((r, most, 0, STEPS.get(r, 1)))
    return out


def _capped(members: tuple[MemberSpec, ...], dim: str, value: int) -> tuple[MemberSpec, ...]:
    out = []
    for m in members:
        if dim == "gpus" and m.kind is RequestKind.WHOLE:
            m = msgspec.structs.replace(m, gpus=min(m.gpus, value))
        elif dim in ("core_pct", "memory_mib") and m.kind is RequestKind.TDM:
            m = msgspec.structs.replace(m, **{dim: min(getattr(m, dim), value)})
        elif dim in m.requests:
            m = msgspec.structs.replace(m, requests={**m.requests, dim: min(m.requests[dim], value)})
        out.append(m)
    return tuple(out)


def probe_smaller(p: Probing) -> list[Answer]:
    """Per request dimension, the largest per-member value that starts the gang; the answers
    ordered by how much they cut (the smallest cut first)."""
    found = []
    for dim, most, low, step in _dimensions(p.members):
        hit: dict[int, Decision | None] = {}

        def fits(k: int, dim: str = dim, step: int = step, hit: dict[int, Decision | None] = hit) -> bool:
            hit[k] = p.starts(_capped(p.members, dim, k * step))
            return hit[k] is not None

        top = -(-most // step)  # the asked value, in steps (known not to fit)
        k = largest_fitting(fits, -(-low // step), top)
        if k is None:
            continue
        value = k * step
        found.append(((most - value) / most, dim, most, value, hit[k]))
    out = []
    for _, dim, most, value, got in sorted(found, key=lambda f: (f[0], f[1])):
        assert got is not None, "largest_fitting returns a value fits said yes to"
        text = f"would start with {_amount(dim, value)} per member instead of {_amount(dim, most)}"
        out.append(Answer(probe="smaller", text=text, change=f"{dim} {most} -> {value}",
                          assignments=got.assignments, **where(p, got)))
    return out


def _amount(dim: str, value: int) -> str:
    if dim == "gpus":
        return f"{value} GPU{'s' if value != 1 else ''}"
    if dim == "core_pct":
        return f"{value}% of a GPU's core"
    if dim == "memory_mib":
        return f"{value} MiB of GPU memory"
    if dim == CPU:
        return f"{value / 1000:g} CPU"
    if dim == MEMORY:
        return f"{value / (1 << 30):g} GiB of memory"
    return f"{value} {dim}"


# --- fewer ----------------------------------------------------------------------------------


def probe_fewer(p: Probing) -> list[Answer]:
    """The most members (the first ones, in the gang's order) that start now."""
    n = len(p.members)
    if n < 2:
        return []
    hit: dict[int, Decision | None] = {}

    def fits(k: int) -> bool:
        hit[k] = p.starts(p.members[:k])
        return hit[k] is not None

    k = largest_fitting(fits, 1, n)
    if k is None:
        return []
    got = hit[k]
    assert got is not None, "largest_fitting returns a value fits said yes to"
    return [Answer(probe="fewer", text=f"would start now with {k} of its {n} members", members=k,
                   assignments=got.assignments, **where(p, got))]
