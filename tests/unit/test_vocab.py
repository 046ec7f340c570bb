"""The saga's vocabularies are said once, in proto (phalanx_proto.vocab), and every reader
uses them: the metrics' label values, the phase groups, the refusal rules."""

from __future__ import annotations

from typing import get_args

import pytest

from phalanx_proto import vocab
from phalanx_proto.events import Phase
from phalanx_telemetry import metrics, refused


def test_every_phase_is_idle_open_or_scheduled_and_in_only_one_of_them():
    groups = [vocab.IDLE, vocab.OPEN, frozenset({"scheduled"})]
    assert sorted(p for g in groups for p in g) == sorted(get_args(Phase))
    assert vocab.RUNNING < vocab.OPEN and vocab.RUNNING < vocab.LIVE


def test_the_metrics_label_values_are_the_vocabularies():
    assert metrics.GANGS.allowed["phase"] == frozenset(get_args(Phase))
    assert metrics.REFUSED.allowed["rule"] == {r.value for r in vocab.RefusalRule}


def test_a_refusal_names_a_rule_of_the_vocabulary_and_counts_under_its_value():
    before = metrics.REFUSED.value(rule="not_bound")
    refused(vocab.RefusalRule.NOT_BOUND, "a test")
    refused("not_bound", "a test, by the rule's value")
    assert metrics.REFUSED.value(rule="not_bound") == before + 2
    with pytest.raises(ValueError):
        refused("not_a_rule", "a misspelt rule is a bug, not an 'other' label")
