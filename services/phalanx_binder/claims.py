"""binder's claim step: a gang's ResourceClaims written before any of its Bindings (docs/dra.md).

For a ``BindPods`` whose reservations hold claims (``Assignment.claims``), every claim of every
pod is reserved first — the finalizer, ``status.allocation`` (when Phalanx allocated it) and the
pod in ``status.reservedFor`` (``ClusterPort.reserve_claim``, idempotent: a redelivered command
finds its writes done) — and only when all succeeded are the pods bound. A claim that cannot be
reserved (allocated elsewhere in the meantime, deleted, full) binds no pod of the command: each
pod fails with the reason, the gang rolls back, and gang-coordinator's compensation takes back
what was written (its ``claims`` step). A gang is never bound with a claim unwritten.

A claim several members share is written once with its allocation and then once more per
further member (each adds itself to ``reservedFor``), in the command's order.
"""

from __future__ import annotations

from collections.abc import Sequence

from phalanx_kube.port import ClaimConflict, ClaimGone, ClaimRef, ClusterPort
from phalanx_proto.events import Assignment, PodRef
from phalanx_telemetry import log, metrics


async def reserve(cluster: ClusterPort, todo: Sequence[Assignment]) -> dict[PodRef, str]:
    """Reserve every claim of ``todo``'s pods; pod → why not, for every pod of ``todo`` when any
    claim failed (empty: all reserved, bind them)."""
    failed: dict[PodRef, str] = {}
    for a in todo:
        for c in a.claims:
            ref = ClaimRef.of(c.claim)
            try:
                await cluster.reserve_claim(ref, a.pod, c.allocation if c.allocated else None)
                metrics.CLAIM_WRITES.inc(result="reserved")
            except (ClaimConflict, ClaimGone) as e:
                metrics.CLAIM_WRITES.inc(result="failed")
                failed[a.pod] = f"claim {ref}: {e}"
                break
        if failed:
            break
    if not failed:
        if any(a.claims for a in todo):
            log("claims reserved", pods=len(todo), claims=sum(len(a.claims) for a in todo))
        return {}
    (culprit, why), = failed.items()
    return {a.pod: why if a.pod == culprit else f"not bound: gang member {culprit}'s {why}" for a in todo}

