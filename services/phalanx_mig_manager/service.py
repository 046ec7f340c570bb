"""mig-manager: the node agent that will create and destroy MIG instances per pod.

In this version it consumes its node's MIG commands and answers every prepare with
``MigFailed`` ("MIG instances are not supported yet"), so a gang asking for MIG fails its
attempt with a clear reason instead of waiting forever. Destroy commands are acknowledged
(nothing was created, so nothing needs destroying).
"""

from __future__ import annotations

import anyio

from phalanx_bus import Bus, Delivery, consume
from phalanx_proto import subjects as S
from phalanx_proto.events import (
    MigDestroyed,
    MigDestroyRequested,
    MigFailed,
    MigPrepareRequested,
    node_decoder,
)
from phalanx_telemetry import log, warn

NOT_SUPPORTED = "MIG instances are not supported yet by this mig-manager version"


class MigManager:
    def __init__(self, bus: Bus, node: str) -> None:
        self.bus = bus
        self.node = node

    async def on_command(self, event, delivery: Delivery) -> None:
        reply = S.node_reply_subject(self.node)
        match event:
            case MigPrepareRequested():
                log("mig prepare refused", node=self.node, pod=str(event.pod), profile=event.profile)
                await self.bus.publish(reply, MigFailed(node=self.node, gang_id=event.gang_id, attempt=event.attempt,
                                                        pod=event.pod, reason=NOT_SUPPORTED))
            case MigDestroyRequested():
                await self.bus.publish(reply, MigDestroyed(node=self.node, gang_id=event.gang_id,
                                                           attempt=event.attempt, pod=event.pod))
            case _:
                warn("unexpected event on mig subject", kind=type(event).__name__)


async def run(bus: Bus, node: str, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
    """Run mig-manager for ``node`` until cancelled; ready once its consumer is live."""
    manager = MigManager(bus, node)
    await consume(bus, stream=S.STREAM_NODE, durable=f"mig-manager-{S.token(node)}",
                  filter_subject=S.mig_subject(node), decoder=node_decoder, handler=manager.on_command,
                  task_status=task_status)
