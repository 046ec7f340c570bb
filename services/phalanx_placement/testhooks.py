"""placement's test hooks: read from the environment once, at import; no flag, no ``Config``
field, nothing a deployment sets.

``PHALANX_TEST_DECIDE_DELAY_S``: seconds placement sleeps between deciding and committing, to
widen the window in which two replicas race for the same GPUs
(``tests/integration/test_placement_race.py`` sets it in the stack's environment).
"""

from __future__ import annotations

import os

DECIDE_DELAY_ENV = "PHALANX_TEST_DECIDE_DELAY_S"
DECIDE_DELAY_S = float(os.environ.get(DECIDE_DELAY_ENV) or 0.0)
