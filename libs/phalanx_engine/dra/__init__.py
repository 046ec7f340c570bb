"""Dynamic Resource Allocation (``resource.k8s.io/v1``) in the engine: which devices of a node
a pod's ResourceClaims get, by the rules of Kubernetes 1.36's structured allocator, choosing
among valid allocations the best-connected GPUs. Pure (values in, values out, no I/O); called
by placement per (member, node), by ``phalanx place`` and by tests.

How to call it::

    from phalanx_engine.dra import Ranking, Usage, allocate, gather

    usage = Usage(pools, held)                 # once per cycle: every DraPool (KV phx-dra) and the
                                               # ledger's ClaimAllocated the API may not show yet
    devices = gather(pools, node, labels)      # once per node and pool snapshot; keep it: it also
                                               # caches what selectors said of each device
    ranking = Ranking(topology)                # the node's NodeTopology (None: first-fit, no GPUs)

    trial = usage.copy()                       # a gang's attempt owns its copy
    for member in gang:
        got = allocate(member.claims, devices_of[node], trial, ranking_of[node])
        if isinstance(got, Refusal):
            ...                                # got.message (kube-scheduler's), got.detail, got.status()
        else:
            trial.add_allocated(got.claims)    # the next member sees these devices taken
            # got.claims: one ClaimAllocated per claim, for Assignment.claims; got.gpus: the
            # topology GPU indices the claims use

``allocate`` takes the pod's claims (``PodClaim`` from ``MemberSpec.claims``, or ``ClaimSpec``)
in ``spec.resourceClaims`` order; claims already allocated are checked against the node and
returned unchanged (``allocated=False``). It returns an ``Allocation`` or a ``Refusal``; it
raises only for caller bugs.

The modules, one concept each:

* ``celenv`` - the CEL selector environment (cel-expr-python / cel-cpp), with the Kubernetes
  quantity and semver libraries; ``semver`` - semantic versions;
* ``pools`` - ``gather``: which pools and devices reach a node (``NodeDevices``);
* ``usage`` - ``Usage``: devices, shares and counters taken, cluster-wide;
* ``allocate`` - the search; ``capacity`` (consumable capacity), ``constraints``
  (matchAttribute / distinctAttribute), ``results`` (the ``AllocationResult``), ``diagnose``
  (why not) help it;
* ``rank`` - ``Ranking``: GPU devices joined to the topology and tried NVLink-best first;
* ``refusal`` - ``Refusal``: kube-scheduler's messages, as data.
"""

from __future__ import annotations

from phalanx_engine.dra.allocate import Allocation, allocate
from phalanx_engine.dra.celenv import ENV, CelCompileError, CelEnv, CelError, CelRuntimeError
from phalanx_engine.dra.pools import Candidate, NodeDevices, PoolView, gather
from phalanx_engine.dra.rank import Ranking, pci_address
from phalanx_engine.dra.refusal import Refusal, RefusalCode
from phalanx_engine.dra.usage import Usage

__all__ = [
    "ENV", "Allocation", "Candidate", "CelCompileError", "CelEnv", "CelError", "CelRuntimeError", "NodeDevices",
    "PoolView", "Ranking", "Refusal", "RefusalCode", "Usage", "allocate", "gather", "pci_address",
]
