"""TDM GPU-share packing research model: requests, nodes, the fit filter and fragmentation.

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
* :func:`fits` is the filter. A policy (``phalanx_bench.sharepolicies``) scores a feasible
  node (higher is better) and picks the GPU(s) that receive the pod. Ties between equal scores
  go to the node that comes first in the cluster's node order (in the trace replay a random
  order drawn once per seed, like the reference simulator's random node-name prefixes).
* :class:`TargetMix` is the target workload mix FGD measures a node's expected fragmentation
  against; :func:`fgd_score_value`, :func:`fgd_share_options` and :func:`fgd_after` are the
  pieces of FGD's score that the policies share.

The policies and the one-shot placement are in ``phalanx_bench.sharepolicies``; the
incremental placement loop, :class:`~phalanx_bench.sharecluster.ShareCluster`, in
``phalanx_bench.sharecluster``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

MILLI = 1000
"""Milli of one whole GPU."""


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


def gpus_after_share(gpus_desc: tuple[int, ...], take_from: int, milli: int) -> tuple[int, ...]:
    """``gpus_desc`` with ``milli`` taken from the first GPU whose value is ``take_from``."""
    out = list(gpus_desc)
    out[out.index(take_from)] -= milli
    out.sort(reverse=True)
    return tuple(out)


def gpus_after_whole(gpus_desc: tuple[int, ...], count: int) -> tuple[int, ...]:
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
            out.append((g, mix.fragmentation(cpu_after, gpus_after_share(gpus_desc, g, pod.gpu_milli), gpu_model)))
            last = g
    return out


def fgd_after(cpu_free: int, gpus_desc: tuple[int, ...], gpu_model: str | None,
              pod: PodRequest, mix: TargetMix) -> float:
    """For a CPU-only or whole-GPU pod: F of the node after placing it."""
    return mix.fragmentation(cpu_free - pod.cpu_milli, gpus_after_whole(gpus_desc, pod.gpu_count), gpu_model)
