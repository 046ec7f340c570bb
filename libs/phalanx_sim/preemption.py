"""Preemption in the simulator: the services' planner (``phalanx_engine.preempt``), asked as
placement asks it (``services/phalanx_placement/preemptions.py``) for a gang the engine could not
place, on the simulation's cluster and running gangs. Eviction takes no time here: the victims'
reservations go at once, each victim gang goes back to waiting as a rolled-back gang does (its
controller recreating it) and starts from the beginning when it is placed again, and the
preemptor starts on the plan's placement at the same instant (docs/whatif.md, "The model")."""

from __future__ import annotations

from typing import TYPE_CHECKING

from phalanx_engine.preempt import Plan, RunningGang, plan_preemption
from phalanx_proto.state import GangState
from phalanx_rules import preemption as rules

if TYPE_CHECKING:
    from phalanx_sim.loop import Simulation


def running(sim: Simulation, but: str) -> tuple[RunningGang, ...]:
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


def worth_planning(sim: Simulation, s: GangState) -> bool:
    """Could any plan exist? The rulebook's cheap necessary condition (``preemption.may_preempt``,
    it only saves asking the planner), with preemption on in this run."""
    who = sim.derived.preemptor(s) if sim.config.preemption else None
    return who is not None and rules.may_preempt(who, sim.tree, sim.held, sim.running_priorities)


def plan(sim: Simulation, s: GangState, t: float) -> Plan | None:
    """The planner's plan with victims for ``s`` at ``t``, or None. Its engine decisions count in
    the run's, whatever it answers."""
    who = sim.derived.preemptor(s)
    if who is None:
        return None
    got = plan_preemption(sim.cluster, who, running(sim, s.gang_id), sim.tree, held_by=dict(sim.held),
                          profile=sim.profile, avoid=s.avoid_nodes, now=t)
    sim.decisions += got.search.trials
    return got if isinstance(got, Plan) and got.victims else None
