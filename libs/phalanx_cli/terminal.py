"""Text that reaches a terminal: every character that could move the cursor, change colours,
retitle the window or reorder text is shown as an escape instead of being sent.

Used by the commands that print what others wrote (``phalanx events``, ``explain``,
``validate``): a gang id or pod name holding ``ESC [ 2 J`` prints as ``\\x1b[2J``.
"""

from __future__ import annotations

_BIDI = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
_TABLE = {c: f"\\x{c:02x}" for c in (*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0))}
_TABLE |= {c: f"\\u{c:04x}" for c in _BIDI}


def safe(text: str) -> str:
    """``text`` with C0/C1 control characters, DEL and bidirectional overrides escaped
    (``\\x1b``, ``\\u202e``); a backslash stays as it is. Newlines and tabs are escaped too:
    one field never becomes two lines."""
    return text.translate(_TABLE)


def safe_lines(text: str) -> str:
    """``safe`` applied to each line of a multi-line text the command itself laid out."""
    return "\n".join(safe(line) for line in text.split("\n"))
