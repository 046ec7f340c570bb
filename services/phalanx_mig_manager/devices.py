"""The MIG devices a ``--nvml`` value names: ``real`` drives the GPUs through the NVIDIA driver;
``fake:<model>x<count>[@off][,...]`` is the simulator's in-memory fake NVML that enforces the
MIG rules of ``phalanx_engine.mig.TABLES`` (for example ``fake:H100-80GBx2``, or
``fake:A100-40GBx1,A100-40GBx1@off`` for a second GPU with MIG mode off). The fake must never
run on a real node: it creates nothing on any GPU, and the image does not have it (``fleet/``).
"""

from __future__ import annotations

from phalanx_nvml import MigDevices, NvmlMig


def devices_from(spec: str, node: str = "") -> MigDevices:
    """The ``MigDevices`` for a ``--nvml`` value (a fake stands for ``node``); raises ValueError
    for a bad one."""
    if spec == "real":
        return NvmlMig()
    if spec.startswith("fake:"):
        try:  # the node fleet's (fleet/): in a checkout's environment, never in the image
            from phalanx_nvmlfake.mig import from_spec
        except ModuleNotFoundError:
            raise ValueError("--nvml fake:... is the simulator's fake NVML, which this installation does not "
                             "have (run the simulator from a checkout: make install)") from None
        return NvmlMig(from_spec(spec.removeprefix("fake:"), node=node))
    raise ValueError(f"--nvml must be 'real' or 'fake:<model>x<count>', not {spec!r}")
