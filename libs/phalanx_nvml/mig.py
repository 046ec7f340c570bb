"""MIG instances through NVML: the ``MigDevices`` port mig-manager works through, and its real
adapter ``NvmlMig``.

mig-manager (one per MIG node) creates a GPU instance of a profile at the start slot placement
chose, with one compute instance spanning it, reads back the MIG device UUID, lists what exists
and destroys instances. ``NvmlMig`` does that with pynvml (nvidia-ml-py's names);
``phalanx_nvmlfake.mig.FakeMigNvml`` stands in for the pynvml module in CI with the same
functions, shapes and error codes. MIG mode is only ever read here, never set.

NVML's vocabulary: a *GPU instance* (GI) owns memory slices ``[start, start+size)``; a *compute
instance* (CI) inside it runs work; the MIG device (``MIG-…`` UUID) is the GI/CI pair CUDA sees.
A GI profile is looked up by its enum (``NVML_GPU_INSTANCE_PROFILE_*``) and then used by its id
(``info.id``, what ``nvidia-smi mig -lgip`` prints).
Reference: https://docs.nvidia.com/deploy/nvml-api/group__nvmlMultiInstanceGPU.html

Every method blocks; callers run them in a worker thread, one at a time per node.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Protocol

import pynvml

GI_PROFILE: dict[tuple[int, int], str] = {
    (1, 1): "NVML_GPU_INSTANCE_PROFILE_1_SLICE",
    (1, 2): "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2",
    (2, 2): "NVML_GPU_INSTANCE_PROFILE_2_SLICE",
    (3, 4): "NVML_GPU_INSTANCE_PROFILE_3_SLICE",
    (4, 4): "NVML_GPU_INSTANCE_PROFILE_4_SLICE",
    (7, 8): "NVML_GPU_INSTANCE_PROFILE_7_SLICE",
}
"""(compute slices, memory slices) of a profile -> the pynvml name of its GI profile enum. The
double-memory 1g profile (``1g.10gb`` on an A100-40GB) is ``1_SLICE_REV2``."""

CI_PROFILE: dict[int, str] = {
    1: "NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE",
    2: "NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE",
    3: "NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE",
    4: "NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE",
    6: "NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE",
    7: "NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE",
    8: "NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE",
}
"""Compute slices of a GPU instance -> the CI profile enum that spans all of it."""

_MIB = 1024 * 1024
_ERROR_NAMES = {v: k for k, v in vars(pynvml).items() if k.startswith("NVML_ERROR_") and isinstance(v, int)}
_GONE = (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_NOT_SUPPORTED)
"""What NVML answers when asked for a GPU instance that does not exist (MIG off: none can)."""


def error_name(code: int) -> str:
    """``ERROR_INSUFFICIENT_RESOURCES`` for 23 (pynvml's constant without ``NVML_``)."""
    return _ERROR_NAMES.get(code, f"NVML_ERROR_{code}").removeprefix("NVML_")


class MigError(RuntimeError):
    """NVML refused a MIG operation, or cannot be used. ``code`` is the NVML error code
    (``pynvml.NVML_ERROR_*``); ``str()`` names the call and the code, or says why in words."""

    def __init__(self, call: str, code: int, detail: str = "") -> None:
        super().__init__(detail or f"{call} failed: {error_name(code)}")
        self.call = call
        self.code = code


@dataclass(frozen=True, slots=True)
class MigInstanceInfo:
    """One GPU instance as NVML lists it. ``uuid`` is the MIG device UUID of its first compute
    instance (``""`` while it has none)."""

    gpu: int
    gi_id: int
    profile: str
    start: int
    size: int
    ci_ids: tuple[int, ...] = ()
    uuid: str = ""


class MigDevices(Protocol):
    """MIG operations on one node's GPUs. Every method blocks and raises ``MigError`` when NVML
    refuses or cannot be used."""

    def gpu_count(self) -> int:
        ...

    def describe(self, gpu: int) -> tuple[str, int]:
        """The GPU's model name and memory in MiB."""
        ...

    def mig_enabled(self, gpu: int) -> bool:
        """Whether MIG mode is on now; raises ``MigError`` (NOT_SUPPORTED) for a GPU without MIG."""
        ...

    def list_instances(self, gpu: int) -> tuple[MigInstanceInfo, ...]:
        """The GPU instances on ``gpu`` by start slot; empty when MIG is off."""
        ...

    def create(self, gpu: int, profile: str, start: int) -> int:
        """Create a ``profile`` GPU instance at memory slice ``start`` and a compute instance
        spanning it; return the GPU instance id. When NVML refuses the compute instance the GPU
        instance is destroyed again before ``MigError`` is raised. Another exception (a bug, a
        crash) leaves what was made to the caller's ownership record and reconciliation."""
        ...

    def destroy(self, gpu: int, gi_id: int) -> bool:
        """Destroy GPU instance ``gi_id`` and its compute instances; False when there was none.
        May be called more than once, and for an instance that was never made."""
        ...


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _profile_name(raw: str | bytes) -> str:
    """``"MIG 3g.40gb"`` (NVML's v2 profile name) -> ``"3g.40gb"``."""
    return _text(raw).strip().removeprefix("MIG ")


@dataclass(frozen=True, slots=True)
class _Profile:
    name: str
    enum: int
    id: int
    slices: int
    size: int
    instances: int


class NvmlMig:
    """``MigDevices`` over NVML. ``nvml`` is the pynvml module (default) or a stand-in with its
    functions (``FakeMigNvml``). NVML is initialised on first use; ``close()`` shuts it down."""

    def __init__(self, nvml: Any = None) -> None:
        self._nvml = pynvml if nvml is None else nvml
        self._ready = False

    def _call(self, fn: str, *args: Any) -> Any:
        """``nvml.<fn>(*args)``, with NVML started first; NVML errors become ``MigError``."""
        nvml = self._nvml
        try:
            if not self._ready:
                nvml.nvmlInit()
                self._ready = True
            return getattr(nvml, fn)(*args)
        except pynvml.NVMLError as e:
            raise MigError(fn, e.value) from e

    def close(self) -> None:
        if self._ready:
            self._ready = False
            try:
                self._nvml.nvmlShutdown()
            except pynvml.NVMLError:
                pass

    def _handle(self, gpu: int) -> Any:
        return self._call("nvmlDeviceGetHandleByIndex", gpu)

    # --- the GPU ------------------------------------------------------------------------

    def gpu_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount"))

    def describe(self, gpu: int) -> tuple[str, int]:
        handle = self._handle(gpu)
        return (_text(self._call("nvmlDeviceGetName", handle)),
                int(self._call("nvmlDeviceGetMemoryInfo", handle).total) // _MIB)

    def mig_enabled(self, gpu: int) -> bool:
        current, _pending = self._call("nvmlDeviceGetMigMode", self._handle(gpu))
        return current == pynvml.NVML_DEVICE_MIG_ENABLE

    def _profiles(self, handle: Any) -> dict[str, _Profile]:
        """The GPU's instance profiles by name (``"3g.40gb"``); every enum NVML knows is tried,
        so instances of profiles Phalanx never makes (``+me``) are still listed."""
        sizes = {getattr(pynvml, const): size for (_, size), const in GI_PROFILE.items()}
        found: dict[str, _Profile] = {}
        for enum in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = self._call("nvmlDeviceGetGpuInstanceProfileInfo", handle, enum)
            except MigError:
                continue  # not a profile of this GPU (or MIG is off)
            name = _profile_name(info.name)
            if name and name not in found:
                found[name] = _Profile(name=name, enum=enum, id=info.id, slices=info.sliceCount,
                                       size=sizes.get(enum, info.sliceCount), instances=info.instanceCount)
        return found

    # --- listing ------------------------------------------------------------------------

    def list_instances(self, gpu: int) -> tuple[MigInstanceInfo, ...]:
        handle = self._handle(gpu)
        try:
            if not self.mig_enabled(gpu):
                return ()
        except MigError as e:
            if e.code == pynvml.NVML_ERROR_NOT_SUPPORTED:
                return ()
            raise
        uuids = self._mig_uuids(handle)
        out = []
        for prof in self._profiles(handle).values():
            size = max(1, prof.instances)
            buf = (self._nvml.c_nvmlGpuInstance_t * size)()
            count = ctypes.c_uint(size)
            self._call("nvmlDeviceGetGpuInstances", handle, prof.id, buf, ctypes.byref(count))
            for i in range(count.value):
                info = self._call("nvmlGpuInstanceGetInfo", buf[i])
                cis = self._ci_ids(buf[i])
                out.append(MigInstanceInfo(
                    gpu=gpu, gi_id=info.id, profile=prof.name, start=info.placement.start,
                    size=info.placement.size, ci_ids=cis,
                    uuid=next((uuids[(info.id, c)] for c in cis if (info.id, c) in uuids), "")))
        return tuple(sorted(out, key=lambda g: (g.start, g.gi_id)))

    def _ci_profiles(self, gi: Any) -> list[Any]:
        out, seen = [], set()
        for enum in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            try:
                info = self._call("nvmlGpuInstanceGetComputeInstanceProfileInfo", gi, enum,
                                  pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            except MigError:
                continue
            if info.id not in seen:
                seen.add(info.id)
                out.append(info)
        return out

    def _ci_handles(self, gi: Any) -> list[Any]:
        handles = []
        for info in self._ci_profiles(gi):
            size = max(8, info.instanceCount)
            buf = (self._nvml.c_nvmlComputeInstance_t * size)()
            count = ctypes.c_uint(size)
            self._call("nvmlGpuInstanceGetComputeInstances", gi, info.id, buf, ctypes.byref(count))
            handles.extend(buf[i] for i in range(count.value))
        return handles

    def _ci_ids(self, gi: Any) -> tuple[int, ...]:
        return tuple(sorted({self._call("nvmlComputeInstanceGetInfo", ci).id for ci in self._ci_handles(gi)}))

    def _mig_uuids(self, handle: Any) -> dict[tuple[int, int], str]:
        """(GI id, CI id) -> MIG device UUID, for every MIG device of the GPU."""
        out = {}
        for i in range(self._call("nvmlDeviceGetMaxMigDeviceCount", handle)):
            try:
                mig = self._call("nvmlDeviceGetMigDeviceHandleByIndex", handle, i)
            except MigError:
                continue  # no MIG device at this index
            key = (self._call("nvmlDeviceGetGpuInstanceId", mig), self._call("nvmlDeviceGetComputeInstanceId", mig))
            out[key] = _text(self._call("nvmlDeviceGetUUID", mig))
        return out

    # --- changing -----------------------------------------------------------------------

    def create(self, gpu: int, profile: str, start: int) -> int:
        handle = self._handle(gpu)
        call = "nvmlDeviceCreateGpuInstanceWithPlacement"
        if not self.mig_enabled(gpu):
            raise MigError(call, pynvml.NVML_ERROR_NOT_SUPPORTED, f"GPU {gpu} is not in MIG mode")
        profiles = self._profiles(handle)
        prof = profiles.get(profile)
        if prof is None:
            model, _ = self.describe(gpu)
            raise MigError(call, pynvml.NVML_ERROR_NOT_SUPPORTED,
                           f"profile {profile} does not exist on GPU {gpu} ({model}; it has {', '.join(profiles)})")
        placement = pynvml.c_nvmlGpuInstancePlacement_t(start=start, size=prof.size)
        gi = self._call(call, handle, prof.id, ctypes.byref(placement))
        try:
            ci_enum = getattr(pynvml, CI_PROFILE.get(prof.slices, ""), prof.slices)
            ci_info = self._call("nvmlGpuInstanceGetComputeInstanceProfileInfo", gi, ci_enum,
                                 pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            self._call("nvmlGpuInstanceCreateComputeInstance", gi, ci_info.id)
            return int(self._call("nvmlGpuInstanceGetInfo", gi).id)
        except MigError:
            try:
                self._destroy_handle(gi)
            except MigError:
                pass  # left to reconciliation: the caller's ownership record names the slot
            raise

    def destroy(self, gpu: int, gi_id: int) -> bool:
        handle = self._handle(gpu)
        try:
            gi = self._call("nvmlDeviceGetGpuInstanceById", handle, gi_id)
        except MigError as e:
            if e.code in _GONE:
                return False
            raise
        self._destroy_handle(gi)
        return True

    def _destroy_handle(self, gi: Any) -> None:
        for ci in self._ci_handles(gi):
            self._call("nvmlComputeInstanceDestroy", ci)
        self._call("nvmlGpuInstanceDestroy", gi)
