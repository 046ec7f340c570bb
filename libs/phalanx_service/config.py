"""A service's configuration, said once: a frozen dataclass whose fields carry their flag in their
metadata (``option``/``required``). ``add_arguments`` makes the ``phalanx run SERVICE`` flags
from it and ``from_args`` builds the value back, so a default, a choice or a help text is
written in one place, the field, and ``--help`` shows what the field says.

* The flag is ``--<field name>`` with ``_`` as ``-``, unless ``flag=`` names it.
* ``env=VAR``: when the variable is set, it is the default (a pod's ``NODE_NAME``); a
  ``required`` field is then not required.
* A ``bool`` field is a switch: ``--<name>`` turns a ``False`` default on; a ``True`` default
  gets ``flag="--no-…"``, which turns it off.
* ``parse=`` checks and converts the text (``argparse``'s ``type``); without it the field's
  ``int``, ``float`` or ``str`` does. ``choices=`` lists the values allowed.
* A field without ``option``/``required`` is no flag (a tuning knob the tests set).

Each service's ``entry.add_arguments`` is ``add_arguments(parser, Config)`` and its ``start``
passes ``from_args(Config, args)`` to ``run(bus, [cluster,] config, *, task_status)``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import typing
from collections.abc import Callable, Sequence
from typing import Any

FLAG = "phalanx.flag"
"""The key of a field's ``Flag`` in its dataclass metadata."""


@dataclasses.dataclass(frozen=True, slots=True)
class Flag:
    help: str
    env: str = ""
    choices: Sequence[str] | None = None
    parse: Callable[[str], Any] | None = None
    flag: str = ""
    metavar: str | None = None
    group: str = ""
    """The title of the argument group ``--help`` lists it under ("" for the service's own)."""


def option(default: Any, help: str, **flag: Any) -> Any:  # noqa: A002 - argparse's word
    """A field with ``default`` and the flag ``Flag(help, **flag)`` describes."""
    return dataclasses.field(default=default, metadata={FLAG: Flag(help, **flag)})


def required(help: str, **flag: Any) -> Any:  # noqa: A002
    """A field without a default: its flag must be given (or its ``env`` set)."""
    return dataclasses.field(metadata={FLAG: Flag(help, **flag)})


def flags_of(config: type) -> list[tuple[dataclasses.Field, Flag]]:
    return [(f, f.metadata[FLAG]) for f in dataclasses.fields(config) if FLAG in f.metadata]


def add_arguments(parser: argparse.ArgumentParser, config: type) -> None:
    """One flag per ``option``/``required`` field of the dataclass ``config`` (module docstring)."""
    hints = typing.get_type_hints(config)
    groups: dict[str, Any] = {}
    for f, spec in flags_of(config):
        target = parser if not spec.group else groups.setdefault(spec.group, parser.add_argument_group(spec.group))
        name = spec.flag or "--" + f.name.replace("_", "-")
        from_env = os.environ.get(spec.env) if spec.env else None
        has_default = f.default is not dataclasses.MISSING
        default = from_env if from_env is not None else (f.default if has_default else None)
        env_note = f"env {spec.env}; " if spec.env else ""
        kw: dict[str, Any] = {"dest": f.name, "default": default}
        if hints[f.name] is bool:
            kw["action"] = "store_false" if f.default else "store_true"
            kw["help"] = spec.help + (f" ({env_note.rstrip('; ')})" if env_note else "")
        else:
            kw["type"] = spec.parse or _text_to(hints[f.name])
            kw["required"] = default is None and not has_default
            shown = "" if default in (None, "") else "default %(default)s"
            note = (env_note + shown).rstrip("; ")
            kw["help"] = spec.help + (f" ({note})" if note else "")
            if spec.choices is not None:
                kw["choices"] = tuple(spec.choices)
            if spec.metavar is not None:
                kw["metavar"] = spec.metavar
        target.add_argument(name, **kw)


def from_args(config: type, args: argparse.Namespace, **more: Any) -> Any:
    """The ``config`` value the parsed flags (and ``more``) say."""
    return config(**{f.name: getattr(args, f.name) for f, _ in flags_of(config)}, **more)


def _text_to(kind: Any) -> Callable[[str], Any]:
    if kind in (int, float, str):
        return kind
    if kind == (str | None):
        return str
    raise TypeError(f"a flag of type {kind!r} needs parse=")


# --- parsers a flag may name -----------------------------------------------------------------------
def whole_number(low: int, high: int) -> Callable[[str], int]:
    """ASCII digits naming a number from ``low`` to ``high``."""
    def parse(text: str) -> int:
        if not (text.isascii() and text.isdigit()) or not low <= int(text) <= high:
            raise argparse.ArgumentTypeError(f"{text!r} must be a whole number from {low} to {high}")
        return int(text)

    return parse


def namespace_name(text: str) -> str:
    """A name the API server takes for a namespace (a DNS label)."""
    from phalanx_kubeobjects.names import dns_label

    if not dns_label(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a namespace name (a DNS label: lower-case letters, digits "
                                         "and '-', at most 63, starting and ending with a letter or digit)")
    return text
