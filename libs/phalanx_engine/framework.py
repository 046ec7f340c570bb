"""The engine's extension points, in the manner of the Kubernetes scheduler framework.

One small ``Protocol`` per extension point; a ``Profile`` lists the plugins in the order they
run (``plugins.default_profile()`` is what placement uses):

* ``Filter.filter(member, node)`` → ``None`` (fits) or a ``Status``: can this node take the
  member at all? The first filter that says no decides the node's status, as in
  kube-scheduler. Filters never change the node.
* ``Allocate.allocate(member, node)`` → an ``Assignment`` (which GPUs, NICs, MIG slot) or a
  ``Status``: the device choice on a node that passed every filter, one plugin per request
  kind. It may still refuse (no legal MIG slot, no GPU set near a NIC).
* ``Score.score(member, node, assignment)`` → a comparable value, larger is better. Scores
  are compared lexicographically in profile order (GPU and topology scores first), then the
  node name; they are not summed.
* ``DomainFilter.filter_domain(gang, nodes)`` → ``None`` or a ``Status``: may a gang be tried
  in this network domain (HyperNode, leaf switch, network-pod) at all?

``Member`` is the pre-filter step: what a member asks, derived once per member.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import msgspec

from phalanx_engine.status import Code, Status, refuse
from phalanx_proto.events import Assignment, MemberSpec, PodRef, RequestKind

if TYPE_CHECKING:
    from phalanx_engine.nodestate import NodeState

_NO_POD = PodRef(namespace="", name="")
_encode = msgspec.json.Encoder(order="sorted").encode


@dataclass(frozen=True, slots=True)
class Member:
    """One gang member as the plugins see it: the wire request plus what is derived from it
    once (its kind, the whole GPUs it needs, its shape)."""

    spec: MemberSpec
    kind: RequestKind
    units: int
    """Whole free GPUs the member needs (0 for shares, MIG and no-GPU members)."""
    shape: bytes
    """The request without the pod's identity: members with equal shapes are interchangeable.
    A member's labels are part of it only when it carries pod (anti-)affinity terms or spread
    constraints of its own;
    where other pods' anti-affinity may select it by its labels, ``podaffinity.relevant`` says
    so and no shortcut reuses another member's answer."""

    @classmethod
    def of(cls, spec: MemberSpec) -> Member:
        kind = spec.kind
        own = spec.pod_affinity or spec.pod_anti_affinity or spec.spread
        return cls(spec=spec, kind=kind, units=spec.gpus if kind is RequestKind.WHOLE else 0,
                   shape=_encode(msgspec.structs.replace(spec, pod=_NO_POD) if own else
                                 msgspec.structs.replace(spec, pod=_NO_POD, labels={})))


class Filter(Protocol):
    """Can ``node`` take ``member``? ``None`` when it can. Must not change ``node``.

    ``applies`` is the pre-filter step (kube-scheduler's PreFilter ``Skip``): whether the
    filter has anything to say about ``member`` on any node; asked once per kind of member,
    and a filter that does not apply is not run on the nodes."""

    name: str

    def applies(self, member: Member) -> bool: ...

    def filter(self, member: Member, node: NodeState) -> Status | None: ...


class Allocate(Protocol):
    """The devices ``member`` gets on ``node`` (which passed every filter), or why none fit.
    Must not change ``node``; the caller books the result with ``NodeState.take``."""

    name: str

    def allocate(self, member: Member, node: NodeState) -> Assignment | Status: ...


class ClaimsStep(Protocol):
    """The member's ResourceClaims allocated on ``node``, added to ``assignment`` (the kind
    allocator's), or why they cannot be (docs/dra.md). Must not change ``node``."""

    name: str

    def allocate(self, member: Member, node: NodeState, assignment: Assignment) -> Assignment | Status: ...


class Score(Protocol):
    """How good ``assignment`` on ``node`` is for ``member``; larger is better. The value
    only needs to compare with other values of the same plugin."""

    name: str

    def score(self, member: Member, node: NodeState, assignment: Assignment) -> object: ...


