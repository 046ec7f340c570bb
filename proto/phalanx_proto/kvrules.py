"""The rules a value in a shared KV bucket must keep to be believed (``BUCKETS``), and the
check that no GPU is booked twice (``gpu_conflicts``; placement and the reconciler use it too).

A value that does not decode or breaks its bucket's rule is *bad*: every reader skips it,
counts it and names it (``phalanx_bus.records``, ``phalanx_bus.mirror``), and
``phalanx doctor`` lists it. The values themselves are in ``phalanx_proto.state``.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from phalanx_proto import subjects as S
from phalanx_proto.codec import Decoder
from phalanx_proto.dra import DraPool, dra_pool_decoder, pool_key
from phalanx_proto.events import Assignment, NodeHeartbeat, NodeTopologyReported, RequestKind
from phalanx_proto.queues import (
    HISTORY_PREFIX,
    USAGE_PREFIX,
    QueueHistory,
    QueueSpec,
    QueueUsage,
    history_key,
    queue_key,
    usage_key,
)
from phalanx_proto.state import (
    MAX_CLOCK_SKEW_S,
    MAX_GANG_MEMBERS,
    MAX_GANG_TIMEOUT_S,
    GangState,
    NodeLedger,
    NodeMig,
    alloc_key,
    gang_state_decoder,
    heartbeat_decoder,
    ledger_decoder,
    mig_slot,
    node_kube_state_decoder,
    node_mig_decoder,
    report_decoder,
)
from phalanx_proto.topology import topology_problem


def gpu_conflicts(allocations: list[Assignment] | tuple[Assignment, ...]) -> list[str]:
    """Where these reservations on one node book a GPU twice, one sentence each (empty: none).

    A GPU holds one whole-GPU reservation, or TDM shares whose core percentages add up to at
    most 100, or MIG instances at distinct start slots; never two kinds at once (R5). GPU
    memory is not checked here (it needs the node's topology)."""
    by_gpu: dict[int, list[Assignment]] = defaultdict(list)
    for a in allocations:
        for g in set(a.gpus):
            by_gpu[g].append(a)
    out = []
    for gpu, held in sorted(by_gpu.items()):
        if len(held) < 2:
            continue
        kinds = {a.kind for a in held}
        pods = ", ".join(sorted(str(a.pod) for a in held))
        if len(kinds) > 1 or kinds == {RequestKind.WHOLE}:
            out.append(f"GPU {gpu} is booked by {pods}")
        elif kinds == {RequestKind.TDM} and sum(a.core_pct for a in held) > 100:
            out.append(f"GPU {gpu} shares add up to {sum(a.core_pct for a in held)}% core ({pods})")
        elif kinds == {RequestKind.MIG} and len({a.mig_start for a in held}) < len(held):
            out.append(f"GPU {gpu} has two MIG reservations at one start slot ({pods})")
    return out


def ledger_problem(key: str, ledger: NodeLedger) -> str:
    """Why a ``phx-ledger`` value cannot be believed, or "" when it keeps the rules."""
    if key != S.token(ledger.node):
        return f"key {key!r} does not match node {ledger.node!r} (expected {S.token(ledger.node)!r})"
    for k, alloc in ledger.allocations.items():
        a = alloc.assignment
        if k != alloc_key(a.pod):
            return f"allocation key {k!r} does not name its pod {alloc_key(a.pod)!r}"
        if a.node != ledger.node:
            return f"allocation {k!r} is for node {a.node!r}, not {ledger.node!r}"
        if not a.pod.uid:
            return f"allocation {k!r} has no pod uid"
        if any(g < 0 for g in a.gpus) or len(set(a.gpus)) != len(a.gpus):
            return f"allocation {k!r} has GPU indices {list(a.gpus)}: each must be >= 0 and listed once"
    for k, nom in ledger.nominations.items():
        if k != alloc_key(nom.assignment.pod) or nom.assignment.node != ledger.node:
            return f"nomination {k!r} does not name its pod on node {ledger.node!r}"
    conflicts = gpu_conflicts([alloc.assignment for alloc in ledger.allocations.values()])
    return f"double-booked: {'; '.join(conflicts)}" if conflicts else ""


def gang_problem(key: str, state: GangState) -> str:
    """Why a ``phx-gangs`` value cannot be believed, or "" when it keeps the rules."""
    if key != S.gang_key(state.gang_id):
        return f"key {key!r} does not match gang {state.gang_id!r} (expected {S.gang_key(state.gang_id)!r})"
    if state.attempt < 0 or state.failures < 0:
        return f"attempt {state.attempt} / failures {state.failures} must be >= 0"
    if not 1 <= state.min_member <= MAX_GANG_MEMBERS:
        return f"min_member {state.min_member} is outside 1..{MAX_GANG_MEMBERS}"
    if state.max_member and not state.min_member <= state.max_member <= MAX_GANG_MEMBERS:
        return f"max_member {state.max_member} is outside min_member ({state.min_member})..{MAX_GANG_MEMBERS}"
    if not 0 <= state.timeout_s <= MAX_GANG_TIMEOUT_S:
        return f"timeout_s {state.timeout_s:g} is outside 0..{MAX_GANG_TIMEOUT_S:g}"
    members = [m.pod for m in state.members]
    if len(set(members)) != len(members):
        return "a pod is listed twice among members"
    return ""


def report_problem(key: str, report: NodeTopologyReported) -> str:
    """Why a node's topology report cannot be believed (the field bounds are checked when it
    decodes; ``topology_problem`` has the rules across fields)."""
    if key != S.token(report.node):
        return f"key {key!r} does not match node {report.node!r}"
    if report.topology.node != report.node:
        return f"the report of node {report.node!r} holds the topology of {report.topology.node!r}"
    problem = topology_problem(report.topology)
    return f"topology: {problem}" if problem else ""


def heartbeat_problem(key: str, beat: NodeHeartbeat, now: float | None = None) -> str:
    """A beat names its node and a time no later than ``MAX_CLOCK_SKEW_S`` after now."""
    if key != S.token(beat.node):
        return f"key {key!r} does not match node {beat.node!r}"
    now = time.time() if now is None else now
    if not math.isfinite(beat.at) or beat.at > now + MAX_CLOCK_SKEW_S:
        return (f"at {beat.at:.0f} is {beat.at - now:.0f} s ahead of now: a beat is at most "
                f"{MAX_CLOCK_SKEW_S:.0f} s ahead (clock skew)")
    return ""


def mig_problem(key: str, book: NodeMig) -> str:
    """Each record sits under its own slot and names the book's node."""
    if key != S.token(book.node):
        return f"key {key!r} does not match node {book.node!r}"
    for slot, record in book.instances.items():
        if slot != mig_slot(record.gpu, record.start) or record.node != book.node:
            return (f"instances[{slot[:16]!r}] is the record of {record.node!r} slot "
                    f"{mig_slot(record.gpu, record.start)}: each record sits under its own slot of its own node")
    return ""


@dataclass(frozen=True, slots=True)
class BucketRule:
    """How to read one bucket's values: the decoder and the rule a decoded value must keep;
    ``keyed``: keys with one of these prefixes hold another kind of value (``phx-ledger``'s
    ``queue.*`` keys hold queue usage) and are read by that prefix's rule."""

    decoder: Decoder[Any]
    problem: Callable[[str, Any], str]
    keyed: tuple[tuple[str, BucketRule], ...] = ()

    def for_key(self, key: str) -> BucketRule:
        for prefix, rule in self.keyed:
            if key.startswith(prefix):
                return rule
        return self


def usage_problem(key: str, usage: QueueUsage) -> str:
    """A queue's usage sits under its own key."""
    expected = usage_key(usage.queue)
    return "" if key == expected else f"key {key!r} does not match queue {usage.queue!r} (expected {expected!r})"


def history_problem(key: str, history: QueueHistory) -> str:
    """A queue's recent usage sits under its own key."""
    expected = history_key(history.queue)
    return "" if key == expected else f"key {key!r} does not match queue {history.queue!r} (expected {expected!r})"


usage_decoder = Decoder(QueueUsage)
history_decoder = Decoder(QueueHistory)
queue_spec_decoder = Decoder(QueueSpec)
USAGE_RULE = BucketRule(usage_decoder, usage_problem)
HISTORY_RULE = BucketRule(history_decoder, history_problem)


def queue_spec_problem(key: str, spec: QueueSpec) -> str:
    return "" if key == queue_key(spec.name) else f"key {key!r} does not match queue {spec.name!r}"


def pool_problem(key: str, pool: DraPool) -> str:
    """A pool sits under its own key, and each of its slices names a device once."""
    expected = pool_key(pool.driver, pool.pool)
    if key != expected:
        return f"key {key!r} does not match pool {pool.driver}/{pool.pool} (expected {expected!r})"
    return ""


BUCKETS: dict[str, BucketRule] = {
    S.KV_LEDGER: BucketRule(ledger_decoder, ledger_problem, keyed=((USAGE_PREFIX, USAGE_RULE),
                                                                          (HISTORY_PREFIX, HISTORY_RULE))),
    S.KV_QUEUES: BucketRule(queue_spec_decoder, queue_spec_problem),
    S.KV_GANGS: BucketRule(gang_state_decoder, gang_problem),
    S.KV_TOPOLOGY: BucketRule(report_decoder, report_problem),
    S.KV_HEARTBEAT: BucketRule(heartbeat_decoder, heartbeat_problem),
    S.KV_MIG: BucketRule(node_mig_decoder, mig_problem),
    S.KV_NODE_STATE: BucketRule(node_kube_state_decoder, lambda key, value: ""),
    S.KV_DRA: BucketRule(dra_pool_decoder, pool_problem),
}
"""Every shared bucket whose values Phalanx believes, with its rule (``phx-leases`` holds
gang-coordinator's own bookkeeping and is read with ``lease_decoder``/``reconciler_report_decoder``)."""
