"""placement's rule for nodes without a reported Kubernetes state (``nodestate.NodeStates``)."""

from __future__ import annotations

from types import SimpleNamespace

import anyio
import pytest

from phalanx_placement.nodestate import NodeStates

REPORT = SimpleNamespace(key="n1")
"""A mirror entry of node n1's state (only its key is read)."""


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def states(policy: str) -> tuple[NodeStates, Clock]:
    clock = Clock()
    return NodeStates(bus=None, policy=policy, grace_s=30.0, clock=clock), clock  # type: ignore[arg-type]


def test_auto_refuses_unreported_nodes_only_after_reports_have_flowed_for_the_grace():
    s, clock = states("auto")
    seen = []
    for step in ("no report yet", "first report", "20 s later", "30 s later"):
        if step == "first report":
            s._seen(REPORT, None)
        clock.now += {"no report yet": 0, "first report": 0, "20 s later": 20, "30 s later": 10}[step]
        seen.append((step, s.required()))
    assert seen == [("no report yet", False), ("first report", False), ("20 s later", False), ("30 s later", True)]


@pytest.mark.parametrize(("policy", "required"), [("required", True), ("optional", False)])
def test_a_fixed_policy_does_not_depend_on_reports(policy, required):
    s, _ = states(policy)
    assert (s.required(), s._seen(REPORT, None), s.required()) == (required, None, required)


def test_an_unknown_policy_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="one of auto, required, optional"):
        NodeStates(bus=None, policy="sometimes")  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_a_wait_for_a_node_report_ends_at_the_report_of_one_of_its_nodes_or_at_its_timeout():
    s, _ = states("auto")
    got = {}

    async def wait(name, nodes, timeout):
        got[name] = await s.changed(nodes, timeout)

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait, "n1 or n2", {"n1", "n2"}, 5.0)
        tg.start_soon(wait, "n3", {"n3"}, 0.05)
        await anyio.sleep(0.01)
        s._gone(SimpleNamespace(key="n2"))  # n2's state deleted: a change too
    assert got == {"n1 or n2": True, "n3": False}
    assert s._waiters == {}  # nothing left behind
