"""``phalanx events``: tail the Phalanx subjects and print every event as it is published.

A live view (a plain NATS subscription; nothing is consumed, acked or replayed), for people
watching a cluster: one line per event with the time it arrived, the subject, the event's tag
and its key fields, or with ``--json`` one JSON object per line::

    {"time": "2026-01-01T12:00:00.123Z", "subject": "phx.gang.coord.answers.placement-0-1-ab12cd",
     "kind": "gang.reserved", "event": {...the event as on the wire...}}

A ``gang.batch`` (docs/events.md, "Batches") is shown as its events, one line each, under the
batch's subject.

Messages that do not decode (a dead letter holding garbage) are shown with ``kind``
``undecodable``. Ends after ``--count`` events or ``--timeout`` seconds (0: never), or Ctrl-C.
Control characters in anything printed (a ``gang_id`` holding an escape sequence) are shown
escaped: ``\x1b`` in a table line, ``\u001b`` in JSON.

Exit codes: 0 done; 2 NATS cannot be reached within ``--connect-timeout`` seconds, or was lost
for longer than that (one line on stderr says which).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import anyio
import msgspec

from phalanx_cli.cmd_run import BusUnreachable, add_nats, bus_auth, connect_bus, one_line
from phalanx_cli.terminal import safe
from phalanx_proto.codec import Decoder
from phalanx_proto.events import (
    AnyGangEvent,
    AnyNodeEvent,
    AnyTopologyEvent,
    Assignment,
    GangBatch,
    MemberSpec,
    PodRef,
)

any_decoder = Decoder(AnyGangEvent | GangBatch | AnyTopologyEvent | AnyNodeEvent)
"""Every event type of every stream (tags are unique across streams)."""


def register(sub) -> None:
    p = sub.add_parser("events", help="tail the Phalanx subjects and print decoded events",
                       description="Print every event published on the Phalanx subjects, one line per event "
                                   "(or JSON lines), as it happens.")
    p.add_argument("--subject", default="phx.>",
                   help="subject filter (NATS wildcards; default %(default)s). A subscriber identity may read "
                        "phx.gang.status.> and phx.topology.> only")
    add_nats(p)
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--count", type=int, default=0, help="exit after this many events (default: never)")
    p.add_argument("--timeout", type=float, default=0.0, help="exit after this many seconds (default: never)")
    p.add_argument("--connect-timeout", type=float, default=10.0,
                   help="seconds to wait for NATS, at start or after losing it, before exiting 2 (default %(default)s)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        anyio.run(tail_events, args)
    except KeyboardInterrupt:
        return 0
    except Exception as e:  # noqa: BLE001 - unreachable NATS: say so on one line
        print(safe(f"phalanx events: {one_line(e)}"), file=sys.stderr)
        return 2
    return 0


async def tail_events(args: argparse.Namespace, out=None) -> int:
    """Print events until ``--count``/``--timeout``; returns how many were printed."""
    from phalanx_bus import tail

    out = out or sys.stdout
    printed = 0
    budget = getattr(args, "connect_timeout", 10.0)
    bus = await connect_bus(args.nats, service="cli-events", budget_s=budget, auth=bus_auth(args))
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_watch_connection, bus, args.nats, budget)
            with anyio.move_on_after(args.timeout or float("inf")):
                def listening() -> None:
                    print(safe(f"phalanx events: listening on {args.subject} at {args.nats}"), file=sys.stderr,
                          flush=True)

                async for subject, event in _unbatched(tail(bus, args.subject, any_decoder,
                                                            on_subscribed=listening)):
                    print(render(time.time(), subject, event, as_json=args.json), file=out, flush=True)
                    printed += 1
                    if args.count and printed >= args.count:
                        break
            tg.cancel_scope.cancel()
    finally:
        with anyio.move_on_after(2, shield=True):
            await bus.close()
    return printed


async def _unbatched(messages):
    """(subject, event) for each message, a ``GangBatch`` as its events in order."""
    async for subject, message in messages:
        for event in [c.event for c in message.events] if isinstance(message, GangBatch) else [message]:
            yield subject, event


def render(at: float, subject: str, event: Any, *, as_json: bool) -> str:
    """One output line for an event (or a ``DecodeFailure``); control characters escaped."""
    from phalanx_bus import DecodeFailure

    if isinstance(event, DecodeFailure):
        if as_json:
            return _json_line(at, subject, "undecodable", {"error": event.error})
        return safe(f"{_clock(at)}  {subject}  undecodable  {event.error}")
    kind = event.__struct_config__.tag
    if as_json:
        return _json_line(at, subject, kind, msgspec.to_builtins(event))
    return safe(f"{_clock(at)}  {subject}  {kind}  {summary(event)}")


async def _watch_connection(bus: Any, url: str, budget_s: float) -> None:
    """Exit 2 once the connection has been down for ``budget_s`` seconds, saying so. The process
    leaves at once (``os._exit``): nats-py's reconnecting tasks swallow cancellation, so the event
    loop's shutdown could wait on them for ever (seen under load); nothing is left to clean up — the
    subscription died with the connection, and every printed line is flushed first."""
    down_since: float | None = None
    while True:
        await anyio.sleep(0.25)
        if getattr(bus.nc, "is_connected", True):
            down_since = None
        elif down_since is None:
            down_since = time.monotonic()
        elif time.monotonic() - down_since > budget_s:
            sys.stdout.flush()
            print(safe(f"phalanx events: {BusUnreachable(f'lost NATS at {url} for more than {budget_s:g}s')}"),
                  file=sys.stderr, flush=True)
            os._exit(2)


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at)) + f".{int(at * 1000) % 1000:03d}"


def _json_line(at: float, subject: str, kind: str, event: Any) -> str:
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(at * 1000) % 1000:03d}Z"
    # ensure_ascii: every control character (and everything non-ASCII) is a \u escape.
    return json.dumps({"time": iso, "subject": subject, "kind": kind, "event": event}, separators=(",", ":"),
                      ensure_ascii=True)


def _assignment(a: Assignment) -> str:
    text = f"{a.pod}@{a.node}:{','.join(map(str, a.gpus)) or '-'}"
    if a.core_pct or a.memory_mib:
        text += f"({a.core_pct}%,{a.memory_mib}MiB)"
    if a.mig_profile:
        text += f"(mig {a.mig_profile})"
    if a.nics:
        text += f"+{','.join(a.nics)}"
    return text


def _member(m: MemberSpec) -> str:
    what = f"{m.mig_slices} MIG" if m.mig_slices else f"{m.gpus} GPU"
    if m.core_pct or m.memory_mib:
        what += f" {m.core_pct}%/{m.memory_mib}MiB"
    return f"{m.pod}[{what}{' rdma' if m.rdma else ''}]"


def _value(value: Any) -> str | None:
    if isinstance(value, PodRef):
        return str(value)
    if isinstance(value, Assignment):
        return _assignment(value)
    if isinstance(value, MemberSpec):
        return _member(value)
    if isinstance(value, tuple | list):
        parts = [_value(v) for v in value]
        return ";".join(p for p in parts if p) if parts else None
    if isinstance(value, dict):
        return ",".join(f"{k}:{v}" for k, v in value.items()) if value else None
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, str):
        return json.dumps(value) if (" " in value or not value) else value
    if isinstance(value, bool | int):
        return str(value)
    return None


LEADING = ("gang_id", "node", "attempt")
"""Fields printed first, and even when they hold their default."""


def summary(event: msgspec.Struct) -> str:
    """The event's fields as ``key=value``, defaults left out, nested topology summarised."""
    parts = []
    fields = sorted(msgspec.structs.fields(event), key=lambda f: (LEADING.index(f.name) if f.name in LEADING
                                                                 else len(LEADING)))
    for info in fields:
        value = getattr(event, info.name)
        if info.name not in LEADING and not info.required and info.default is not msgspec.NODEFAULT \
                and value == info.default:
            continue
        if info.name == "topology":
            parts.append(f"gpus={len(value.gpus)} nics={len(value.nics)} generation={value.generation}")
            continue
        if info.name == "tiers":
            tiers = [t for t in (value.hypernode, value.leaf, value.netpod) if t]
            if tiers:
                parts.append(f"tiers={'/'.join(tiers)}")
            continue
        text = _value(value)
        if text:
            parts.append(f"{info.name}={text}")
    return " ".join(parts)
