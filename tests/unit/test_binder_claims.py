"""binder's claim step (``phalanx_binder.claims.reserve``) on a claim write the API server refuses
outright (an admission policy, validation, authorization: ``ClaimRefused``): like a claim allocated
elsewhere, it binds no member of the gang and tells each why, at once; the command is not retried
until the attempt times out (tests/e2e/test_dra_e2e.py has the same on a real API server)."""

from __future__ import annotations

import pytest

from phalanx_binder import claims
from phalanx_kube.port import ClaimRef, ClaimRefused
from phalanx_proto.dra import AllocatedDevice, ClaimAllocated, ClaimAllocation
from phalanx_proto.events import Assignment, PodRef

pytestmark = pytest.mark.anyio


class RefusingCluster:
    """Reserves every claim but ``refused``, whose write the API server refuses."""

    def __init__(self, refused: str) -> None:
        self.refused = refused
        self.reserved: list[str] = []

    async def reserve_claim(self, claim: ClaimRef, pod: PodRef, allocation: ClaimAllocation | None) -> dict:
        if claim.name == self.refused:
            raise ClaimRefused(f"update status of claim {claim}: HTTP 422: denied by policy")
        self.reserved.append(claim.name)
        return {}


def member(name: str, claim: str, gpu: int) -> Assignment:
    alloc = ClaimAllocation(devices=(AllocatedDevice(request="gpu", driver="gpu.nvidia.com", pool="n1",
                                                     device=f"gpu-{gpu}"),))
    return Assignment(pod=PodRef(namespace="t", name=name, uid=f"uid-{name}"), node="n1", gpus=(gpu,),
                      claims=(ClaimAllocated(claim=f"t/{claim}/uid-{claim}", pod_claim="gpus", allocation=alloc),))


async def test_a_claim_write_the_api_server_refuses_binds_no_member_and_each_is_told_why():
    cluster = RefusingCluster("cb")
    gang = (member("a", "ca", 0), member("b", "cb", 1))
    failed = await claims.reserve(cluster, gang)  # type: ignore[arg-type]
    assert cluster.reserved == ["ca"]  # written before the refusal: the rollback's compensation takes it back
    assert set(failed) == {gang[0].pod, gang[1].pod}
    assert failed[gang[1].pod] == "claim t/cb: update status of claim t/cb: HTTP 422: denied by policy"
    assert failed[gang[0].pod] == f"not bound: gang member {gang[1].pod}'s {failed[gang[1].pod]}"
