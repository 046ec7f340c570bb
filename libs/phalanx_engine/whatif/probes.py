"""The what-if probes that need no search (``queue-limit``/``queue-quota``, ``preempt``,
``tier``): each asks the engine once or a few times through ``Probing``. Called by
``what_if`` in ``PROBES`` order; docs/whatif.md describes the answers.
"""

from __future__ import annotations

from phalanx_engine.topology import TIER_NAMES, TIERS
from phalanx_engine.whatif.probing import Probing, busy_gpus, holders, where
from phalanx_proto.queues import GPU_UNITS, shown
from phalanx_proto.whatif import Answer
from phalanx_rules import queueorder


def probe_queue(p: Probing) -> list[Answer]:
    """The queue's limit (nearest on its chain first) or, under the borrow gate, its quota:
    the headroom lacking. ``starts`` when that alone stands between the gang and a place."""
    q = p.ctx.queue
    if q is None:
        return []
    tree, queue, need = q.tree, queueorder.queue_of(p.members), queueorder.units(p.members)
    if tree.problem(queue):
        return []  # the reason names the broken queue; no amount of headroom helps
    short = []
    for name in tree.chain(queue):
        link = tree.specs[name]
        held = q.held.get(name, 0) - q.releasing.get(name, 0)
        if link.limit is not None and held + need > link.limit:
            short.append((name, link.limit, held))
    if short:
        name, limit, held = short[0]
        lack = held + need - limit
        fits = p.decide(p.members)
        starts = fits is not None and len(short) == 1 and not q.owed
        text = (f"would start if queue {name} had {shown(lack)} more GPUs under its limit {shown(limit)} "
                f"(it holds {shown(held)}, the gang needs {shown(need)})")
        if fits is None:
            text = f"needs {shown(lack)} more GPUs of headroom under queue {name}'s limit {shown(limit)}, and room in the cluster"
        return [Answer(probe="queue-limit", text=text, starts=starts, queue=name, lacking_gpus=lack / GPU_UNITS,
                       assignments=fits.assignments if fits else (), **where(p, fits))]
    spec = tree.get(queue)
    if q.owed and spec is not None and queueorder.borrowing(tree, p.members, q.held, q.releasing.get(queue, 0)):
        held = q.held.get(queue, 0) - q.releasing.get(queue, 0)
        lack = held + need - spec.quota
        fits = p.decide(p.members)
        text = (f"would start if queue {queue}'s quota were {shown(lack)} GPUs higher (it would borrow beyond "
                f"{shown(spec.quota)} while queue(s) {', '.join(q.owed)}, below quota, wait)")
        return [Answer(probe="queue-quota", text=text, starts=fits is not None, queue=queue,
                       lacking_gpus=lack / GPU_UNITS, assignments=fits.assignments if fits else (),
                       **where(p, fits))]
    return []


def probe_preempt(p: Probing) -> list[Answer]:
    """The planner's victims, checked: the gang must fit once their reservations are gone."""
    if p.ctx.preempt is None:
        return []
    plan = p.ctx.preempt(p.cluster, p.members, holders=p.ctx.holders)
    if plan is None or not plan.victims:
        return []
    victims = set(plan.victims)
    pods = frozenset(a.pod for st in p.cluster.nodes.values() for a in st.view.allocations
                     if p.holder(a.pod).gang_id in victims)
    fits = p.decide(p.members, p.released(p.cluster.nodes, pods))
    if fits is None:
        return []
    names = ", ".join(sorted(victims)[:3]) + (f" and {len(victims) - 3} more" if len(victims) > 3 else "")
    text = f"would start if gang(s) {names} were preempted"
    if not plan.allowed:
        text += f"; not done: {plan.why_not or 'preemption does not allow it'}"
    found = holders(p, pods, fits.assignments)
    return [Answer(probe="preempt", text=text, starts=plan.allowed and p.queue_lets(p.members), holders=found,
                   gpus=busy_gpus(p.cluster, fits.assignments), assignments=fits.assignments, **where(p, fits))]


def probe_tier(p: Probing) -> list[Answer]:
    """The next looser tier up to ``ctx.permitted`` where the gang fits (none when the gang may
    already span as far as its constraints allow — R8's network-pod, for every gang today)."""
    lo, hi = TIERS.index(p.ctx.loosest), TIERS.index(p.ctx.permitted)
    for tier in TIERS[lo + 1:hi + 1]:
        fits = p.starts(p.members, loosest=tier)
        if fits is not None:
            text = (f"would start if it could span one {TIER_NAMES[tier]} instead of one "
                    f"{TIER_NAMES[p.ctx.loosest]}")
            return [Answer(probe="tier", text=text, change=f"{p.ctx.loosest} -> {tier}",
                           assignments=fits.assignments, **where(p, fits))]
    return []
