"""The research model's incremental placement loop: :class:`ShareCluster`.

It runs the filter/score/place loop of ``phalanx_bench.sharepack`` with a policy of
``phalanx_bench.sharepolicies`` over many pods quickly: it caches each node's score per
distinct request and only rescores the nodes that changed since the request was last seen,
and it memoises scores per (node state, request). It makes the same choices as
``sharepolicies.place_one`` (a unit test checks that). Used by ``bench/packing.py``; see
docs/packing.md, "Speed of the replay".
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from phalanx_bench.sharepack import MILLI, PodRequest, ShareChoice, ShareNode, fits
from phalanx_bench.sharepolicies import Policy

_INFEASIBLE = -(1 << 62)
_MAX_CHANGES = 1 << 16
_MAX_VECTORS = 4096


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
