"""What a simulation takes: gangs with their arrival and duration, and the settings of the
services it stands for (their defaults are the services' own); and what it gives: each gang's
``Outcome`` and the ``Sample``s taken along the way."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property

from phalanx_proto.events import MemberSpec
from phalanx_proto.queues import units_of_member
from phalanx_rules import fairness as order
from phalanx_rules.queueorder import queue_of


@dataclass(frozen=True)
class SimGang:
    """One gang of the workload: its members' requests (each naming its queue), when it arrives
    and how long it runs once all its members are placed (None: until the end of the run)."""

    gang_id: str
    members: tuple[MemberSpec, ...]
    arrival_s: float = 0.0
    duration_s: float | None = None
    priority: int = 0
    refused: str = ""
    """Why gang-coordinator would not admit it (its queue is missing or does not select its
    namespace): it never tries."""

    @cached_property
    def queue(self) -> str:
        return queue_of(self.members)

    @cached_property
    def units(self) -> int:
        return sum(units_of_member(m) for m in self.members)


@dataclass(frozen=True)
class SimConfig:
    """The services' settings the run uses (gang-coordinator's flags, same defaults)."""

    starve_after_s: float = order.STARVE_AFTER_S
    fairness: str = order.MODES[0]
    backoff_base_s: float = order.BACKOFF_BASE_S
    backoff_max_s: float = order.BACKOFF_MAX_S
    unschedulable_retry_s: float = order.UNSCHEDULABLE_RETRY_S
    resync_s: float = 2.0
    """How soon a gang held back by the fairness gate asks again (gang-coordinator's resync)."""
    horizon_s: float | None = None
    """Stop at this virtual time (None: when nothing is left to happen)."""
    sample_s: float = 60.0
    """Virtual seconds between samples of utilisation and queue shares."""
    exact: bool = False
    """Decide every retry, even one nothing could have changed for (docs/whatif.md)."""
    preemption: bool = True
    """Preempt as placement does (``phalanx_sim.preemption``); off: gangs only wait."""
    usage_half_life_s: float = 0.0
    """The queues' recent usage weighs their fair share with this half-life, as placement's
    ``--usage-half-life-s`` (docs/queues.md, "Fair share that remembers"); 0: off."""


@dataclass
class Outcome:
    """What happened to one gang."""

    gang: SimGang
    start: float | None = None
    end: float | None = None
    tier: str = ""
    domain: str = ""
    nodes: int = 0
    split: bool = False
    """Placed at a looser network tier than the empty cluster would give it."""
    attempts: int = 0
    reason: str = ""
    preempted: int = 0
    """Times it was evicted for a preemptor (each time it starts again from the beginning)."""
    lost_gpu_s: float = 0.0
    """GPU-seconds of its runs cut short by preemption."""


@dataclass
class Sample:
    t: float
    allocated: float
    """GPUs allocated (whole-GPU equivalents: a share counts its core %, MIG its slices)."""
    stranded: float
    """Free GPU capacity its node's free CPU cannot feed (``packing.stranded_milli``), in GPUs."""
    pending: int
    pending_gpus: float
    running: int
    queues: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Per queue: (GPUs held, fair share in GPUs)."""



_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, None: 1}


def parse_duration(text: str | float | int) -> float:
    """``90``, ``90s``, ``30m``, ``2h``, ``1.5d``, ``1w`` as seconds; ``ValueError`` otherwise."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"{text!r}: a duration is not negative")
        return float(text)
    m = _DURATION.match(str(text))
    if not m:
        raise ValueError(f"{text!r}: a duration is a number with an optional unit ms, s, m, h, d or w (e.g. 30m)")
    return float(m.group(1)) * _UNITS[m.group(2)]


def clock(seconds: float) -> str:
    """Virtual time for people: ``2d 03:04:05``."""
    days, rest = divmod(int(seconds), 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    return (f"{days}d " if days else "") + f"{h:02d}:{m:02d}:{s:02d}"
