"""The scenarios ``bench/peers.py`` runs, each a small declarative ``Scenario``. Pure.

A scenario is made of parts (``Part``: gang size, share of the cluster's GPUs, RDMA, team, wave),
a creation order, and, for a scenario with teams, each team's quota; ``Scenario.members``
turns it into the pods of each wave, in creation order, for a ``Layout``. ``SCENARIOS`` are
the ones the bench knows (docs/peers.md, "The scenarios").
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from phalanx_bench.peers import Layout, Member


@dataclass(frozen=True)
class Part:
    """``share`` of the cluster's GPUs asked as gangs of ``size`` one-GPU pods (1: single pods)."""

    size: int
    share: float
    rdma: bool = False
    team: str = ""
    wave: int = 0
    """Waves start in order, each once the one before has settled."""


@dataclass(frozen=True)
class Scenario:
    name: str
    what: str
    parts: tuple[Part, ...]
    order: str = "shuffled"
    """``shuffled``: gangs (and single pods) in a seeded random order, each gang's pods together;
    ``interleaved``: one pod of each gang in turn (what a controller racing others looks like)."""
    quotas: tuple[tuple[str, float], ...] = ()
    """Team → share of the GPUs as its nominal quota (the teams borrow from each other)."""

    def members(self, layout: Layout, seed: int) -> list[list[Member]]:
        """The pods of each wave, in creation order."""
        rng = random.Random(seed)
        waves: dict[int, list[list[Member]]] = {}
        for k, part in enumerate(self.parts):
            count = int(part.share * layout.gpus) // part.size
            for g in range(count):
                gang = f"{part.team or 'g'}{k}-{g:02d}x{part.size}" if part.size > 1 else ""
                name = gang or f"{part.team or 's'}{k}-{g:03d}"
                waves.setdefault(part.wave, []).append(
                    [Member(f"{name}-m{m:02d}" if gang else name, gang, part.size, rdma=part.rdma, team=part.team)
                     for m in range(part.size)])
        out = []
        for w in sorted(waves):
            units = waves[w]
            rng.shuffle(units)
            if self.order == "interleaved":
                out.append([u[i] for i in range(max(map(len, units))) for u in units if i < len(u)])
            else:
                out.append([m for u in units for m in u])
        return out


SCENARIOS = {s.name: s for s in (
    Scenario("jobset7", "the seed's JobSet: gangs of 7 workers x (1 GPU + 1 RDMA NIC, host network), "
             "80 % of the GPUs", (Part(7, 0.8, rdma=True),)),
    Scenario("gangs8-64", "gangs of 8 and of 64 one-GPU pods (25 % and 50 % of the GPUs), gangs in random order",
             (Part(8, 0.25), Part(64, 0.5))),
    Scenario("mix90", "single one-GPU pods (40 %), gangs of 8 (25 %) and of 64 (25 %): the cluster filled to 90 %, "
             "all in random order", (Part(1, 0.4), Part(8, 0.25), Part(64, 0.25))),
    Scenario("contention", "gangs of 8 (50 %) and of 64 (75 %): 125 % of the GPUs asked, the pods created "
             "round-robin across gangs", (Part(8, 0.5), Part(64, 0.75)), order="interleaved"),
    Scenario("two-teams", "two teams with 50 % of the GPUs each as quota, in one cohort: team a asks 75 % "
             "in gangs of 8, then team b asks 50 %", (Part(8, 0.75, team="a"), Part(8, 0.5, team="b", wave=1)),
             quotas=(("a", 0.5), ("b", 0.5))),
)}
