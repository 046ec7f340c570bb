"""binder's claim step: a gang's ResourceClaims written before any of its Bindings (docs/dra.md).

For a ``BindPods`` whose reservations hold claims (``Assignment.claims``), every claim of every
pod is reserved first — the finalizer, ``status.allocation`` (when Phalanx allocated it) and the
pod in ``status.reservedFor`` (``ClusterPort.reserve_claim``, idempotent: a redelivered command
finds its writes done) — and only when all succeeded are the pods bound. A claim that cannot be
reserved (allocated elsewhere in the meantime, deleted, full) binds no pod of the command: each
pod fails with the reason, the gang rolls back, and the rollback's ``claims`` compensation takes
back what was written: gang-coordinator sends ``UnreserveClaims`` and binder runs ``unreserve``,
for pods that are not bound only (a forged command cannot take a running pod's devices). A gang is never bound with a claim unwritten.

A claim several members share is written once with its allocation and then once more per
further member (each adds itself to ``reservedFor``), in the command's order.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from phalanx_kube.port import ClaimConflict, ClaimGone, ClaimRef, ClusterPort, Pod
from phalanx_proto.events import Assignment, PodRef, UnreserveClaims
from phalanx_proto.kubeapi import SCHEDULER_NAMES
from phalanx_proto.vocab import RefusalRule as R
from phalanx_telemetry import log, metrics, refused


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



async def unreserve(cluster: ClusterPort, ev: UnreserveClaims, pod_of: Callable[[PodRef], Awaitable[Pod | None]]) -> None:
    """Take each named pod out of its claims and clear the allocations Phalanx wrote that nobody
    else holds (``ClusterPort.unreserve_claim``: idempotent, nothing for a claim that is gone or
    never reserved). A pod still bound, or not Phalanx's, is refused: logged with the rule,
    its claims left alone."""
    for h in ev.held:
        pod = await pod_of(h.pod)
        if pod is not None and pod.uid == h.pod.uid:
            if pod.scheduler_name not in SCHEDULER_NAMES:
                refused(R.FOREIGN_SCHEDULER, f"pod {h.pod} has schedulerName {pod.scheduler_name!r}",
                        gang=ev.gang_id, attempt=ev.attempt)
                continue
            if pod.node_name:
                refused(R.LIVE_POD, f"pod {h.pod} is bound to {pod.node_name}: its claims stay reserved",
                        gang=ev.gang_id, attempt=ev.attempt)
                continue
        for c in h.claims:
            await cluster.unreserve_claim(ClaimRef.of(c.claim), h.pod, c.allocation if c.allocated else None)
            metrics.CLAIM_WRITES.inc(result="unreserved")
        log("claims unreserved", pod=str(h.pod), claims=len(h.claims), gang=ev.gang_id, attempt=ev.attempt)
