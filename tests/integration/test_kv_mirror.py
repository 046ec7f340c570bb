"""``KvMirror`` against a real nats-server: listing, changes, poison, breaks, restarts.

The property test drives random puts, compare-and-set updates, deletes, purges, poisoned
values and marker removals, restarts the server in the middle, and requires the mirror (and
the state its callbacks derive) to equal a fresh read of the bucket.
"""

from __future__ import annotations

import logging
import random

import anyio
import msgspec
import pytest

from phalanx_bus import Bus, KvMirror, MirrorLagging
from phalanx_bus.mirror import MirrorEntry
from phalanx_localstack.natsserver import free_port
from phalanx_proto import subjects as S
from phalanx_proto.kvrules import ledger_problem
from phalanx_proto.state import NodeLedger

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

BUCKET = "phx-mirror-test"


class Item(msgspec.Struct, frozen=True):
    n: int


decode = msgspec.json.Decoder(Item).decode


def good(n: int) -> bytes:
    return msgspec.json.encode(Item(n))


POISON = (b"not json", b'{"n": "seven"}', b"")


@pytest.fixture
async def bus(nats_private):
    b = await Bus.connect(nats_private.url, service="mirror-test")
    yield b
    await b.close()


class Derived:
    """State kept only from the callbacks, as a consumer with indexes would."""

    def __init__(self) -> None:
        self.values: dict[str, int] = {}
        self.total = 0

    def put(self, entry: MirrorEntry[Item], previous: MirrorEntry[Item] | None) -> None:
        assert self.values.get(entry.key) == (previous.value.n if previous else None)
        self.total += entry.value.n - (previous.value.n if previous else 0)
        self.values[entry.key] = entry.value.n

    def delete(self, previous: MirrorEntry[Item]) -> None:
        assert self.values.pop(previous.key) == previous.value.n
        self.total -= previous.value.n


def mirror_of(bus: Bus, derived: Derived | None = None) -> KvMirror[Item]:
    return KvMirror(bus, BUCKET, decode, on_put=derived.put if derived else None,
                    on_delete=derived.delete if derived else None)


async def fresh_read(bus: Bus) -> tuple[dict[str, tuple[Item, int]], dict[str, int]]:
    """(decodable key → (value, revision), undecodable key → revision) read from the server."""
    good_, bad = {}, {}
    for e in await (await bus.kv(BUCKET)).items():
        try:
            good_[e.key] = (decode(e.value), e.revision)
        except msgspec.MsgspecError:
            bad[e.key] = e.revision
    return good_, bad


def held(mirror: KvMirror[Item]) -> tuple[dict[str, tuple[Item, int]], dict[str, int]]:
    return ({k: (e.value, e.revision) for k, e in mirror.entries.items()},
            {k: p.revision for k, p in mirror.poisoned.items()})


async def test_the_mirror_reports_started_only_with_every_initial_value_in(bus):
    kv = await bus.kv(BUCKET)
    for i in range(300):
        await kv.put(f"k{i}", good(i))
    await kv.delete("k7")
    mirror = mirror_of(bus)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(mirror.run)
            assert held(mirror) == await fresh_read(bus)
            assert len(mirror) == 299 and mirror.get("k7") is None and mirror.listings == 1
            tg.cancel_scope.cancel()


async def test_puts_updates_deletes_and_purges_reach_the_mirror_and_its_callbacks(bus):
    kv = await bus.kv(BUCKET)
    derived = Derived()
    mirror = mirror_of(bus, derived)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(mirror.run)
            assert len(mirror) == 0
            r1 = await kv.put("a", good(1))
            r2 = await kv.create("b", good(2))
            r3 = await kv.update("a", good(10), last=r1)
            await kv.put("c", good(3))
            await kv.delete("c")
            await (await bus.kv(BUCKET))._kv.purge("b")
            await mirror.catch_up()
            assert held(mirror) == ({"a": (Item(10), r3)}, {})
            assert (derived.values, derived.total) == ({"a": 10}, 10)
            assert r2 < r3
            tg.cancel_scope.cancel()


