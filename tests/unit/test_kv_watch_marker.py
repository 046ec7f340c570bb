"""``Kv.watch`` says "every initial value delivered" once, after the last of them, whatever
order nats-py's watcher hands its marker and the values in.

nats-py sends the marker before any value when the consumer's info shows nothing pending and
its subscription has received nothing, which is also the case when the server has already sent
every value and the client has not read them yet. These are the three orders nats-py can
produce, replayed through a watcher double (the real server case is
``tests/integration/test_kv_mirror.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import anyio
import pytest

from phalanx_bus.kv import Kv, KvEntry

pytestmark = pytest.mark.anyio


@dataclass
class Value:
    key: str
    value: bytes
    revision: int
    delta: int  # what the server had pending after this one when it sent it
    operation: str | None = None


class Watcher:
    """What nats-py's KeyWatcher gives: its items in order, and its consumer's info."""

    def __init__(self, items: list[Value | None], delivered: int, pending: int) -> None:
        self.items = items
        self._sub = self
        self.info = SimpleNamespace(delivered=SimpleNamespace(consumer_seq=delivered), num_pending=pending)
        self.stopped = False

    async def consumer_info(self):
        return self.info

    def __aiter__(self):
        return self._gen()

    async def _gen(self):
        for item in self.items:
            yield item

    async def stop(self) -> None:
        self.stopped = True


class Handle:
    def __init__(self, watcher: Watcher) -> None:
        self.watcher = watcher

    async def watch(self, keys: str) -> Watcher:
        return self.watcher


def v(key: str, revision: int, delta: int) -> Value:
    return Value(key, key.encode(), revision, delta)


def entry(key: str, revision: int) -> KvEntry:
    return KvEntry(key, key.encode(), revision)


CASES = [
    ("the marker after the last initial value, as usual",
     [v("a", 1, 1), v("b", 2, 0), None, v("c", 3, 0)], 2, 0,
     [entry("a", 1), entry("b", 2), None, entry("c", 3)]),
    ("the marker early, with the values already sent and not yet read",
     [None, v("a", 1, 1), v("b", 2, 0), v("c", 3, 0)], 2, 0,
     [entry("a", 1), entry("b", 2), None, entry("c", 3)]),
    ("the marker early, with the values still pending on the server",
     [None, v("a", 1, 1), v("b", 2, 0)], 0, 2,
     [entry("a", 1), entry("b", 2), None]),
    ("the marker first for an empty bucket, then a change",
     [None, v("a", 5, 0)], 0, 0,
     [None, entry("a", 5)]),
]


@pytest.mark.parametrize(("items", "delivered", "pending", "want"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
async def test_the_marker_comes_once_after_every_initial_value(items, delivered, pending, want):
    watcher = Watcher(items, delivered, pending)
    kv = Kv(SimpleNamespace(nc=None), "b", Handle(watcher))
    with anyio.fail_after(5):
        got = [e async for e in kv.watch()]
    assert got == want
    assert watcher.stopped
