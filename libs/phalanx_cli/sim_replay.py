"""``phalanx sim --replay``: read placement's decision log from a running cluster (stream
``PHX_DECISIONS``, as the read-only ``reader`` identity) and decide every logged decision again
with this build's engine (``phalanx_sim.replay``, docs/whatif.md "Replay").

Prints, per placement replica, how many decisions were replayed and how many differ, then each
difference with both answers; ``--json`` for all of it. Exit codes: 0 every replayed decision
agrees; 1 at least one differs (or, with ``--require N``, fewer than N were replayed); 2 the
log cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict

from phalanx_cli.terminal import safe, safe_lines


def register_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("--replay (reads placement's decision log at --nats as the reader)")
    g.add_argument("--replay", action="store_true",
                   help="decide every decision placement logged again and report any that differ (exit 1)")
    g.add_argument("--replica", action="append", default=[], metavar="NAME",
                   help="only this placement replica's log (repeatable; default every replica's)")
    g.add_argument("--since", metavar="D", help="compare only the decisions of the last D (e.g. 10m); the "
                                                "log before them is still applied")
    g.add_argument("--require", type=int, default=0, metavar="N",
                   help="exit 1 unless at least N decisions were replayed")


async def read_log(args: argparse.Namespace, feed, progress=None) -> int:
    """Feed every record of the log to ``feed`` in stream order; the records read. Raises
    ``TimeoutError`` when NATS does not answer within ``args.timeout`` for one read."""
    import anyio
    import msgspec

    from phalanx_bus import stored_messages
    from phalanx_cli.cmd_run import bus_auth, connect_bus
    from phalanx_proto import subjects as S
    from phalanx_proto.events import decisions_decoder

    with anyio.fail_after(args.timeout):
        bus = await connect_bus(args.nats, service="cli", budget_s=args.timeout, auth=bus_auth(args))
    wanted = {S.render(S.CHANNEL["placementDecisions"].template, replica=r) for r in args.replica}
    read = 0
    try:
        async for msg, last in stored_messages(bus, S.STREAM_DECISIONS, timeout_s=args.timeout):
            if wanted and msg.subject not in wanted:
                continue
            try:
                feed(decisions_decoder.decode(msg.data))
            except (msgspec.DecodeError, msgspec.ValidationError) as e:
                print(safe(f"phalanx sim: record {msg.seq} ({msg.subject}) undecodable, skipped: {e}"),
                      file=sys.stderr)
                continue
            read += 1
            if progress is not None:
                progress(msg.seq, last)
    finally:
        await bus.close()
    return read


def main(args: argparse.Namespace) -> int:
    import anyio

    from phalanx_bus import BusError
    from phalanx_sim.model import parse_duration
    from phalanx_sim.replay import Replay

    since = time.time() - parse_duration(args.since) if args.since else 0.0
    replay = Replay(since=since)
    t0 = time.perf_counter()
    last_print = [t0]

    def progress(done: int, total: int) -> None:
        if not args.quiet and time.perf_counter() - last_print[0] > 2:
            last_print[0] = time.perf_counter()
            print(f"  {done}/{total} records, {replay.decisions} decisions replayed", file=sys.stderr, flush=True)

    try:
        anyio.run(read_log, args, replay.feed, progress)
    except TimeoutError:
        print(safe(f"phalanx sim: no answer from NATS at {args.nats} within {args.timeout:g}s"), file=sys.stderr)
        return 2
    except (BusError, OSError) as e:
        print(safe(f"phalanx sim: cannot read the decision log: {e}"), file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - the server's refusal (permissions, no stream) reaches the user
        print(safe(f"phalanx sim: cannot read the decision log: {type(e).__name__}: {e}"), file=sys.stderr)
        return 2
    wall = time.perf_counter() - t0
    replicas = sorted(replay.replicas.values(), key=lambda r: r.first_at)
    if args.json:
        print(json.dumps({"replicas": [{k: v for k, v in asdict(r).items() if not k.startswith("_")}
                                       for r in replicas],
                          "replayed": replay.decisions, "differ": len(replay.differences), "wall_s": round(wall, 3)},
                         indent=1))
    else:
        print(safe_lines(_text(replicas, replay, wall)))
    if replay.differences:
        return 1
    if replay.decisions < args.require:
        print(f"phalanx sim: {replay.decisions} decisions replayed, fewer than --require {args.require}",
              file=sys.stderr)
        return 1
    return 0


def _text(replicas, replay, wall: float) -> str:
    lines = [f"{'REPLICA':<36} {'RECORDS':>9} {'BASES':>5} {'GAPS':>4} {'DECISIONS':>9} {'QUEUE':>6} {'PLANS':>5} "
             f"{'AGREE':>7} {'DIFFER':>6} {'NOT REPLAYABLE':>14}"]
    for r in replicas:
        lines.append(f"{r.replica[:36]:<36} {r.records:>9} {r.bases:>5} {r.gaps:>4} {r.decisions:>9} "
                     f"{r.queue_checks:>6} {r.plans:>5} {r.agree:>7} {len(r.differences):>6} {r.not_replayable:>14}")
    lines.append(f"{replay.decisions} decisions replayed, {len(replay.differences)} differ ({wall:.1f} s)")
    for d in replay.differences[:50]:
        lines += [f"DIFFERS {d.replica} record {d.seq} gang {d.gang_id} attempt {d.attempt}",
                  f"  recorded: {d.recorded}", f"  replayed: {d.replayed}"]
    return "\n".join(lines)
