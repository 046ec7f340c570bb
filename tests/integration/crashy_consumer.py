"""Test helper process: consume one message on a durable and die (os._exit) before the ack."""

import os
import sys

import anyio

from phalanx_bus import Bus, consume
from phalanx_proto.events import gang_decoder


async def main(url: str, marker: str) -> None:
    bus = await Bus.connect(url, service="crashy")

    async def handler(event, delivery) -> None:
        with open(marker, "w") as f:
            f.write(f"{event.gang_id} {delivery.num_delivered}\n")
        os._exit(17)  # the side effect happened, the ack never will

    await consume(bus, stream="PHX_GANG", durable="crash-test", filter_subject="phx.gang.placement.>",
                  decoder=gang_decoder, handler=handler, ack_wait_s=1.0)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2])
