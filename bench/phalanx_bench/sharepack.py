"""TDM GPU-share packing research model: fit filter, scoring policies and an incremental loop.

Used by ``bench/packing.py`` only (the trace replay against the FGD paper); the placement
service's own policy lives in ``phalanx_engine``. A pure library (standard library only) for
placing pods that ask for fractions of a GPU
(time-division multiplexing, "TDM" sharing) or for whole GPUs, on nodes that each hold a
number of GPUs of one model. See docs/packing.md for the method and the measured figures.

Model
-----
* A node has CPU (milli-cores) and memory (MiB) left, and per GPU the milli (0..1000) left.
* A pod asks for CPU, memory and ``gpu_count`` GPUs of ``gpu_milli`` each: a *sharing* pod
  has ``gpu_count == 1`` and ``0 < gpu_milli < 1000`` and goes onto one GPU that has at least
  ``gpu_milli`` left; a *whole-GPU* pod has ``gpu_milli == 1000`` and needs ``gpu_count``
  completely free GPUs on one node. A pod may restrict the GPU model.
* :func:`fits` is the filter. A :class:`Policy` scores a feasible node (higher is better) and
  picks the GPU(s) that receive the pod. Ties between equal scores go to the node that comes
  first in the cluster's node order (in the trace replay a random order drawn once per seed,
  like the reference simulator's random node-name prefixes).

Policies
--------
* :class:`RandomFit` — a uniformly random feasible node, a random GPU that fits.
* :class:`BestFit` — the FGD paper's best-fit baseline: least CPU and GPU left afterwards,
  ``0.5 * cpu_left / 128000 + 0.5 * gpu_left / 8000`` (as an integer score 0..100), on the
  tightest GPU that fits.
* :class:`FGD` — Fragmentation Gradient Descent (Weng et al., USENIX ATC'23): the expected
  fragmentation of a node w.r.t. a target workload mix (:class:`TargetMix`), the score
  ``floor(100 * sigmoid((F_before - F_after) / 1000))``, the GPU that minimises ``F_after``.
* :class:`PhalanxPack` — Phalanx's policy: FGD's fragmentation plus the GPU milli a node's
  CPU can no longer feed ("CPU stranding"), scored like FGD, and sharing pods packed onto the
  tightest GPU in the cluster that fits. On the openb trace it allocates 95.9 % of the GPUs
  at 100 % arrived demand, FGD 95.2 % (docs/packing.md).

:class:`ShareCluster` runs the filter/score/place loop over many pods quickly: it caches each
node's score per distinct request and only rescores the nodes that changed since the request
was last seen, and it memoises scores per (node state, request).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

MILLI = 1000
"""Milli of one whole GPU."""

MAX_SPEC_CPU = 128_000
"""CPU milli that best fit normalises by (the largest node of the reference trace)."""

MAX_SPEC_GPU = 8 * MILLI
"""GPU milli that best fit normalises by (8 GPUs)."""

_INFEASIBLE = -(1 << 62)
_MAX_CHANGES = 1 << 16
_MAX_VECTORS = 4096


# --------------------------------------------------------------------------- requests and nodes


@dataclass(frozen=True, slots=True)
class PodRequest:
    """What one pod asks for.

    ``gpu_milli`` is per GPU: ``0`` with ``gpu_count == 0`` (CPU only), ``1..999`` with
    ``gpu_count == 1`` (a share of one GPU) or ``1000`` with ``gpu_count >= 1`` (whole GPUs).
    ``gpu_models`` restricts the GPU model (``None``: any model).
    """

    cpu_milli: int
    memory_mib: int = 0
    gpu_milli: int = 0
    gpu_count: int = 0
    gpu_models: frozenset[str] | None = None

    def __post_init__(self) -> None:
        if self.cpu_milli < 0 or self.memory_mib < 0:
            raise ValueError("cpu_milli and memory_mib must be >= 0")
        if self.gpu_count < 0 or not 0 <= self.gpu_milli <= MILLI:
            raise ValueError("gpu_count must be >= 0 and gpu_milli in 0..1000")
        if (self.gpu_count == 0) != (self.gpu_milli == 0):
            raise ValueError("gpu_milli and gpu_count must be both zero or both positive")
        if 0 < self.gpu_milli < MILLI and self.gpu_count != 1:
            raise ValueError("a GPU share (0 < gpu_milli < 1000) is for exactly one GPU")
        if self.gpu_models is not None and not isinstance(self.gpu_models, frozenset):
            object.__setattr__(self, "gpu_models", frozenset(self.gpu_models))

    @classmethod
    def from_total(cls, cpu_milli: int, memory_mib: int, total_gpu_milli: int,
                   gpu_models: Iterable[str] | None = None) -> PodRequest:
        """A request from a total GPU milli: below 1000 is a share, else a multiple of 1000."""
        models = None if gpu_models is None else frozenset(gpu_models)
        if total_gpu_milli <= 0:
            return cls(cpu_milli, memory_mib, 0, 0, models)
        if total_gpu_milli < MILLI:
            return cls(cpu_milli, memory_mib, total_gpu_milli, 1, models)
        if total_gpu_milli % MILLI:
            raise ValueError("a GPU request of 1000 milli or more must be a multiple of 1000")
        return cls(cpu_milli, memory_mib, MILLI, total_gpu_milli // MILLI, models)

    @property
    def is_share(self) -> bool:
        """True for a pod that takes part of one GPU."""
        return self.gpu_count == 1 and self.gpu_milli < MILLI

    @property
    def total_gpu_milli(self) -> int:
        return self.gpu_milli * self.gpu_count

    @property
    def shape(self) -> tuple[int, int, int, frozenset[str] | None]:
        """(cpu, gpu milli, gpu count, models): what fragmentation looks at (memory is not)."""
        return (self.cpu_milli, self.gpu_milli, self.gpu_count, self.gpu_models)


@dataclass(slots=True)
class ShareNode:
    """A node's free resources: CPU milli, memory MiB, and milli left on each GPU (by index)."""

    name: str
    cpu_free: int
    memory_free: int
    gpu_free: list[int] = field(default_factory=list)
    gpu_model: str | None = None

    @classmethod
    def empty(cls, name: str, cpu_milli: int, memory_mib: int, gpus: int,
              gpu_model: str | None = None) -> ShareNode:
        return cls(name, cpu_milli, memory_mib, [MILLI] * gpus, gpu_model)

    @property
    def gpu_free_total(self) -> int:
        return sum(self.gpu_free)

    @property
    def full_gpus(self) -> int:
        """Number of completely free GPUs."""
        return sum(1 for g in self.gpu_free if g == MILLI)

    def copy(self) -> ShareNode:
        return ShareNode(self.name, self.cpu_free, self.memory_free, list(self.gpu_free), self.gpu_model)

    def allocate(self, pod: PodRequest, gpu_ids: Sequence[int]) -> None:
        """Take the pod's resources, ``pod.gpu_milli`` from each GPU in ``gpu_ids``."""
        if len(gpu_ids) != pod.gpu_count:
            raise ValueError(f"pod needs {pod.gpu_count} GPU(s), got {len(gpu_ids)}")
        if pod.cpu_milli > self.cpu_free or pod.memory_mib > self.memory_free:
            raise ValueError(f"node {self.name} lacks CPU or memory for the pod")
        if len(set(gpu_ids)) != len(gpu_ids) or any(self.gpu_free[i] < pod.gpu_milli for i in gpu_ids):
            raise ValueError(f"GPUs {list(gpu_ids)} of node {self.name} cannot take {pod.gpu_milli} milli each")
        self.cpu_free -= pod.cpu_milli
        self.memory_free -= pod.memory_mib
        for i in gpu_ids:
            self.gpu_free[i] -= pod.gpu_milli

    def release(self, pod: PodRequest, gpu_ids: Sequence[int]) -> None:
        """Give back what :meth:`allocate` took."""
        self.cpu_free += pod.cpu_milli
        self.memory_free += pod.memory_mib
        for i in gpu_ids:
            self.gpu_free[i] += pod.gpu_milli
            if self.gpu_free[i] > MILLI:
                raise ValueError(f"GPU {i} of node {self.name} would exceed {MILLI} milli")


