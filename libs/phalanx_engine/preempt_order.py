"""How the preemption planner judges one victim set: the engine's decision for the preemptor on
the cluster without the victims (``Trials``), how good that placement is (``placement_rank``)
and the plan order (``plan_order``). Pure; used by ``preempt_search`` for every set it tries,
and by the brute-force test as the definition of "best placement".
"""

from __future__ import annotations

import dataclasses
import functools
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence

from phalanx_engine.decide import Cluster, decide
from phalanx_engine.framework import Member, Profile
from phalanx_engine.gpu_plugins import GpuTopology
from phalanx_engine.nodestate import NodeState
from phalanx_engine.snapshot import Decision
from phalanx_engine.status import NoFit
from phalanx_engine.topology import TIERS
from phalanx_proto.events import MemberSpec, pod_key
from phalanx_rules.preemption import RunningGang

Cost = tuple[int, int, int]
"""(highest victim priority, queue units evicted, gangs evicted): smaller is cheaper."""


@functools.total_ordering
class Desc:
    """A value that sorts larger first inside an ascending key."""

    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Desc) and self.value == other.value

    def __lt__(self, other: Desc) -> bool:
        return self.value > other.value  # type: ignore[operator]  # values of one key position compare

    def __hash__(self) -> int:
        return hash(self.value)


def plan_order(cost: Cost, rank: tuple, gpu_seconds: float, gang_ids: tuple[str, ...]) -> tuple:
    """The plan order, smallest first: the cost, then the best placement (``placement_rank``),
    then the fewest GPU-seconds of work lost, then the victims' sorted gang ids."""
    return (cost, Desc(rank), gpu_seconds, gang_ids)


_TOPOLOGY = GpuTopology()


def placement_rank(cluster: Cluster, decision: Decision, members: Sequence[MemberSpec]) -> tuple:
    """How good a placement is, larger better, by the engine's own topology ranking: the
    smallest network tier that holds every member (one node, HyperNode, leaf switch,
    network-pod), then each member's GPU set as the ``GpuTopology`` score ranks it (RDMA
    level, slowest pair link, link sum), worst member first, then fewer nodes."""
    by_pod = {pod_key(m.pod): Member.of(m) for m in members}
    names = {a.node for a in decision.assignments}
    tier, _ = cluster.topology.tier_of(names)
    scores = sorted(_TOPOLOGY.score(by_pod[pod_key(a.pod)], cluster.nodes[a.node], a) for a in decision.assignments)
    return (-(*TIERS, "cluster").index(tier), tuple(scores), -len(names))


class Trials:
    """The engine's decision for the preemptor on the cluster without a set of gangs' pods:
    the only test of whether a victim set helps. Works on its own shallow copy of the cluster
    (the caller's is never changed): a node a set touches is rebuilt from its view without the
    victims' reservations for the decision and put back after it. Assumes, as placement's cache
    keeps them, that each node's state is built from its view."""

    def __init__(self, cluster: Cluster, members: tuple[MemberSpec, ...], profile: Profile,
                 avoid: Collection[str], gangs: Mapping[str, RunningGang]) -> None:
        self.scratch = cluster.copy()
        self.members, self.profile, self.avoid, self.gangs = members, profile, frozenset(avoid), gangs
        self.done: dict[frozenset[str], Decision | None] = {}
        self.calls = 0

    def decide(self, victims: frozenset[str]) -> Decision | None:
        """The preemptor's placement once ``victims`` are gone, or None (remembered per set)."""
        if victims not in self.done:
            self.calls += 1
            got = self._without(victims, lambda: decide(self.scratch, self.members, self.profile, explain=False,
                                                        avoid=self.avoid))
            self.done[victims] = got if isinstance(got, Decision) else None
        return self.done[victims]

    def explain(self, victims: frozenset[str]) -> Decision | NoFit:
        """The engine's full answer once ``victims`` are gone (with every node's status)."""
        return self._without(victims, lambda: decide(self.scratch, self.members, self.profile, avoid=self.avoid))

    def rank(self, decision: Decision) -> tuple:
        return placement_rank(self.scratch, decision, self.members)

    def _without(self, victims: frozenset[str], run: Callable[[], Decision | NoFit]) -> Decision | NoFit:
        gone: dict[str, set[str]] = defaultdict(set)
        for g in victims:
            for a in self.gangs[g].assignments:
                gone[a.node].add(pod_key(a.pod))
        saved = []
        try:
            for node, pods in sorted(gone.items()):
                st = self.scratch.nodes.get(node)
                if st is None:
                    continue
                keep = tuple(a for a in st.view.allocations if pod_key(a.pod) not in pods)
                saved.append(st)
                self.scratch.put(NodeState(dataclasses.replace(st.view, allocations=keep)))
            return run()
        finally:
            for st in saved:
                self.scratch.put(st)
