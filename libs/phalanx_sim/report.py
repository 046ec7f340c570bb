"""What a run of ``phalanx sim`` says: per gang its wait and placement tier, GPU utilisation and
stranded GPUs over time, queue shares over time, the gangs split across a looser tier than the
empty cluster would give them, and for the gangs still pending at the end why, and what would
start them (``phalanx_engine.whatif``). ``document`` is the ``--json`` output; ``text`` prints it.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import msgspec

from phalanx_engine.decide import decide
from phalanx_engine.snapshot import Decision
from phalanx_engine.status import NoFit
from phalanx_engine.whatif import ProbeContext, QueueView, Running, what_if
from phalanx_proto.queues import GPU_UNITS
from phalanx_proto.state import attempt_members
from phalanx_rules import saga
from phalanx_rules.queueorder import owed, owed_candidate, owed_candidates, queue_of
from phalanx_sim.loop import Outcome, Simulation
from phalanx_sim.model import clock

TIERS = ("node", "hypernode", "leaf", "netpod", "cluster")


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p * len(ordered)) - 1)]


def _waits(outcomes) -> dict[str, float | None]:
    waits = [o.start - o.gang.arrival_s for o in outcomes if o.start is not None]
    return {"mean": round(sum(waits) / len(waits), 3) if waits else None,
            **{f"p{int(p * 100)}": percentile(waits, p) for p in (0.5, 0.9, 0.99)},
            "max": max(waits) if waits else None}


def gang_row(o: Outcome) -> dict[str, Any]:
    g = o.gang
    return {"gang": g.gang_id, "queue": g.queue, "priority": g.priority, "members": len(g.members),
            "gpus": round(g.units / GPU_UNITS, 3), "arrival_s": g.arrival_s, "start_s": o.start,
            "wait_s": None if o.start is None else round(o.start - g.arrival_s, 3), "end_s": o.end,
            "tier": o.tier or None, "domain": o.domain or None, "nodes": o.nodes, "split": o.split,
            "attempts": o.attempts, "preempted": o.preempted, "gpu_s_lost": round(o.lost_gpu_s, 3),
            "reason": o.reason or None}


def summary(sim: Simulation) -> dict[str, Any]:
    outs = list(sim.outcomes.values())
    arrived = [o for o in outs if o.gang.arrival_s <= sim.now]
    started = [o for o in arrived if o.start is not None]
    cap = sim.capacity / GPU_UNITS
    samples = sim.samples
    util = [s.allocated / cap * 100 for s in samples] if cap else []
    queues = {}
    for q in sorted(sim.tree.specs):
        mine = [o for o in arrived if o.gang.queue == q]
        held = [s.queues.get(q, (0.0, 0.0)) for s in samples]
        if not mine and not any(h for h, _ in held):
            continue
        queues[q] = {"gangs": len(mine), "started": sum(o.start is not None for o in mine), "wait_s": _waits(mine),
                     "mean_held_gpus": round(sum(h for h, _ in held) / len(held), 3) if held else 0.0,
                     "mean_fair_share_gpus": round(sum(f for _, f in held) / len(held), 3) if held else 0.0}
    return {
        "virtual_s": sim.now, "nodes": len(sim.views), "gpus": cap,
        "gangs": {"arrived": len(arrived), "started": len(started), "finished": sum(o.end is not None for o in arrived),
                  "pending_at_end": sum(o.start is None and not o.gang.refused for o in arrived),
                  "pending_unfit": sum(not s.fits_empty_cluster for q in sim.pending.values() for s in q.values()),
                  "not_admitted": sum(bool(o.gang.refused) for o in arrived)},
        "wait_s": _waits(arrived),
        "tiers": {t: n for t, n in sorted(Counter(o.tier for o in started).items(), key=lambda kv: TIERS.index(kv[0]))},
        "split": sum(o.split for o in started),
        "utilisation_pct": {"mean": round(sum(util) / len(util), 3) if util else None,
                            "peak": round(max(util), 3) if util else None},
        "stranded_gpus": {"mean": round(sum(s.stranded for s in samples) / len(samples), 3) if samples else None,
                          "peak": max((s.stranded for s in samples), default=None)},
        "queues": queues,
        "preemption": {"on": sim.config.preemption, "plans": sim.preemptions,
                       "gangs_evicted": sum(o.preempted for o in outs),
                       "gpus_evicted": round(sum(o.preempted * o.gang.units for o in outs) / GPU_UNITS, 3),
                       "gpu_s_lost": round(sum(o.lost_gpu_s for o in outs), 3)},
        "decisions": sim.decisions,
    }


def pending(sim: Simulation, *, limit: int, decisions: int) -> list[dict[str, Any]]:
    """The gangs still waiting at the end (at most ``limit``, longest waiting first): the
    engine's reason, as placement would give it, and the counterfactual answers."""
    waiting = sorted((s for q in sim.pending.values() for s in q.values()), key=lambda s: (s.created_at, s.gang_id))
    holders = {**sim.live, **{pod: Running(gang_id=g, queue=queue_of(sim.outcomes[g].gang.members),
                                           priority=sim.outcomes[g].gang.priority, since=sim.outcomes[g].start or 0.0)
                              for pod, g in sim.owner.items()}}
    candidates = owed_candidates(sim.tree, sim.held, ((queue_of(s.members), attempt_members(s)) for s in waiting
                                                      if owed_candidate(s, lambda s: False)))
    out = []
    for s in waiting[:limit]:
        decision = decide(sim.cluster, s.members, sim.profile, avoid=s.avoid_nodes)
        reason = (saga.failure_reason(decision.summary, s) if isinstance(decision, NoFit)
                  else sim.outcomes[s.gang_id].reason)
        kept = owed(sim.tree, queue_of(s.members), candidates, lambda m: isinstance(
            decide(sim.cluster, m, sim.profile, explain=False), Decision))
        ctx = ProbeContext(holders=holders, now=sim.now, avoid=frozenset(s.avoid_nodes),
                           queue=QueueView(tree=sim.tree, held=dict(sim.held), owed=kept))
        answers = None
        if decisions > 0:  # a budget in decisions, not seconds: the same answers on any machine
            answers = msgspec.structs.replace(what_if(sim.cluster, s.members, sim.profile, ctx, budget_s=float("inf"),
                                                      max_decisions=decisions), spent_ms=0.0)
        out.append({"gang": s.gang_id, "queue": queue_of(s.members), "waiting_s": round(sim.now - s.created_at, 3),
                    "attempts": sim.outcomes[s.gang_id].attempts, "reason": reason,
                    "whatif": msgspec.to_builtins(answers) if answers is not None else None})
    return out


