"""An allocation as the API writes it (``AllocationResult``): one claim's chosen devices turned
into ``ClaimAllocation`` the way upstream's allocator builds it (Kubernetes 1.36). Called by
``phalanx_engine.dra.allocate`` once a solution is found.

* results in request order (``req``, or ``req/sub`` for the chosen subrequest), each with the
  request's tolerations, admin access, the device's binding conditions, and for a shared device
  a share id and the capacity taken;
* config: first each DeviceClass's config once, for every request that used the class
  (``FromClass``), then the claim's own config entries (``FromClaim``) that name no request or
  name a request of the claim or the chosen subrequest (upstream lists an entry once per request
  it names; Phalanx lists it once);
* node selector: ``metadata.name In [node]`` when any device is local to the node (its slice's
  or its own node name, or ``bindsToNode``); else one term merging the devices' node selectors
  (each requirement once); else none: the devices are usable from every node.

Share ids are made from the claim's uid, the request and the device (a name-based UUID), so the
same decision gives the same ids: the ledger, binder and a replayed decision agree.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from phalanx_engine.dra.capacity import quantity_text
from phalanx_engine.dra.pools import Candidate, nanos
from phalanx_proto.dra import AllocatedConfig, AllocatedDevice, ClaimAllocation, ClaimSpec, ExactRequest
from phalanx_proto.scheduling import NodeSelectorRequirement, NodeSelectorTerm

_SHARES = uuid.UUID("6f1c2a8e-3b7d-5c40-9a1e-d2a0c0ffee01")
"""The namespace of Phalanx's share ids (any fixed UUID; changing it changes every id)."""


@dataclass(slots=True)
class Pick:
    """One device chosen for one request (or subrequest) of a claim."""

    request: str
    """The request's name."""
    full_name: str
    """``req`` or ``req/sub``."""
    spec: ExactRequest
    device: Candidate
    consumed: dict[str, int] | None = None
    """What a shared device gives (nanos by capacity name); None for an exclusive device."""
    activated: bool = False
    """This pick made the device allocated in the attempt (its counters counted)."""
    constraints: list | None = None


def share_id(claim: ClaimSpec, full_name: str, device: Candidate) -> str:
    driver, pool, name = device.key
    return str(uuid.uuid5(_SHARES, f"{claim.uid}/{full_name}/{driver}/{pool}/{name}"))


def claim_allocation(claim: ClaimSpec, picks: Sequence[Pick], chosen: Sequence[ExactRequest],
                     full_names: Sequence[str], node: str) -> ClaimAllocation:
    """The ``AllocationResult`` of ``claim``: ``picks`` in request order, ``chosen`` the
    request or subrequest used for each of the claim's requests (``full_names`` its name)."""
    results = tuple(
        AllocatedDevice(
            request=p.full_name, driver=p.device.key[0], pool=p.device.key[1], device=p.device.key[2],
            admin_access=p.spec.admin_access, tolerations=p.spec.tolerations,
            share_id=share_id(claim, p.full_name, p.device) if p.consumed is not None else "",
            consumed_capacity={k: _text(p, k, v) for k, v in (p.consumed or {}).items()},
            binding_conditions=p.device.device.binding_conditions,
            binding_failure_conditions=p.device.device.binding_failure_conditions)
        for p in picks)
    return ClaimAllocation(devices=results, config=_config(claim, chosen, full_names),
                           node_selector=_node_selector(picks, node))


def _text(pick: Pick, name: str, amount: int) -> str:
    """The capacity taken as the request, the policy's default or the capacity wrote it, when
    it is that value; else canonical."""
    cap = pick.device.device.capacity[name]
    policy = cap.request_policy
    for text in (pick.spec.capacity.get(name), policy.default if policy else None, cap.value):
        if text and nanos(text) == amount:
            return text
    return quantity_text(amount)


def _config(claim: ClaimSpec, chosen: Sequence[ExactRequest], full_names: Sequence[str]) -> tuple[AllocatedConfig, ...]:
    by_class: dict[str, list[str]] = {}
    configs: dict[str, tuple] = {}
    for spec, name in zip(chosen, full_names, strict=True):
        cls = spec.device_class
        by_class.setdefault(cls.name, []).append(name)
        configs.setdefault(cls.name, cls.config)
    out = [AllocatedConfig(source="FromClass", requests=tuple(names), opaque=c.opaque)
           for cls, names in by_class.items() for c in configs[cls]]
    allocated = {r.name for r in claim.requests} | {n for n in full_names if "/" in n}
    for c in claim.config:
        if not c.requests or any(r in allocated for r in c.requests):
            out.append(AllocatedConfig(source="FromClaim", requests=c.requests, opaque=c.opaque))
    return tuple(out)


def _node_selector(picks: Sequence[Pick], node: str) -> tuple[NodeSelectorTerm, ...] | None:
    if any(p.device.node_local for p in picks):
        return (NodeSelectorTerm(match_fields=(
            NodeSelectorRequirement(key="metadata.name", operator="In", values=(node,)),)),)
    fields: list[NodeSelectorRequirement] = []
    exprs: list[NodeSelectorRequirement] = []
    for p in picks:
        term = p.device.node_selector
        if term is not None:
            _merge(term.match_fields, fields)
            _merge(term.match_expressions, exprs)
    if fields or exprs:
        return (NodeSelectorTerm(match_expressions=tuple(exprs), match_fields=tuple(fields)),)
    return None


def _merge(new: Sequence[NodeSelectorRequirement], into: list[NodeSelectorRequirement]) -> None:
    for r in new:
        if not any(o.key == r.key and o.operator == r.operator and set(o.values) == set(r.values) for o in into):
            into.append(r)
