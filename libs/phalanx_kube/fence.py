"""The per-node fence: binder's record of which pods it bound to a node and what it assigned.

A ``coordination.k8s.io/v1`` Lease ``phalanx-fence-<node>`` in the Phalanx namespace, written
only by binder (RBAC: no pod, user or node agent can write it). Its annotation
``phalanx.io/fence`` holds a ``Fence`` (``phalanx_proto.kubeapi``, the wire format): for each pod between its Binding and its admission by
the kubelet, the pod's uid, namespace/name, the SHA-256 of the ``phalanx.io/assignment``
annotation binder wrote on it, and an expiry. The plugin serves a pod only if the fence names
its uid, the entry has not expired, the lease is held (renewed within its duration), and the
pod's annotation still hashes to the recorded digest: an annotation written or edited by anyone
else is never trusted.

Unlike a lock, the fence is a set: any number of pods (a gang's members on the node, several
gangs) can be listed at once, because the plugin learns which one the kubelet is admitting from
the kubelet itself (``identify``), not from the fence. So an entry left by a deleted or
terminal pod blocks nothing; it is skipped (the pod is read) and pruned.

Binder's protocol (docs/delivery.md, "The fence"): entries are added before the Bindings and
removed once a pod is admitted, deleted or terminal, by ``change`` (any number of additions and
removals in one compare-and-set write on the lease's resourceVersion, lapsed entries pruned;
binder's ``phalanx_binder.fences`` batches them per node); ``fence_pods``/``release_pods`` are
the one-shot forms. The plugin (``phalanx_deviceplugin``) uses ``read``/``verify``; both sides
share this module.
"""

from __future__ import annotations

import hashlib
import re
from typing import NamedTuple

import msgspec

from phalanx_kube.port import ClusterPort, Lease, LeaseConflict
from phalanx_proto.kubeapi import (
    ASSIGNMENT_ANNOTATION,
    FENCE_ANNOTATION,
    MAX_FENCE_ENTRIES,
    Fence,
    FenceEntry,
    assignment_digest,
    decode_fence,
    encode_fence,
)

LEASE_PREFIX = "phalanx-fence-"
ENTRY_TTL_S = 300.0
"""How long binder lets a bound pod wait for its admission before the entry lapses."""
LEASE_DURATION_S = 600
_NAME_OK = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


class FenceError(ValueError):
    """The lease does not hold a usable fence (absent, expired, malformed, another node's)."""


def lease_name(node: str) -> str:
    """``phalanx-fence-<node>``; a node name that would not fit a Lease name (253 characters,
    DNS subdomain) is replaced by a digest of it."""
    name = LEASE_PREFIX + node
    if len(name) <= 253 and _NAME_OK.fullmatch(name):
        return name
    return LEASE_PREFIX + hashlib.sha256(node.encode()).hexdigest()[:40]


def read(lease: Lease | None, node: str, now: float) -> Fence:
    """The fence a lease holds, or ``FenceError`` naming what is wrong with it."""
    if lease is None:
        raise FenceError(f"no fence lease {lease_name(node)}: binder has bound no pod here")
    if lease.expired(now):
        raise FenceError(f"fence lease {lease.namespace}/{lease.name} expired (holder {lease.holder or '-'} "
                         f"did not renew within {lease.duration_s}s)")
    raw = lease.annotations.get(FENCE_ANNOTATION)
    if raw is None:
        raise FenceError(f"fence lease {lease.namespace}/{lease.name} has no {FENCE_ANNOTATION} annotation")
    try:
        fence = decode_fence(raw)
    except msgspec.ValidationError as e:
        raise FenceError(f"fence lease {lease.namespace}/{lease.name}: {FENCE_ANNOTATION} is invalid: {e}") from e
    except msgspec.DecodeError as e:
        raise FenceError(f"fence lease {lease.namespace}/{lease.name}: {FENCE_ANNOTATION} is not JSON: {e}") from e
    if fence.node != node:
        raise FenceError(f"fence lease {lease.namespace}/{lease.name} is for node {fence.node!r}, not {node!r}")
    return fence


def verify(fence: Fence, *, uid: str, namespace: str, name: str, annotation: str | None, now: float) -> str:
    """Empty when the fence vouches for this pod and this assignment annotation; else the reason."""
    e = fence.entry(uid)
    if e is None:
        return f"pod {namespace}/{name} (uid {uid}) is not in the node's fence: binder did not bind it here"
    if (e.namespace, e.name) != (namespace, name):
        return f"fence entry for uid {uid} names {e.namespace}/{e.name}, not {namespace}/{name}"
    if e.expires <= now:
        return f"fence entry of pod {namespace}/{name} expired {now - e.expires:.0f}s ago"
    if annotation is None:
        return f"pod {namespace}/{name} has no {ASSIGNMENT_ANNOTATION} annotation"
    if assignment_digest(annotation) != e.digest:
        return (f"pod {namespace}/{name}: {ASSIGNMENT_ANNOTATION} differs from what binder wrote "
                f"(digest {assignment_digest(annotation)[:19]}…, fence has {e.digest[:19]}…)")
    return ""


