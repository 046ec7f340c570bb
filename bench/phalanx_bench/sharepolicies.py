"""The GPU-share packing policies of the research model, and one-shot placement with them.

The model (requests, nodes, the filter, fragmentation) is ``phalanx_bench.sharepack``; a policy
scores a node that passes :func:`~phalanx_bench.sharepack.fits` (higher is better) and picks
the GPU(s) that receive the pod. Used by ``bench/packing.py``; see docs/packing.md.

* :class:`RandomFit` — a uniformly random feasible node, a random GPU that fits.
* :class:`BestFit` — the FGD paper's best-fit baseline: least CPU and GPU left afterwards,
  ``0.5 * cpu_left / 128000 + 0.5 * gpu_left / 8000`` (as an integer score 0..100), on the
  tightest GPU that fits.
* :class:`FGD` — Fragmentation Gradient Descent (Weng et al., USENIX ATC'23): the expected
  fragmentation of a node w.r.t. a target workload mix (``TargetMix``), the score
  ``floor(100 * sigmoid((F_before - F_after) / 1000))``, the GPU that minimises ``F_after``.
* :class:`PhalanxPack` — Phalanx's policy: FGD's fragmentation plus the GPU milli a node's
  CPU can no longer feed ("CPU stranding"), scored like FGD, and sharing pods packed onto the
  tightest GPU in the cluster that fits. On the openb trace it allocates 95.9 % of the GPUs
  at 100 % arrived demand, FGD 95.2 % (docs/packing.md).

:func:`place_one` (and its shortcuts ``random_fit``, ``best_fit``, ``fgd``, ``phalanx_pack``)
chooses a node in one full pass; ``phalanx_bench.sharecluster.ShareCluster`` places many pods
faster with the same choices.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence
from typing import Protocol

from phalanx_bench.sharepack import (
    MILLI,
    PodRequest,
    ShareChoice,
    ShareNode,
    TargetMix,
    candidate_gpus,
    fgd_after,
    fgd_score_value,
    fgd_share_options,
    fits,
    gpus_after_share,
    gpus_after_whole,
    lowest_free_gpus,
)

MAX_SPEC_CPU = 128_000
"""CPU milli that best fit normalises by (the largest node of the reference trace)."""

MAX_SPEC_GPU = 8 * MILLI
"""GPU milli that best fit normalises by (8 GPUs)."""


class Policy(Protocol):
    """A scoring policy. ``score`` is only asked about nodes that pass :func:`fits`.

    Scores are integers, higher is better; equal scores go to the node first in node order.
    ``score_key`` names what the score depends on so a cluster can memoise it (``None``: do not).
    The policies below subclass it to inherit that default ``score_key``.
    """

    name: str = "policy"
    randomized: bool = False

    def score(self, node: ShareNode, pod: PodRequest) -> int: ...

    def select_gpus(self, node: ShareNode, pod: PodRequest) -> tuple[int, ...]: ...

    def score_key(self, node: ShareNode) -> Hashable | None:
        return (node.cpu_free, tuple(sorted(node.gpu_free, reverse=True)), node.gpu_model)


class RandomFit(Policy):
    """A uniformly random feasible node (:class:`ShareCluster` draws it), a random fitting GPU."""

    name = "random"
    randomized = True

    def __init__(self, seed: int | str = 0):
        self.rng = random.Random(seed)

    def score(self, node: ShareNode, pod: PodRequest) -> int:
        return 0

    def select_gpus(self, node: ShareNode, pod: PodRequest) -> tuple[int, ...]:
        if pod.gpu_count == 0:
            return ()
        if pod.is_share:
            return (self.rng.choice(candidate_gpus(node, pod)),)
        return lowest_free_gpus(node, pod)


def best_fit_score(node: ShareNode, pod: PodRequest) -> int:
    """Best fit as the FGD paper's baseline defines it: 0..100, higher = less left afterwards."""
    left = (0.5 * (node.cpu_free - pod.cpu_milli) / MAX_SPEC_CPU
            + 0.5 * (sum(node.gpu_free) - pod.total_gpu_milli) / MAX_SPEC_GPU)
    return int((1.0 - left) * 100)


def tightest_gpu(node: ShareNode, pod: PodRequest) -> int:
    """For a sharing pod, the GPU with the least milli left that still fits (lowest index on ties)."""
    best = -1
    for i, g in enumerate(node.gpu_free):
        if g >= pod.gpu_milli and (best < 0 or g < node.gpu_free[best]):
            best = i
    if best < 0:
        raise ValueError(f"no GPU of node {node.name} has {pod.gpu_milli} milli left")
    return best


