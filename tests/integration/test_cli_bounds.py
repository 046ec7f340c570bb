"""Commands that talk to NATS are bounded in time, and what they print is safe for a terminal:
``explain``/``events`` against an unreachable server exit 2 with one line; ``events`` exits 2
when it loses the server; a ``gang_id`` holding escape sequences prints escaped (real
nats-server)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import anyio
import pytest

from phalanx_bus import Bus
from phalanx_cli.main import main
from phalanx_localstack.natsserver import NatsServer, free_port
from phalanx_proto.events import GangPending

pytestmark = pytest.mark.integration

HOSTILE = "default/\x1b[2J\x1b]0;owned\x07train\u202e"


def unreachable() -> str:
    return f"nats://127.0.0.1:{free_port()}"


@pytest.mark.parametrize("argv,line", [
    pytest.param(["explain", "default/p", "--timeout", "2"], "phalanx explain: cannot reach NATS at {url} within 2s",
                 id="explain"),
    pytest.param(["events", "--connect-timeout", "2"], "phalanx events: cannot reach NATS at {url} within 2s",
                 id="events"),
])
def test_an_unreachable_nats_gives_one_line_and_exit_2(argv: list[str], line: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    url = unreachable()
    started = time.monotonic()
    assert main([*argv, "--nats", url]) == 2
    took = time.monotonic() - started
    out = capsys.readouterr()
    assert (out.out, out.err) == ("", line.format(url=url) + "\n")
    assert took < 30  # the budget is 2 s; generous for a loaded machine


def test_explain_defaults_to_a_bounded_wait_as_a_user_runs_it() -> None:
    url = unreachable()
    proc = subprocess.run([sys.executable, "-m", "phalanx_cli.main", "explain", "default/p", "--nats", url],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        2, "", f"phalanx explain: cannot reach NATS at {url} within 10s\n")


def test_events_exits_2_when_it_loses_nats_for_longer_than_its_budget(tmp_path) -> None:
    server = NatsServer(store_dir=str(tmp_path))
    server.start()
    proc = subprocess.Popen([sys.executable, "-m", "phalanx_cli.main", "events", "--nats", server.url,
                             "--connect-timeout", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    try:
        assert proc.stderr is not None
        assert proc.stderr.readline().startswith("phalanx events: listening on phx.>")
        server.stop(kill=True)
        assert proc.wait(timeout=60) == 2
        assert proc.stderr.read() == f"phalanx events: lost NATS at {server.url} for more than 2s\n"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        server.close()


async def _publish_hostile(url: str) -> None:
    bus = await Bus.connect(url, service="test")
    try:
        event = GangPending(gang_id=HOSTILE, attempt=1, reason="no fit\x1b[31m red\nsecond line")
        await bus.nc.publish("phx.gang.status.x", event_bytes(event))
        await bus.nc.flush()
    finally:
        await bus.close()


def event_bytes(event: GangPending) -> bytes:
    import msgspec

    return msgspec.json.encode(event)


@pytest.mark.parametrize("as_json", [False, True], ids=["table", "json"])
def test_events_escapes_control_characters_in_every_field(tmp_path, as_json: bool) -> None:
    with NatsServer(store_dir=str(tmp_path)) as server:
        proc = subprocess.Popen([sys.executable, "-m", "phalanx_cli.main", "events", "--nats", server.url,
                                 "--count", "1", "--timeout", "60", *(["--json"] if as_json else [])],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        try:
            assert proc.stderr is not None
            assert proc.stderr.readline().startswith(b"phalanx events: listening")
            anyio.run(_publish_hostile, server.url)
            out, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    assert proc.returncode == 0
    assert not any(b < 0x20 or 0x7F <= b < 0xA0 for b in out.rstrip(b"\n"))  # no raw control byte at all
    line = out.decode()
    if as_json:
        event = json.loads(line)["event"]
        assert (event["gang_id"], event["reason"]) == (HOSTILE, "no fit\x1b[31m red\nsecond line")
        assert "\\u001b[2J" in line and "\\u202e" in line
    else:
        assert "gang_id=default/\\x1b[2J\\x1b]0;owned\\x07train\\u202e" in line
        assert 'reason="no fit\\u001b[31m red\\nsecond line"' in line
