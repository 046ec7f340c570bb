"""One pod's ResourceClaims on one node (``phalanx_engine.dra.allocate``), upstream's structured
allocator semantics (Kubernetes 1.36) on NVIDIA-shaped slices: first-fit order, selectors, taints,
counters (MIG), consumable capacity, constraints, firstAvailable, All, admin access, claims
already allocated, the AllocationResult, and the refusals in kube-scheduler's words."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from dra_builders import (
    GPU_CLASS,
    MIG_CLASS,
    NIC,
    NIC_CLASS,
    NVIDIA,
    claim,
    counter_set,
    distinct,
    exact,
    first_available,
    gpu,
    gpu_pool,
    match,
    mig,
    nic,
    nic_pool,
    on,
    opaque,
    pool,
    request,
    slice_,
    term,
    with_config,
)

from phalanx_engine.dra import Allocation, Refusal, RefusalCode, Usage, allocate, gather
from phalanx_engine.dra.capacity import keeps_policy, quantity_text, take
from phalanx_engine.dra.pools import CapacityView, nanos
from phalanx_engine.dra.results import share_id
from phalanx_engine.status import Code, Reason, Status
from phalanx_proto.dra import (
    AllocatedConfig,
    AllocatedDevice,
    CapacityPolicy,
    CapacityRange,
    ClaimAllocated,
    ClaimAllocation,
    ClaimConfig,
    ClaimSpec,
    Device,
    DeviceClassRef,
    DeviceTaint,
    DeviceToleration,
    DraPool,
    InUse,
    NodeSelection,
    PodClaim,
)
from phalanx_proto.scheduling import NodeSelectorRequirement, NodeSelectorTerm


def cases(*rows: tuple) -> list:
    """Parametrize rows whose first item is the case sentence; the sentence is the test id."""
    return [pytest.param(*row, id=row[0]) for row in rows]


ON_N1 = (NodeSelectorTerm(match_fields=(NodeSelectorRequirement(key="metadata.name", operator="In", values=("n1",)),)),)
LABELS = {"zone": "a"}


def run(claims: Sequence[ClaimSpec | PodClaim], pools: Sequence[DraPool], *, held: Sequence[ClaimAllocated] = (),
        node: str = "n1") -> Allocation | Refusal:
    return allocate(claims, gather(pools, node, LABELS), Usage(pools, held))


def picked(result: Allocation | Refusal) -> dict | Refusal:
    """claim name -> [(request, device)], or the refusal itself."""
    if isinstance(result, Refusal):
        return result
    return {c.claim.split("/")[1]: [(d.request, d.device) for d in c.allocation.devices] for c in result.claims}


def no(detail: str, *, resolvable: bool, claim_: str = "ns/c", request_: str = "") -> Refusal:
    return Refusal(code=RefusalCode.CANNOT_ALLOCATE, message="cannot allocate all claims", detail=detail,
                   claim=claim_, request=request_, resolvable=resolvable)


def error(message: str, *, claim_: str = "ns/c", request_: str = "") -> Refusal:
    return Refusal(code=RefusalCode.ERROR, message=message, claim=claim_, request=request_, error=True)


MIG_POOL = gpu_pool("n1", 2, mig=True)
SHARED_NIC = pool(NIC, "n1", slice_("s", nic(0, shared=True, bandwidth="100G"), nodes=on("n1")))
BUSY = [InUse(device="gpu-0", claim="x/held/u0"), InUse(device="gpu-2", claim="x/held/u0")]
TOLERATE_ALL = DeviceToleration(operator="Exists")


def tainted(effect: str, key: str = "example.com/unhealthy", value: str = "") -> DraPool:
    return pool(NVIDIA, "n1", slice_("s", gpu(0, taints=[DeviceTaint(key=key, value=value, effect=effect)]), gpu(1),
                                     nodes=on("n1")))


# --- which devices ----------------------------------------------------------------------------------

@pytest.mark.parametrize("case,claims,pools,want", cases(
    ("two GPUs are the first two in upstream's order", [claim("c", request("gpu", count=2))], [gpu_pool("n1")],
     {"c": [("gpu", "gpu-0"), ("gpu", "gpu-1")]}),
    ("devices in use by any claim are skipped", [claim("c", request("gpu", count=2))],
     [gpu_pool("n1", in_use=["gpu-0", "gpu-2"])], {"c": [("gpu", "gpu-1"), ("gpu", "gpu-3")]}),
    ("a request selector narrows the class",
     [claim("c", request("gpu", selectors=["device.attributes['gpu.nvidia.com'].productName.contains('H100')"]))],
     [pool(NVIDIA, "n1", slice_("s", gpu(0), gpu(1, product="NVIDIA H100 80GB HBM3"), nodes=on("n1")))],
     {"c": [("gpu", "gpu-1")]}),
    ("a memory quantity in a selector",
     [claim("c", request("gpu", selectors=["device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) > 0"]))],
     [pool(NVIDIA, "n1", slice_("s", gpu(0, memory="40Gi"), gpu(1, memory="80Gi"), nodes=on("n1")))],
     {"c": [("gpu", "gpu-1")]}),
    ("the MIG class picks MIG devices, not GPUs", [claim("c", request("m", MIG_CLASS, count=2))], [MIG_POOL],
     {"c": [("m", "gpu-0-mig-1g10gb-0"), ("m", "gpu-0-mig-1g10gb-1")]}),
    ("a second claim gets what the first left", [claim("a", request("gpu", count=3)), claim("b", request("gpu", count=3))],
     [gpu_pool("n1", 6)], {"a": [("gpu", f"gpu-{i}") for i in range(3)], "b": [("gpu", f"gpu-{i}") for i in range(3, 6)]}),
    ("the extended-resource claim is allocated last",
     [claim("ext", request("gpu", count=1), extended=True), claim("c", request("gpu", selectors=[
         "device.attributes['gpu.nvidia.com'].uuid == 'GPU-00000000'"]))],
     [gpu_pool("n1", 2)], {"ext": [("gpu", "gpu-1")], "c": [("gpu", "gpu-0")]}),
    ("two requests of one claim take different devices", [claim("c", request("a"), request("b"))], [gpu_pool("n1", 2)],
     {"c": [("a", "gpu-0"), ("b", "gpu-1")]}),
))
def test_which_devices_a_claim_gets(case: str, claims: list, pools: list, want: dict) -> None:
    assert picked(run(claims, pools)) == want


# --- firstAvailable ---------------------------------------------------------------------------------

@pytest.mark.parametrize("case,claims,pools,want", cases(
    ("the first subrequest wins when it fits",
     [claim("c", first_available("gpu", exact(count=4, name="big"), exact(count=1, name="small")))],
     [gpu_pool("n1")], {"c": [("gpu/big", f"gpu-{i}") for i in range(4)]}),
    ("the next subrequest when the first does not fit",
     [claim("c", first_available("gpu", exact(count=4, name="big"), exact(count=2, name="small")))],
     [gpu_pool("n1", in_use=["gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4"])],
     {"c": [("gpu/small", "gpu-5"), ("gpu/small", "gpu-6")]}),
    ("a subrequest that fits alone but not with a later request gives way",
     [claim("c", first_available("gpu", exact(count=3, name="big"), exact(count=2, name="small")), request("more", count=2))],
     [gpu_pool("n1", 4)], {"c": [("gpu/small", "gpu-0"), ("gpu/small", "gpu-1"), ("more", "gpu-2"), ("more", "gpu-3")]}),
    ("a subrequest of another class",
     [claim("c", first_available("dev", exact(MIG_CLASS, name="mig", selectors=["false"]), exact(name="gpu")))],
     [MIG_POOL], {"c": [("dev/gpu", "gpu-0")]}),
    ("a subrequest asking more devices than a claim may hold gives way to the next",
     [claim("c", first_available("gpu", exact(mode="All", name="all"), exact(name="one")))],
     [gpu_pool("n1", 33)], {"c": [("gpu/one", "gpu-0")]}),
))
def test_first_available_subrequests_in_order(case: str, claims: list, pools: list, want: dict) -> None:
    assert picked(run(claims, pools)) == want


# --- All ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case,claims,pools,want", cases(
    ("All takes every matching device", [claim("c", request("gpu", mode="All"))], [gpu_pool("n1", 3)],
     {"c": [("gpu", "gpu-0"), ("gpu", "gpu-1"), ("gpu", "gpu-2")]}),
    ("All takes matching devices of every relevant pool",
     [claim("c", request("nic", NIC_CLASS, mode="All"))],
     [nic_pool("n1", 2), pool(NIC, "fabric", slice_("f", Device(name="vf-0"), nodes=NodeSelection(all_nodes=True)))],
     {"c": [("nic", "vf-0"), ("nic", "nic-0"), ("nic", "nic-1")]}),
    ("All cannot be met when one matching device is in use", [claim("c", request("gpu", mode="All"))],
     [gpu_pool("n1", 3, in_use=["gpu-1"])],
     no("claim ns/c, request gpu: 2 of 3 matching devices are free", resolvable=True, request_="gpu")),
    ("All cannot be met when a matching device has an untolerated taint", [claim("c", request("gpu", mode="All"))],
     [tainted("NoSchedule")],
     no("claim ns/c, request gpu: 1 of 2 matching devices have a taint the request does not tolerate",
        resolvable=False, request_="gpu")),
    ("All with a relevant pool being updated is an error",
     [claim("c", request("gpu", mode="All"))],
     [gpu_pool("n1", 2), pool(NIC, "n1", slice_("a", nic(0), nodes=on("n1"), count=2))],
     error("claim ns/c, request gpu: asks for all devices, but resource pool nic.example.com/n1 is currently being "
           "updated", request_="gpu")),
    ("All with an invalid pool is an error",
     [claim("c", first_available("gpu", exact(mode="All", name="every")))],
     [pool(NVIDIA, "n1", slice_("a", gpu(0), gpu(0), nodes=on("n1")))],
     error("claim ns/c, request every: asks for all devices, but resource pool gpu.nvidia.com/n1 is currently "
           "invalid", request_="gpu/every")),
    ("All with no matching device cannot be met", [claim("c", request("gpu", mode="All"))], [nic_pool("n1", 1)],
     no("claim ns/c, request gpu: no device of class gpu.nvidia.com matches", resolvable=False, request_="gpu")),
))
def test_all_devices(case: str, claims: list, pools: list, want: dict | Refusal) -> None:
    assert picked(run(claims, pools)) == want


# --- taints -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("case,effect,tolerations,want", cases(
    ("NoSchedule keeps the device from a claim that does not tolerate it", "NoSchedule", [], "gpu-1"),
    ("NoExecute keeps it too", "NoExecute", [], "gpu-1"),
    ("None only informs", "None", [], "gpu-0"),
    ("Exists with an empty key tolerates everything", "NoSchedule", [TOLERATE_ALL], "gpu-0"),
    ("a toleration of the key with Exists", "NoExecute",
     [DeviceToleration(key="example.com/unhealthy", operator="Exists")], "gpu-0"),
    ("Equal needs the same value", "NoSchedule",
     [DeviceToleration(key="example.com/unhealthy", operator="Equal", value="other")], "gpu-1"),
    ("a toleration of another effect does not tolerate", "NoExecute",
     [DeviceToleration(key="example.com/unhealthy", operator="Exists", effect="NoSchedule")], "gpu-1"),
))
def test_device_taints_and_request_tolerations(case: str, effect: str, tolerations: list, want: str) -> None:
    got = run([claim("c", request("gpu", tolerations=tolerations))], [tainted(effect)])
    assert picked(got) == {"c": [("gpu", want)]}


def test_a_tolerated_taint_copies_the_tolerations_into_the_result() -> None:
    got = run([claim("c", request("gpu", count=2, tolerations=[TOLERATE_ALL]))], [tainted("NoSchedule")])
    assert isinstance(got, Allocation)
    assert [d.tolerations for d in got.claims[0].allocation.devices] == [(TOLERATE_ALL,), (TOLERATE_ALL,)]


# --- counters (partitionable GPUs) --------------------------------------------------------------------

def mig_claim(profile: str, count: int = 1, name: str = "c") -> ClaimSpec:
    return claim(name, request("m", MIG_CLASS, count=count,
                               selectors=[f"device.attributes['gpu.nvidia.com'].profile == '{profile}'"]))


@pytest.mark.parametrize("case,claims,in_use,want", cases(
    ("a full GPU uses its whole counter set, so its MIG devices are gone", [mig_claim("1g.10gb")], ["gpu-0"],
     {"c": [("m", "gpu-1-mig-1g10gb-0")]}),
    ("a MIG device in use keeps the full GPU from being allocated", [claim("c", request("gpu"))],
     ["gpu-0-mig-1g10gb-3"], {"c": [("gpu", "gpu-1")]}),
    ("MIG devices never share a memory slice", [mig_claim("3g.40gb", 2)], [],
     {"c": [("m", "gpu-0-mig-3g40gb-0"), ("m", "gpu-0-mig-3g40gb-4")]}),
    ("a 7g MIG device takes every slice, the next goes to the other GPU", [mig_claim("7g.80gb", 2)], [],
     {"c": [("m", "gpu-0-mig-7g80gb-0"), ("m", "gpu-1-mig-7g80gb-0")]}),
    ("multiprocessors run out before memory slices", [mig_claim("4g.40gb"), mig_claim("4g.40gb", name="d")], [],
     {"c": [("m", "gpu-0-mig-4g40gb-0")], "d": [("m", "gpu-1-mig-4g40gb-0")]}),
    ("in-use MIG devices' slices are not handed out again", [mig_claim("1g.10gb", 2)],
     ["gpu-0-mig-1g10gb-0", "gpu-0-mig-1g20gb-2"], {"c": [("m", "gpu-0-mig-1g10gb-1"), ("m", "gpu-0-mig-1g10gb-4")]}),
))
def test_counters_are_never_over_committed(case: str, claims: list, in_use: list, want: dict) -> None:
    pools = [msgspec_replace_in_use(MIG_POOL, in_use)]
    assert picked(run(claims, pools)) == want


def msgspec_replace_in_use(p: DraPool, devices: list[str]) -> DraPool:
    return pool(p.driver, p.pool, *p.slices, in_use=[InUse(device=d, claim="x/held/u0") for d in devices])


def test_counters_of_a_device_in_a_slice_for_another_node_count_too() -> None:
    shared = pool(NVIDIA, "rack", slice_("c", counters=[counter_set(0)], nodes=NodeSelection(all_nodes=True), count=3),
                  slice_("n1", mig(0, "7g.80gb", 0), nodes=on("n1"), count=3),
                  slice_("n2", mig(0, "1g.10gb", 0), nodes=on("n2"), count=3),
                  in_use=[InUse(device="gpu-0-mig-1g10gb-0", claim="x/held/u0")])
    assert picked(run([mig_claim("7g.80gb")], [shared])) == no(
        "claim ns/c, request m: 0 of 1 matching devices are free", resolvable=True, request_="m")


# --- consumable capacity ------------------------------------------------------------------------------

def nic_claim(name: str, bandwidth: str | None, request_name: str = "nic") -> ClaimSpec:
    return claim(name, request(request_name, NIC_CLASS, capacity={"bandwidth": bandwidth} if bandwidth else None))


@pytest.mark.parametrize("case,claims,held,want", cases(
    ("two shares of one shared NIC", [nic_claim("a", "40G"), nic_claim("b", "40G")], [],
     {"a": ("nic-0", {"bandwidth": "40G"}), "b": ("nic-0", {"bandwidth": "40G"})}),
    ("no request takes the policy's default", [nic_claim("a", None)], [], {"a": ("nic-0", {"bandwidth": "10G"})}),
    ("a request is rounded up to the step", [nic_claim("a", "1500M")], [], {"a": ("nic-0", {"bandwidth": "2G"})}),
    ("a request below the minimum takes the minimum", [nic_claim("a", "1M")], [], {"a": ("nic-0", {"bandwidth": "1G"})}),
    ("a request of exactly the value keeps its text", [nic_claim("a", "0.1T")], [],
     {"a": ("nic-0", {"bandwidth": "0.1T"})}),
))
def test_consumable_capacity(case: str, claims: list, held: list, want: dict) -> None:
    got = run(claims, [SHARED_NIC], held=held)
    assert isinstance(got, Allocation)
    assert {c.claim.split("/")[1]: (c.allocation.devices[0].device, c.allocation.devices[0].consumed_capacity)
            for c in got.claims} == want


def test_a_shared_device_that_would_overflow_is_refused() -> None:
    held = [ClaimAllocated(claim="x/y/z", allocation=ClaimAllocation(devices=(AllocatedDevice(
        request="nic", driver=NIC, pool="n1", device="nic-0", share_id="s0", consumed_capacity={"bandwidth": "70G"}),)))]
    assert run([nic_claim("a", "40G")], [SHARED_NIC], held=held) == no(
        "claim ns/a, request nic: 0 of 1 matching devices are free", resolvable=True, claim_="ns/a", request_="nic")


def test_two_requests_of_one_claim_can_share_one_device_with_their_own_share_ids() -> None:
    c = claim("a", request("x", NIC_CLASS, capacity={"bandwidth": "30G"}), request("y", NIC_CLASS, capacity={"bandwidth": "30G"}))
    got = run([c], [SHARED_NIC])
    assert isinstance(got, Allocation)
    d = gather([SHARED_NIC], "n1").candidates[0]
    assert [(r.request, r.device, r.share_id) for r in got.claims[0].allocation.devices] == [
        ("x", "nic-0", share_id(c, "x", d)), ("y", "nic-0", share_id(c, "y", d))]
    assert share_id(c, "x", d) != share_id(c, "y", d)
    assert share_id(c, "x", d) == run([c], [SHARED_NIC]).claims[0].allocation.devices[0].share_id  # type: ignore[union-attr]


def test_a_request_for_a_capacity_the_device_lacks_skips_it() -> None:
    got = run([claim("c", request("gpu", capacity={"bandwidth": "1"}))], [gpu_pool("n1", 1)])
    assert got == no("claim ns/c, request gpu: 1 of 1 matching devices cannot give the capacity asked",
                     resolvable=False, request_="gpu")


def test_an_exclusive_device_fits_a_capacity_request_up_to_its_value() -> None:
    pools = [pool(NVIDIA, "n1", slice_("s", gpu(0, memory="40Gi"), gpu(1, memory="80Gi"), nodes=on("n1")))]
    got = run([claim("c", request("gpu", capacity={"memory": "60Gi"}))], pools)
    assert isinstance(got, Allocation)
    assert got.claims[0].allocation.devices == (AllocatedDevice(request="gpu", driver=NVIDIA, pool="n1", device="gpu-1"),)


def view(value: str, default: str = "", values: tuple[str, ...] = (), rng: tuple[str, str, str] | None = None):
    policy = CapacityPolicy(default=default, valid_values=values,
                            valid_range=CapacityRange(min=rng[0], max=rng[1], step=rng[2]) if rng else None)
    return CapacityView(nanos(value), policy if default or values or rng else None)


@pytest.mark.parametrize("case,cap,asked,takes,keeps", cases(
    ("no policy: what is asked", view("10"), "3", "3", True),
    ("no policy, nothing asked: all of it", view("10"), None, "10", True),
    ("nothing asked: the default", view("10", default="2", rng=("1", "", "1")), None, "2", True),
    ("below the range: its minimum", view("10", rng=("2", "", "2")), "1", "2", True),
    ("in the range: up to the next step", view("10", rng=("2", "", "3")), "6", "8", True),
    ("above the range's maximum: breaks the policy", view("10", rng=("2", "6", "1")), "7", "7", False),
    ("valid values: the next one up", view("10", values=("2", "4", "8")), "3", "4", True),
    ("beyond the valid values: breaks the policy", view("10", values=("2", "4")), "5", "5", False),
    ("the default keeps the policy even off the valid values", view("10", default="3", values=("2", "4")), None, "3",
     True),
))
def test_what_a_request_takes_of_a_capacity(case: str, cap, asked: str | None, takes: str, keeps: bool) -> None:
    amount = take(cap, None if asked is None else nanos(asked))
    assert (amount, keeps_policy(cap, amount)) == (nanos(takes), keeps)


@pytest.mark.parametrize("case,text,want", cases(
    ("binary when shorter", "2Gi", "2Gi"),
    ("decimal when shorter", "40G", "40G"),
    ("plain when neither divides", "1001", "1001"),
    ("milli", "1500m", "1500m"),
    ("nano", "1n", "1n"),
    ("zero", "0", "0"),
))
def test_a_capacity_taken_is_written_as_a_quantity(case: str, text: str, want: str) -> None:
    assert quantity_text(nanos(text)) == want


# --- constraints ----------------------------------------------------------------------------------------

ROOT = "resource.kubernetes.io/pcieRoot"


@pytest.mark.parametrize("case,claims,pools,want", cases(
    ("matchAttribute puts the NIC on the GPU's PCIe root",
     [claim("c", request("gpu"), request("nic", NIC_CLASS), constraints=[match(ROOT, "gpu", "nic")])],
     [gpu_pool("n1", in_use=["gpu-0"]), nic_pool("n1", 4, roots=["pci0000:80", "pci0000:00", "pci0000:00", "pci0000:40"])],
     {"c": [("gpu", "gpu-1"), ("nic", "nic-1")]}),
    ("matchAttribute backs out of a GPU without a NIC on its root",
     [claim("c", request("gpu"), request("nic", NIC_CLASS), constraints=[match(ROOT)])],
     [gpu_pool("n1"), nic_pool("n1", 1, roots=["pci0000:c0"])], {"c": [("gpu", "gpu-6"), ("nic", "nic-0")]}),
    ("distinctAttribute spreads GPUs over roots",
     [claim("c", request("gpu", count=3), constraints=[distinct(ROOT)])], [gpu_pool("n1")],
     {"c": [("gpu", "gpu-0"), ("gpu", "gpu-2"), ("gpu", "gpu-4")]}),
    ("a fully qualified name finds the driver's unqualified attribute",
     [claim("c", request("gpu", count=2), constraints=[match("gpu.nvidia.com/productName")])],
     [pool(NVIDIA, "n1", slice_("s", gpu(0, product="A"), gpu(1, product="B"), gpu(2, product="A"), nodes=on("n1")))],
     {"c": [("gpu", "gpu-0"), ("gpu", "gpu-2")]}),
    ("a device without the attribute cannot be in scope",
     [claim("c", request("any", DeviceClassRef(name="any"), count=2), constraints=[match("gpu.nvidia.com/productName")])],
     [gpu_pool("n1", 2), nic_pool("n1", 2)], {"c": [("any", "gpu-0"), ("any", "gpu-1")]}),
    ("a constraint naming one request leaves the others free",
     [claim("c", request("a"), request("b"), request("n", NIC_CLASS), constraints=[match(ROOT, "a", "n")])],
     [gpu_pool("n1", 4), nic_pool("n1", 1, roots=["pci0000:40"])],
     {"c": [("a", "gpu-2"), ("b", "gpu-0"), ("n", "nic-0")]}),
    ("a constraint naming a subrequest covers it",
     [claim("c", first_available("g", exact(name="one")), request("n", NIC_CLASS), constraints=[match(ROOT, "g/one", "n")])],
     [gpu_pool("n1", 4), nic_pool("n1", 1, roots=["pci0000:40"])], {"c": [("g/one", "gpu-2"), ("n", "nic-0")]}),
    ("a version attribute matches as written",
     [claim("c", request("gpu", count=2), constraints=[match("gpu.nvidia.com/driverVersion")])], [gpu_pool("n1", 2)],
     {"c": [("gpu", "gpu-0"), ("gpu", "gpu-1")]}),
))
def test_constraints(case: str, claims: list, pools: list, want: dict) -> None:
    assert picked(run(claims, pools)) == want


def test_distinct_values_are_pairwise_distinct_within_one_request() -> None:
    # Four roots with two GPUs each: four distinct roots exist, a fifth does not.
    assert isinstance(run([claim("c", request("gpu", count=4), constraints=[distinct(ROOT)])], [gpu_pool("n1")]), Allocation)
    got = run([claim("c", request("gpu", count=5), constraints=[distinct(ROOT)])], [gpu_pool("n1")])
    assert got == no("claim ns/c: its requests do not fit on the node's free devices together under its constraints",
                     resolvable=False)


def test_an_all_request_a_constraint_refuses_is_upstreams_error_when_nothing_fits() -> None:
    got = run([claim("c", request("gpu"), request("nic", NIC_CLASS, mode="All"), constraints=[match(ROOT)])],
              [gpu_pool("n1", 2), nic_pool("n1", 2, roots=["pci0000:00", "pci0000:40"])])
    assert got == error("claim ns/c, request nic: cannot add device nic.example.com/n1/nic-1 because a claim "
                        "constraint would not be satisfied", request_="nic")


def test_an_all_request_finds_the_one_choice_a_constraint_allows() -> None:
    got = run([claim("c", request("gpu"), request("nic", NIC_CLASS, mode="All"), constraints=[match(ROOT)])],
              [gpu_pool("n1", 4), nic_pool("n1", 1, roots=["pci0000:40"])])
    assert picked(got) == {"c": [("gpu", "gpu-2"), ("nic", "nic-0")]}


# --- limits, admin access, errors ---------------------------------------------------------------------------

def test_a_claim_asking_more_than_32_devices_is_an_error() -> None:
    got = run([claim("c", request("a", count=20), request("b", count=20))], [gpu_pool("n1", 40)])
    assert got == error("claim ns/c: number of requested devices 40 exceeds the claim limit of 32")


def test_a_search_that_runs_too_long_stops_with_upstreams_timeout_error() -> None:
    pools = [gpu_pool("n1")]
    c = [claim("c", request("gpu", count=4)), claim("d", request("gpu", count=5))]  # 9 of 8: every way is tried
    assert isinstance(allocate(c[:1], gather(pools, "n1"), Usage(pools), max_steps=4), Allocation)
    got = allocate(c, gather(pools, "n1"), Usage(pools), max_steps=100)
    assert got == Refusal(code=RefusalCode.ERROR, message="node n1: timed out trying to allocate devices", error=True)


def test_admin_access_takes_a_device_in_use_and_says_so() -> None:
    got = run([claim("c", request("gpu", admin=True))], [gpu_pool("n1", 1, in_use=["gpu-0"])])
    assert isinstance(got, Allocation)
    assert got.claims[0].allocation.devices == (
        AllocatedDevice(request="gpu", driver=NVIDIA, pool="n1", device="gpu-0", admin_access=True),)


def test_a_device_an_admin_request_picked_is_taken_for_the_pods_other_claims() -> None:
    got = run([claim("a", request("gpu", admin=True)), claim("b", request("gpu"))], [gpu_pool("n1", 2)])
    assert picked(got) == {"a": [("gpu", "gpu-0")], "b": [("gpu", "gpu-1")]}


def test_admin_requests_of_one_claim_do_not_pick_one_device_twice() -> None:
    got = run([claim("c", request("a", admin=True), request("b", admin=True))], [gpu_pool("n1", 1, in_use=["gpu-0"])])
    assert got == no("claim ns/c: its requests do not fit on the node's free devices together", resolvable=True)


@pytest.mark.parametrize("case,cls,selectors,want", cases(
    ("a class selector that fails at run time", DeviceClassRef(name="bad", selectors=(
        "device.attributes['gpu.nvidia.com'].bogus == 1",)), [],
     error("class bad: selector #0: CEL runtime error: no such key: bogus", request_="gpu")),
    ("a request selector that fails at run time", GPU_CLASS, ["true", "device.attributes['x.com'].y > 1"],
     error("claim ns/c: selector #1: CEL runtime error: no such key: y", request_="gpu")),
    ("a class selector that is not a bool", DeviceClassRef(name="bad", selectors=("true", "1")), [],
     error("class bad: selector #1: CEL compile error: must evaluate to bool or the unknown type, not int",
           request_="gpu")),
))
def test_a_selector_error_is_an_error_for_the_pod(case: str, cls: DeviceClassRef, selectors: list,
                                                  want: Refusal) -> None:
    assert run([claim("c", request("gpu", cls, selectors=selectors))], [gpu_pool("n1", 2)]) == want


def test_an_error_is_not_resolvable_as_a_status() -> None:
    refusal = error("class bad: selector #0: CEL runtime error: no such key: bogus")
    assert refusal.status() == Status("DynamicResources", (Reason(Code.DRA_ERROR, refusal.message),), False)


def test_a_missing_device_class_names_the_request() -> None:
    gone = DeviceClassRef(name="gone.example.com", missing=True)
    got = run([claim("c", first_available("gpu", exact(name="fast"), exact(gone, name="slow")))], [gpu_pool("n1")])
    assert got == Refusal(code=RefusalCode.CLASS_MISSING, message="request gpu/slow: device class gone.example.com does "
                          "not exist", claim="ns/c", request="gpu/slow")


# --- refusals ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case,claims,pools,want", cases(
    ("too few free devices, waiting can help", [claim("c", request("gpu", count=8))], [gpu_pool("n1", in_use=["gpu-3", "gpu-5"])],
     no("claim ns/c, request gpu: 6 of 8 matching devices are free", resolvable=True, request_="gpu")),
    ("no device of the class", [claim("c", request("m", MIG_CLASS))], [gpu_pool("n1")],
     no("claim ns/c, request m: no device of class mig.nvidia.com matches", resolvable=False, request_="m")),
    ("no device the request's selectors accept", [claim("c", request("gpu", selectors=["false"]))], [gpu_pool("n1")],
     no("claim ns/c, request gpu: no device of class gpu.nvidia.com matches the request's selectors", resolvable=False,
        request_="gpu")),
    ("claims that each fit alone but not together", [claim("a", request("gpu", count=5)), claim("b", request("gpu", count=5))],
     [gpu_pool("n1")], Refusal(code=RefusalCode.CANNOT_ALLOCATE, message="cannot allocate all claims",
                               detail="claims ns/a, ns/b do not fit on the node's free devices together")),
    ("an invalid pool on the node and no solution",
     [claim("c", request("gpu", count=2))],
     [gpu_pool("n1", 1), pool(NVIDIA, "n1-extra", slice_("x", gpu(0), gpu(0), nodes=on("n1")))],
     Refusal(code=RefusalCode.INVALID_POOLS, message="invalid resource pools were encountered",
             detail="pool gpu.nvidia.com/n1-extra: duplicate device name gpu-0")),
))
def test_refusals_in_kube_schedulers_words(case: str, claims: list, pools: list, want: Refusal) -> None:
    assert run(claims, pools) == want


def test_an_invalid_pool_does_not_stop_other_pools_from_serving() -> None:
    got = run([claim("c", request("gpu"))],
              [gpu_pool("n1", 1), pool(NVIDIA, "n1-extra", slice_("x", gpu(0), gpu(0), nodes=on("n1")))])
    assert picked(got) == {"c": [("gpu", "gpu-0")]}


def test_an_incomplete_pool_gives_nothing() -> None:
    got = run([claim("c", request("gpu"))], [pool(NVIDIA, "n1", slice_("a", gpu(0), nodes=on("n1"), count=2))])
    assert got == no("claim ns/c, request gpu: no device of class gpu.nvidia.com matches", resolvable=False,
                     request_="gpu")


# --- claims already allocated ----------------------------------------------------------------------------

def allocated(node_selector) -> ClaimSpec:
    return claim("shared", request("gpu"), allocation=ClaimAllocation(devices=(AllocatedDevice(
        request="gpu", driver=NVIDIA, pool="n1", device="gpu-3"),), node_selector=node_selector))


@pytest.mark.parametrize("case,node_selector,node,want", cases(
    ("an allocated claim for this node is used as it is", ON_N1, "n1", True),
    ("an allocated claim for every node is used as it is", None, "n2", True),
    ("an allocated claim for a zone of this node", (term(zone="a"),), "n2", True),
    ("an allocated claim for another node keeps the pod away", ON_N1, "n2", False),
))
def test_a_claim_already_allocated(case: str, node_selector, node: str, want: bool) -> None:
    c = allocated(node_selector)
    got = run([PodClaim(name="shared-gpu", claim=c)], [gpu_pool(node)], node=node)
    if want:
        assert got == Allocation(node=node, claims=(ClaimAllocated(claim=c.key, pod_claim="shared-gpu",
                                                                   allocation=c.allocation, allocated=False),))
    else:
        assert got == Refusal(code=RefusalCode.NOT_ON_NODE, message="resourceclaim not available on the node",
                              detail="claim ns/shared is allocated for other nodes", claim="ns/shared")


# --- the AllocationResult -----------------------------------------------------------------------------------

def test_the_whole_allocation_result() -> None:
    gpu_cls = with_config(GPU_CLASS, opaque(NVIDIA, sharing="TimeSlicing"))
    nic_cls = with_config(NIC_CLASS, opaque(NIC, mtu=9000), opaque(NIC, mode="rdma"))
    c = claim("c", first_available("gpu", exact(gpu_cls, count=3, name="three"), exact(gpu_cls, count=1, name="one")),
              request("nic", nic_cls), request("more", gpu_cls),
              constraints=[match(ROOT, "gpu", "nic")],
              config=[ClaimConfig(opaque=opaque(NVIDIA, everything=True)),
                      ClaimConfig(requests=("gpu/three",), opaque=opaque(NVIDIA, unchosen=True)),
                      ClaimConfig(requests=("gpu/one", "nic"), opaque=opaque(NIC, chosen=True))])
    got = run([PodClaim(name="devices", claim=c)], [gpu_pool("n1", 4), nic_pool("n1", 1, roots=["pci0000:40"])])
    assert got == Allocation(node="n1", claims=(ClaimAllocated(claim="ns/c/uid-c", pod_claim="devices", allocation=ClaimAllocation(
        devices=(AllocatedDevice(request="gpu/one", driver=NVIDIA, pool="n1", device="gpu-2"),
                 AllocatedDevice(request="nic", driver=NIC, pool="n1", device="nic-0"),
                 AllocatedDevice(request="more", driver=NVIDIA, pool="n1", device="gpu-0")),
        config=(AllocatedConfig(source="FromClass", requests=("gpu/one", "more"), opaque=opaque(NVIDIA, sharing="TimeSlicing")),
                AllocatedConfig(source="FromClass", requests=("nic",), opaque=opaque(NIC, mtu=9000)),
                AllocatedConfig(source="FromClass", requests=("nic",), opaque=opaque(NIC, mode="rdma")),
                AllocatedConfig(source="FromClaim", opaque=opaque(NVIDIA, everything=True)),
                AllocatedConfig(source="FromClaim", requests=("gpu/one", "nic"), opaque=opaque(NIC, chosen=True))),
        node_selector=ON_N1)),))


@pytest.mark.parametrize("case,pools,want", cases(
    ("devices on every node leave the claim usable everywhere",
     [pool(NIC, "fabric", slice_("s", nic(0), nic(1), nodes=NodeSelection(all_nodes=True)))], None),
    ("devices behind node selectors merge their terms, each requirement once",
     [pool(NIC, "zone", slice_("s", nic(0), nic(1), nodes=NodeSelection(node_selector=term(zone="a"))))],
     (term(zone="a"),)),
    ("a device bound to its node ties the claim to it",
     [pool(NIC, "fabric", slice_("s", Device(name="nic-0", binds_to_node=True), nic(1),
                                 nodes=NodeSelection(all_nodes=True)))], ON_N1),
    ("a device with its own node name ties the claim to it",
     [pool(NIC, "pd", slice_("s", Device(name="nic-0", nodes=on("n1")), Device(name="nic-1", nodes=on("n1")),
                             per_device=True))], ON_N1),
))
def test_the_node_selector_of_a_result(case: str, pools: list, want) -> None:
    got = run([claim("c", request("nic", DeviceClassRef(name="any"), count=2))], pools)
    assert isinstance(got, Allocation)
    assert got.claims[0].allocation.node_selector == want


def test_binding_conditions_travel_with_the_device() -> None:
    dpu = Device(name="dpu-0", binding_conditions=("example.com/attached",),
                 binding_failure_conditions=("example.com/failed",))
    got = run([claim("c", request("d", DeviceClassRef(name="any")))], [pool(NIC, "n1", slice_("s", dpu, nodes=on("n1")))])
    assert isinstance(got, Allocation)
    assert got.claims[0].allocation.devices == (AllocatedDevice(
        request="d", driver=NIC, pool="n1", device="dpu-0", binding_conditions=("example.com/attached",),
        binding_failure_conditions=("example.com/failed",)),)


# --- a gang, member after member -------------------------------------------------------------------------------

def test_each_member_sees_the_devices_the_previous_ones_got() -> None:
    pools = [gpu_pool("n1")]
    devices, trial = gather(pools, "n1"), Usage(pools).copy()
    got = []
    for m in range(3):
        result = allocate([claim(f"m{m}", request("gpu", count=3))], devices, trial)
        got.append(picked(result))
        if isinstance(result, Allocation):
            trial.add_allocated(result.claims)
    assert got == [{"m0": [("gpu", "gpu-0"), ("gpu", "gpu-1"), ("gpu", "gpu-2")]},
                   {"m1": [("gpu", "gpu-3"), ("gpu", "gpu-4"), ("gpu", "gpu-5")]},
                   no("claim ns/m2, request gpu: 2 of 8 matching devices are free", resolvable=True, claim_="ns/m2",
                      request_="gpu")]


def test_allocating_changes_neither_usage_nor_the_answer_when_repeated() -> None:
    pools = [MIG_POOL, SHARED_NIC]
    devices, usage = gather(pools, "n1"), Usage(pools)
    claims = [mig_claim("2g.20gb", 2), nic_claim("n", "5G")]
    first = allocate(claims, devices, usage)
    assert allocate(claims, devices, usage) == first
    assert isinstance(first, Allocation)