class BestFit(Policy):
    """The paper's best-fit baseline (score :func:`best_fit_score`, GPU :func:`tightest_gpu`)."""

    name = "bestfit"

    def score(self, node: ShareNode, pod: PodRequest) -> int:
        return best_fit_score(node, pod)

    def select_gpus(self, node: ShareNode, pod: PodRequest) -> tuple[int, ...]:
        if pod.gpu_count == 0:
            return ()
        if pod.is_share:
            return (tightest_gpu(node, pod),)
        return lowest_free_gpus(node, pod)


def _pick_share_gpu(node: ShareNode, best_values: set[int]) -> int:
    return next(i for i, g in enumerate(node.gpu_free) if g in best_values)


class FGD(Policy):
    """Fragmentation Gradient Descent, as the paper's simulator computes it.

    Score ``floor(100 * sigmoid((F_n - F_n') / 1000))`` with F the node's fragmentation
    w.r.t. ``mix`` before and after the placement. A sharing pod goes to the GPU with the best
    score (lowest index among equals); whole-GPU pods take the lowest-index free GPUs.
    """

    name = "fgd"

    def __init__(self, mix: TargetMix):
        self.mix = mix

    def _share(self, node: ShareNode, pod: PodRequest) -> tuple[int, set[int]]:
        gpus = tuple(sorted(node.gpu_free, reverse=True))
        before = self.mix.fragmentation(node.cpu_free, gpus, node.gpu_model)
        scored = [(fgd_score_value(before, f), g) for g, f in
                  fgd_share_options(node.cpu_free, gpus, node.gpu_model, pod, self.mix)]
        top = max(s for s, _ in scored)
        return top, {g for s, g in scored if s == top}

    def score(self, node: ShareNode, pod: PodRequest) -> int:
        if pod.is_share:
            return self._share(node, pod)[0]
        gpus = tuple(sorted(node.gpu_free, reverse=True))
        before = self.mix.fragmentation(node.cpu_free, gpus, node.gpu_model)
        return fgd_score_value(before, fgd_after(node.cpu_free, gpus, node.gpu_model, pod, self.mix))

    def select_gpus(self, node: ShareNode, pod: PodRequest) -> tuple[int, ...]:
        if pod.gpu_count == 0:
            return ()
        if pod.is_share:
            return (_pick_share_gpu(node, self._share(node, pod)[1]),)
        return lowest_free_gpus(node, pod)


class PhalanxPack(Policy):
    """Phalanx's policy: CPU-stranding-aware FGD with tightest-GPU share packing.

    * Fragmentation ``F'(n) = F(n) + w * S(n)``: FGD's measure plus the GPU milli the node's
      CPU cannot feed, ``S(n) = max(0, G_n - cpu_free_n / c)``, where ``c`` is the CPU milli per
      GPU milli that the GPU shapes of the target mix ask for on average (10.9 on the openb
      trace: a GPU left on a node with less CPU than that will probably never be used).
    * Node score ``floor(100 * sigmoid((F'(n) - F'(n')) / 1000))``, as FGD's; equal scores go
      to the first node in node order.
    * A sharing pod goes to the tightest GPU that fits, over the whole cluster (least milli
      left afterwards) when ``tight_share``; the node score only ranks equally tight choices
      (e.g. which fresh GPU to open). Otherwise the GPU with the best node score, as FGD.
    * Whole-GPU pods take the lowest-index free GPUs.
    """

    name = "phalanx"

    def __init__(self, mix: TargetMix, stranding_weight: float = 1.0, cpu_per_gpu: float | None = None,
                 tight_share: bool = True):
        self.mix = mix
        self.stranding_weight = stranding_weight
        self.cpu_per_gpu = mix.cpu_per_gpu_milli() if cpu_per_gpu is None else cpu_per_gpu
        if self.cpu_per_gpu <= 0:
            raise ValueError("cpu_per_gpu must be positive")
        self.tight_share = tight_share

    def stranded(self, cpu_free: int, gpu_free_total: int) -> float:
        """GPU milli the node's free CPU cannot feed at the mix's CPU per GPU."""
        return max(0.0, gpu_free_total - cpu_free / self.cpu_per_gpu)

    def fragmentation(self, cpu_free: int, gpus_desc: tuple[int, ...], gpu_model: str | None) -> float:
        """``F'``: FGD's fragmentation plus ``stranding_weight`` times :meth:`stranded`."""
        return (self.mix.fragmentation(cpu_free, gpus_desc, gpu_model)
                + self.stranding_weight * self.stranded(cpu_free, sum(gpus_desc)))

    def _share(self, node: ShareNode, pod: PodRequest) -> tuple[int, set[int]]:
        gpus = tuple(sorted(node.gpu_free, reverse=True))
        before = self.fragmentation(node.cpu_free, gpus, node.gpu_model)
        cpu_after = node.cpu_free - pod.cpu_milli
        scored = []
        last = -1
        for g in gpus:
            if g < pod.gpu_milli:
                break
            if g == last:
                continue
            last = g
            s = fgd_score_value(before, self.fragmentation(cpu_after, gpus_after_share(gpus, g, pod.gpu_milli),
                                                           node.gpu_model))
            if self.tight_share:
                s += (MILLI - (g - pod.gpu_milli)) * 1000
            scored.append((s, g))
        top = max(s for s, _ in scored)
        return top, {g for s, g in scored if s == top}

    def score(self, node: ShareNode, pod: PodRequest) -> int:
        if pod.is_share:
            return self._share(node, pod)[0]
        gpus = tuple(sorted(node.gpu_free, reverse=True))
        before = self.fragmentation(node.cpu_free, gpus, node.gpu_model)
        after = self.fragmentation(node.cpu_free - pod.cpu_milli, gpus_after_whole(gpus, pod.gpu_count),
                                   node.gpu_model)
        return fgd_score_value(before, after)

    def select_gpus(self, node: ShareNode, pod: PodRequest) -> tuple[int, ...]:
        if pod.gpu_count == 0:
            return ()
        if pod.is_share:
            return (_pick_share_gpu(node, self._share(node, pod)[1]),)
        return lowest_free_gpus(node, pod)


