"""Decoding wire bytes: one decoder per type or union (built once, style rule 5) whose every
refusal is a ``msgspec.DecodeError`` or ``msgspec.ValidationError``, the two errors the bus
adapter turns into a dead letter.

A bare ``msgspec.json.Decoder`` raises ``RecursionError`` for JSON nested deeper than the
interpreter's recursion allows (``{"kind": [[[[...]]]]}``, found by ``tests/unit/test_fuzz.py``),
and how deep that is depends on the caller's own stack. Such a message is malformed, not a
crash: ``Decoder`` reports it as a ``DecodeError``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

import msgspec

if TYPE_CHECKING:
    from typing_extensions import TypeForm

T = TypeVar("T")


class Decoder(Generic[T]):
    """``msgspec.json.Decoder(type)`` with one more promise: ``decode`` raises nothing but
    ``msgspec.DecodeError`` and ``msgspec.ValidationError`` on bad input. Generic like
    msgspec's: ``Decoder(Fence).decode`` is typed as returning a ``Fence``."""

    __slots__ = ("_decoder", "type")

    @overload
    def __init__(self: Decoder[T], type: TypeForm[T]) -> None: ...
    @overload
    def __init__(self: Decoder[Any], type: Any) -> None: ...

    def __init__(self, type: Any) -> None:  # noqa: A002 - the name msgspec uses
        self._decoder: msgspec.json.Decoder[T] = msgspec.json.Decoder(type)
        self.type = type

    def decode(self, data: bytes | bytearray | memoryview | str) -> T:
        try:
            return self._decoder.decode(data)
        except RecursionError:
            raise msgspec.DecodeError("JSON is malformed: nested too deeply to decode") from None