@dataclass(frozen=True, slots=True)
class ShareChoice:
    """Where a pod went: the node's position in the cluster's node list, and its GPU indices."""

    node: int
    gpu_ids: tuple[int, ...]
    score: int


# --------------------------------------------------------------------------- the filter


def model_ok(gpu_model: str | None, pod: PodRequest) -> bool:
    """The node's GPU model satisfies the pod's model constraint (CPU-only pods always do)."""
    return pod.gpu_count == 0 or pod.gpu_models is None or gpu_model in pod.gpu_models


def fits(node: ShareNode, pod: PodRequest) -> bool:
    """The filter: CPU, memory, GPU model and GPU capacity all fit the node's remainder."""
    if pod.cpu_milli > node.cpu_free or pod.memory_mib > node.memory_free:
        return False
    if pod.gpu_count == 0:
        return True
    if not model_ok(node.gpu_model, pod):
        return False
    need, milli = pod.gpu_count, pod.gpu_milli
    return sum(1 for g in node.gpu_free if g >= milli) >= need


def candidate_gpus(node: ShareNode, pod: PodRequest) -> list[int]:
    """Indices of the GPUs that could take (one of) the pod's GPU parts."""
    return [i for i, g in enumerate(node.gpu_free) if g >= pod.gpu_milli] if pod.gpu_count else []


