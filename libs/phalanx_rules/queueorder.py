"""The queue rules of a scheduling cycle, pure (docs/queues.md, "Order and fair share"): which
queue a pod is in, whether a gang's queue lets it be placed, the order of a cycle, and when a
gang that would borrow must leave the free GPUs to a queue below its quota.

Called by placement (``services/phalanx_placement/queues.py`` reads its cache — the queue tree,
the ledgers' units, the usage records, the gang records — and calls these), by gang-coordinator
(``queuebook``: which queue a pod is in, whether a queue is below its quota) and by
``phalanx sim`` (its own books, the same calls). Amounts are queue units
(``phalanx_proto.queues``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from phalanx_proto.events import MemberSpec
from phalanx_proto.kubeapi import QUEUE_LABEL
from phalanx_proto.queues import DEFAULT_QUEUE, units_of_member
from phalanx_proto.state import GangState
from phalanx_proto.vocab import ASKING
from phalanx_rules.queues import QueueTree, fair_shares, over_limit
from phalanx_rules.queues import rank as queue_rank


def queue_of(members: Iterable[MemberSpec]) -> str:
    """The queue a gang's members name (gang-coordinator admits a gang only when they agree)."""
    for m in members:
        if m.queue:
            return m.queue
    return DEFAULT_QUEUE


def units(members: Iterable[MemberSpec]) -> int:
    return sum(units_of_member(m) for m in members)


def resolve(tree: QueueTree, namespace: str, pod_labels: Mapping[str, str],
            namespace_labels: Mapping[str, str]) -> tuple[str, str]:
    """(the pod's queue, why it may not be in it — "" when it may): its label, else its
    namespace's, else ``default``; the queue must exist, be usable and select the namespace."""
    queue = pod_labels.get(QUEUE_LABEL) or namespace_labels.get(QUEUE_LABEL) or DEFAULT_QUEUE
    problem = tree.problem(queue)
    if problem:
        return queue, problem
    spec = tree.specs[queue]
    if spec.namespace_selector is not None and not spec.namespace_selector.matches(dict(namespace_labels)):
        return queue, (f"queue {queue} does not admit pods of namespace {namespace} (its "
                       "spec.namespaceSelector does not select the namespace's labels)")
    return queue, ""


def refusal(tree: QueueTree, members: tuple[MemberSpec, ...], limited_held: Mapping[str, int],
            releasing: Mapping[str, int] | None = None, *, placed: int | None = None) -> str:
    """Why the gang may not be placed now for its queue ("" when it may): its queue does not
    exist or is invalid, or its units would pass a limit on the queue's chain. ``limited_held``:
    units each limited queue holds; ``releasing``: units per queue the same commit gives back;
    ``placed``: the units a decision actually gives the gang, when more than its members say
    (GPUs its ResourceClaims got: known only once they are allocated, docs/dra.md)."""
    queue = queue_of(members)
    problem = tree.problem(queue)
    if problem:
        return problem
    asked = units(members) if placed is None else max(units(members), placed)
    return over_limit(tree, queue, limited_held, asked, releasing)


def borrowing(tree: QueueTree, members: tuple[MemberSpec, ...], held: Mapping[str, int],
              releasing: int = 0) -> bool:
    """Would placing the gang put its queue above its quota?"""
    queue = queue_of(members)
    spec = tree.get(queue)
    if spec is None:
        return False
    return held.get(queue, 0) - releasing + units(members) > spec.quota


def below_quota(tree: QueueTree, held: Mapping[str, int], queue: str) -> bool:
    """The queue exists and holds less than its quota (``held``: units, its subtree included)."""
    spec = tree.get(queue)
    return spec is not None and held.get(queue, 0) < spec.quota


def asking(s: GangState, reserved: Callable[[GangState], bool]) -> bool:
    """The gang asks for GPUs it does not hold yet (``vocab.ASKING``; a ``placing`` gang only
    until its reservation is in: ``reserved``, asked only then)."""
    return s.phase in ASKING and bool(s.members) and not (s.phase == "placing" and reserved(s))


