"""What DRA devices are taken (``phalanx_engine.dra.usage.Usage``): from every pool's claims in use
and from the allocations Phalanx holds, each (claim, device, share) once, admin access never."""

from __future__ import annotations

from dra_builders import NIC, NVIDIA, counter_set, gpu, mig, nic, on, pool, slice_

from phalanx_engine.dra.usage import Usage
from phalanx_proto.dra import AllocatedDevice, ClaimAllocated, ClaimAllocation, InUse

G = 10**9  # nanos per unit (and units per G)
MIG_POOL = pool(NVIDIA, "n1", slice_("c", counters=[counter_set(0)], nodes=on("n1"), count=2),
                slice_("d", gpu(0, counters=True), mig(0, "1g.10gb", 0), mig(0, "1g.10gb", 1), nodes=on("n1"),
                       count=2))
SHARED_NIC = pool(NIC, "n1", slice_("s", nic(0, shared=True, bandwidth="100G"), nic(1), nodes=on("n1")))


def held(claim: str, *devices: AllocatedDevice) -> ClaimAllocated:
    return ClaimAllocated(claim=claim, allocation=ClaimAllocation(devices=devices))


def dev(device: str, *, driver: str = NVIDIA, share: str = "", consumed: dict | None = None,
        admin: bool = False) -> AllocatedDevice:
    return AllocatedDevice(request="r", driver=driver, pool="n1", device=device, share_id=share,
                           consumed_capacity=consumed or {}, admin_access=admin)


def state(u: Usage) -> dict:
    keys = [(NVIDIA, "n1", n) for n in ("gpu-0", "gpu-0-mig-1g10gb-0", "gpu-0-mig-1g10gb-1")] + \
           [(NIC, "n1", n) for n in ("nic-0", "nic-1")]
    return {"exclusive": [k[2] for k in keys if u.exclusive(k)],
            "allocated": [k[2] for k in keys if u.allocated(k)],
            "shared": {k[2]: dict(s) for k in keys if (s := u.shared(k)) is not None},
            "counters": {ck: v for ck, v in u.counters(NVIDIA, "n1").items() if v}}


def test_nothing_in_use_is_nothing_taken() -> None:
    assert state(Usage([MIG_POOL, SHARED_NIC])) == {"exclusive": [], "allocated": [], "shared": {}, "counters": {}}


def test_a_mig_device_in_use_takes_itself_and_its_counters() -> None:
    p = pool(NVIDIA, "n1", *MIG_POOL.slices, in_use=[InUse(device="gpu-0-mig-1g10gb-1", claim="a/b/c")])
    assert state(Usage([p])) == {
        "exclusive": ["gpu-0-mig-1g10gb-1"], "allocated": ["gpu-0-mig-1g10gb-1"], "shared": {},
        "counters": {("gpu-0-counter-set", "memory"): 10 * 2**30 * G, ("gpu-0-counter-set", "multiprocessors"): 14 * G,
                     ("gpu-0-counter-set", "memory-slice-1"): G}}


def test_a_claim_in_the_api_and_in_the_ledger_counts_once() -> None:
    p = pool(NVIDIA, "n1", *MIG_POOL.slices, in_use=[InUse(device="gpu-0-mig-1g10gb-0", claim="a/b/c")])
    u = Usage([p], [held("a/b/c", dev("gpu-0-mig-1g10gb-0"))])
    assert u.counters(NVIDIA, "n1")[("gpu-0-counter-set", "multiprocessors")] == 14 * G


def test_shares_of_a_shared_device_add_up_and_do_not_make_it_exclusive() -> None:
    p = pool(NIC, "n1", *SHARED_NIC.slices, in_use=[
        InUse(device="nic-0", claim="a/b/c", share_id="s1", consumed={"bandwidth": "10G"}),
        InUse(device="nic-0", claim="a/d/e", share_id="s2", consumed={"bandwidth": "25G"})])
    assert state(Usage([p])) == {"exclusive": [], "allocated": ["nic-0"], "shared": {"nic-0": {"bandwidth": 35 * G * G}},
                                 "counters": {}}


def test_the_same_share_reported_twice_counts_once() -> None:
    u = Usage([SHARED_NIC], [held("a/b/c", dev("nic-0", driver=NIC, share="s1", consumed={"bandwidth": "10G"}))])
    u.add("a/b/c", ClaimAllocation(devices=(dev("nic-0", driver=NIC, share="s1", consumed={"bandwidth": "10G"}),)))
    assert dict(u.shared((NIC, "n1", "nic-0")) or {}) == {"bandwidth": 10 * G * G}


def test_admin_access_takes_nothing() -> None:
    u = Usage([MIG_POOL], [held("a/b/c", dev("gpu-0", admin=True))])
    assert state(u) == {"exclusive": [], "allocated": [], "shared": {}, "counters": {}}


def test_a_device_held_by_two_claims_counts_its_counters_once() -> None:
    u = Usage([MIG_POOL], [held("a/b/c", dev("gpu-0-mig-1g10gb-0")), held("a/d/e", dev("gpu-0-mig-1g10gb-0"))])
    assert u.counters(NVIDIA, "n1")[("gpu-0-counter-set", "memory-slice-0")] == G


def test_a_copy_is_independent() -> None:
    u = Usage([MIG_POOL, SHARED_NIC])
    trial = u.copy()
    trial.add("a/b/c", ClaimAllocation(devices=(dev("gpu-0"), dev("nic-0", driver=NIC, share="s", consumed={"bandwidth": "1G"}))))
    assert state(u) == {"exclusive": [], "allocated": [], "shared": {}, "counters": {}}
    assert state(trial)["exclusive"] == ["gpu-0"]
    assert state(trial)["shared"] == {"nic-0": {"bandwidth": G * G}}
    assert state(trial)["counters"][("gpu-0-counter-set", "memory-slice-7")] == G


def test_a_device_no_pool_knows_is_taken_without_counters() -> None:
    u = Usage([], [held("a/b/c", dev("gpu-9"))])
    assert (u.exclusive((NVIDIA, "n1", "gpu-9")), dict(u.counters(NVIDIA, "n1"))) == (True, {})


def test_a_pool_seen_from_several_nodes_counts_once() -> None:
    p = pool(NVIDIA, "n1", *MIG_POOL.slices, in_use=[InUse(device="gpu-0-mig-1g10gb-1", claim="a/b/c")])
    assert state(Usage([p, p, p])) == state(Usage([p]))
