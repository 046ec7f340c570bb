"""A fake NVML for MIG, for tests and the simulator only (never shipped to a node).

``FakeMigNvml`` has the pynvml MIG functions ``phalanx_nvml.mig.NvmlMig`` calls, under the same
names, taking and returning the same shapes (pynvml's ctypes structs, caller-allocated handle
arrays and counts) and raising pynvml's own ``NVMLError`` codes. Its rules come from
``phalanx_engine.mig.TABLES`` (one source of truth with placement): which profiles a model has,
their memory, their legal start slots and which placements overlap.

What it enforces, the way the driver answers:

* a GPU whose model has no MIG: ``nvmlDeviceGetMigMode`` → NOT_SUPPORTED;
* MIG mode off: profile queries and creates → NOT_SUPPORTED (the fake never changes the mode
  by itself; ``set_mig_mode`` is the admin's ``nvidia-smi -mig 1`` for tests);
* a profile enum the model lacks → NOT_SUPPORTED; an unknown profile id → INVALID_ARGUMENT;
* a start that is not a legal placement of the profile → INVALID_ARGUMENT;
* a legal start whose memory slices overlap an existing instance → INSUFFICIENT_RESOURCES;
* destroying a GPU instance that still has compute instances → IN_USE; an unknown one → NOT_FOUND.

Failure injection for fail-closed tests: ``fail_next_create(code)`` makes the next create raise;
``phantom_next_create()`` makes the next create "succeed" while the instance never shows up.
"""

from __future__ import annotations

import ctypes
import threading
import uuid
from dataclasses import dataclass, field

import pynvml

from phalanx_engine.mig import TABLES, MigInstance, MigTable, mig_table
from phalanx_nvml.mig import CI_PROFILE, GI_PROFILE
from phalanx_nvmlfake.nvml import gpu_uuid

E = pynvml.NVMLError


@dataclass(slots=True)
class _Gi:
    gi_id: int
    profile: str
    enum: int
    slices: int
    start: int
    size: int
    cis: dict[int, str] = field(default_factory=dict)
    hidden: bool = False


@dataclass(slots=True)
class FakeMigGpu:
    """One fake GPU: its model as NVML names it, memory, MIG mode and its GPU instances."""

    index: int
    model: str
    memory_mib: int
    mig_enabled: bool = True
    instances: dict[int, _Gi] = field(default_factory=dict)
    next_gi: int = 1

    @property
    def table(self) -> MigTable | None:
        return mig_table(self.model, self.memory_mib)


@dataclass(frozen=True, slots=True)
class _Dev:
    index: int


@dataclass(frozen=True, slots=True)
class _MigDev:
    index: int
    gi_id: int
    ci_id: int


def model_name(key: str) -> tuple[str, int]:
    """NVML-style name and memory for a table key (``H100-80GB``) or any other model name."""
    table = TABLES.get(key)
    if table is None:
        gib = [int(x) for x in key.upper().replace("GB", " ").split("-")[-1].split() if x.isdigit()]
        return f"NVIDIA {key}", (gib[0] if gib else 16) * 1024
    return f"NVIDIA {key}", max(p.memory_gib for p in table.profiles) * 1024


def from_spec(spec: str, *, node: str = "") -> FakeMigNvml:
    """A fake from ``<model>x<count>[@off][,...]``: ``H100-80GBx2,A100-40GBx1@off``. ``@off``
    means MIG mode is off on those GPUs; a model without a table (``V100-32GB``) has no MIG.
    ``node`` names the node the fake stands for (see ``FakeMigNvml``: UUIDs)."""
    gpus = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        body, _, mode = part.partition("@")
        model, sep, count = body.rpartition("x")
        if not sep or not count.isdigit() or not model:
            raise ValueError(f"bad fake NVML spec {part!r}: want <model>x<count>[@off]")
        name, mem = model_name(model)
        for _ in range(int(count)):
            gpus.append(FakeMigGpu(index=len(gpus), model=name, memory_mib=mem, mig_enabled=mode != "off"))
    if not gpus:
        raise ValueError("a fake NVML needs at least one GPU")
    return FakeMigNvml(gpus, node=node)


