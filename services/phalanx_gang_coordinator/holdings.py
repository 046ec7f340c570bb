"""What a gang's attempt holds, read from the mirrors that are its one home: its reservations
(``phx-ledger``) and, for MIG members, the instances their nodes recorded (``phx-mig``). The saga
driver and the compensator ask here instead of believing what a reply or a command carries."""

from __future__ import annotations

import msgspec

from phalanx_bus import KvMirror, MirrorLagging, TemporaryError
from phalanx_bus.ledger import LedgerBook
from phalanx_proto import subjects as S
from phalanx_proto.events import Assignment, MigReady, PodRef
from phalanx_proto.state import GangState, NodeMig, alloc_key, attempt_members, mig_slot
from phalanx_proto.vocab import RefusalRule as R
from phalanx_telemetry import refused


class Holdings:
    def __init__(self, ledger: LedgerBook, mig: KvMirror[NodeMig]) -> None:
        self.ledger, self.mig = ledger, mig

    def reservations_of(self, state: GangState, attempt: int | None = None) -> tuple[Assignment, ...]:
        """The attempt's assignments as the ledger holds them, in member order (MIG members with
        the instance their node recorded ready, when it has)."""
        attempt = state.attempt if attempt is None else attempt
        by_key = self.ledger.reservations(state.gang_id, attempt)
        out = []
        for m in state.members:
            a = by_key.get(alloc_key(m.pod))
            if a is not None:
                out.append(self._with_instance(a, state.gang_id, attempt))
        return tuple(out)

    def _with_instance(self, a: Assignment, gang_id: str, attempt: int) -> Assignment:
        record = self.mig_record(a, gang_id, attempt)
        if record is None or record.state != "ready":
            return a
        return msgspec.structs.replace(a, mig_instance_uuid=record.uuid)

    def mig_record(self, a: Assignment, gang_id: str, attempt: int):
        """The ``phx-mig`` record of the MIG slot ``a`` reserves, if this (gang, attempt, pod) owns it."""
        if not a.mig_profile:
            return None
        entry = self.mig.get(S.token(a.node))
        record = entry.value.instances.get(mig_slot(a.gpus[0] if a.gpus else 0, max(0, a.mig_start))) \
            if entry is not None else None
        return record if record is not None and record.owned_by(gang_id, attempt, a.pod) else None

    async def unreserved(self, state: GangState) -> list[PodRef]:
        """The attempt's members the ledger holds no reservation for (gang, attempt, pod uid);
        the mirror is caught up first when some seem missing (the reply can outrun the watch)."""
        for fresh in (False, True):
            if fresh:
                await _catch_up(self.ledger)
            held = self.ledger.reservations(state.gang_id, state.attempt)
            missing = [m.pod for m in attempt_members(state) if alloc_key(m.pod) not in held]
            if not missing:
                return []
        return missing

    async def mig_recorded(self, ev: MigReady, state: GangState) -> bool:
        """A ``MigReady`` is believed only when the node's mig-manager recorded that instance
        ready for this gang attempt and pod in ``phx-mig``."""
        a = self.ledger.reservations(ev.gang_id, ev.attempt).get(alloc_key(ev.pod))
        if a is None or a.node != ev.node or not a.mig_profile:
            return False  # the transition ignores it anyway
        for fresh in (False, True):
            if fresh:
                await _catch_up(self.mig)
            record = self.mig_record(a, ev.gang_id, ev.attempt)
            if record is not None and record.state == "ready" and record.uuid == ev.instance_uuid:
                return True
        refused(R.NOT_RECORDED, f"no ready MIG instance {ev.instance_uuid} is recorded in phx-mig for {ev.pod} "
                                f"attempt {ev.attempt}", gang=ev.gang_id, node=ev.node)
        return False

    def all_instances_ready(self, state: GangState) -> bool:
        return all(a.mig_instance_uuid for a in self.reservations_of(state) if a.mig_profile)


async def _catch_up(mirror) -> None:
    try:
        await mirror.catch_up()
    except MirrorLagging as e:
        raise TemporaryError(f"cannot check the reply yet: {e}", delay=1.0) from e
