"""The reconciler's lease (services/phalanx_gang_coordinator/lease.py) against a real
nats-server: one holder at a time, renewed by its owner, taken over once expired, given up on
exit, and an unreadable lease value is no obstacle. The clock is the test's, so no sleeping."""

from __future__ import annotations

import pytest

from phalanx_bus import Bus
from phalanx_gang_coordinator.lease import LeaseHolder
from phalanx_proto import subjects as S

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


@pytest.fixture
async def kv(nats_private):
    bus = await Bus.connect(nats_private.url, service="test")
    try:
        yield await bus.kv(S.KV_LEASES)
    finally:
        await bus.close()


async def test_one_holder_at_a_time_renewed_taken_over_when_expired_and_given_up_on_exit(kv):
    now = [1000.0]
    a, b = (LeaseHolder(kv, "reconciler", owner, ttl_s=10.0, clock=lambda: now[0]) for owner in ("a", "b"))
    assert [await a.hold(), await b.hold()] == [True, False]
    now[0] += 8
    assert [await a.hold(), await b.hold()] == [True, False]     # renewed: good until 1018
    now[0] += 9
    assert await b.hold() is False
    now[0] += 2                                                  # a stopped renewing; expired at 1018
    assert [await b.hold(), await a.hold()] == [True, False]
    await b.release()
    assert [await a.hold(), await b.hold()] == [True, False]    # no wait for the expiry after a release


async def test_an_unreadable_lease_value_is_taken_over(kv):
    await kv.put("reconciler", b"{not a lease")
    holder = LeaseHolder(kv, "reconciler", "a", ttl_s=10.0, clock=lambda: 1000.0)
    assert await holder.hold() is True
    assert await LeaseHolder(kv, "reconciler", "b", ttl_s=10.0, clock=lambda: 1000.0).hold() is False
