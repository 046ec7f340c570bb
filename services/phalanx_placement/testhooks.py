"""placement's test hooks: read from the environment once, at import; no flag, no ``Config``
field, nothing a deployment sets.

``PHALANX_TEST_DECIDE_DELAY_S``: seconds placement sleeps between deciding and committing, to
widen the window in which two replicas race for the same GPUs
(``tests/integration/test_placement_race.py`` sets it in the stack's environment).

``PHALANX_TEST_DROP_EVICTIONS``: the first N preemptions' eviction commands are not sent, as if
placement had stopped between committing the nomination and sending them
(``tests/integration/test_preemption.py``).

``PHALANX_TEST_EXIT_AFTER_PROMOTION``: a file path; the first time placement has committed a
nomination's promotion, it creates the file and exits at once, before its ``Reserved`` is sent
(as a SIGKILL there would); a process started again finds the file and goes on
(``tests/integration/test_preemption_crash.py``).

``PHALANX_TEST_PROMOTE_DELAY_S``: seconds placement waits between building a promotion and
committing it, and releases leave promotions to the nomination pass, so two replicas' passes
promote the same nomination at once (``tests/integration/test_preemption_crash.py``).
"""

from __future__ import annotations

import os

DECIDE_DELAY_ENV = "PHALANX_TEST_DECIDE_DELAY_S"
DECIDE_DELAY_S = float(os.environ.get(DECIDE_DELAY_ENV) or 0.0)

EXIT_AFTER_PROMOTION_ENV = "PHALANX_TEST_EXIT_AFTER_PROMOTION"
PROMOTE_DELAY_ENV = "PHALANX_TEST_PROMOTE_DELAY_S"
PROMOTE_DELAY_S = float(os.environ.get(PROMOTE_DELAY_ENV) or 0.0)

DROP_EVICTIONS_ENV = "PHALANX_TEST_DROP_EVICTIONS"
_drop_evictions = int(os.environ.get(DROP_EVICTIONS_ENV) or 0)


def take_dropped_eviction() -> bool:
    """Whether the eviction about to be sent is one the hook drops (counting it)."""
    global _drop_evictions
    if _drop_evictions <= 0:
        return False
    _drop_evictions -= 1
    return True


def exit_after_promotion() -> None:
    """Exit now, as if killed, the first time (per marker file) a promotion is committed."""
    path = os.environ.get(EXIT_AFTER_PROMOTION_ENV)
    if path and not os.path.exists(path):
        with open(path, "w") as f:
            f.write("exited after a promotion's commit, before its reply\n")
        os._exit(137)