def lowest_free_gpus(node: ShareNode, pod: PodRequest) -> tuple[int, ...]:
    """For a whole-GPU pod, the lowest-index completely free GPUs (the reference's choice)."""
    ids = [i for i, g in enumerate(node.gpu_free) if g == MILLI][: pod.gpu_count]
    if len(ids) < pod.gpu_count:
        raise ValueError(f"node {node.name} has fewer than {pod.gpu_count} free GPUs")
    return tuple(ids)


# --------------------------------------------------------------------------- fragmentation


@dataclass(frozen=True, slots=True)
class WorkloadShape:
    """One kind of pod in the target mix, with its probability."""

    cpu_milli: int
    gpu_milli: int
    gpu_count: int
    gpu_models: frozenset[str] | None
    prob: float


class TargetMix:
    """The target workload distribution FGD measures fragmentation against.

    :meth:`from_requests` follows the reference simulator: count requests by shape (CPU, GPU
    milli, GPU count, GPU model; memory is ignored), keep the most frequent shapes until they
    cover ``coverage`` of all requests, renormalise. Fragmentation values are memoised.
    """

    def __init__(self, shapes: Iterable[WorkloadShape]):
        self.shapes: tuple[WorkloadShape, ...] = tuple(shapes)
        if not self.shapes:
            raise ValueError("a target mix needs at least one shape")
        total = sum(s.prob for s in self.shapes)
        if not math.isclose(total, 1.0, rel_tol=0, abs_tol=1e-6):
            raise ValueError(f"shape probabilities sum to {total}, not 1")
        self.cpu_only_prob = sum(s.prob for s in self.shapes if s.gpu_count == 0)
        # GPU shapes as plain tuples for the hot loop: (prob, cpu, milli, count, models)
        self._gpu_shapes = tuple((s.prob, s.cpu_milli, s.gpu_milli, s.gpu_count, s.gpu_models)
                                 for s in self.shapes if s.gpu_count > 0)
        self._memo: dict[tuple, float] = {}

    @classmethod
    def from_requests(cls, pods: Iterable[PodRequest], coverage: float = 0.95,
                      include_cpu_only: bool = True) -> TargetMix:
        counts = Counter(p.shape for p in pods if include_cpu_only or p.gpu_count > 0)
        if not counts:
            raise ValueError("no requests to build a target mix from")
        total = sum(counts.values())

        def order(item: tuple[tuple, int]) -> tuple:
            (cpu, milli, count, models), n = item
            return (-n, -cpu, -milli, -count, sorted(models) if models else [])

        kept: list[tuple[tuple, int]] = []
        covered = 0
        for item in sorted(counts.items(), key=order):
            if covered >= coverage * total:
                break
            kept.append(item)
            covered += item[1]
        return cls(WorkloadShape(c, m, n, g, k / covered) for (c, m, n, g), k in kept)

    def __len__(self) -> int:
        return len(self.shapes)

    def cpu_per_gpu_milli(self) -> float:
        """Expected CPU milli per GPU milli of the mix's GPU shapes (probability-weighted)."""
        gpu = sum(p * milli * count for p, _, milli, count, _ in self._gpu_shapes)
        cpu = sum(p * cpu for p, cpu, _, _, _ in self._gpu_shapes)
        return cpu / gpu if gpu else 0.0

    def fragmentation(self, cpu_free: int, gpus_desc: tuple[int, ...], gpu_model: str | None) -> float:
        """Expected fragmented GPU milli of a node (GPU milli left sorted descending).

        For each shape m: all the node's free GPU milli if m needs no GPU, may not use the
        model, or does not fit (CPU or GPUs); otherwise the free milli of the GPUs that each
        have less than m's per-GPU milli left. Weighted by m's probability.
        """
        key = (cpu_free, gpus_desc, gpu_model)
        value = self._memo.get(key)
        if value is not None:
            return value
        total = sum(gpus_desc)
        if total == 0:
            value = 0.0
        else:
            value = self.cpu_only_prob * total
            n = len(gpus_desc)
            for prob, cpu, milli, count, models in self._gpu_shapes:
                if (cpu > cpu_free or count > n or gpus_desc[count - 1] < milli
                        or (models is not None and gpu_model not in models)):
                    value += prob * total
                elif gpus_desc[-1] < milli:
                    value += prob * sum(g for g in gpus_desc if g < milli)
        if len(self._memo) > 4_000_000:
            self._memo.clear()
        self._memo[key] = value
        return value

    def node_fragmentation(self, node: ShareNode) -> float:
        return self.fragmentation(node.cpu_free, tuple(sorted(node.gpu_free, reverse=True)), node.gpu_model)


