"""Orchestrate the gang saga: watch pending pods, admit gangs, drive placement and binding."""

from __future__ import annotations

import anyio

NEEDS_CLUSTER = True


def add_arguments(p) -> None:
    p.add_argument("--resync-s", type=float, default=2.0, help="seconds between pod re-lists (default %(default)s)")


async def start(args, bus, cluster, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
    from phalanx_gang_coordinator.service import Config, run

    await run(bus, cluster, Config(resync_s=args.resync_s), task_status=task_status)
