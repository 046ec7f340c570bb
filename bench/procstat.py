"""What the benchmarks read about processes (from ``/proc``; py-spy profiles of them), and their percentile rule."""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import sys
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


class Cpu:
    """CPU seconds of named process groups between ``start`` and ``stop``."""

    def __init__(self, groups: dict[str, list[int]]) -> None:
        self.groups = groups
        self.start = {g: sum(map(cpu_seconds, pids)) for g, pids in groups.items()}

    def stop(self) -> dict[str, float]:
        return {g: sum(map(cpu_seconds, pids)) - self.start[g] for g, pids in self.groups.items()}


def start_profiles(directory: str | None, pids: dict[str, int], tag: str) -> list:
    """One ``py-spy record`` per service (collapsed stacks, 20 samples/s) when ``--profile``."""
    if not directory:
        return []
    Path(directory).mkdir(parents=True, exist_ok=True)
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    return [subprocess.Popen([spy, "record", "--nonblocking", "--rate", "20", "--format", "raw",
                              "-o", str(Path(directory) / f"{tag}-{name}.txt"), "--pid", str(p)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for name, p in pids.items()]


def stop_profiles(procs: list) -> None:
    for p in procs:
        p.send_signal(signal.SIGINT)
    for p in procs:
        p.wait(60)