POLICIES = ("random", "bestfit", "fgd", "phalanx")


def make_policy(name: str, mix: TargetMix | None = None, seed: int | str = 0) -> Policy:
    """A policy by name (``random``, ``bestfit``, ``fgd``, ``phalanx``)."""
    if name == "random":
        return RandomFit(seed)
    if name == "bestfit":
        return BestFit()
    if mix is None:
        raise ValueError(f"policy {name!r} needs a target mix")
    if name == "fgd":
        return FGD(mix)
    if name == "phalanx":
        return PhalanxPack(mix)
    raise ValueError(f"unknown policy {name!r} (expected one of {', '.join(POLICIES)})")


# --------------------------------------------------------------------------- one-shot placement


def place_one(nodes: Sequence[ShareNode], pod: PodRequest, policy: Policy,
              rng: random.Random | None = None) -> ShareChoice | None:
    """Filter and score ``nodes`` for one pod and return the policy's choice (nodes unchanged).

    Equal scores go to the earliest node in ``nodes``; a randomized policy (random fit) draws
    the node with ``rng`` among the feasible ones. None when the pod fits nowhere.
    """
    feasible = [i for i, n in enumerate(nodes) if fits(n, pod)]
    if not feasible:
        return None
    if policy.randomized:
        i = feasible[(rng or random.Random(0)).randrange(len(feasible))]
        return ShareChoice(i, policy.select_gpus(nodes[i], pod), 0)
    best_i, best_s = feasible[0], policy.score(nodes[feasible[0]], pod)
    for i in feasible[1:]:
        s = policy.score(nodes[i], pod)
        if s > best_s:
            best_i, best_s = i, s
    return ShareChoice(best_i, policy.select_gpus(nodes[best_i], pod), best_s)


def random_fit(nodes: Sequence[ShareNode], pod: PodRequest, rng: random.Random) -> ShareChoice | None:
    """Random fit: a uniformly random feasible node and a random GPU that fits (drawn from rng)."""
    policy = RandomFit()
    policy.rng = rng
    return place_one(nodes, pod, policy, rng)


def best_fit(nodes: Sequence[ShareNode], pod: PodRequest) -> ShareChoice | None:
    """The paper's best fit (:class:`BestFit`) over ``nodes``."""
    return place_one(nodes, pod, BestFit())


def fgd(nodes: Sequence[ShareNode], pod: PodRequest, mix: TargetMix) -> ShareChoice | None:
    """Fragmentation Gradient Descent (:class:`FGD`) over ``nodes``."""
    return place_one(nodes, pod, FGD(mix))


def phalanx_pack(nodes: Sequence[ShareNode], pod: PodRequest, mix: TargetMix) -> ShareChoice | None:
    """Phalanx's policy (:class:`PhalanxPack`) over ``nodes``."""
    return place_one(nodes, pod, PhalanxPack(mix))