async def test_an_undecodable_value_is_isolated_counted_and_logged_once_with_its_key(bus, caplog):
    kv = await bus.kv(BUCKET)
    derived = Derived()
    mirror = mirror_of(bus, derived)
    await kv.put("ok", good(1))
    await kv.put("bad", good(5))
    with anyio.fail_after(30), caplog.at_level(logging.WARNING, logger="phalanx"):
        async with anyio.create_task_group() as tg:
            await tg.start(mirror.run)
            r_bad1 = await kv.put("bad", b"not json")
            await mirror.wait_for(r_bad1)
            r_bad2 = await kv.put("bad", b'{"n": "seven"}')
            r_ok = await kv.put("ok", good(2))
            await mirror.wait_for(r_ok)
            assert held(mirror) == ({"ok": (Item(2), r_ok)}, {"bad": r_bad2})
            assert "Expected `int`" in mirror.poisoned["bad"].error
            assert (derived.values, mirror.undecodable) == ({"ok": 2}, 2)
            warned = [r for r in caplog.records if r.getMessage() == "undecodable kv value isolated"]
            assert [r.kv["key"] for r in warned] == ["bad"]
            r_back = await kv.put("bad", good(6))
            await mirror.wait_for(r_back)
            assert held(mirror) == ({"ok": (Item(2), r_ok), "bad": (Item(6), r_back)}, {})
            assert derived.values == {"ok": 2, "bad": 6}
            tg.cancel_scope.cancel()


async def test_a_value_breaking_its_buckets_rule_is_poisoned_like_an_undecodable_one(bus):
    kv = await bus.kv(S.KV_LEDGER)
    mirror = KvMirror.of_bucket(bus, S.KV_LEDGER)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(mirror.run)
            r_good = await kv.put("n1", msgspec.json.encode(NodeLedger(node="n1")))
            r_bad = await kv.put("n2", msgspec.json.encode(NodeLedger(node="n1")))
            await mirror.wait_for(max(r_good, r_bad))
            assert ({k: e.value for k, e in mirror.entries.items()}, list(mirror.poisoned)) == (
                {"n1": NodeLedger(node="n1")}, ["n2"])
            assert mirror.poisoned["n2"].error == ledger_problem("n2", NodeLedger(node="n1"))
            tg.cancel_scope.cancel()


async def test_a_callback_that_raises_is_counted_and_the_mirror_goes_on(bus):
    kv = await bus.kv(BUCKET)

    def on_put(entry, previous):
        if entry.value.n == 13:
            raise RuntimeError("unlucky")

    mirror = KvMirror(bus, BUCKET, decode, on_put=on_put)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(mirror.run)
            await kv.put("x", good(13))
            last = await kv.put("y", good(14))
            await mirror.wait_for(last)
            assert ({k: e.value.n for k, e in mirror.entries.items()}, mirror.callback_errors) == (
                {"x": 13, "y": 14}, 1)
            tg.cancel_scope.cancel()


async def test_wait_for_a_revision_the_bucket_never_reaches_raises_mirror_lagging(bus):
    mirror = mirror_of(bus)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(mirror.run)
            with pytest.raises(MirrorLagging, match="not 1000000"):
                await mirror.wait_for(1_000_000, timeout_s=0.3)
            tg.cancel_scope.cancel()


async def random_writes(bus: Bus, rng: random.Random, count: int) -> None:
    """``count`` random writes over a few keys; retried while the server is coming back."""
    keys = [f"node-{i}" for i in range(12)]
    for _ in range(count):
        key, op = rng.choice(keys), rng.choices(
            ["put", "update", "delete", "purge", "poison", "drop-markers"], [8, 4, 3, 2, 2, 1])[0]
        with anyio.fail_after(30):
            while True:
                try:
                    await write_once(bus, key, op, rng)
                    break
                except Exception:  # noqa: BLE001 - the server is restarting: try again
                    await anyio.sleep(0.2)


async def write_once(bus: Bus, key: str, op: str, rng: random.Random) -> None:
    kv = await bus.kv(BUCKET)
    if op == "put":
        await kv.put(key, good(rng.randrange(100)))
    elif op == "update":
        current = await kv.get(key)
        if current is None:
            await kv.put(key, good(rng.randrange(100)))
        else:
            await kv.update(key, good(decode_or(current.value) + 1), last=current.revision)
    elif op == "delete":
        await kv.delete(key)
    elif op == "purge":
        await kv._kv.purge(key)
    elif op == "poison":
        await kv.put(key, rng.choice(POISON))
    elif await kv.get(key) is None:  # a delete marker removed, as the server's purge_deletes does
        await bus.js.purge_stream(f"KV_{BUCKET}", subject=f"$KV.{BUCKET}.{key}", keep=0)


