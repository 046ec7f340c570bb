"""Pod GPU requests (R1-R5, R7, R12): parsing, every rejection rule, the node-side model
check, workload templates, and ``phalanx validate`` on the seed's examples."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from phalanx_cli.main import main
from phalanx_engine.gpumodel import check_gpu_model
from phalanx_kubeobjects.gangs import NO_GPU_RULE
from phalanx_kubeobjects.podspec import PodConstraints
from phalanx_kubeobjects.requests import (
    GpuRequest,
    RequestError,
    RequestKind,
    Violation,
    parse_pod,
)
from phalanx_kubeobjects.workloads import (
    GangCheck,
    ObjectCheck,
    check_object,
    expand_pods,
    gang_check,
    pod_templates,
)
from phalanx_proto.events import MemberSpec, PodRef


def cases(*rows: tuple) -> list:
    """Parametrize rows whose first item is the case sentence; the sentence is the test id."""
    return [pytest.param(*row, id=row[0]) for row in rows]


EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "pods"


# --- builders -------------------------------------------------------------------------------


def ctr(name: str = "app", *, requests: dict | None = None, caps: list[str] | None = None, **limits: Any) -> dict:
    """A container; limit keys use ``_`` for ``/`` and ``__`` for ``-`` (gpu__core -> gpu-core)."""
    res: dict[str, Any] = {"limits": {_res(k): v for k, v in limits.items()}}
    if requests is not None:
        res["requests"] = {_res(k): v for k, v in requests.items()}
    c: dict[str, Any] = {"name": name, "image": "img", "resources": res}
    if caps is not None:
        c["securityContext"] = {"capabilities": {"add": caps}}
    return c


def _res(key: str) -> str:
    if "/" in key:
        return key
    vendor, _, rest = key.partition("_")
    return f"{vendor}.com/{rest.replace('__', '-')}"


def pod(*containers: dict, name: str = "p", labels: dict | None = None, annotations: dict | None = None,
        scheduler: str | None = "phalanx", **spec: Any) -> dict:
    meta: dict[str, Any] = {"name": name}
    if labels:
        meta["labels"] = labels
    if annotations:
        meta["annotations"] = annotations
    body: dict[str, Any] = {"containers": list(containers or [ctr()]), **spec}
    if scheduler is not None:
        body["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": body}


def example(name: str) -> dict:
    return yaml.safe_load((EXAMPLES / name).read_text())


def lim(container: str, resource: str) -> str:
    return f"spec.containers[{container}].resources.limits[{resource}]"


SEED = dict(scheduler_name="lj-runtimekit-scheduler", runtime_class="lj-runtime")


# --- valid requests -------------------------------------------------------------------------

VALID = [
    ("the seed's whole-card-demo asks for one whole NVIDIA GPU", example("whole-card-demo.yaml"),
     GpuRequest(pod="whole-card-demo", kind=RequestKind.WHOLE, gpus=1, resource_name="nvidia.com/gpu",
                vendor="nvidia", **SEED)),
    ("the seed's tdm-demo asks for 50 percent core and 4 GiB on one GPU", example("tdm-demo.yaml"),
     GpuRequest(pod="tdm-demo", kind=RequestKind.TDM, gpus=1, core_pct=50, memory_mib=4096, **SEED)),
    ("the seed's mig-demo asks for a 3-slice MIG instance with 4 GiB", example("mig-demo.yaml"),
     GpuRequest(pod="mig-demo", kind=RequestKind.MIG, gpus=1, mig_slices=3, memory_mib=4096, **SEED)),
    ("the seed's multi-gpu-demo asks for the same share on each of 2 GPUs", example("multi-gpu-demo.yaml"),
     GpuRequest(pod="multi-gpu-demo", kind=RequestKind.TDM, gpus=2, core_pct=50, memory_mib=4096, **SEED)),
    ("the seed's 4-GPU topology pod asks for 4 whole aliyun GPUs", example("topology-4gpu.yaml"),
     GpuRequest(pod="topology-4gpu-demo", kind=RequestKind.WHOLE, gpus=4, resource_name="aliyun.com/gpu", **SEED)),
    ("the seed's RDMA pod asks for 4 whole GPUs plus RDMA on the host network", example("rdma-4gpu.yaml"),
     GpuRequest(pod="rdma-4gpu-demo", kind=RequestKind.WHOLE, gpus=4, resource_name="aliyun.com/gpu", rdma=True,
                host_network=True, constraints=PodConstraints(host_network=True), **SEED,
                warnings=("container training uses RDMA without the IPC_LOCK capability; RDMA memory "
                          "registration may fail",))),
    ("the seed's gang worker template is one GPU plus RDMA in a gang of 7",
     example("gang-nccl-test.yaml")["spec"]["replicatedJobs"][0]["template"]["spec"]["template"],
     GpuRequest(pod="", kind=RequestKind.WHOLE, gpus=1, resource_name="aliyun.com/gpu", rdma=True,
                host_network=True, constraints=PodConstraints(host_network=True), min_member=7, **SEED)),
    ("a bare spec snippet without metadata parses as an unnamed pod",
     {"spec": {"schedulerName": "phalanx", "containers": [ctr(aliyun_gpu="2")]}},
     GpuRequest(pod="", scheduler_name="phalanx", kind=RequestKind.WHOLE, gpus=2, resource_name="aliyun.com/gpu")),
    ("a share with only gpu-memory has no compute limit", pod(ctr(aliyun_gpu__memory="8")),
     GpuRequest(pod="p", scheduler_name="phalanx", kind=RequestKind.TDM, gpus=1, memory_mib=8192)),
    ("a share with only gpu-core has no memory limit", pod(ctr(aliyun_gpu__core="30")),
     GpuRequest(pod="p", scheduler_name="phalanx", kind=RequestKind.TDM, gpus=1, core_pct=30)),
    ("gpu-core 100 is the whole compute of one GPU and is allowed", pod(ctr(aliyun_gpu__core="100")),
     GpuRequest(pod="p", scheduler_name="phalanx", kind=RequestKind.TDM, gpus=1, core_pct=100)),
    ("gpu-memory-mib in a multiple of 128 gives memory in MiB",
     pod(ctr(aliyun_gpu__core="10", aliyun_gpu__memory__mib="1536")),
     GpuRequest(pod="p", scheduler_name="phalanx", kind=RequestKind.TDM, gpus=1, core_pct=10, memory_mib=1536)),
    ("YAML integers are accepted like strings", pod(ctr(aliyun_gpu__core=50, aliyun_gpu__memory=4)),
     GpuRequest(pod="p", scheduler_name="phalanx", kind=RequestKind.TDM, gpus=1, core_pct=50, memory_mib=4096)),
    ("requests that repeat the limits are accepted",
     pod(ctr(nvidia_gpu="2", requests={"nvidia.com/gpu": 2})),
     GpuRequest(pod="p", scheduler_name="phalanx", kind=RequestKind.WHOLE, gpus=2, resource_name="nvidia.com/gpu",
                vendor="nvidia")),
    ("whole GPUs add up over containers as in Kubernetes",
     pod(ctr("a", nvidia_gpu="1"), ctr("b", nvidia_gpu="2")),
     GpuRequest(pod="p", scheduler_name="phalanx", kind=RequestKind.WHOLE, gpus=3, resource_name="nvidia.com/gpu",
                vendor="nvidia")),
    ("containers asking the same share share the pod's GPUs",
     pod(ctr("a", aliyun_gpu__core="20"), ctr("b", aliyun_gpu__core="20"), labels={"replica": "2"}),
     GpuRequest(pod="p", scheduler_name="phalanx", kind=RequestKind.TDM, gpus=2, core_pct=20)),
    ("a MIG slice with replica asks for one instance on each of N GPUs",
     pod(ctr(aliyun_gpu__slice="1", aliyun_gpu__memory="5"), labels={"replica": "3"}),
     GpuRequest(pod="p", scheduler_name="phalanx", kind=RequestKind.MIG, gpus=3, mig_slices=1, memory_mib=5120)),
    ("whole AMD GPUs are fine with the vendor hint", pod(ctr(aliyun_gpu="1"),
                                                          annotations={"phalanx.io/gpu-vendor": "amd"}),
     GpuRequest(pod="p", scheduler_name="phalanx", kind=RequestKind.WHOLE, gpus=1, resource_name="aliyun.com/gpu",
                vendor="amd")),
    ("a pod without GPU resources is a request for no GPU", pod(ctr()),
     GpuRequest(pod="p", scheduler_name="phalanx", kind=RequestKind.NONE)),
    ("the namespace is part of the pod name", {**pod(ctr(nvidia_gpu="1")),
                                               "metadata": {"name": "p", "namespace": "ml"}},
     GpuRequest(pod="ml/p", scheduler_name="phalanx", kind=RequestKind.WHOLE, gpus=1, resource_name="nvidia.com/gpu",
                vendor="nvidia")),
]


@pytest.mark.parametrize(("case", "spec", "expected"), VALID, ids=[c[0] for c in VALID])
def test_requests_valid_pods_parse_to_the_expected_request(case: str, spec: dict, expected: GpuRequest) -> None:
    labels = dict(sorted(spec.get("metadata", {}).get("labels", {}).items()))  # carried for pod affinity
    assert parse_pod(spec) == msgspec.structs.replace(
        expected, constraints=msgspec.structs.replace(expected.constraints, labels=labels))


# --- every rule, rejected ------------------------------------------------------------------

HANG = ("gpu-core 0 is not allowed: it would make the GPU program in the container hang without output (seed "
        "FAQ Q1); give a percent from 1 to 100, or leave gpu-core out for no compute limit")
CORE_MOST = "must be at most 100: gpu-core is a percent of one GPU's compute"
NOT_INTEGER = "must be an integer (the API server's rule for extended resources)"
NEGATIVE = "must be greater than or equal to 0"
SLICES = "gpu-slice must be one of 1, 2, 3, 4, 7 (MIG compute slices)"
APP_LIMITS = "spec.containers[app].resources.limits"


def mib_rule(near: str) -> str:
    return (f"gpu-memory-mib must be a positive multiple of 128 MiB (the MiB granularity, seed 3.5); the nearest "
            f"allowed: {near}")


INVALID = [
    ("gpu-core 0 is rejected because it would hang the GPU program",
     pod(ctr(aliyun_gpu__core="0", aliyun_gpu__memory="4")),
     [Violation(lim("app", "aliyun.com/gpu-core"), "0", HANG)]),
    ("a negative gpu-core is rejected as the API server rejects it", pod(ctr(aliyun_gpu__core="-5")),
     [Violation(lim("app", "aliyun.com/gpu-core"), "-5", NEGATIVE)]),
    ("gpu-core over 100 is rejected with its range", pod(ctr(aliyun_gpu__core=101)),
     [Violation(lim("app", "aliyun.com/gpu-core"), "101", CORE_MOST)]),
    ("a fractional gpu-core is not an integer", pod(ctr(aliyun_gpu__core="0.5")),
     [Violation(lim("app", "aliyun.com/gpu-core"), "0.5", NOT_INTEGER)]),
    ("gpu-memory 4Gi is 4Gi GiB, more than any GPU has", pod(ctr(aliyun_gpu__memory="4Gi")),
     [Violation(lim("app", "aliyun.com/gpu-memory"), "4Gi",
                'must be at most 1024: gpu-memory is GiB of one GPU\'s memory, and no GPU has more than 1 TiB (4 GiB '
                'is written "4", not "4Gi")')]),
    ("gpu-memory 0 GiB is rejected", pod(ctr(aliyun_gpu__memory="0")),
     [Violation(lim("app", "aliyun.com/gpu-memory"), "0",
                "gpu-memory is GiB of GPU memory and must be at least 1 (for less, use aliyun.com/gpu-memory-mib)")]),
    ("MiB memory that is not a multiple of 128 names the nearest allowed sizes",
     pod(ctr(aliyun_gpu__memory__mib="1000")),
     [Violation(lim("app", "aliyun.com/gpu-memory-mib"), "1000", mib_rule("896 or 1024"))]),
    ("MiB memory below 128 is rejected", pod(ctr(aliyun_gpu__memory__mib="64")),
     [Violation(lim("app", "aliyun.com/gpu-memory-mib"), "64", mib_rule("128"))]),
    ("gpu-slice 5 is rejected with the allowed values", pod(ctr(aliyun_gpu__slice="5")),
     [Violation(lim("app", "aliyun.com/gpu-slice"), "5", SLICES)]),
    ("TDM and MIG in one request are rejected", pod(ctr(aliyun_gpu__core="50", aliyun_gpu__slice="3")),
     [Violation(APP_LIMITS, "aliyun.com/gpu-core=50, aliyun.com/gpu-slice=3",
                "TDM (gpu-core) and MIG (gpu-slice) cannot be combined: they never share a GPU (seed 3.5); ask for "
                "one or the other")]),
    ("gpu-core together with a whole-GPU count is rejected", pod(ctr(nvidia_gpu="1", aliyun_gpu__core="50")),
     [Violation(APP_LIMITS, "nvidia.com/gpu=1, aliyun.com/gpu-core=50",
                "aliyun.com/gpu-core cannot be combined with a whole-GPU request (nvidia.com/gpu): a whole GPU has no "
                "compute limit; leave gpu-core out (seed 3.2)")]),
    ("gpu-memory together with a whole-GPU count is rejected", pod(ctr(aliyun_gpu="1", aliyun_gpu__memory="4")),
     [Violation(APP_LIMITS, "aliyun.com/gpu=1, aliyun.com/gpu-memory=4",
                "aliyun.com/gpu-memory cannot be combined with a whole-GPU request (aliyun.com/gpu): a whole GPU "
                "comes with all its memory; leave gpu-memory out")]),
    ("a MIG slice together with a whole-GPU count is rejected", pod(ctr(aliyun_gpu="1", aliyun_gpu__slice="1")),
     [Violation(APP_LIMITS, "aliyun.com/gpu=1, aliyun.com/gpu-slice=1",
                "aliyun.com/gpu-slice cannot be combined with a whole-GPU request (aliyun.com/gpu): a MIG slice is "
                "part of one GPU; ask for one or the other")]),
    ("memory in both GiB and MiB is rejected", pod(ctr(aliyun_gpu__memory="4", aliyun_gpu__memory__mib="4096")),
     [Violation(APP_LIMITS, "aliyun.com/gpu-memory=4, aliyun.com/gpu-memory-mib=4096",
                "give GPU memory once: aliyun.com/gpu-memory in GiB or aliyun.com/gpu-memory-mib in MiB")]),
    ("both whole-GPU names in one pod are rejected", pod(ctr("a", nvidia_gpu="1"), ctr("b", aliyun_gpu="1")),
     [Violation("spec.containers", "nvidia.com/gpu=1, aliyun.com/gpu=1",
                "ask for whole GPUs under one name: nvidia.com/gpu (NVIDIA, community name) or aliyun.com/gpu (any "
                "vendor), not both")]),
    ("zero whole GPUs is rejected", pod(ctr(nvidia_gpu="0")),
     [Violation(lim("app", "nvidia.com/gpu"), "0",
                "nvidia.com/gpu is a number of whole GPUs and must be at least 1 (leave it out to ask for none)")]),
    ("a fractional whole-GPU count is not an integer", pod(ctr(nvidia_gpu="1.5")),
     [Violation(lim("app", "nvidia.com/gpu"), "1.5", NOT_INTEGER)]),
    ("a boolean is not an integer", pod(ctr(aliyun_gpu=True)),
     [Violation(lim("app", "aliyun.com/gpu"), "true", 'a quantity is a string such as "4" or a number, not true')]),
    ("containers asking different shares with replica are heterogeneous",
     pod(ctr("a", aliyun_gpu__core="50", aliyun_gpu__memory="4"), ctr("b", aliyun_gpu__core="30"),
         labels={"replica": "2"}),
     [Violation("spec.containers", "a: gpu-core=50 memory=4096MiB; b: gpu-core=30",
                "heterogeneous per-GPU requests are not supported: every container that asks for a GPU share must "
                "ask the same gpu-core/gpu-memory/gpu-slice, and the pod label replica sets how many GPUs get that "
                "share (seed 3.4)")]),
    ("whole GPUs in one container and a share in another are rejected",
     pod(ctr("a", nvidia_gpu="1"), ctr("b", aliyun_gpu__core="30")),
     [Violation("spec.containers", "a=whole, b=share",
                "all containers of a pod must ask for the same kind of GPU: whole GPUs, or one TDM/MIG share per GPU "
                "(seed 3.4: homogeneous requests only)")]),
    ("replica with whole GPUs is rejected", pod(ctr(nvidia_gpu="2"), labels={"replica": "2"}),
     [Violation("metadata.labels[replica]", "2",
                "replica applies to GPU shares (gpu-core/gpu-memory/gpu-slice); for whole GPUs ask nvidia.com/gpu: N "
                "instead")]),
    ("replica without a per-GPU share is rejected", pod(ctr(), labels={"replica": "2"}),
     [Violation("metadata.labels[replica]", "2",
                "replica asks for 2 GPUs but no container says what each GPU gets: set aliyun.com/gpu-core and/or "
                "aliyun.com/gpu-memory (or gpu-slice) in resources.limits")]),
    ("replica that is not a positive integer is rejected", pod(ctr(aliyun_gpu__core="5"), labels={"replica": "two"}),
     [Violation("metadata.labels[replica]", "two",
                "replica is the number of GPUs: must be a whole number written with ASCII digits 0-9 only")]),
    ("rdma is a switch, not a NIC count", pod(ctr(aliyun_gpu="1", aliyun_rdma="2"), hostNetwork=True),
     [Violation(lim("app", "aliyun.com/rdma"), "2",
                'must be at most 1: aliyun.com/rdma is a switch, not a NIC count: set it to "1" to place GPUs and '
                "RDMA NICs together, or leave it out")]),
    ("rdma with a GPU share is rejected", pod(ctr(aliyun_gpu__core="50", aliyun_rdma="1"), hostNetwork=True),
     [Violation(lim("app", "aliyun.com/rdma"), "1",
                "aliyun.com/rdma places whole GPUs together with RDMA NICs: ask for aliyun.com/gpu (1 to 8) with it, "
                "not a GPU share or nothing")]),
    ("rdma with more than 8 GPUs is rejected", pod(ctr(aliyun_gpu="9", aliyun_rdma="1"), hostNetwork=True),
     [Violation("spec.containers", "9", "with aliyun.com/rdma the pod asks for 1 to 8 whole GPUs")]),
    ("rdma without hostNetwork is rejected", pod(ctr(aliyun_gpu="4", aliyun_rdma="1")),
     [Violation("spec.hostNetwork", "false", "RDMA needs hostNetwork: true (seed 4.1)")]),
    ("an RDMA gang member without IPC_LOCK is rejected",
     pod(ctr(aliyun_gpu="1", aliyun_rdma="1"), labels={"aliyun.com/min-member": "2"}, hostNetwork=True),
     [Violation("spec.containers[app].securityContext.capabilities.add", "[]",
                "RDMA gang members need the IPC_LOCK capability, or RDMA memory registration fails (seed 4.2)")]),
    ("a gang member by the coscheduling plugin's label is a gang member for the RDMA rule too (min-member is "
     "read in one place)",
     pod(ctr(aliyun_gpu="1", aliyun_rdma="1"), labels={"scheduling.x-k8s.io/min-member": "2"}, hostNetwork=True),
     [Violation("spec.containers[app].securityContext.capabilities.add", "[]",
                "RDMA gang members need the IPC_LOCK capability, or RDMA memory registration fails (seed 4.2)")]),
    ("a gang size said as an annotation is checked as one said as a label",
     pod(ctr(nvidia_gpu="1"), annotations={"phalanx.io/gang-min-member": "0"}),
     [Violation("metadata.labels[phalanx.io/gang-min-member]", "0",
                "min-member is the number of pods in the gang: must be at least 1")]),
    ("a slicing request for AMD GPUs is rejected",
     pod(ctr(aliyun_gpu__core="50"), annotations={"phalanx.io/gpu-vendor": "amd"}),
     [Violation("metadata.annotations[phalanx.io/gpu-vendor]", "amd",
                "AMD GPUs take whole-GPU requests only; gpu-core, gpu-memory and gpu-slice cannot be used with them "
                "(seed 3.5)")]),
    ("nvidia.com/gpu with an AMD vendor hint is rejected",
     pod(ctr(nvidia_gpu="1"), annotations={"phalanx.io/gpu-vendor": "amd"}),
     [Violation("metadata.annotations[phalanx.io/gpu-vendor]", "amd",
                "nvidia.com/gpu asks for NVIDIA GPUs; for amd GPUs ask aliyun.com/gpu")]),
    ("MIG on PPU is rejected in favour of TDM",
     pod(ctr(aliyun_gpu__slice="1"), annotations={"phalanx.io/gpu-vendor": "ppu"}),
     [Violation("metadata.annotations[phalanx.io/gpu-vendor]", "ppu",
                "MIG (gpu-slice) is an NVIDIA feature; on PPU use a TDM share (gpu-core/gpu-memory) instead (seed "
                "3.3)")]),
    ("an unknown vendor hint is rejected", pod(ctr(aliyun_gpu="1"), annotations={"phalanx.io/gpu-vendor": "intel"}),
     [Violation("metadata.annotations[phalanx.io/gpu-vendor]", "intel",
                "the GPU vendor hint must be one of nvidia, amd, ppu")]),
    ("another scheduler's pod is not Phalanx's", pod(ctr(nvidia_gpu="1"), scheduler=None),
     [Violation("spec.schedulerName", "default-scheduler",
                "Phalanx schedules only pods whose schedulerName is 'phalanx' or 'lj-runtimekit-scheduler'; this pod "
                "would wait for another scheduler")]),
    ("a pod without containers is rejected", {"metadata": {"name": "p"}, "spec": {"schedulerName": "phalanx"}},
     [Violation("spec.containers", "None", "a pod needs at least one container")]),
    ("a GPU resource only in requests must be in limits",
     pod({"name": "app", "resources": {"requests": {"nvidia.com/gpu": "1"}}}),
     [Violation("spec.containers[app].resources.requests[nvidia.com/gpu]", "1",
                "must be set in resources.limits; Kubernetes does not overcommit extended resources, so requests may "
                "only repeat the limit")]),
    ("requests that differ from limits are rejected", pod(ctr(nvidia_gpu="2", requests={"nvidia.com/gpu": "1"})),
     [Violation("spec.containers[app].resources.requests[nvidia.com/gpu]", "1",
                "must equal the limit (2) or be left out")]),
    ("an init container cannot ask for GPUs", pod(ctr(), initContainers=[ctr("init", nvidia_gpu="1")]),
     [Violation("spec.initContainers[init].resources.limits[nvidia.com/gpu]", "1",
                "init containers cannot ask for GPU resources; ask in the main containers")]),
    ("a min-member of zero is rejected", pod(ctr(nvidia_gpu="1"), labels={"aliyun.com/min-member": "0"}),
     [Violation("metadata.labels[aliyun.com/min-member]", "0",
                "min-member is the number of pods in the gang: must be at least 1")]),
    ("a gang timeout of a fraction of a second is rejected as gang-coordinator rejects it",
     pod(ctr(nvidia_gpu="1"), annotations={"phalanx.io/gang-timeout-seconds": "0.5"}),
     [Violation("metadata.annotations[phalanx.io/gang-timeout-seconds]", "0.5",
                "the gang timeout is a whole number of seconds: must be a whole number written with ASCII digits "
                "0-9 only")]),
    ("every broken rule is listed, not just the first", pod(ctr(aliyun_gpu__core="0", aliyun_gpu__slice="5")),
     [Violation(lim("app", "aliyun.com/gpu-core"), "0", HANG),
      Violation(lim("app", "aliyun.com/gpu-slice"), "5", SLICES)]),
]


@pytest.mark.parametrize(("case", "spec", "expected"), INVALID, ids=[c[0] for c in INVALID])
def test_requests_invalid_pods_are_rejected_with_every_violation(case: str, spec: dict,
                                                                 expected: list[Violation]) -> None:
    with pytest.raises(RequestError) as info:
        parse_pod(spec)
    assert info.value.violations == tuple(expected)


def test_requests_error_message_names_the_pod_field_value_and_rule() -> None:
    with pytest.raises(RequestError) as info:
        parse_pod(pod(ctr(aliyun_gpu__core="0"), name="tdm"))
    assert str(info.value) == f"invalid GPU request in pod tdm: {lim('app', 'aliyun.com/gpu-core')} = '0': {HANG}"


def test_requests_scheduler_check_can_be_left_to_the_caller() -> None:
    req = parse_pod(pod(ctr(nvidia_gpu="1"), scheduler="default-scheduler"), require_scheduler=False)
    assert (req.kind, req.gpus, req.scheduler_name) == (RequestKind.WHOLE, 1, "default-scheduler")


def test_requests_turn_into_the_wire_member_spec() -> None:
    req = parse_pod(example("tdm-demo.yaml"))
    ref = PodRef(namespace="default", name="tdm-demo")
    assert req.member_spec(ref) == MemberSpec(pod=ref, gpus=1, core_pct=50, memory_mib=4096,
                                              resource_name="nvidia.com/gpu")


# --- hostile input: the exact values users tried ------------------------------------------------

GRAMMAR_RULE = ("a Kubernetes quantity is ASCII digits with an optional sign and decimal point and an optional suffix "
                "(Ki Mi Gi Ti Pi Ei, n u m k M G T P E, or an exponent such as e3); the API server rejects anything "
                "else")
GPUS_MOST = "must be at most 64: a pod's GPUs are on one node, and no node has more than 64 GPUs"
TEN_20 = "100000000000000000000"
SUBDOMAIN = ("must be a DNS-1123 subdomain: at most 253 characters, lower-case ASCII letters, digits, '-' and '.', "
             "each part starting and ending with a letter or digit")


@pytest.mark.parametrize(("case", "spec", "expected"), cases(
    ("an Arabic-Indic four is not four GPUs", pod(ctr(nvidia_gpu="٤")),
     [Violation(lim("app", "nvidia.com/gpu"), "٤", GRAMMAR_RULE)]),
    ("a full-width eight is not eight GPUs", pod(ctr(aliyun_gpu="８")),
     [Violation(lim("app", "aliyun.com/gpu"), "８", GRAMMAR_RULE)]),
    ("10^20 GPUs name the bound", pod(ctr(nvidia_gpu=TEN_20)), [Violation(lim("app", "nvidia.com/gpu"), TEN_20, GPUS_MOST)]),
    ("10^20 GPUs as a YAML integer name the bound", pod(ctr(nvidia_gpu=10**20)),
     [Violation(lim("app", "nvidia.com/gpu"), TEN_20, GPUS_MOST)]),
    ("10^20 MiB of GPU memory name the bound", pod(ctr(aliyun_gpu__memory__mib=TEN_20)),
     [Violation(lim("app", "aliyun.com/gpu-memory-mib"), TEN_20,
                "must be at most 1048576: gpu-memory-mib is MiB of one GPU's memory, and no GPU has more than 1 TiB")]),
    ("replica 10^20 names the bound", pod(ctr(aliyun_gpu__core="5"), labels={"replica": TEN_20}),
     [Violation("metadata.labels[replica]", TEN_20, f"replica is the number of GPUs: {GPUS_MOST}")]),
    ("an Arabic-Indic replica is neither a label value nor a number", pod(ctr(aliyun_gpu__core="5"),
                                                                         labels={"replica": "٤"}),
     [Violation("metadata.labels[replica]", "٤", "a label value is empty or at most 63 ASCII letters, digits, '-', "
                                                "'_' and '.', starting and ending with a letter or digit"),
      Violation("metadata.labels[replica]", "٤",
                "replica is the number of GPUs: must be a whole number written with ASCII digits 0-9 only")]),
    ("min-member 10^20 names the bound", pod(ctr(nvidia_gpu="1"), labels={"aliyun.com/min-member": TEN_20}),
     [Violation("metadata.labels[aliyun.com/min-member]", TEN_20,
                "min-member is the number of pods in the gang: must be at most 10000: a gang has at most 10000 pods "
                "(the wire contract's bound: one decision commits at most 1,000 nodes)")]),
    ("a pod name of 200,000 characters is refused and shown cut", pod(ctr(nvidia_gpu="1"), name="a" * 200_000),
     [Violation("metadata.name", "a" * 60 + "... (200000 characters)", SUBDOMAIN)]),
    ("an emoji pod name is refused", pod(ctr(nvidia_gpu="1"), name="train-\U0001f680"),
     [Violation("metadata.name", "train-\U0001f680", SUBDOMAIN)]),
    ("an unquoted label value is refused as the API server refuses it",
     pod(ctr(aliyun_gpu__core="5"), labels={"replica": 2}),
     [Violation("metadata.labels[replica]", "2", 'label values are strings: write the value in quotes, e.g. "4"')]),
    ("initContainers that is an integer is a shape error, not a crash", pod(ctr(nvidia_gpu="1"), initContainers=5),
     [Violation("spec.initContainers", "5", "must be a list of containers")]),
    ("a container that is not a mapping is named", pod(ctr(nvidia_gpu="1"), initContainers=[7]),
     [Violation("spec.initContainers[0]", "7", "must be a container (a mapping)")]),
))
def test_requests_hostile_values_are_violations_naming_the_rule(case: str, spec: dict,
                                                                expected: list[Violation]) -> None:
    with pytest.raises(RequestError) as info:
        parse_pod(spec)
    assert info.value.violations == tuple(expected)


def _jobset(parallelism: object) -> dict:
    obj = example("gang-nccl-test.yaml")
    obj["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] = parallelism
    return obj


def _self_referencing_list() -> dict:
    obj: dict = {"kind": "List", "items": []}
    obj["items"].append(obj)
    return obj


WORKER = "JobSet/gang-nccl-test spec.replicatedJobs[worker]"
NOT_INT = "must be an integer (a number without quotes or decimal point)"


@pytest.mark.parametrize(("case", "obj", "expected"), cases(
    ("a JobSet parallelism of \"four\" is an error, not 1", _jobset("four"),
     (ObjectCheck(where=WORKER, violations=(Violation(
         "spec.replicatedJobs[0].template.spec.parallelism", "four", NOT_INT),)),)),
    ("a quoted JobSet parallelism is an error, as the API server's is", _jobset("7"),
     (ObjectCheck(where=WORKER, violations=(Violation(
         "spec.replicatedJobs[0].template.spec.parallelism", "7", NOT_INT),)),)),
    ("a JobSet whose replicatedJobs is an integer", {"kind": "JobSet", "metadata": {"name": "j"},
                                                     "spec": {"replicatedJobs": 3}},
     (ObjectCheck(where="JobSet/j", violations=(Violation("spec.replicatedJobs", "3",
                                                          "must be a list of replicated jobs"),)),)),
    ("a List whose items is an integer", {"kind": "List", "items": 3},
     (ObjectCheck(where="List (unnamed)", violations=(Violation("items", "3", "must be a list of objects"),)),)),
    ("a self-referencing List ends at its first level", _self_referencing_list(),
     (ObjectCheck(where="List (unnamed)", violations=(Violation("items[0].kind", "List",
                                                                "a List item cannot itself be a List"),)),)),
    ("a Job's parallelism of 10^20 names the bound",
     {"kind": "Job", "metadata": {"name": "j"}, "spec": {"parallelism": 10**20, "template": pod(ctr(nvidia_gpu="1"))}},
     (ObjectCheck(where="Job/j", violations=(Violation(
         "spec.parallelism", TEN_20, "must be at most 10000: a gang has at most 10000 pods (the wire contract's "
                                     "bound: one decision commits at most 1,000 nodes)"),)),)),
))
def test_requests_malformed_workload_objects_are_violations(case: str, obj: dict,
                                                            expected: tuple[ObjectCheck, ...]) -> None:
    assert check_object(obj) == expected


# --- node-side: the GPU model ---------------------------------------------------------------

MIG_3G = parse_pod(example("mig-demo.yaml"))
TDM = parse_pod(example("tdm-demo.yaml"))
WHOLE = parse_pod(example("whole-card-demo.yaml"))
BIG_1G = parse_pod(pod(ctr(aliyun_gpu__slice="1", aliyun_gpu__memory="30")))

MODEL_CASES = [
    ("MIG fits a 3g profile on an A100 40GB", MIG_3G, "NVIDIA A100-SXM4-40GB", {}, ()),
    ("MIG fits on the seed's H800", MIG_3G, "NVIDIA H800", {}, ()),
    ("MIG fits on an H200", MIG_3G, "NVIDIA H200", {}, ()),
    ("MIG on a V100 is refused: the model has no MIG", MIG_3G, "Tesla V100-SXM2-16GB", {},
     (Violation("aliyun.com/gpu-slice", "3",
                "GPU model 'Tesla V100-SXM2-16GB' does not support MIG; MIG needs a MIG-capable NVIDIA model such as "
                "A100, A30, H100, H800, H200 or B200 (seed: A100 and H800)"),)),
    ("MIG on a GeForce RTX 4090 is refused", MIG_3G, "NVIDIA GeForce RTX 4090", {},
     (Violation("aliyun.com/gpu-slice", "3",
                "GPU model 'NVIDIA GeForce RTX 4090' does not support MIG; MIG needs a MIG-capable NVIDIA model such "
                "as A100, A30, H100, H800, H200 or B200 (seed: A100 and H800)"),)),
    ("a 1-slice request with more memory than any 1g profile is refused on an A100 40GB", BIG_1G,
     "NVIDIA A100-SXM4-40GB", {},
     (Violation("aliyun.com/gpu-slice", "1 with 30720 MiB",
                "A100-40GB has no MIG profile with 1 compute slices and that much memory; its profiles are 1g.5gb, "
                "1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb"),)),
    ("a 3-slice request is refused on an A30, which has no 3g profile", MIG_3G, "NVIDIA A30", {},
     (Violation("aliyun.com/gpu-slice", "3 with 4096 MiB",
                "A30-24GB has no MIG profile with 3 compute slices and that much memory; its profiles are 1g.6gb, "
                "2g.12gb, 4g.24gb"),)),
    ("a MIG-capable model without a profile table is named as such", MIG_3G, "NVIDIA H20", {},
     (Violation("aliyun.com/gpu-slice", "3",
                "Phalanx has no MIG profile table for 'NVIDIA H20', so it cannot choose a MIG profile and slot on it"),)),
    ("TDM on an AMD GPU is refused", TDM, "AMD Instinct MI300X", {"vendor": "amd"},
     (Violation("aliyun.com/gpu-core", "50", "AMD GPUs (AMD Instinct MI300X) take whole-GPU requests only (seed 3.5)"),)),
    ("a whole NVIDIA GPU request is refused on an AMD node", WHOLE, "AMD Instinct MI300X", {"vendor": "amd"},
     (Violation("metadata.annotations[phalanx.io/gpu-vendor]", "nvidia", "the GPU is a amd AMD Instinct MI300X"),)),
    ("a TDM share with more memory than the GPU has is refused", TDM, "NVIDIA T4", {"memory_mib": 2048},
     (Violation("aliyun.com/gpu-memory", "4096 MiB", "more GPU memory than a NVIDIA T4 has (2048 MiB)"),)),
    ("TDM works on any NVIDIA model", TDM, "Tesla V100-SXM2-16GB", {"memory_mib": 16384}, ()),
]


@pytest.mark.parametrize(("case", "request_", "model", "kw", "expected"), MODEL_CASES, ids=[c[0] for c in MODEL_CASES])
def test_requests_checked_against_a_gpu_model(case: str, request_: GpuRequest, model: str, kw: dict,
                                              expected: tuple[Violation, ...]) -> None:
    assert check_gpu_model(request_, model, **kw) == expected


# --- workload objects ------------------------------------------------------------------------


def test_requests_jobset_gang_template_is_checked_as_a_gang_of_its_parallelism() -> None:
    checks = check_object(example("gang-nccl-test.yaml"))
    assert checks is not None and [(c.where, c.ok, c.request.gpus if c.request else 0) for c in checks] == [
        ("JobSet/gang-nccl-test spec.replicatedJobs[worker]", True, 1)]


def test_requests_jobset_min_member_must_equal_parallelism() -> None:
    obj = example("gang-nccl-test.yaml")
    obj["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] = 6
    assert check_object(obj) == (ObjectCheck(
        where="JobSet/gang-nccl-test spec.replicatedJobs[worker]",
        violations=(Violation("metadata.labels[aliyun.com/min-member]", "7",
                              "must equal the job's parallelism (6): the gang is all the job's pods (seed 4.2)"),)),)


def test_requests_mpijob_templates_are_found_per_replica_role() -> None:
    worker = pod(ctr(nvidia_gpu="1"))
    obj = {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": {"name": "m"},
           "spec": {"mpiReplicaSpecs": {"Launcher": {"replicas": 1, "template": pod(ctr())},
                                        "Worker": {"replicas": 4, "template": worker}}}}
    found = pod_templates(obj)
    assert found is not None and [t.where for t in found] == [
        "MPIJob/m spec.mpiReplicaSpecs[Launcher]", "MPIJob/m spec.mpiReplicaSpecs[Worker]"]


@pytest.mark.parametrize(("case", "obj", "wheres"), cases(
    ("a Deployment's pod template is checked",
     {"kind": "Deployment", "metadata": {"name": "d"}, "spec": {"template": pod(ctr())}}, ["Deployment/d"]),
    ("a List's items are checked", {"kind": "List", "items": [pod(ctr(), name="a"), pod(ctr(), name="b")]},
     ["Pod/a", "Pod/b"]),
    ("a Service holds no pods", {"kind": "Service", "metadata": {"name": "s"}}, None),
))
def test_requests_pod_templates_of_workload_kinds(case: str, obj: dict, wheres: list[str] | None) -> None:
    found = pod_templates(obj)
    assert (None if found is None else [t.where for t in found]) == wheres


# --- phalanx validate -----------------------------------------------------------------------


def test_validate_accepts_every_seed_example_with_one_ok_line_each(capsys: pytest.CaptureFixture[str]) -> None:
    files = sorted(str(p) for p in EXAMPLES.glob("*.yaml"))
    assert len(files) == 7
    assert main(["validate", *files]) == 0
    out = capsys.readouterr()
    lines = [line for line in out.out.splitlines() if not line.startswith("  ")]
    assert [line.split(": OK ")[1].split(":")[0] for line in lines] == [
        "JobSet/gang-nccl-test spec.replicatedJobs[worker]", "Pod/mig-demo", "Pod/multi-gpu-demo",
        "Pod/rdma-4gpu-demo", "Pod/tdm-demo", "Pod/topology-4gpu-demo", "Pod/whole-card-demo"]
    assert out.err == ""


def test_validate_multi_document_file_reports_the_invalid_pod_and_exits_1(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "pods.yaml"
    f.write_text(yaml.safe_dump_all([pod(ctr(nvidia_gpu="1"), name="good"),
                                     pod(ctr(aliyun_gpu__core="0"), name="bad"),
                                     {"kind": "Service", "metadata": {"name": "svc"}}]))
    assert main(["validate", str(f)]) == 1
    out = capsys.readouterr()
    assert out.out.splitlines() == [f"{f}#1: OK Pod/good: 1 whole GPU (nvidia.com/gpu)",
                                    f"{f}#3: SKIP Service: holds no pods"]
    assert out.err.splitlines() == [f"{f}#2: INVALID Pod/bad:",
                                    f"  - {lim('app', 'aliyun.com/gpu-core')} = '0': {HANG}"]


def test_validate_warns_about_the_scheduling_terms_phalanx_refuses_and_names_invalid_constraints(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "pods.yaml"
    spread = [{"maxSkew": 1, "topologyKey": "zone", "labelSelector": {}, "whenUnsatisfiable": "DoNotSchedule"}]
    anti = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "zone", "namespaceSelector": {"matchLabels": {"team": "a"}}}]}}
    f.write_text(yaml.safe_dump_all([
        pod(ctr(nvidia_gpu="1"), name="spread", topologySpreadConstraints=spread, affinity=anti),
        pod({**ctr(), "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": "lots"}}}, name="bad",
            tolerations=[{"key": "k", "operator": "Gt"}]),
    ]))
    assert main(["validate", str(f)]) == 1
    out = capsys.readouterr()
    assert out.out.splitlines() == [
        f"{f}#1: OK Pod/spread: 1 whole GPU (nvidia.com/gpu); required pod anti-affinity on zone, spread over zone "
        "(maxSkew 1)"]
    err = out.err.splitlines()
    assert err[0] == f"{f}#2: INVALID Pod/bad:" and len(err) == 3
    assert err[1].startswith("  - spec.containers[app].resources.requests[cpu] = 'lots': a Kubernetes quantity is")
    assert err[2] == ("  - spec.tolerations[0].operator = 'Gt': a toleration's operator is Equal or Exists (Phalanx "
                      "does not take the Lt/Gt comparison operators)")


def test_the_ok_line_says_what_the_pod_asks_of_a_node_besides_gpus() -> None:
    c = {**ctr(), "resources": {"limits": {"nvidia.com/gpu": "2", "memory": "64Gi"}, "requests": {"cpu": "8"}},
         "ports": [{"containerPort": 29500, "hostPort": 29500}]}
    got = parse_pod(pod(c, nodeSelector={"pool": "train"}, tolerations=[{"key": "dedicated", "operator": "Exists"}],
                        affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [{"matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}))
    assert got.describe() == ("2 whole GPUs (nvidia.com/gpu); cpu 8, memory 64Gi, host port 29500/TCP, "
                              "nodeSelector pool=train, required node affinity (1 term), 1 toleration")


def test_validate_checks_the_gpu_model_when_given(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--gpu-model", "Tesla V100-SXM2-16GB", str(EXAMPLES / "mig-demo.yaml")]) == 1
    assert "does not support MIG" in capsys.readouterr().err
    assert main(["validate", "--gpu-model", "NVIDIA A100-SXM4-40GB", str(EXAMPLES / "mig-demo.yaml")]) == 0


@pytest.mark.parametrize(("case", "content"), cases(
    ("a missing file", None),
    ("a YAML syntax error", "kind: Pod\n  spec: [\n"),
    ("a file without objects", "# nothing\n"),
))
def test_validate_exits_2_for_unreadable_input(case: str, content: str | None, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "in.yaml"
    if content is not None:
        f.write_text(content)
    assert main(["validate", str(f)]) == 2
    assert str(f) in capsys.readouterr().err


def test_validate_reads_stdin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO((EXAMPLES / "tdm-demo.yaml").read_text()))
    assert main(["validate", "-"]) == 0
    assert capsys.readouterr().out == "-#1: OK Pod/tdm-demo: TDM share 50% core, 4096 MiB on 1 GPU\n"


def _rj(name: str, replicas: int, parallelism: int, gpu: bool = True, scheduler: str = "phalanx") -> dict:
    limits = {"nvidia.com/gpu": "1"} if gpu else {}
    return {"name": name, "replicas": replicas, "template": {"spec": {"parallelism": parallelism, "template": {
        "metadata": {"labels": {"aliyun.com/min-member": str(parallelism)}},
        "spec": {"schedulerName": scheduler, "containers": [{"name": "c", "image": "x",
                                                              "resources": {"limits": limits}}]}}}}}


def _lws(*, replicas: int, size: int, leader: bool = True) -> dict:
    def template(gpus: str) -> dict:
        return {"spec": {"schedulerName": "phalanx", "containers": [
            {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}}
    lwt: dict = {"size": size, "workerTemplate": template("2")}
    if leader:
        lwt["leaderTemplate"] = template("1")
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"name": "vllm", "namespace": "serve"}, "spec": {"replicas": replicas, "leaderWorkerTemplate": lwt}}


def _mpijob(worker_labels: dict, launcher_scheduler: str = "default-scheduler") -> dict:
    def replica(n: int, limits: dict, scheduler: str, labels: dict) -> dict:
        return {"replicas": n, "template": {"metadata": {"labels": labels}, "spec": {
            "schedulerName": scheduler, "containers": [{"name": "c", "image": "x", "resources": {"limits": limits}}]}}}
    return {"kind": "MPIJob", "metadata": {"name": "m", "namespace": "ml"}, "spec": {"mpiReplicaSpecs": {
        "Launcher": replica(1, {}, launcher_scheduler, {}),
        "Worker": replica(4, {"nvidia.com/gpu": "1"}, "phalanx", worker_labels)}}}


@pytest.mark.parametrize(("case", "obj", "expected"), cases(
    ("a JobSet with a driver and two worker Jobs is one gang of all five pods",
     {"kind": "JobSet", "metadata": {"name": "dw", "namespace": "ml"},
      "spec": {"replicatedJobs": [_rj("driver", 1, 1), _rj("workers", 2, 2)]}},
     GangCheck(gang_id="ml/JobSet:dw", members=5, how="driver 1 x 1 + workers 2 x 2")),
    ("replicas 2 of a 7-pod Job make a gang of 14", {"kind": "JobSet", "metadata": {"name": "r"},
                                                     "spec": {"replicatedJobs": [_rj("w", 2, 7)]}},
     GangCheck(gang_id="default/JobSet:r", members=14, how="w 2 x 7")),
    ("a JobSet whose driver is left to another scheduler would wait for it forever",
     {"kind": "JobSet", "metadata": {"name": "x"},
      "spec": {"replicatedJobs": [_rj("driver", 1, 1, gpu=False, scheduler="default-scheduler"), _rj("w", 1, 2)]}},
     GangCheck(gang_id="default/JobSet:x", members=0, how="w 1 x 2; the gang is the pods present once none arrived "
               "for the settle time", violations=(Violation(
                   "JobSet/x spec.replicatedJobs[driver] spec.schedulerName", "default-scheduler",
                   "every replicated job of a JobSet gang is scheduled by Phalanx, or the gang waits for the Jobs it "
                   "never sees; or set phalanx.io/gang-min-member"),))),
    ("an MPIJob's gang is its workers", _mpijob({"aliyun.com/min-member": "4"}),
     GangCheck(gang_id="ml/MPIJob:m", members=4, how="min-member said by the pods")),
    ("an MPIJob whose min-member counts the launcher is refused: the launcher is no member",
     _mpijob({"aliyun.com/min-member": "5"}),
     GangCheck(gang_id="ml/MPIJob:m", members=5, how="min-member said by the pods", violations=(Violation(
         "metadata.labels[aliyun.com/min-member]", "5", "must equal the Worker replicas (4): the launcher asks for "
         "no GPU and is not a gang member"),))),
    ("a plain Job is one gang", {"kind": "Job", "metadata": {"name": "j"}, "spec": _rj("j", 1, 3)["template"]["spec"]},
     GangCheck(gang_id="default/Job:j", members=3, how="min-member said by the pods")),
    ("each LeaderWorkerSet group is a gang of its size", _lws(replicas=3, size=4),
     GangCheck(gang_id="serve/LeaderWorkerSet:vllm-0", members=4,
               how="each of 3 groups (leader and workers) is a gang; this is group 0")),
    ("an exclusive LeaderWorkerSet group waits for its leader only",
     {**_lws(replicas=2, size=4), "metadata": {"name": "vllm", "namespace": "serve", "annotations": {
         "leaderworkerset.sigs.k8s.io/exclusive-topology": "rack"}}},
     GangCheck(gang_id="serve/LeaderWorkerSet:vllm-0", members=1,
               how="each of 2 groups (leader and workers) is a gang; this is group 0; exclusive: its leader first, "
                   "the workers join once it is scheduled")),
    ("an exclusive JobSet through JobSet's webhook waits for its Jobs' leaders",
     {"kind": "JobSet", "metadata": {"name": "x", "annotations": {"alpha.jobset.sigs.k8s.io/exclusive-topology": "rack"}},
      "spec": {"replicatedJobs": [_rj("w", 2, 4)]}},
     GangCheck(gang_id="default/JobSet:x", members=2,
               how="w 2 x 1; exclusive through JobSet's webhook: each Job's leader, the followers join once it is "
                   "scheduled")),
))
def test_validate_names_the_gang_the_runtime_forms(case: str, obj: dict, expected: GangCheck) -> None:
    assert gang_check(obj) == expected


def test_a_leaderworkerset_has_its_leader_and_worker_templates_and_expands_to_the_controllers_pods() -> None:
    checks = check_object(_lws(replicas=2, size=3))
    assert checks is not None
    assert [(c.where, c.request.gpus if c.request else None) for c in checks] == [
        ("LeaderWorkerSet/vllm spec.leaderWorkerTemplate.leaderTemplate (leader)", 1),
        ("LeaderWorkerSet/vllm spec.leaderWorkerTemplate.workerTemplate", 2)]
    pods = expand_pods(_lws(replicas=2, size=3))
    assert [(p["metadata"]["name"], p["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/group-index"],
             p["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/worker-index"],
             p["metadata"]["annotations"]["leaderworkerset.sigs.k8s.io/size"]) for p in pods] == [
        ("vllm-0", "0", "0", "3"), ("vllm-1", "1", "0", "3"),
        ("vllm-0-1", "0", "1", "3"), ("vllm-0-2", "0", "2", "3"), ("vllm-1-1", "1", "1", "3"), ("vllm-1-2", "1", "2", "3")]
    without_leader_template = check_object(_lws(replicas=1, size=2, leader=False))
    assert without_leader_template is not None and [c.request.gpus for c in without_leader_template if c.request] == [2, 2]


def test_a_leaderworkerset_size_that_is_no_positive_integer_is_a_violation() -> None:
    obj = _lws(replicas=1, size=0)
    checks = check_object(obj)
    assert checks is not None
    assert [v.field for c in checks for v in c.violations] == ["spec.leaderWorkerTemplate.size"]


def test_validate_refuses_a_gpu_less_launcher_with_phalanx_s_scheduler_as_the_runtime_does() -> None:
    checks = check_object(_mpijob({"aliyun.com/min-member": "4"}, launcher_scheduler="phalanx"))
    assert checks is not None
    launcher = checks[0]
    assert (launcher.where, launcher.violations) == ("MPIJob/m spec.mpiReplicaSpecs[Launcher]", (Violation(
        "spec.containers[*].resources.limits", "no GPU resource", NO_GPU_RULE),))


@pytest.mark.parametrize(("case", "labels", "expected"), cases(
    ("a pod alone that says min-member is told it is a gang of one, as the runtime schedules it",
     {"aliyun.com/min-member": "4"},
     GangCheck(gang_id="default/p", members=1, how="no group label or annotation: a gang of one; its min-member "
               "is not used")),
    ("a pod of a pod group is that group's member", {"scheduling.x-k8s.io/pod-group": "g",
                                                     "scheduling.x-k8s.io/min-member": "3"},
     GangCheck(gang_id="default/PodGroup:g", members=3, how="min-member said by the pod")),
    ("a pod as the JobSet controller labels it counts its JobSet's jobs", {
        "jobset.sigs.k8s.io/jobset-name": "js", "jobset.sigs.k8s.io/replicatedjob-name": "w",
        "jobset.sigs.k8s.io/replicatedjob-replicas": "2", "jobset.sigs.k8s.io/global-replicas": "2",
        "aliyun.com/min-member": "7"},
     GangCheck(gang_id="default/JobSet:js", members=14, how="min-member said by the pod")),
    ("a pod alone that says nothing about gangs gets no gang line", {}, None),
))
def test_validate_says_the_gang_of_a_bare_pod_as_the_runtime_forms_it(case: str, labels: dict,
                                                                       expected: GangCheck | None) -> None:
    obj = {"kind": "Pod", "metadata": {"name": "p", "labels": labels},
           "spec": {"schedulerName": "phalanx", "containers": [{"name": "c", "image": "x",
                                                                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    assert gang_check(obj) == expected
