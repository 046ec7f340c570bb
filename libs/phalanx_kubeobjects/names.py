"""The API server's rules for object names, namespaces, label keys and values and annotation
keys (apimachinery ``validation``), so ``phalanx validate`` and the simulator refuse what a real
cluster refuses: a 200,000-character or emoji pod name never reaches the engine.

``check_metadata(meta)`` returns every ``Violation`` of an object's ``metadata`` (a pod or a
pod template); it never raises. Lengths are checked before patterns, so a huge value costs no
more than its length.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from phalanx_kubeobjects.violations import Violation, shown

LABEL_MAX = 63
SUBDOMAIN_MAX = 253
ANNOTATIONS_MAX_BYTES = 256 * 1024

_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUALIFIED = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")

LABEL_RULE = (f"must be a DNS-1123 label: at most {LABEL_MAX} characters, lower-case ASCII letters, digits and "
              "'-', starting and ending with a letter or digit")
SUBDOMAIN_RULE = (f"must be a DNS-1123 subdomain: at most {SUBDOMAIN_MAX} characters, lower-case ASCII letters, "
                  "digits, '-' and '.', each part starting and ending with a letter or digit")
QUALIFIED_RULE = (f"must be a qualified name: an optional DNS-1123 subdomain prefix and '/', then at most {LABEL_MAX} "
                  "ASCII letters, digits, '-', '_' and '.', starting and ending with a letter or digit")
VALUE_RULE = (f"a label value is empty or at most {LABEL_MAX} ASCII letters, digits, '-', '_' and '.', starting "
              "and ending with a letter or digit")


def dns_label(text: object) -> bool:
    """A namespace: a DNS-1123 label."""
    return isinstance(text, str) and len(text) <= LABEL_MAX and _LABEL.fullmatch(text) is not None


def dns_subdomain(text: object) -> bool:
    """A pod name: a DNS-1123 subdomain."""
    return isinstance(text, str) and len(text) <= SUBDOMAIN_MAX and _SUBDOMAIN.fullmatch(text) is not None


def qualified_name(text: object) -> bool:
    """A label or annotation key: ``[prefix/]name``."""
    if not isinstance(text, str) or len(text) > SUBDOMAIN_MAX + 1 + LABEL_MAX:
        return False
    prefix, sep, name = text.rpartition("/")
    if sep and not dns_subdomain(prefix):
        return False
    return len(name) <= LABEL_MAX and _QUALIFIED.fullmatch(name) is not None


def label_value(text: object) -> bool:
    return isinstance(text, str) and (text == "" or (len(text) <= LABEL_MAX and _QUALIFIED.fullmatch(text) is not None))


def check_metadata(meta: Mapping[str, Any]) -> list[Violation]:
    """Every way ``meta`` breaks the API server's naming rules (fields ``metadata.…``)."""
    out: list[Violation] = []
    name, generate = meta.get("name"), meta.get("generateName")
    if name is not None and not dns_subdomain(name):
        out.append(Violation("metadata.name", shown(name), SUBDOMAIN_RULE))
    if generate is not None and not (isinstance(generate, str) and dns_subdomain(generate.removesuffix("-") or "x")):
        out.append(Violation("metadata.generateName", shown(generate), f"a name prefix {SUBDOMAIN_RULE}"))
    namespace = meta.get("namespace")
    if namespace is not None and not dns_label(namespace):
        out.append(Violation("metadata.namespace", shown(namespace), LABEL_RULE))
    labels = meta.get("labels")
    if labels is not None and not isinstance(labels, Mapping):
        out.append(Violation("metadata.labels", shown(labels), "must be a map of strings to strings"))
    for key, value in (labels.items() if isinstance(labels, Mapping) else ()):
        field = f"metadata.labels[{shown(key)}]"
        if not qualified_name(key):
            out.append(Violation(field, shown(key), f"a label key {QUALIFIED_RULE}"))
        elif not isinstance(value, str):
            out.append(Violation(field, shown(value), "label values are strings: write the value in quotes, "
                                                      "e.g. \"4\""))
        elif not label_value(value):
            out.append(Violation(field, shown(value), VALUE_RULE))
    annotations = meta.get("annotations")
    if annotations is not None and not isinstance(annotations, Mapping):
        out.append(Violation("metadata.annotations", shown(annotations), "must be a map of strings to strings"))
    size = 0
    for key, value in (annotations.items() if isinstance(annotations, Mapping) else ()):
        field = f"metadata.annotations[{shown(key)}]"
        if not qualified_name(key if not isinstance(key, str) else key.lower()):
            out.append(Violation(field, shown(key), f"an annotation key {QUALIFIED_RULE}"))
        elif not isinstance(value, str):
            out.append(Violation(field, shown(value), "annotation values are strings: write the value in quotes"))
        else:
            size += len(key.encode("utf-8", "replace")) + len(value.encode("utf-8", "replace"))
    if size > ANNOTATIONS_MAX_BYTES:
        out.append(Violation("metadata.annotations", f"{size} bytes",
                             f"annotations may hold at most {ANNOTATIONS_MAX_BYTES} bytes in all"))
    return out


def name_text(raw: Any) -> str:
    """A name as written ('' when it is not a string, cut when it is too long to be a name; a
    violation says so)."""
    if not isinstance(raw, str):
        return ""
    return raw if len(raw) <= SUBDOMAIN_MAX else shown(raw)
