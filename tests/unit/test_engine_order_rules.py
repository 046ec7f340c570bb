"""The order rules moved into the engine for ``phalanx sim`` (``phalanx_engine.fairness``) answer
as gang-coordinator's own copies do, until gang-coordinator imports them from there."""

from __future__ import annotations

import pytest

from phalanx_engine import fairness
from phalanx_gang_coordinator import fairness as service_fairness
from phalanx_gang_coordinator import saga
from phalanx_proto.events import MemberSpec, PodRef
from phalanx_proto.state import GangState


def gang(name: str, *, priority: int = 0, created: float = 0.0, phase: str = "backoff", attempt: int = 1,
         reserve: tuple[str, ...] = (), fits: bool = True) -> GangState:
    return GangState(gang_id=f"ns/{name}", phase=phase, attempt=attempt, priority=priority, created_at=created,
                     reserve_nodes=reserve, fits_empty_cluster=fits,
                     members=(MemberSpec(pod=PodRef(namespace="ns", name=name), gpus=1),))


OTHERS = [gang("head", created=0, reserve=("n1",)), gang("later", created=50), gang("vip", priority=5, created=90)]


@pytest.mark.parametrize("s", [gang("later", created=50), gang("new", created=100), gang("vip", priority=5, created=90),
                               gang("head", created=0, reserve=("n1",))], ids=lambda s: s.gang_id)
@pytest.mark.parametrize("mode", ["backfill", "strict"])
@pytest.mark.parametrize("now", [30.0, 200.0])
def test_the_fairness_gate_is_the_services(s, mode, now):
    others = [o for o in OTHERS if o.gang_id != s.gang_id]
    assert fairness.gate(s, others, now=now, starve_after_s=60, mode=mode) == \
        fairness.Gate(**vars_of(service_fairness.gate(s, others, now=now, starve_after_s=60, mode=mode)))


def vars_of(g) -> dict:
    return {"hold": g.hold, "avoid": g.avoid, "head": g.head}


@pytest.mark.parametrize("failures", [1, 2, 5, 12])
def test_the_backoff_and_the_queue_order_are_the_services(failures):
    assert fairness.backoff_delay(failures, base_s=1, max_s=60, gang_id="ns/x") == \
        saga.backoff_delay(failures, base_s=1, max_s=60, gang_id="ns/x")
    assert sorted(OTHERS, key=fairness.queue_key) == sorted(OTHERS, key=saga.queue_key)


def test_the_backoff_of_a_gang_refused_for_days_stays_at_its_cap():
    assert 45 <= fairness.backoff_delay(5000, base_s=1, max_s=60, gang_id="ns/x") <= 75
