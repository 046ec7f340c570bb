"""Dynamic Resource Allocation (``resource.k8s.io/v1``) in the engine: which devices of a node
a pod's ResourceClaims get, by the rules of Kubernetes 1.36's structured allocator, choosing
among valid allocations the best-connected GPUs. Pure (values in, values out, no I/O); called
by placement per (member, node), by ``phalanx place`` and by tests.

How to call it (``view`` a ``snapshot.NodeView``)::

    from phalanx_engine.dra import Ranking, Refusal, Usage, allocate, gather

    # once per cycle: every pool (a pool reaching several nodes may come more than once) and the
    # claims Phalanx holds that the API may not show yet (the ledger's Assignment.claims)
    usage = Usage([p for v in snapshot.nodes for p in v.dra],
                  [c for v in snapshot.nodes for a in v.allocations for c in a.claims])
    # once per node and pool snapshot; keep both: they cache what selectors said of each device
    # and which device is which GPU
    devices = gather(view.dra, view.name, view.kube.labels if view.kube else {})
    ranking = Ranking(view.topology)           # or None: first-fit, no GPU indices

    trial = usage.copy()                       # a gang's attempt owns its copy
    for member in gang:
        got = allocate(member.claims, devices_of[node], trial, ranking_of[node])
        if isinstance(got, Refusal):
            ...                                # got.message (kube-scheduler's), got.detail,
                                               # got.error, got.resolvable, got.status()
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
