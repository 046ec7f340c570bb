"""Counterfactual answers for a gang that does not fit: "what would start it now"
(``phalanx_engine.whatif`` computes them; docs/whatif.md has the probes and their order).

The Structs are defined in ``phalanx_proto.events``, beside ``PlacementFailed`` that carries
them (``whatif: WhatIf | None``) and ``Assignment`` that they hold (one module, no import
cycle); the gang record keeps the last ones (``GangState.whatif``), ``phalanx explain`` prints
them, and ``phalanx sim --json`` writes them for the gangs still pending. This module names them
for the code that is about the answers alone.
"""

from __future__ import annotations

from phalanx_proto.events import (
    MAX_ANSWER_TEXT,
    MAX_ANSWERS,
    MAX_HOLDERS,
    PROBES,
    Answer,
    Holder,
    Probe,
    WhatIf,
)

__all__ = ["MAX_ANSWERS", "MAX_ANSWER_TEXT", "MAX_HOLDERS", "PROBES", "Answer", "Holder", "Probe", "WhatIf"]
