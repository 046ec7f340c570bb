"""Values stored in the shared KV buckets: saga state (``phx-gangs``) and the ledger
(``phx-ledger``). They are part of the contract because ``phalanx explain`` and other systems
read them; like events they accept unknown fields and only grow fields with defaults.
"""

from __future__ import annotations

import msgspec

from phalanx_proto.events import Assignment, MemberSpec, Phase, PodRef


class Allocation(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One member's reservation on one node."""

    gang_id: str
    attempt: int
    assignment: Assignment


class NodeLedger(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Every reservation on one node, keyed by ``alloc_key(pod)``. Written only by placement,
    always by compare-and-set on the KV revision it read, so no GPU is booked twice."""

    node: str
    allocations: dict[str, Allocation] = {}


def alloc_key(pod: PodRef) -> str:
    return f"{pod.namespace}/{pod.name}"


class GangState(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The saga state of one gang, owned by gang-coordinator and updated by compare-and-set."""

    gang_id: str
    phase: Phase = "waiting"
    attempt: int = 0
    min_member: int = 1
    members: tuple[MemberSpec, ...] = ()
    assignments: tuple[Assignment, ...] = ()
    bound: tuple[PodRef, ...] = ()
    reason: str = ""
    """Why the gang is not scheduled (yet): the pending reason its pods show."""
    created_at: float = 0.0
    updated_at: float = 0.0
    trace_id: str = ""


gang_state_decoder = msgspec.json.Decoder(GangState)
ledger_decoder = msgspec.json.Decoder(NodeLedger)