def document(sim: Simulation, *, gangs: int | None, pending_limit: int, decisions: int,
             extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The whole result as one JSON-able document (``gangs``: rows listed, None for all)."""
    ordered = sorted(sim.outcomes.values(), key=lambda o: o.gang.arrival_s)  # stable: as submitted
    rows = [gang_row(o) for o in (ordered if gangs is None else ordered[:gangs])]
    return {
        "summary": summary(sim) | (extra or {}),
        "samples": [{"t": s.t, "allocated_gpus": s.allocated, "stranded_gpus": s.stranded, "pending": s.pending,
                     "pending_gpus": s.pending_gpus, "running": s.running,
                     "queues": {q: {"held_gpus": h, "fair_share_gpus": f} for q, (h, f) in s.queues.items()}}
                    for s in sim.samples],
        "gangs": rows,
        "gangs_listed": len(rows),
        "pending": pending(sim, limit=pending_limit, decisions=decisions),
    }


def _t(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.0f}s" if x < 60 else clock(x)


def text(doc: dict[str, Any], *, gangs: int | None) -> str:
    s = doc["summary"]
    g, w, u = s["gangs"], s["wait_s"], s["utilisation_pct"]
    lines = [f"cluster: {s['nodes']} nodes, {s['gpus']:g} GPUs; virtual time {clock(s['virtual_s'])}; "
             f"{s['decisions']} engine decisions",
             f"gangs: {g['arrived']} arrived, {g['started']} started, {g['finished']} finished, "
             f"{g['pending_at_end']} pending at the end ({g['pending_unfit']} of them fit no empty cluster), "
             f"{g['not_admitted']} not admitted",
             f"wait: mean {_t(w['mean'])}, p50 {_t(w['p50'])}, p90 {_t(w['p90'])}, p99 {_t(w['p99'])}, "
             f"max {_t(w['max'])}",
             "placement tier: " + (", ".join(f"{t} {n}" for t, n in s["tiers"].items()) or "-")
             + f"; split across a looser tier than on an empty cluster: {s['split']}",
             f"GPU utilisation: mean {u['mean']} %, peak {u['peak']} %; stranded GPUs: mean "
             f"{s['stranded_gpus']['mean']}, peak {s['stranded_gpus']['peak']}"]
    pre = s["preemption"]
    lines.append(f"preemption: {pre['plans']} plans, {pre['gangs_evicted']} gangs evicted ({pre['gpus_evicted']:g} "
                 f"GPUs), {pre['gpu_s_lost'] / 3600:.2f} GPU-hours of work lost" if pre["on"] else "preemption: off")
    for key in ("alloc_100", "alloc_130"):
        if key in s:
            lines.append(f"packing figure: allocation at {key[6:]} % arrived "
                         + (f"{s[key]:.2f} %" if s[key] is not None else "-"))
    if s["queues"]:
        lines += ["", f"{'QUEUE':<16} {'GANGS':>6} {'STARTED':>7} {'WAIT-P50':>10} {'WAIT-P90':>10} "
                      f"{'HELD(mean)':>10} {'FAIR(mean)':>10}"]
        for q, r in s["queues"].items():
            lines.append(f"{q:<16} {r['gangs']:>6} {r['started']:>7} {_t(r['wait_s']['p50']):>10} "
                         f"{_t(r['wait_s']['p90']):>10} {r['mean_held_gpus']:>10g} {r['mean_fair_share_gpus']:>10g}")
    rows = doc["gangs"]
    if rows:
        shown = rows if gangs is None else sorted(rows, key=lambda r: -(r["wait_s"] or 0))[:gangs]
        title = "every gang" if len(shown) == doc["gangs_listed"] == len(rows) else f"the {len(shown)} longest waits"
        lines += ["", f"{title}:", f"{'GANG':<36} {'QUEUE':<10} {'GPUS':>6} {'ARRIVAL':>11} {'WAIT':>11} "
                                   f"{'TIER':<9} {'DOMAIN':<14} {'TRIES':>5} {'PREEMPTED':>9}"]
        for r in shown:
            lines.append(f"{r['gang'][:36]:<36} {r['queue'][:10]:<10} {r['gpus']:>6g} {_t(r['arrival_s']):>11} "
                         f"{_t(r['wait_s']) if r['start_s'] is not None else 'pending':>11} {r['tier'] or '-':<9} "
                         f"{(r['domain'] or '-')[:14]:<14} {r['attempts']:>5} {r['preempted']:>9}")
    if doc["pending"]:
        lines += ["", "pending at the end:"]
        for p in doc["pending"]:
            lines.append(f"  {p['gang']} (queue {p['queue']}, waiting {_t(p['waiting_s'])}): {p['reason']}")
            for a in (p["whatif"] or {}).get("answers", ()):
                lines.append(f"    - {a['text']}" + ("" if a.get("starts", True) else " (not enough alone)"))
    return "\n".join(lines)