def node_fragmentation(node: ShareNode, mix: TargetMix) -> float:
    """FGD's fragmentation measure F_n of one node w.r.t. the target mix."""
    return mix.node_fragmentation(node)


def _after(gpus_desc: tuple[int, ...], take_from: int, milli: int) -> tuple[int, ...]:
    """``gpus_desc`` with ``milli`` taken from the first GPU whose value is ``take_from``."""
    out = list(gpus_desc)
    out[out.index(take_from)] -= milli
    out.sort(reverse=True)
    return tuple(out)


def _after_whole(gpus_desc: tuple[int, ...], count: int) -> tuple[int, ...]:
    """``gpus_desc`` (descending, so full GPUs first) with ``count`` full GPUs taken."""
    return gpus_desc[count:] + (0,) * count


def _sigmoid(x: float) -> float:
    if x < -700:
        return 0.0
    return 1.0 / (1.0 + math.exp(-x))


def fgd_score_value(before: float, after: float) -> int:
    """The reference's FGD score: ``floor(100 * sigmoid((before - after) / 1000))``."""
    return int(_sigmoid((before - after) / 1000) * 100)


def fgd_share_options(cpu_free: int, gpus_desc: tuple[int, ...], gpu_model: str | None,
                      pod: PodRequest, mix: TargetMix) -> list[tuple[int, float]]:
    """For a sharing pod: (distinct free milli of a GPU that fits, F of the node after it)."""
    cpu_after = cpu_free - pod.cpu_milli
    out = []
    last = -1
    for g in gpus_desc:
        if g < pod.gpu_milli:
            break
        if g != last:
            out.append((g, mix.fragmentation(cpu_after, _after(gpus_desc, g, pod.gpu_milli), gpu_model)))
            last = g
    return out


def fgd_after(cpu_free: int, gpus_desc: tuple[int, ...], gpu_model: str | None,
              pod: PodRequest, mix: TargetMix) -> float:
    """For a CPU-only or whole-GPU pod: F of the node after placing it."""
    return mix.fragmentation(cpu_free - pod.cpu_milli, _after_whole(gpus_desc, pod.gpu_count), gpu_model)


