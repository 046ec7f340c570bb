"""Create and destroy this node's MIG instances for placed pods (``--nvml``: phalanx_mig_manager.devices)."""

from __future__ import annotations

import anyio

from phalanx_service.config import add_arguments as _flags
from phalanx_service.config import from_args

NEEDS_CLUSTER = False


def add_arguments(p) -> None:
    from phalanx_mig_manager.service import Config

    _flags(p, Config)


async def start(args, bus, cluster, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
    from phalanx_mig_manager.service import Config, run

    await run(bus, from_args(Config, args), task_status=task_status)
