"""Preemption in the simulator: the services' planner (``phalanx_engine.preempt``), asked as
placement asks it (``services/phalanx_placement/preemptions.py``) for a gang the engine could not
place, on the simulation's cluster and running gangs. Eviction takes no time here: the victims'
reservations go at once, each victim gang goes back to waiting as a rolled-back gang does (its
controller recreating it) and starts from the beginning when it is placed again, and the
preemptor starts on the plan's placement at the same instant (docs/whatif.md, "The model")."""

from __future__ import annotations

from typing import TYPE_CHECKING

from phalanx_engine.preempt import Plan, Preemptor, RunningGang, plan_preemption
from phalanx_proto.state import GangState
from phalanx_rules import queueorder

if TYPE_CHECKING:
    from phalanx_sim.loop import Simulation

NEVER = "Never"


def preemptor(s: GangState) -> Preemptor | None:
    """The gang as the planner's preemptor; None when its members disagree on the priority (the
    services refuse such a gang preemption)."""
    priorities = {m.priority for m in s.members}
    if len(priorities) > 1:
        return None
    policy = NEVER if any(m.preemption_policy == NEVER for m in s.members) else "PreemptLowerPriority"
    return Preemptor(gang_id=s.gang_id, members=s.members, priority=priorities.pop() if priorities else s.priority,
                     queue=queueorder.queue_of(s.members), preemption_policy=policy)


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


def may_preempt(sim: Simulation, s: GangState) -> bool:
    """Could any plan exist? Cheap, and never False where the planner could find one (it only
    saves asking it): preemption on, the gang not ``Never``, and a running gang some rule of
    ``preempt_rules`` could take — of its queue with a lower priority (its queue preempting within
    itself), or, its queue reclaiming (``reclaim: Any`` and below its quota), of another queue:
    one on its own chain (an ancestor's gang: its units stay within the ancestors, whose quotas
    are not checked) or one holding more than its quota (a victim's own queue must keep its
    quota without it)."""
    who = sim.derived.preemptor(s) if sim.config.preemption else None
    if who is None or who.preemption_policy == NEVER:
        return False
    spec = sim.tree.get(who.queue)
    if spec is None:
        return False
    if spec.within_queue != NEVER and min(sim.running_priorities.get(who.queue) or (who.priority,)) < who.priority:
        return True
    if spec.reclaim == NEVER or sim.held.get(who.queue, 0) >= spec.quota:
        return False
    chain = sim.tree.chain(who.queue)
    return any(q != who.queue and sim.running_priorities.get(q) and (q in chain or sim.held.get(q, 0) > qs.quota)
               for q, qs in sim.tree.specs.items())


def plan(sim: Simulation, s: GangState, t: float) -> Plan | None:
    """The planner's plan with victims for ``s`` at ``t``, or None. Its engine decisions count in
    the run's, whatever it answers."""
    who = preemptor(s)
    if who is None:
        return None
    got = plan_preemption(sim.cluster, who, running(sim, s.gang_id), sim.tree, held_by=dict(sim.held),
                          profile=sim.profile, avoid=s.avoid_nodes, now=t)
    sim.decisions += got.search.trials
    return got if isinstance(got, Plan) and got.victims else None
