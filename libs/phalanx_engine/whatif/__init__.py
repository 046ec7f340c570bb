"""Counterfactual probes: for a gang that does not fit, the smallest changes that would let it
start now (docs/whatif.md). Pure; called by placement after a ``NoFit`` (the top answer goes at
the end of the pending reason), by ``phalanx sim`` for the gangs still pending, and by tests.

Every probe changes one thing — the capacity running gangs hold, the queue's headroom, the
network tier, the GPU model, the request, the member count — and asks the same engine
(``decide.decide`` with the caller's ``Profile``) on the same cluster view; an answer carries
that decision. The probes, in the order their answers are listed (``PROBES``):

1. ``queue-limit`` / ``queue-quota`` — the queue's limit (or, while a queue below its quota is
   owed the free GPUs, its quota) lacks headroom: how much;
2. ``wait`` — which GPUs would have to be free, and which running gangs hold them;
3. ``preempt`` — which gangs a preemption planner would evict, and why it does not (a hook:
   ``Preemptor``);
4. ``tier`` — a looser network tier, only as loose as the gang's constraints allow;
5. ``model`` — another GPU model, where the gang pins one by a node selector;
6. ``smaller`` — smaller per-member requests (GPUs, core %, GPU memory, CPU, memory, ...);
7. ``fewer`` — fewer members.

The first answers need no change to the gang (the queue's numbers, time, someone else's
gang), the later ones change what it asks for. Each probe searches for its minimal change
(``search``) and all of them share one time budget: a probe that runs out is listed in
``WhatIf.cut`` with every probe after it.

The package: ``probing`` (what every probe shares: the context, ``Probing``, where an answer
lands, who holds what), ``probes`` (the probes that need no search: queue, preempt, tier),
``search`` (wait, model, smaller, fewer) and here ``what_if``, which runs them in order.
Importers keep ``from phalanx_engine.whatif import ...`` for the names below.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from phalanx_engine.decide import DEFAULT_PROFILE, Cluster
from phalanx_engine.framework import Profile
from phalanx_engine.whatif import search
from phalanx_engine.whatif.probes import probe_preempt, probe_queue, probe_tier
from phalanx_engine.whatif.probing import (
    OutOfTime,
    Preemptor,
    PreemptPlan,
    ProbeContext,
    Probing,
    QueueView,
    Running,
    busy_gpus,
    names_text,
    tier_of,
)
from phalanx_proto.events import MemberSpec
from phalanx_proto.whatif import PROBES, Answer, WhatIf

__all__ = ["DEFAULT_BUDGET_S", "NO_CONTEXT", "OutOfTime", "PreemptPlan", "Preemptor", "ProbeContext", "Probing",
           "QueueView", "Running", "busy_gpus", "names_text", "probe_preempt", "probe_queue", "probe_tier", "tier_of",
           "top_line", "what_if"]
"""What ``phalanx_engine.whatif`` offered as one module; the probes' search lives in ``search``."""

DEFAULT_BUDGET_S = 0.05
"""Time all probes of one gang share unless the caller says otherwise (docs/whatif.md has the
cost measured at 1,000 nodes)."""
NO_CONTEXT = ProbeContext()
"""A gang's probes with nothing known besides the cluster and the gang (a frozen value)."""


def what_if(cluster: Cluster, members: tuple[MemberSpec, ...], profile: Profile = DEFAULT_PROFILE,
            ctx: ProbeContext = NO_CONTEXT, *, budget_s: float = DEFAULT_BUDGET_S,
            clock: Callable[[], float] = time.perf_counter, max_decisions: int | None = None) -> WhatIf:
    """Every probe's answer for a gang that did not fit ``cluster`` (which is not changed), in
    ``PROBES`` order, within ``budget_s`` seconds of ``clock`` and at most ``max_decisions``
    engine decisions (a budget in decisions gives the same answers on any machine: the
    simulator's). Never raises for a gang the engine can decide; a probe out of budget is named
    in ``cut``, with every probe after it."""
    started = clock()
    p = Probing(cluster, members, profile, ctx, started + budget_s, clock, max_decisions)
    steps: tuple[tuple[str, Callable[[Probing], list[Answer]]], ...] = (
        ("queue", probe_queue), ("wait", search.probe_wait), ("preempt", probe_preempt), ("tier", probe_tier),
        ("model", search.probe_model), ("smaller", search.probe_smaller), ("fewer", search.probe_fewer))
    answers: list[Answer] = []
    cut: list[str] = []
    for i, (_name, probe) in enumerate(steps):
        try:
            answers.extend(probe(p))
        except OutOfTime:
            cut = [n for n, _ in steps[i:]]
            break
    answers.sort(key=lambda a: PROBES.index(a.probe))
    return WhatIf(answers=tuple(answers), spent_ms=round((clock() - started) * 1000, 3), decisions=p.decisions,
                  cut=tuple(cut))


def top_line(result: WhatIf) -> str:
    """The line placement appends to the pending reason (``...; would start if ...``)."""
    return result.top()
