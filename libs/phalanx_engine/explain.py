"""Why a gang found no place: every node's status per kind of member, and whether waiting can
ever help (``NoFit.resolvable``, the fairness gate's input) — computed from the statuses, not
from a second decision on an emptied cluster.

Called by ``decide`` only when it places nothing. Members with the same request (``shape``)
are one kind; each kind is tried alone on every node of the unchanged cluster. A node that
refuses it keeps its status; a node that would take it alone is one the gang as a whole could
not use (its members did not fit together in one network domain), and says so.

Resolvable: every kind has a node that takes it now or whose refusal is resolvable, and some
network-pod holds, on such nodes, at least the whole GPUs the gang needs (counting every GPU
not in MIG mode). That is a necessary condition, not a packing: a gang that passes it may
still never fit when only the bin packing fails, and then it waits like any other.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from phalanx_engine import podaffinity
from phalanx_engine.framework import Member, Profile
from phalanx_engine.nodestate import NodeState
from phalanx_engine.status import Code, MemberFailure, NoFit, Status, refuse, statuses_of
from phalanx_proto.events import MemberSpec, RequestKind

GANG_PLUGIN = "GangDomain"
KEPT_PLUGIN = "QueueOrder"
R_KEPT = "kept for a gang ahead in the queue"


def describe(spec: MemberSpec) -> str:
    """A member's GPU request in a few words: ``2 GPUs``, ``a 30% / 4096 MiB share of 1 GPU``,
    ``claim team/quad``."""
    gpus = _gpus(spec)
    if not spec.claims:
        return gpus or "no GPU"
    names = ", ".join(f"{pc.claim.namespace}/{pc.claim.name}" for pc in spec.claims[:3])
    claims = f"claim{'s' if len(spec.claims) > 1 else ''} {names}{' …' if len(spec.claims) > 3 else ''}"
    return f"{gpus} and {claims}" if gpus else claims


def _gpus(spec: MemberSpec) -> str:
    match spec.kind:
        case RequestKind.WHOLE:
            return f"{spec.gpus} GPU{'s' if spec.gpus != 1 else ''}"
        case RequestKind.TDM:
            parts = [p for p in (f"{spec.core_pct}%" if spec.core_pct else "",
                                 f"{spec.memory_mib} MiB" if spec.memory_mib else "") if p]
            n = max(1, spec.gpus)
            return f"a {' / '.join(parts)} share of {n} GPU{'s' if n != 1 else ''}"
        case RequestKind.MIG:
            return f"a {spec.mig_slices}-slice MIG instance"
    return ""


def _shapes(members: Sequence[Member]) -> list[list[Member]]:
    groups: dict[tuple, list[Member]] = {}
    for m in members:  # labels too where pod (anti-)affinity may tell members apart by them
        labels = tuple(sorted(m.spec.labels.items())) if podaffinity.relevant(m.spec) else ()
        groups.setdefault((m.shape, m.spec.pod.namespace, labels), []).append(m)
    return list(groups.values())


def no_fit(profile: Profile, nodes: dict[str, NodeState], excluded: dict[str, Status], total: int,
           members: Sequence[Member], domains: Iterable[Collection[str]], detail: str = "",
           avoid: Collection[str] = frozenset()) -> NoFit:
    """The ``NoFit`` of ``members``: per kind, every node's status; ``domains`` are the
    network-pods (collections of node names) the resolvability check may use. A node in ``avoid``
    that would take a kind (or refuses it resolvably) shows as kept for a gang ahead."""
    kept = refuse(KEPT_PLUGIN, Code.KEPT_FOR_GANG_AHEAD, R_KEPT, resolvable=True)
    failures, could_by_kind, alone_anywhere = [], [], True
    for group in _shapes(members):
        first = group[0]
        statuses, could, alone = dict(excluded), set(), []
        for name, st in nodes.items():
            got = profile.evaluate(first, st)
            if name in avoid and (not isinstance(got, Status) or got.resolvable):
                statuses[name] = kept
                could.add(name)
            elif isinstance(got, Status):
                statuses[name] = got
                if got.resolvable:
                    could.add(name)
            else:
                alone.append(name)
                could.add(name)
        if alone:
            text = (f"cannot hold the gang's {len(members)} members within one network-pod" if len(members) > 1
                    else "cannot hold the member")
            gang = refuse(GANG_PLUGIN, Code.GANG_DOMAIN, text, resolvable=True)
            statuses.update(dict.fromkeys(alone, gang))
        else:
            alone_anywhere = False
        more = f" and {len(group) - 1} more" if len(group) > 1 else ""
        failures.append(MemberFailure(members=tuple(m.spec.pod for m in group), statuses=statuses_of(statuses),
                                      what=f"{first.spec.pod.name}{more} ({describe(first.spec)})"))
        could_by_kind.append((group, could))
    resolvable = _resolvable(nodes, members, could_by_kind, domains)
    return NoFit(total_nodes=total, failures=tuple(failures), detail=detail if alone_anywhere else "",
                 resolvable=resolvable)


def _resolvable(nodes: dict[str, NodeState], members: Sequence[Member],
                could_by_kind: list[tuple[list[Member], set[str]]], domains: Iterable[Collection[str]]) -> bool:
    if any(not could for _, could in could_by_kind):
        return False
    need = sum(m.units for m in members)
    whole_nodes = set().union(*(could for group, could in could_by_kind if group[0].units))
    for domain in domains:
        names = set(domain)
        if not all(could & names for _, could in could_by_kind):
            continue
        if sum(nodes[n].whole_capacity() for n in names & whole_nodes) >= need:
            return True
    return False