class DomainFilter(Protocol):
    """May the gang (``members``) be tried in the network domain made of ``nodes``?"""

    name: str

    def filter_domain(self, members: Sequence[Member], nodes: Sequence[NodeState]) -> Status | None: ...


ALL_KINDS = frozenset(RequestKind)
R_NO_CLAIMS = "this placement policy allocates no ResourceClaims"
R_NODE_ERROR = "node could not be evaluated"
_SHAPES = 4096


@dataclass(frozen=True)
class Profile:
    """The plugins of one placement policy, in the order they run."""

    filters: tuple[Filter, ...]
    allocators: Mapping[RequestKind, Allocate]
    scores: tuple[Score, ...]
    domain_filters: tuple[DomainFilter, ...] = ()
    claims: ClaimsStep | None = None
    """Allocates members' ResourceClaims; None: a member with claims fits no node."""
    _applying: dict[bytes, tuple[Filter, ...]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def filters_for(self, member: Member) -> tuple[Filter, ...]:
        """The filters that apply to ``member``'s kind of request, in order (remembered per
        shape; the memory is bounded and holds no node state)."""
        got = self._applying.get(member.shape)
        if got is None:
            if len(self._applying) > _SHAPES:
                self._applying.clear()
            got = self._applying[member.shape] = tuple(f for f in self.filters if f.applies(member))
        return got

    def evaluate(self, member: Member, node: NodeState) -> Assignment | Status:
        """Filters in order, then the member kind's allocator, then (for a member with
        ResourceClaims) the claims step: where ``member`` would go on ``node``, or the first
        status that refuses it. A plugin that raises on this node (its
        agent's report passed the wire rules but holds something no plugin expected) refuses
        this node alone (``node_error``): one node's data never stops a decision."""
        try:
            for f in self.filters_for(member):
                status = f.filter(member, node)
                if status is not None:
                    return status
            got = self.allocators[member.kind].allocate(member, node)
            if not member.spec.claims or isinstance(got, Status):
                return got
            if self.claims is None:
                return refuse("DynamicResources", Code.DRA_CANNOT_ALLOCATE, R_NO_CLAIMS, resolvable=False)
            return self.claims.allocate(member, node, got)
        except Exception as e:  # noqa: BLE001 - isolated to the node, reported as its status
            return node_error(node.name, e)

    def rank(self, member: Member, node: NodeState, assignment: Assignment) -> tuple | None:
        """The scores of one feasible placement, in profile order (compare as a tuple); None
        when a score raises on this node (the node is then passed over, as ``evaluate`` does)."""
        try:
            return tuple(s.score(member, node, assignment) for s in self.scores)
        except Exception as e:  # noqa: BLE001 - isolated to the node
            node_error(node.name, e)
            return None


def node_error(node: str, error: Exception) -> Status:
    """The status of a node a plugin raised on, never resolvable by waiting; noted for the
    decision under way (``collecting_node_errors``), which returns it to its caller (the
    placement service logs and counts them: the engine has no I/O)."""
    text = f"{type(error).__name__}: {error}"[:300]
    errors = _NODE_ERRORS.get()
    if errors is not None and len(errors) < MAX_NODE_ERRORS:
        errors.append((node, text))
    return refuse("NodeEvaluation", Code.NODE_ERROR, R_NODE_ERROR, resolvable=False, detail=text)


MAX_NODE_ERRORS = 100
"""Node errors one decision returns at most."""
_NODE_ERRORS: contextvars.ContextVar[list[tuple[str, str]] | None] = contextvars.ContextVar("node_errors",
                                                                                           default=None)


@contextlib.contextmanager
def collecting_node_errors() -> Iterator[list[tuple[str, str]]]:
    """The node errors (node, error) of the code run inside, in order: one decision's, so they
    travel with its result instead of through a process-wide list."""
    errors: list[tuple[str, str]] = []
    token = _NODE_ERRORS.set(errors)
    try:
        yield errors
    finally:
        _NODE_ERRORS.reset(token)