def decode_or(raw: bytes) -> int:
    try:
        return decode(raw).n
    except msgspec.MsgspecError:
        return 0


async def settle(mirror: KvMirror, bus: Bus) -> None:
    """Catch the mirror up (retrying while the server comes back), then compare whole states."""
    with anyio.fail_after(60):
        while True:
            try:
                await mirror.catch_up(timeout_s=5)
                break
            except Exception:  # noqa: BLE001 - reconnecting
                await anyio.sleep(0.2)
    assert held(mirror) == await fresh_read(bus)


@pytest.mark.parametrize("seed", [11, 12, 13])
async def test_random_writes_across_a_server_restart_leave_the_mirror_equal_to_a_fresh_read(nats_private, seed):
    rng = random.Random(seed)
    reader = await Bus.connect(nats_private.url, service="mirror-reader")
    writer = await Bus.connect(nats_private.url, service="mirror-writer")
    try:
        await random_writes(writer, rng, 40)
        derived = Derived()
        mirror = mirror_of(reader, derived)
        async with anyio.create_task_group() as tg:
            with anyio.fail_after(30):
                await tg.start(mirror.run)
            await random_writes(writer, rng, 60)
            await settle(mirror, writer)
            await anyio.to_thread.run_sync(lambda: nats_private.restart(kill=True))
            await random_writes(writer, rng, 60)
            await settle(mirror, writer)
            good_, _ = await fresh_read(writer)
            assert derived.values == {k: v.n for k, (v, _) in good_.items()}
            assert derived.total == sum(v.n for v, _ in good_.values())
            assert mirror.listings >= 2  # the restart made it list again
            tg.cancel_scope.cancel()
    finally:
        await reader.close()
        await writer.close()


class CuttableProxy:
    """A TCP proxy to the nats-server whose connections can be cut (a network break for one
    client while the others stay connected)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.server = None
        self.pipes: set = set()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def open(self) -> None:
        import asyncio

        async def pipe(reader, writer):
            try:
                while data := await reader.read(65536):
                    writer.write(data)
                    await writer.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                writer.close()

        async def on_client(reader, writer):
            try:
                up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
            except OSError:
                writer.close()
                return
            self.pipes.update({writer, up_w})
            await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))

        self.server = await asyncio.start_server(on_client, "127.0.0.1", self.port)

    async def cut(self) -> None:
        self.server.close()
        for w in self.pipes:
            w.close()
        self.pipes.clear()
        await self.server.wait_closed()


async def test_a_delete_made_while_the_mirror_was_cut_off_reaches_it_although_its_marker_is_gone(nats_private):
    proxy = CuttableProxy(nats_private.port)
    await proxy.open()
    writer = await Bus.connect(nats_private.url, service="mirror-writer")
    reader = await Bus.connect(proxy.url, service="mirror-reader")
    try:
        kv = await writer.kv(BUCKET)
        for name in ("gone", "kept", "changed"):
            await kv.put(name, good(1))
        derived = Derived()
        mirror = mirror_of(reader, derived)
        async with anyio.create_task_group() as tg:
            with anyio.fail_after(30):
                await tg.start(mirror.run)
            assert set(mirror.entries) == {"gone", "kept", "changed"}
            await proxy.cut()
            await kv.delete("gone")
            await writer.js.purge_stream(f"KV_{BUCKET}", subject=f"$KV.{BUCKET}.gone", keep=0)
            await kv.put("changed", good(2))
            await kv.put("new", good(3))
            await proxy.open()
            await settle(mirror, writer)
            assert ({k: e.value.n for k, e in mirror.entries.items()}, derived.values) == (
                {"kept": 1, "changed": 2, "new": 3}, {"kept": 1, "changed": 2, "new": 3})
            assert reader.reconnects >= 1 and mirror.listings >= 2
            tg.cancel_scope.cancel()
    finally:
        await reader.close()
        await writer.close()
        await proxy.cut()
