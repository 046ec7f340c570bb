"""Counterfactual answers for a gang that does not fit: "what would start it now"
(``phalanx_engine.whatif`` computes them; docs/whatif.md has the probes and their order).

These Structs are not part of any wire event yet. They live in ``proto`` so that a wire event
or a gang record can carry them as one optional field with a default (``whatif: WhatIf | None =
None``) without the wire contract importing the engine; ``phalanx explain`` prints them when a
gang record carries them, and ``phalanx sim --json`` writes them for the gangs still pending.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from phalanx_proto.events import Assignment

Probe = Literal["queue-limit", "queue-quota", "wait", "preempt", "tier", "model", "smaller", "fewer"]
PROBES: tuple[str, ...] = ("queue-limit", "queue-quota", "wait", "preempt", "tier", "model", "smaller", "fewer")
"""Every probe, in the order its answers are listed (docs/whatif.md says why)."""


class Holder(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A running gang that holds capacity the pending gang would need."""

    gang_id: Annotated[str, msgspec.Meta(max_length=512)]
    queue: str = ""
    priority: int = 0
    age_s: float = 0.0
    """How long it has held its reservation (0 when unknown)."""
    gpus: int = 0
    """Whole GPUs (or GPUs with a share of it) it holds where the pending gang would go."""


class Answer(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One probe's answer: ``text`` for people (``would start if 3 GPUs free in network-pod p1
    (held by gangs a/train-7, b/exp-2)``), the fields for programs. ``starts``: the change alone
    lets the gang start now (the engine placed it, and its queue lets it); False for a necessary
    change that is not enough by itself. ``assignments``: the engine's decision under the change."""

    probe: Probe
    text: str
    starts: bool = True
    tier: str = ""
    """The tightest network tier holding the decision (node, hypernode, leaf, netpod)."""
    domain: str = ""
    """That tier's domain (a node, HyperNode, leaf switch or network-pod name)."""
    gpus: int = 0
    """wait/preempt: GPUs that would have to be freed."""
    holders: tuple[Holder, ...] = ()
    queue: str = ""
    lacking_gpus: float = 0.0
    """queue-limit/queue-quota: GPUs of headroom the queue lacks."""
    members: int = 0
    """fewer: how many members would start."""
    change: str = ""
    """smaller/model/tier: what changes, ``gpus 8 -> 4``, ``nvidia.com/gpu.product=A100``."""
    minimal: bool = True
    """False when the probe ran out of time before proving its answer minimal."""
    assignments: tuple[Assignment, ...] = ()


class WhatIf(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Every answer, ordered; ``cut``: probes that ran out of their time budget."""

    answers: tuple[Answer, ...] = ()
    spent_ms: float = 0.0
    decisions: int = 0
    """Engine decisions the probes made."""
    cut: tuple[str, ...] = ()

    def top(self) -> str:
        """One line to append to the pending reason ("" when nothing would start it): the first
        answer that starts the gang by itself."""
        return next((a.text for a in self.answers if a.starts), "")
