"""binder's claim step: a gang's ResourceClaims written before any of its Bindings (docs/dra.md).

For a ``BindPods`` whose reservations hold claims (``Assignment.claims``), every claim of every
pod is reserved first — the finalizer, ``status.allocation`` (when Phalanx allocated it) and the
pod in ``status.reservedFor`` (``ClusterPort.reserve_claim``, idempotent: a redelivered command
finds its writes done) — and only when all succeeded are the pods bound. A claim that cannot be
reserved (allocated elsewhere in the meantime, deleted, full, or a write the API server refuses:
an admission policy, validation, authorization) binds no pod of the command: each
pod fails with the reason, the gang rolls back, and the rollback's ``claims`` compensation takes
back what was written: gang-coordinator sends ``UnreserveClaims`` and binder runs ``unreserve``,
for pods that are not bound only (a forged command cannot take a running pod's devices). A gang is never bound with a claim unwritten.

A claim several members share is written once with its allocation and then once more per
further member (each adds itself to ``reservedFor``), in the command's order. The claim for a
pod's extended resources on a node without their device plugin (KEP-5004) is created first,
as kube-scheduler creates it, and named in the pod's ``status.extendedResourceClaimStatus``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from phalanx_kube.port import (
    ClaimConflict,
    ClaimGone,
    ClaimRef,
    ClaimRefused,
    ClusterPort,
    NotOurs,
    Pod,
    PodGone,
)
from phalanx_kubeobjects import dra as K
from phalanx_proto.dra import EXTENDED_CLAIM_ANNOTATION, ClaimAllocated
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
                if c.extended:
                    ref = await _create_extended(cluster, a.pod, c)
                await cluster.reserve_claim(ref, a.pod, c.allocation if c.allocated else None)
                if c.extended:
                    await cluster.set_extended_claim_status(a.pod, K.extended_claim_status(ref.name,
                                                                                          c.extended_requests))
                metrics.CLAIM_WRITES.inc(result="reserved")
            except (ClaimConflict, ClaimGone, ClaimRefused, PodGone, NotOurs) as e:
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
            if c.extended:
                await _drop_extended(cluster, h.pod, c, pod)
            else:
                await cluster.unreserve_claim(ClaimRef.of(c.claim), h.pod, c.allocation if c.allocated else None)
            metrics.CLAIM_WRITES.inc(result="unreserved")
        log("claims unreserved", pod=str(h.pod), claims=len(h.claims), gang=ev.gang_id, attempt=ev.attempt)


async def _create_extended(cluster: ClusterPort, pod: PodRef, c: ClaimAllocated) -> ClaimRef:
    """The claim for the pod's extended resources, created as kube-scheduler creates it (found
    again, not made twice, on a redelivery: ``create_resource_claim`` is idempotent)."""
    made = await cluster.create_resource_claim(K.extended_claim(pod, c.extended_requests))
    meta = made["metadata"]
    return ClaimRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


async def _drop_extended(cluster: ClusterPort, pod: PodRef, c: ClaimAllocated, seen: Pod | None) -> None:
    """Undo ``_create_extended`` and its reservation: the claim Phalanx made for the pod is
    unreserved and deleted, and the pod's status no longer names it."""
    for obj in await cluster.list_resource_claims(pod.namespace):
        meta = obj.get("metadata") or {}
        owners = [o for o in meta.get("ownerReferences") or [] if o.get("controller")]
        if (meta.get("annotations") or {}).get(EXTENDED_CLAIM_ANNOTATION) == "true" and owners \
                and owners[0].get("uid") == pod.uid:
            ref = ClaimRef(namespace=pod.namespace, name=meta["name"], uid=meta["uid"])
            await cluster.unreserve_claim(ref, pod, c.allocation)
            await cluster.delete_resource_claim(ref)
    if seen is not None and seen.uid == pod.uid and K.extended_claim_name(seen.raw):
        try:
            await cluster.set_extended_claim_status(pod, None)
        except (PodGone, NotOurs):
            pass