def waiting_units(states: Iterable[GangState], reserved: Callable[[GangState], bool]) -> dict[str, int]:
    """Units each queue's gangs that ask for GPUs ask for (all their members): the demand a
    queue's fair share counts beside what it holds."""
    out: dict[str, int] = {}
    for s in states:
        if asking(s, reserved):
            q = queue_of(s.members)
            out[q] = out.get(q, 0) + units(s.members)
    return out


def owed_candidate(s: GangState, reserved: Callable[[GangState], bool]) -> bool:
    """The gang may make its queue owed free GPUs: it asks for GPUs, has tried at least once,
    and could fit the empty cluster."""
    return asking(s, reserved) and s.attempt >= 1 and s.fits_empty_cluster


def borrow_reason(queue: str, owed_queues: Iterable[str]) -> str:
    """Why a gang that would borrow waits: the free GPUs are kept for queues below their quota."""
    return (f"queue {queue} would borrow beyond its quota, and the GPUs free now are kept for queue(s) "
            f"{', '.join(owed_queues)}, below quota, whose gangs wait for them")


def owed_candidates(tree: QueueTree, held: Mapping[str, int],
                    waiting: Iterable[tuple[str, tuple[MemberSpec, ...]]]) -> list[tuple[str, tuple[MemberSpec, ...]]]:
    """Of ``waiting`` (queue, members) — gangs that tried at least once, wait, and fit the
    empty cluster — those of queues below their quota (none when no queue has a quota): what a
    cycle notes once, for ``owed``."""
    if not any(spec.quota for spec in tree.specs.values()):
        return []
    out = []
    for q, members in waiting:
        spec = tree.get(q)
        if spec is not None and held.get(q, 0) < spec.quota:
            out.append((q, members))
    return out


def owed(tree: QueueTree, queue: str, candidates: list[tuple[str, tuple[MemberSpec, ...]]],
         fits: Callable[[tuple[MemberSpec, ...]], bool], memo: dict[int, bool] | None = None) -> tuple[str, ...]:
    """The queues below their quota, outside ``queue``'s line of the tree, with a waiting gang
    that ``fits`` the cluster now (``memo``: each candidate decided at most once a cycle)."""
    memo = {} if memo is None else memo
    line = set(tree.chain(queue))
    found: set[str] = set()
    for i, (q, members) in enumerate(candidates):
        if q in found or line & set(tree.chain(q)):
            continue
        if i not in memo:
            memo[i] = fits(members)
        if memo[i]:
            found.add(q)
    return tuple(sorted(found))


def shares_and_ranks(tree: QueueTree, held: Mapping[str, int], waiting_units: Mapping[str, int],
                     capacity: int, recent: Mapping[str, float] | None = None) -> tuple[dict[str, int], dict[str, float]]:
    """Each queue's fair share of ``capacity`` and its distance from it (lower goes first):
    a queue's demand is what its own gangs hold (``held`` counts a queue's subtree) plus what
    its waiting gangs ask (``waiting_units``); ``recent``: each queue's recent GPUs, which
    weigh its part beyond the quotas (``usage``; None: the plain weights)."""
    demand: dict[str, int] = {}
    for q in tree.specs:
        own = held.get(q, 0) - sum(held.get(c, 0) for c in tree.children.get(q, ()))
        demand[q] = own + waiting_units.get(q, 0)
    shares = fair_shares(tree, demand, capacity, recent)
    return shares, {q: queue_rank(q, held, shares) for q in tree.specs}


def cycle_key(rank: float, priority: int, arrival: int) -> tuple[float, int, int]:
    """The order a scheduling cycle takes requests in: the queue furthest below its fair share
    first, then higher priority, then earlier arrival."""
    return (rank, -priority, arrival)
