"""Reading a stream's stored messages one by one, by sequence (``$JS.API.STREAM.MSG.GET``): what
an identity that may not create consumers (the reader) can do to read a log such as placement's
decisions (``phalanx sim --replay``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio
from nats.js.errors import NotFoundError

from phalanx_bus.bus import Bus


@dataclass(frozen=True, slots=True)
class Stored:
    seq: int
    subject: str
    data: bytes


async def stored_messages(bus: Bus, stream: str, *, timeout_s: float) -> AsyncIterator[tuple[Stored, int]]:
    """Every message the stream holds, oldest first, with the last sequence it held when the read
    began; messages removed meanwhile by its limits are skipped. ``TimeoutError`` when one read
    takes longer than ``timeout_s``."""
    with anyio.fail_after(timeout_s):
        info = await bus.js.stream_info(stream)
    first, last = max(info.state.first_seq, 1), info.state.last_seq  # empty: 0, 0 (or first = last + 1)
    for seq in range(first, last + 1):
        with anyio.fail_after(timeout_s):
            try:
                msg = await bus.js.get_msg(stream, seq=seq)
            except NotFoundError:
                continue
        yield Stored(seq=seq, subject=msg.subject or "", data=msg.data or b""), last
