"""The API server's naming rules (``phalanx_kubeobjects.names``): pod names, namespaces, label keys
and values, annotation keys, each violation naming the field and the rule."""

from __future__ import annotations

import pytest

from phalanx_kubeobjects.names import (
    LABEL_RULE,
    QUALIFIED_RULE,
    SUBDOMAIN_RULE,
    VALUE_RULE,
    check_metadata,
)
from phalanx_kubeobjects.violations import Violation


def cases(*rows: tuple) -> list:
    return [pytest.param(*row, id=row[0]) for row in rows]


@pytest.mark.parametrize("case,meta,expected", cases(
    ("a dotted lower-case name, a namespace and prefixed labels are fine",
     {"name": "train-0.worker", "namespace": "ml", "labels": {"aliyun.com/min-member": "7", "app": ""},
      "annotations": {"phalanx.io/gpu-vendor": "nvidia"}}, []),
    ("a generateName prefix may end in a dash", {"generateName": "train-"}, []),
    ("a 253-character name is the longest allowed", {"name": "a" * 253}, []),
    ("a 254-character name is too long", {"name": "a" * 254}, [Violation("metadata.name", "a" * 60 + "... (254 characters)",
                                                                         SUBDOMAIN_RULE)]),
    ("an upper-case name is refused", {"name": "Train"}, [Violation("metadata.name", "Train", SUBDOMAIN_RULE)]),
    ("an emoji name is refused", {"name": "\U0001f680"}, [Violation("metadata.name", "\U0001f680", SUBDOMAIN_RULE)]),
    ("a name that is a number is refused", {"name": 7}, [Violation("metadata.name", "7", SUBDOMAIN_RULE)]),
    ("a namespace with a dot is not a DNS label", {"namespace": "a.b"}, [Violation("metadata.namespace", "a.b", LABEL_RULE)]),
    ("a 64-character namespace is too long", {"namespace": "n" * 64},
     [Violation("metadata.namespace", "n" * 64, LABEL_RULE)]),
    ("a label key with two slashes is refused", {"labels": {"a/b/c": "x"}},
     [Violation("metadata.labels[a/b/c]", "a/b/c", f"a label key {QUALIFIED_RULE}")]),
    ("a label key with an upper-case prefix is refused", {"labels": {"Example.com/x": "x"}},
     [Violation("metadata.labels[Example.com/x]", "Example.com/x", f"a label key {QUALIFIED_RULE}")]),
    ("a label value of 64 characters is too long", {"labels": {"k": "v" * 64}},
     [Violation("metadata.labels[k]", "v" * 64, VALUE_RULE)]),
    ("a label value with a space is refused", {"labels": {"k": "a b"}}, [Violation("metadata.labels[k]", "a b", VALUE_RULE)]),
    ("labels that are a list are refused", {"labels": ["a"]},
     [Violation("metadata.labels", "a list", "must be a map of strings to strings")]),
    ("an annotation value that is a number is refused", {"annotations": {"k": 1}},
     [Violation("metadata.annotations[k]", "1", "annotation values are strings: write the value in quotes")]),
    ("annotations over 256 KiB in all are refused", {"annotations": {"k": "x" * (256 * 1024)}},
     [Violation("metadata.annotations", "262145 bytes", "annotations may hold at most 262144 bytes in all")]),
))
def test_names_follow_the_api_server_rules(case: str, meta: dict, expected: list[Violation]) -> None:
    assert check_metadata(meta) == expected
