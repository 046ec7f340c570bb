"""Semantic versions as DRA selectors see them: the ``version`` attributes a driver publishes
(``driverVersion: 580.126.20``) and the CEL ``semver()`` library of Kubernetes
(``k8s.io/apiserver/pkg/cel/library/semverlib.go``, library version 1). Called by
``phalanx_engine.dra.celenv`` only.

Parsing is strict semver 2.0.0, as the Go library Kubernetes uses (``blang/semver/v4``):
``MAJOR.MINOR.PATCH`` with no leading zeros and no ``v``, an optional ``-pre.release`` (numeric
identifiers without leading zeros) and an optional ``+build`` (ignored when comparing).
``parse(text, normalize=True)`` first does what ``semver(text, true)`` does upstream: drop one
leading ``v``, drop leading zeros of each of the first three dot-separated parts, and pad
``1`` / ``1.2`` to ``1.0.0`` / ``1.2.0`` (a short version may not carry ``-`` or ``+``).

``canonical`` is the text without build metadata: two versions are equal (upstream ``EQ``)
exactly when their canonical texts are, which is what lets CEL compare them as values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ID = r"[0-9A-Za-z-]+"
_NUM = r"0|[1-9][0-9]*"
_FULL = re.compile(rf"({_NUM})\.({_NUM})\.({_NUM})(?:-({_ID}(?:\.{_ID})*))?(?:\+({_ID}(?:\.{_ID})*))?")
_DIGITS = re.compile(r"[0-9]+")


class SemverError(ValueError):
    """Not a semantic version; the message says why."""


@dataclass(frozen=True, slots=True)
class Semver:
    """One parsed version. ``pre`` holds the pre-release identifiers; build metadata is not
    kept (it never takes part in a comparison)."""

    major: int
    minor: int
    patch: int
    pre: tuple[str, ...] = ()

    @property
    def canonical(self) -> str:
        core = f"{self.major}.{self.minor}.{self.patch}"
        return f"{core}-{'.'.join(self.pre)}" if self.pre else core

    def compare(self, other: Semver) -> int:
        """-1, 0 or 1 by semver precedence (build metadata ignored)."""
        mine, theirs = (self.major, self.minor, self.patch), (other.major, other.minor, other.patch)
        if mine != theirs:
            return -1 if mine < theirs else 1
        if self.pre == other.pre:
            return 0
        if not self.pre or not other.pre:  # a release ranks above its pre-releases
            return 1 if not self.pre else -1
        for a, b in zip(self.pre, other.pre, strict=False):
            if a != b:
                return _compare_identifier(a, b)
        return -1 if len(self.pre) < len(other.pre) else 1


def parse(text: str, normalize: bool = False) -> Semver:
    """``text`` as a version, or ``SemverError``."""
    if normalize:
        text = _normalized(text)
    if not text:
        raise SemverError("version string empty")
    m = _FULL.fullmatch(text)
    if m is None:
        raise SemverError(f"{text!r} is not a semantic version (MAJOR.MINOR.PATCH[-PRE][+BUILD])")
    pre = tuple(m.group(4).split(".")) if m.group(4) else ()
    for ident in pre:
        if len(ident) > 1 and ident[0] == "0" and _DIGITS.fullmatch(ident):
            raise SemverError(f"numeric pre-release identifier {ident!r} has a leading zero")
    return Semver(int(m.group(1)), int(m.group(2)), int(m.group(3)), pre)


def is_semver(text: str, normalize: bool = False) -> bool:
    try:
        parse(text, normalize)
    except SemverError:
        return False
    return True


def _compare_identifier(a: str, b: str) -> int:
    a_num, b_num = _DIGITS.fullmatch(a) is not None, _DIGITS.fullmatch(b) is not None
    if a_num and b_num:
        x, y = int(a), int(b)
        return -1 if x < y else 1
    if a_num != b_num:  # numeric identifiers rank below alphanumeric ones
        return -1 if a_num else 1
    return -1 if a < b else 1


def _normalized(text: str) -> str:
    if text.startswith("v"):
        text = text[1:]
    parts = text.split(".", 2)
    for i, part in enumerate(parts):
        if len(part) > 1:
            stripped = part.lstrip("0")
            parts[i] = stripped if stripped[:1].isdigit() and stripped[:1].isascii() else "0" + stripped
    if len(parts) < 3:
        if "+" in parts[-1] or "-" in parts[-1]:
            raise SemverError("short version cannot contain PreRelease/Build meta data")
        parts += ["0"] * (3 - len(parts))
    return ".".join(parts)