class FakeMigNvml:
    """Stands in for ``pynvml`` under ``NvmlMig``: ``NvmlMig(FakeMigNvml.of("H100-80GB", 2))``.

    UUIDs are those of the node's other fakes, so every part of a simulated node names a device
    alike: a GPU's is ``phalanx_nvmlfake.nvml.gpu_uuid(node, "GPU<index>")`` (what topology
    discovery reports from the fake NVML, and so what placement writes in ``gpu_uuids`` and
    the device plugin advertises), and a MIG device's is derived from that GPU's UUID, the GPU
    instance id and the number of instances created so far: stable within a run, and new for
    every create, as the driver's are."""

    NVMLError = pynvml.NVMLError
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE
    NVML_DEVICE_MIG_DISABLE = pynvml.NVML_DEVICE_MIG_DISABLE
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    c_nvmlGpuInstancePlacement_t = pynvml.c_nvmlGpuInstancePlacement_t
    c_nvmlGpuInstance_t = ctypes.c_void_p
    c_nvmlComputeInstance_t = ctypes.c_void_p
    """Handles are small integers in the fake (opaque pointers in the real module)."""

    def __init__(self, gpus: list[FakeMigGpu], *, node: str = "") -> None:
        self.gpus = gpus
        self.node = node
        self.creates = 0
        """GPU instances created so far (tests assert "no second create")."""
        self.cis_created = 0
        self.calls: list[str] = []
        self._handles: dict[int, tuple] = {}
        self._fail: int | None = None
        self._phantom = False
        self._lock = threading.RLock()

    @classmethod
    def of(cls, model: str, count: int = 1, *, mig_enabled: bool = True, node: str = "") -> FakeMigNvml:
        return from_spec(f"{model}x{count}{'' if mig_enabled else '@off'}", node=node)

    def gpu_uuid(self, index: int) -> str:
        return gpu_uuid(self.node or "fake", f"GPU{index}")

    def __getattr__(self, name: str):
        if name.startswith(("NVML_GPU_INSTANCE_PROFILE_", "NVML_COMPUTE_INSTANCE_PROFILE_")):
            return getattr(pynvml, name)
        raise AttributeError(name)

    # --- test controls ----------------------------------------------------------------

    def fail_next_create(self, code: int = pynvml.NVML_ERROR_UNKNOWN) -> None:
        self._fail = code

    def phantom_next_create(self) -> None:
        self._phantom = True

    def set_mig_mode(self, index: int, enabled: bool) -> None:
        """What ``nvidia-smi -i <index> -mig 1|0`` does (refused while instances exist)."""
        gpu = self.gpus[index]
        if gpu.instances:
            raise E(pynvml.NVML_ERROR_IN_USE)
        gpu.mig_enabled = enabled

    def layout(self, index: int) -> tuple[MigInstance, ...]:
        """The visible instances of a GPU as engine values."""
        return tuple(MigInstance(profile=g.profile, start=g.start)
                     for g in sorted(self.gpus[index].instances.values(), key=lambda g: g.start) if not g.hidden)

    # --- helpers ----------------------------------------------------------------------

    def _handle(self, *ref) -> int:
        h = 0x1000 + len(self._handles)
        self._handles[h] = ref
        return h

    def _deref(self, h, kind: str) -> tuple:
        ref = self._handles.get(int(h or 0))
        if ref is None or ref[0] != kind:
            raise E(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return ref

    def _gpu(self, device) -> FakeMigGpu:
        if not isinstance(device, _Dev) or not 0 <= device.index < len(self.gpus):
            raise E(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[device.index]

    def _mig_gpu(self, device) -> tuple[FakeMigGpu, MigTable]:
        gpu = self._gpu(device)
        table = gpu.table
        if table is None or not gpu.mig_enabled:
            raise E(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu, table

    def _gi(self, h) -> tuple[FakeMigGpu, _Gi]:
        _, index, gi_id = self._deref(h, "gi")
        gi = self.gpus[index].instances.get(gi_id)
        if gi is None:
            raise E(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[index], gi

    @staticmethod
    def _profiles(table: MigTable) -> dict[int, tuple]:
        """GI profile enum → (engine profile, enum) for the model's profiles."""
        out = {}
        for p in table.profiles:
            const = GI_PROFILE.get((p.slices, p.size))
            if const is not None:
                out[getattr(pynvml, const)] = p
        return out

    # --- device -----------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")

    def nvmlShutdown(self) -> None:
        self.calls.append("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Dev:
        if not 0 <= index < len(self.gpus):
            raise E(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _Dev(index)

    def nvmlDeviceGetName(self, device) -> str:
        return self._gpu(device).model

    def nvmlDeviceGetMemoryInfo(self, device) -> pynvml.c_nvmlMemory_t:
        total = self._gpu(device).memory_mib * 1024 * 1024
        return pynvml.c_nvmlMemory_t(total=total, free=total, used=0)

    def nvmlDeviceGetUUID(self, device) -> str:
        if isinstance(device, _MigDev):
            return self.gpus[device.index].instances[device.gi_id].cis[device.ci_id]
        return self.gpu_uuid(self._gpu(device).index)

    def nvmlDeviceGetMigMode(self, device) -> list[int]:
        gpu = self._gpu(device)
        if gpu.table is None:
            raise E(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if gpu.mig_enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    # --- GPU instances ----------------------------------------------------------------

    def nvmlDeviceGetGpuInstanceProfileInfo(self, device, profile: int, version: int = 2):
        _gpu, table = self._mig_gpu(device)
        p = self._profiles(table).get(profile)
        if p is None:
            raise E(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
        info.id, info.sliceCount, info.instanceCount = profile, p.slices, len(p.starts)
        info.memorySizeMB = p.memory_gib * 1024
        info.name = f"MIG {p.name}".encode()
        return info

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, device, profileId: int, placement):  # noqa: N803
        with self._lock:
            self.calls.append("nvmlDeviceCreateGpuInstanceWithPlacement")
            gpu, table = self._mig_gpu(device)
            p = self._profiles(table).get(profileId)
            if p is None:
                raise E(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            if self._fail is not None:
                code, self._fail = self._fail, None
                raise E(code)
            start = int(getattr(placement, "_obj", placement).start)  # ctypes.byref(placement) or the struct
            if start not in p.starts:
                raise E(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            taken = {s for g in gpu.instances.values() for s in range(g.start, g.start + g.size)}
            if taken & set(range(start, start + p.size)):
                raise E(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
            gi = _Gi(gi_id=gpu.next_gi, profile=p.name, enum=profileId, slices=p.slices, start=start,
                     size=p.size, hidden=self._phantom)
            self._phantom = False
            gpu.next_gi += 1
            gpu.instances[gi.gi_id] = gi
            self.creates += 1
            return self._handle("gi", gpu.index, gi.gi_id)

    def nvmlDeviceGetGpuInstances(self, device, profileId: int, gpuInstancesRef, countRef) -> int:  # noqa: N803
        gpu, _table = self._mig_gpu(device)
        found = [g for g in gpu.instances.values() if g.enum == profileId and not g.hidden]
        count = getattr(countRef, "_obj", countRef)  # ctypes.byref(c_uint) or the c_uint
        if len(found) > len(gpuInstancesRef):
            raise E(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for i, g in enumerate(sorted(found, key=lambda g: g.gi_id)):
            gpuInstancesRef[i] = self._handle("gi", gpu.index, g.gi_id)
        count.value = len(found)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetGpuInstanceById(self, device, gpuInstanceId: int) -> int:  # noqa: N803
        gpu, _table = self._mig_gpu(device)
        gi = gpu.instances.get(gpuInstanceId)
        if gi is None or gi.hidden:
            raise E(pynvml.NVML_ERROR_NOT_FOUND)
        return self._handle("gi", gpu.index, gi.gi_id)

    def nvmlGpuInstanceGetInfo(self, gpuInstance):  # noqa: N803
        _gpu, gi = self._gi(gpuInstance)
        return pynvml.c_nvmlGpuInstanceInfo_t(id=gi.gi_id, profileId=gi.enum,
                                              placement=pynvml.c_nvmlGpuInstancePlacement_t(gi.start, gi.size))

    def nvmlGpuInstanceDestroy(self, gpuInstance) -> int:  # noqa: N803
        with self._lock:
            gpu, gi = self._gi(gpuInstance)
            if gi.cis:
                raise E(pynvml.NVML_ERROR_IN_USE)
            del gpu.instances[gi.gi_id]
            return pynvml.NVML_SUCCESS

    # --- compute instances ------------------------------------------------------------

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gpuInstance, profile: int, engProfile: int,  # noqa: N803
                                                     version: int = 2):
        _gpu, gi = self._gi(gpuInstance)
        if profile != getattr(pynvml, CI_PROFILE.get(gi.slices, ""), None):
            raise E(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = pynvml.c_nvmlComputeInstanceProfileInfo_v2_t()
        info.id, info.sliceCount, info.instanceCount = profile, gi.slices, 1
        return info

    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance, profileId: int) -> int:  # noqa: N803
        with self._lock:
            gpu, gi = self._gi(gpuInstance)
            if profileId != getattr(pynvml, CI_PROFILE.get(gi.slices, ""), None):
                raise E(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            if gi.cis:
                raise E(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
            self.cis_created += 1
            name = f"{self.gpu_uuid(gpu.index)}.gi{gi.gi_id}.{self.cis_created}"
            gi.cis[0] = f"MIG-{uuid.uuid5(uuid.NAMESPACE_DNS, name + '.phalanx.invalid')}"
            return self._handle("ci", gpu.index, gi.gi_id, 0)

    def nvmlGpuInstanceGetComputeInstances(self, gpuInstance, profileId: int, computeInstancesRef,  # noqa: N803
                                           countRef) -> int:  # noqa: N803
        gpu, gi = self._gi(gpuInstance)
        count = getattr(countRef, "_obj", countRef)  # ctypes.byref(c_uint) or the c_uint
        ids = sorted(gi.cis) if profileId == getattr(pynvml, CI_PROFILE.get(gi.slices, ""), None) else []
        for i, ci in enumerate(ids):
            computeInstancesRef[i] = self._handle("ci", gpu.index, gi.gi_id, ci)
        count.value = len(ids)
        return pynvml.NVML_SUCCESS

    def nvmlComputeInstanceGetInfo(self, computeInstance):  # noqa: N803
        _, index, gi_id, ci_id = self._deref(computeInstance, "ci")
        gi = self.gpus[index].instances.get(gi_id)
        if gi is None or ci_id not in gi.cis:
            raise E(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.c_nvmlComputeInstanceInfo_t(id=ci_id, profileId=gi.enum)

    def nvmlComputeInstanceDestroy(self, computeInstance) -> int:  # noqa: N803
        with self._lock:
            _, index, gi_id, ci_id = self._deref(computeInstance, "ci")
            gi = self.gpus[index].instances.get(gi_id)
            if gi is None or gi.cis.pop(ci_id, None) is None:
                raise E(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            return pynvml.NVML_SUCCESS

    # --- MIG devices ------------------------------------------------------------------

    def _mig_devices(self, device) -> list[_MigDev]:
        gpu = self._gpu(device)
        return [_MigDev(gpu.index, g.gi_id, ci) for g in sorted(gpu.instances.values(), key=lambda g: g.gi_id)
                if not g.hidden for ci in sorted(g.cis)]

    def nvmlDeviceGetMaxMigDeviceCount(self, device) -> int:
        gpu = self._gpu(device)
        return 0 if gpu.table is None else 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device, index: int) -> _MigDev:
        devs = self._mig_devices(device)
        if not 0 <= index < len(devs):
            raise E(pynvml.NVML_ERROR_NOT_FOUND)
        return devs[index]

    def nvmlDeviceGetGpuInstanceId(self, device) -> int:
        if not isinstance(device, _MigDev):
            raise E(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return device.gi_id

    def nvmlDeviceGetComputeInstanceId(self, device) -> int:
        if not isinstance(device, _MigDev):
            raise E(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return device.ci_id