# -- binder's side (pure; binder does the compare-and-set) ---------------------------------------
def admit(fence: Fence, entries: list[FenceEntry], now: float) -> Fence:
    """The fence with ``entries`` added (replacing entries of the same uid) and lapsed ones
    pruned. Raises ``FenceError`` past ``MAX_FENCE_ENTRIES``."""
    uids = {e.uid for e in entries}
    kept = [e for e in prune(fence, now).pods if e.uid not in uids]
    if len(kept) + len(entries) > MAX_FENCE_ENTRIES:
        raise FenceError(f"fence of node {fence.node} would list more than {MAX_FENCE_ENTRIES} pods")
    return msgspec.structs.replace(fence, pods=tuple(kept + list(entries)))


def release(fence: Fence, uids: set[str], now: float) -> Fence:
    """The fence without ``uids`` (admitted, deleted or terminal pods), lapsed entries pruned."""
    return msgspec.structs.replace(fence, pods=tuple(e for e in prune(fence, now).pods if e.uid not in uids))


def prune(fence: Fence, now: float) -> Fence:
    return msgspec.structs.replace(fence, pods=tuple(e for e in fence.pods if e.expires > now))


# -- the writes, by compare-and-set (binder) ------------------------------------------------------
CAS_RETRIES = 20


class Unknown:
    """``known`` not given: read the lease first."""


class Written(NamedTuple):
    lease: Lease | None
    """The lease as it is now (``None``: there is none)."""
    wrote: bool
    """False when nothing needed writing."""


UNKNOWN = Unknown()


async def change(cluster: ClusterPort, *, namespace: str, node: str, holder: str, now: float,
                 add: list[FenceEntry] | tuple[FenceEntry, ...] = (), remove: set[str] | frozenset[str] = frozenset(),
                 known: Lease | None | Unknown = UNKNOWN) -> Written:
    """Add ``add`` and drop ``remove`` in one compare-and-set write of the node's fence lease
    (created when absent, deleted when left empty), lapsed entries pruned.

    ``known`` is the lease as the caller last saw it (``None``: believed absent): the first try
    writes on its resourceVersion without reading, and only a conflict costs a read, so a
    writer that is the only one (one binder replica) pays one request per change. A change
    that changes nothing (a release of uids the fence does not list) writes nothing while the
    lease has more than half its duration left."""
    name = lease_name(node)
    lease = known
    for _ in range(CAS_RETRIES):
        if isinstance(lease, Unknown):
            lease = await cluster.get_lease(namespace, name)
        current, readable = Fence(node=node), False
        if lease is not None and not lease.expired(now):
            try:
                current, readable = read(lease, node, now), True
            except FenceError:
                pass  # unreadable: binder owns the lease, so it rewrites it
        fence = release(admit(current, list(add), now), set(remove), now) if add else release(current, set(remove), now)
        try:
            if not fence.pods:
                if lease is None:
                    return Written(None, False)
                await cluster.delete_lease(namespace, name, resource_version=lease.resource_version)
                return Written(None, True)
            if (readable and lease is not None and fence.pods == current.pods
                    and lease.renewed + lease.duration_s / 2 > now):
                return Written(lease, False)
            body = Lease(namespace=namespace, name=name, holder=holder, duration_s=LEASE_DURATION_S,
                         acquired=lease.acquired if lease and lease.holder == holder else now, renewed=now,
                         annotations={FENCE_ANNOTATION: encode_fence(fence)},
                         resource_version=lease.resource_version if lease else "")
            return Written(await (cluster.update_lease(body) if lease is not None else cluster.create_lease(body)), True)
        except LeaseConflict:
            lease = UNKNOWN
            continue
    raise LeaseConflict(f"fence lease {namespace}/{name}: too many concurrent writers")


async def fence_pods(cluster: ClusterPort, *, namespace: str, node: str, entries: list[FenceEntry],
                     holder: str, now: float) -> Lease | None:
    """Add ``entries`` (a batch: every pod about to be bound to ``node``) in one write."""
    return (await change(cluster, namespace=namespace, node=node, holder=holder, now=now, add=entries)).lease


async def release_pods(cluster: ClusterPort, *, namespace: str, node: str, uids: set[str], holder: str,
                       now: float) -> Lease | None:
    """Drop ``uids`` from the node's fence (admitted, deleted or terminal pods). Idempotent."""
    return (await change(cluster, namespace=namespace, node=node, holder=holder, now=now, remove=uids)).lease