# --------------------------------------------------------------------------- policies


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
            s = fgd_score_value(before, self.fragmentation(cpu_after, _after(gpus, g, pod.gpu_milli),
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
        after = self.fragmentation(node.cpu_free - pod.cpu_milli, _after_whole(gpus, pod.gpu_count),
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


# --------------------------------------------------------------------------- the placement loop


class ShareCluster:
    """Nodes plus a policy: filter, score, pick and place pods one at a time.

    The cluster owns ``nodes`` (it changes them in place); their order breaks ties (first
    wins). The policy's score must depend only on ``policy.score_key(node)`` and the request
    (or ``score_key`` must return None), and the nodes must only change through
    :meth:`place` and :meth:`remove`, or the caches go stale. ``rng`` draws the node for a
    randomized policy. Per distinct
    request the cluster keeps every node's encoded score and, when the request comes again,
    rescores only the nodes placed on since; scores are memoised per (``policy.score_key``,
    request), so nodes in the same state are scored once.
    """

    def __init__(self, nodes: Sequence[ShareNode], policy: Policy, rng: random.Random | None = None):
        self.nodes = list(nodes)
        self.policy = policy
        self.rng = rng if rng is not None else random.Random(0)
        self.gpu_capacity = sum(len(n.gpu_free) for n in self.nodes) * MILLI
        self.gpu_allocated = MILLI * sum(len(n.gpu_free) for n in self.nodes) - sum(
            n.gpu_free_total for n in self.nodes)
        self._n = len(self.nodes)
        self._stride = self._n + 1
        self._changes: list[int] = []
        self._vectors: dict[PodRequest, tuple[list[int], int]] = {}
        self._memo: dict[tuple, int] = {}

    # score of one node for one request, encoded so that max() also breaks ties by node order
    def _encoded(self, i: int, pod: PodRequest) -> int:
        node = self.nodes[i]
        if not fits(node, pod):
            return _INFEASIBLE
        key = self.policy.score_key(node)
        if key is None:
            s = self.policy.score(node, pod)
        else:
            mk = (key, pod)
            s = self._memo.get(mk)
            if s is None:
                s = self.policy.score(node, pod)
                if len(self._memo) > 2_000_000:
                    self._memo.clear()
                self._memo[mk] = s
        return s * self._stride + (self._n - i)

    def _vector(self, pod: PodRequest) -> list[int]:
        entry = self._vectors.get(pod)
        changes = self._changes
        if entry is None:
            vec = [self._encoded(i, pod) for i in range(self._n)]
        else:
            vec, seen = entry
            pending = len(changes) - seen
            if pending:
                todo = range(self._n) if pending >= self._n else set(changes[seen:])
                for i in todo:
                    vec[i] = self._encoded(i, pod)
        if entry is None and len(self._vectors) >= _MAX_VECTORS:
            self._vectors.clear()
        self._vectors[pod] = (vec, len(changes))
        return vec

    def choose(self, pod: PodRequest) -> ShareChoice | None:
        """Where the policy would put ``pod`` (nothing is changed), or None if it fits nowhere."""
        vec = self._vector(pod)
        if self.policy.randomized:
            feasible = [i for i, v in enumerate(vec) if v != _INFEASIBLE]
            if not feasible:
                return None
            i = feasible[self.rng.randrange(len(feasible))]
            score = 0
        else:
            top = max(vec) if vec else _INFEASIBLE
            if top == _INFEASIBLE:
                return None
            score, rest = divmod(top, self._stride)
            i = self._n - rest
        return ShareChoice(i, self.policy.select_gpus(self.nodes[i], pod), score)

    def _changed(self, i: int) -> None:
        self._changes.append(i)
        if len(self._changes) > _MAX_CHANGES:  # keep the log bounded: rescore from scratch
            self._changes.clear()
            self._vectors.clear()

    def place(self, pod: PodRequest, placement: ShareChoice) -> None:
        """Apply a placement (from :meth:`choose`, or any feasible one)."""
        self.nodes[placement.node].allocate(pod, placement.gpu_ids)
        self.gpu_allocated += pod.total_gpu_milli
        self._changed(placement.node)

    def remove(self, pod: PodRequest, placement: ShareChoice) -> None:
        """Undo :meth:`place` (the pod left)."""
        self.nodes[placement.node].release(pod, placement.gpu_ids)
        self.gpu_allocated -= pod.total_gpu_milli
        self._changed(placement.node)

    def schedule(self, pod: PodRequest) -> ShareChoice | None:
        """Choose and place; None (and nothing changes) when the pod fits nowhere."""
        placement = self.choose(pod)
        if placement is not None:
            self.place(pod, placement)
        return placement

    @property
    def allocation_ratio(self) -> float:
        return self.gpu_allocated / self.gpu_capacity if self.gpu_capacity else 0.0
