"""How the embedded stack starts its child processes so that none outlives it.

Every child (nats-server, each service) gets its own process group, so a Ctrl-C typed at the
terminal reaches ``phalanx up`` alone, which then stops its children in order. On Linux a child
started from the main thread also gets a parent-death signal (``prctl(PR_SET_PDEATHSIG,
SIGTERM)``), so even a ``kill -9`` of ``phalanx up`` stops them. The kernel sends that signal
when the *thread* that started the child exits, so it is set only for children started from
the main thread (a worker thread may end long before the process).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

_PR_SET_PDEATHSIG = 1


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()


def popen_options() -> dict[str, Any]:
    """Keyword arguments for ``subprocess.Popen`` (see the module docstring)."""
    options: dict[str, Any] = {"process_group": 0}
    if _PRCTL is not None and threading.current_thread() is threading.main_thread():
        options["preexec_fn"] = _die_with(os.getpid())
    return options


def _die_with(parent: int) -> Callable[[], None]:
    prctl = _PRCTL

    def preexec() -> None:  # runs in the child between fork and exec: no allocation-heavy work
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)  # type: ignore[misc]
        if os.getppid() != parent:  # the parent died before the signal was armed
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec
