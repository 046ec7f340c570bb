"""placement's configuration: one dataclass whose fields with a flag are ``phalanx run
placement``'s (``phalanx_service.config`` makes the flags from it)."""

from __future__ import annotations

from dataclasses import dataclass

from phalanx_placement.nodestate import GRACE_S, POLICIES
from phalanx_service.config import option


@dataclass(frozen=True)
class Config:
    """placement's configuration; the fields with a flag are ``phalanx run placement``'s
    (``phalanx_service.config``)."""

    heartbeat_stale_s: float = option(40.0, "a node whose topology heartbeat is older than this is unavailable "
                                      "(4 of its agent's 10 s beats)")
    max_commit_retries: int = 20
    node_state: str = option("auto", "when a node whose agent has not reported its Kubernetes state takes "
                             "nothing: 'auto' once reports have flowed for --node-state-grace-s, always "
                             "('required'), or never ('optional') (docs/placement.md)", choices=POLICIES)
    node_state_grace_s: float = option(GRACE_S, "seconds of reports before 'auto' refuses unreported nodes")
    cycle_max: int = 64
    """Requests decided in one scheduling cycle at most (and handlers waiting for one)."""
    usage_audit_s: float = 10.0
    """Seconds between audits of the queues' usage against the ledger (``audit_usage``)."""
    usage_half_life_s: float = option(0.0, "half-life of the queues' recent usage, in seconds: the part of the GPUs "
                                      "beyond the quotas goes first to the queues that used less lately "
                                      "(docs/queues.md, 'Fair share that remembers'); 0: off, the records are removed")
    usage_every_s: float = option(10.0, "seconds between looks at what each queue holds, to advance its recent-usage "
                                  "record when that changed (the usage a change adds is counted from the look after "
                                  "it: at most this late)")
    whatif_share: float = option(0.03, "share of placement's time the counterfactual probes of gangs that do not "
                                 "fit may take, at most (0: no probes; docs/whatif.md)")
    whatif_burst_s: float = option(0.05, "seconds of counterfactual probing saved up at most (docs/whatif.md)")
    whatif_gang_s: float = option(0.02, "seconds one gang's counterfactual probes may take at most (docs/whatif.md); "
                                  "on a loaded machine a probe cut short answers nothing")
    nomination_s: float = option(120.0, "seconds a preemptor's nomination keeps the GPUs its victims free for it "
                                 "(docs/preemption.md); then it is dropped and the planner chooses again")
    record_decisions: bool = option(True, "do not record each engine decision's inputs and outcome on the bounded "
                                    "phx.decisions stream (`phalanx sim --replay`, docs/whatif.md)",
                                    flag="--no-record-decisions")
    record_base_every_s: float = 300.0
    """The decision log starts again from every node at least this often, so its bounded stream
    always holds a base to replay from (``recorder``)."""
