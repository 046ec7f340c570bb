"""placement's test hooks: read from the environment once, at import; no flag, no ``Config``
field, nothing a deployment sets.

``PHALANX_TEST_DECIDE_DELAY_S``: seconds placement sleeps between deciding and committing, to
widen the window in which two replicas race for the same GPUs
(``tests/integration/test_placement_race.py`` sets it in the stack's environment).

``PHALANX_TEST_DROP_EVICTIONS``: the first N preemptions' eviction commands are not sent, as if
placement had stopped between committing the nomination and sending them
(``tests/integration/test_preemption.py``).
"""

from __future__ import annotations

import os

DECIDE_DELAY_ENV = "PHALANX_TEST_DECIDE_DELAY_S"
DECIDE_DELAY_S = float(os.environ.get(DECIDE_DELAY_ENV) or 0.0)

DROP_EVICTIONS_ENV = "PHALANX_TEST_DROP_EVICTIONS"
_drop_evictions = int(os.environ.get(DROP_EVICTIONS_ENV) or 0)


def take_dropped_eviction() -> bool:
    """Whether the eviction about to be sent is one the hook drops (counting it)."""
    global _drop_evictions
    if _drop_evictions <= 0:
        return False
    _drop_evictions -= 1
    return True
