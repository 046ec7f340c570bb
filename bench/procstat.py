"""What the benchmarks read about processes from ``/proc``, and their percentile rule."""

from __future__ import annotations

import math
import os
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds ``pid`` has used so far (fields 14 and 15 of
    ``/proc/<pid>/stat``); 0 when the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2:].split()  # the command name may contain spaces
    return (int(fields[11]) + int(fields[12])) / _TICK


def memory_mib(pid: int) -> tuple[float, float]:
    """(resident, peak resident) MiB of ``pid`` (``VmRSS``, ``VmHWM``); zeros when gone."""
    out = {"VmRSS": 0.0, "VmHWM": 0.0}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in out:
                out[key] = int(value.split()[0]) / 1024
    except OSError:
        pass
    return out["VmRSS"], out["VmHWM"]


def pct(samples: list[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (``inf`` stands for "not reached" and sorts last)."""
    s = sorted(samples)
    if not s:
        return math.nan
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]
