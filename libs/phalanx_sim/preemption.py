"""Preemption in the simulator: the services' planner (``phalanx_engine.preempt``), asked as
placement asks it (``services/phalanx_placement/preemptions.py``) for a gang the engine could not
place, on the simulation's cluster and running gangs. Eviction takes no time here: the victims'
reservations go at once, each victim gang goes back to waiting as a rolled-back gang does (its
controller recreating it) and starts from the beginning when it is placed again, and the
preemptor starts on the plan's placement at the same instant (docs/whatif.md, "The model")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from phalanx_engine.decide import Cluster
from phalanx_engine.framework import Profile
from phalanx_engine.preempt import NoPlan, Plan, RunningGang, plan_preemption
from phalanx_proto.events import Assignment
from phalanx_proto.state import GangState
from phalanx_rules import preemption as rules
from phalanx_rules.preemption import Preemptor
from phalanx_rules.queues import QueueTree
from phalanx_sim.model import Outcome, SimConfig


class Derived(Protocol):
    def preemptor(self, s: GangState) -> Preemptor | None: ...


class Books(Protocol):
    """What preemption reads of the run (``loop.Simulation``)."""

    cluster: Cluster
    profile: Profile
    tree: QueueTree
    config: SimConfig
    derived: Derived
    held: Mapping[str, int]
    running: Mapping[str, tuple[Assignment, ...]]
    running_priorities: Mapping[str, Mapping[int, int]]
    outcomes: Mapping[str, Outcome]


def running(sim: Books, but: str) -> tuple[RunningGang, ...]:
    """Every running gang but ``but``, with its priority, its queue chain and when it started."""
    out = []
    for gang_id in sorted(sim.running):
        if gang_id == but:
            continue
        o = sim.outcomes[gang_id]
        queue = o.gang.queue
        out.append(RunningGang(gang_id=gang_id, assignments=sim.running[gang_id], priority=o.gang.priority,
                               queues=sim.tree.chain(queue) or (queue,), started_at=o.start))
    return tuple(out)


def worth_planning(sim: Books, s: GangState) -> bool:
    """Could any plan exist? The rulebook's cheap necessary condition (``preemption.may_preempt``,
    it only saves asking the planner), with preemption on in this run."""
    who = sim.derived.preemptor(s) if sim.config.preemption else None
    return who is not None and rules.may_preempt(who, sim.tree, sim.held, sim.running_priorities)


def plan(sim: Books, s: GangState, t: float) -> tuple[Plan | None, int]:
    """The planner's plan with victims for ``s`` at ``t`` (None when there is none), and the engine
    decisions it took (they count in the run's, whatever it answers)."""
    got, trials = answer(sim, s, t)
    return (got if isinstance(got, Plan) and got.victims else None), trials


def answer(sim: Books, s: GangState, t: float, avoid: tuple[str, ...] | None = None) -> tuple[Plan | NoPlan | None, int]:
    """The planner's whole answer for ``s`` at ``t`` on the nodes it may use (``avoid``: the
    nodes to leave out, the gang's own by default) (None: it may not preempt at all), and the
    engine decisions it took. A ``NoPlan`` of code ``min-runtime`` says when its victims come
    of age (``retry_at``): the run retries the gang then, as gang-coordinator does."""
    who = sim.derived.preemptor(s)
    if who is None:
        return None, 0
    got = plan_preemption(sim.cluster, who, running(sim, s.gang_id), sim.tree, held_by=dict(sim.held),
                          profile=sim.profile, avoid=s.avoid_nodes if avoid is None else avoid, now=t)
    return got, got.search.trials
