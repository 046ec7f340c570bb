"""Orchestrate the gang saga: watch pending pods, admit gangs, drive placement and binding."""

from __future__ import annotations

import anyio

from phalanx_service.config import add_arguments as _flags
from phalanx_service.config import from_args

NEEDS_CLUSTER = True


def add_arguments(p) -> None:
    from phalanx_gang_coordinator.service import Config

    _flags(p, Config)


async def start(args, bus, cluster, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
    from phalanx_gang_coordinator.service import Config, run

    await run(bus, cluster, from_args(Config, args), task_status=task_status)
