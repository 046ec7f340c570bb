"""CEL device selectors as Kubernetes evaluates them for DRA (``resource.k8s.io/v1``), on Google's
cel-cpp (the ``cel-expr-python`` package). Called by ``phalanx_engine.dra.allocate`` for every
DeviceClass and request selector; nothing else in Phalanx evaluates CEL.

The environment is upstream's (``k8s.io/dynamic-resource-allocation/cel``, Kubernetes 1.36):

* one variable, ``device``, with ``driver`` (string), ``allowMultipleAllocations`` (bool),
  ``attributes[domain][id]`` (int, bool, string or semantic version) and
  ``capacity[domain][id]`` (quantity). A name without a domain belongs to the driver's domain
  (``productName`` of driver ``gpu.nvidia.com`` is ``device.attributes["gpu.nvidia.com"].productName``);
* an unknown domain is an empty map; a missing key inside a domain is a runtime error;
* the Kubernetes quantity library (``quantity``, ``isQuantity``, ``sign``, members ``compareTo``,
  ``isGreaterThan``, ``isLessThan``, ``add``, ``sub``, ``asInteger``, ``asApproximateFloat``,
  ``isInteger``; ``==`` compares values, so ``1Gi == 1024Mi``) and semver library
  (``semver(s[, normalize])``, ``isSemver``, members ``major``/``minor``/``patch`` and the three
  comparisons); ``cel.bind``, the strings extension and optional types;
* a selector must have type ``bool`` (or an unknown type that turns out bool when evaluated);
  anything else is a compile error.

How it is done here: cel-cpp cannot carry foreign objects, so a quantity is the one-entry map
``{"__k8s_quantity__": "<nanos>"}`` and a version ``{"__k8s_semver__": "<canonical text>"}``:
both are canonical, so map equality is value equality. cel-cpp has no map with a default value,
so every domain a compiled selector names as a literal (``attributes["x"]``, ``capacity['x']``)
and the device's own driver domain are put into each device's maps as ``{}``.

Known differences from upstream, none of which a DeviceClass shipped by a driver touches:
``"x" in device.attributes`` and ``size(device.attributes)`` also see those added empty domains;
a domain computed at run time that no selector names literally is a missing key (an error), not
``{}``; comparing a quantity with something else by ``==`` is ``false`` where cel-go refuses to
compile it; the runtime cost limit (1,000,000) is not enforced (every selector here is linear in
the size of one device); the ``lists``/``sets``/``url``/``ip``/``cidr``/``format`` libraries and
list-type attributes (alpha) are absent.

Compiling is cached by expression text (``MAX_EXPRESSIONS``, least recently used first out), and
each device's input (``DeviceInput``) is built once and keeps what each selector said of it.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable
from fractions import Fraction

from cel_expr_python import cel
from cel_expr_python.ext import ext_bindings, ext_optional, ext_strings

from phalanx_engine.dra import semver
from phalanx_kubeobjects import quantity
from phalanx_proto.dra import Device

MAX_EXPRESSIONS = 4096
"""Compiled selectors kept (a cluster has a handful of DeviceClasses; claims add a few more)."""
QUANTITY_TAG = "__k8s_quantity__"
SEMVER_TAG = "__k8s_semver__"
_INT64 = (-(2**63), 2**63 - 1)
_NANO = 10**9


class CelError(Exception):
    """A selector could not be compiled, or failed while evaluated. ``str()`` is the message
    upstream would put after ``CEL compile error:`` / ``CEL runtime error:``."""


class CelCompileError(CelError):
    pass


class CelRuntimeError(CelError):
    pass


# --- values --------------------------------------------------------------------------------------


def _q(nanos: int) -> dict:
    return {QUANTITY_TAG: str(nanos)}


def _v(version: semver.Semver) -> dict:
    return {SEMVER_TAG: version.canonical}


def _nanos(value: object) -> int:
    if isinstance(value, dict) and len(value) == 1 and QUANTITY_TAG in value:
        return int(value[QUANTITY_TAG])
    raise TypeError("no such overload: not a quantity")


def _version(value: object) -> semver.Semver:
    if isinstance(value, dict) and len(value) == 1 and SEMVER_TAG in value:
        return semver.parse(value[SEMVER_TAG])
    raise TypeError("no such overload: not a semantic version")


def parse_quantity(text: str) -> int:
    """``quantity(text)``: nanos, or ``ValueError`` (upstream takes no surrounding space)."""
    parsed = quantity.parse(text, "quantity") if text == text.strip() else None
    if not isinstance(parsed, quantity.Quantity):
        raise ValueError(f"quantities must match the regular expression "
                         f"'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {text!r}")
    return parsed.nanos


def _is_quantity(text: str) -> bool:
    try:
        parse_quantity(text)
    except ValueError:
        return False
    return True


def _as_integer(value: object) -> int:
    nanos = _nanos(value)
    if nanos % _NANO or not _INT64[0] <= nanos // _NANO <= _INT64[1]:
        raise ValueError("cannot convert value to integer")
    return nanos // _NANO


def _is_integer(value: object) -> bool:
    nanos = _nanos(value)
    return nanos % _NANO == 0 and _INT64[0] <= nanos // _NANO <= _INT64[1]


def _compare(a: object, b: object) -> int:
    if isinstance(a, dict) and QUANTITY_TAG in a:
        x, y = _nanos(a), _nanos(b)
        return (x > y) - (x < y)
    return _version(a).compare(_version(b))


def _plus(sign: int) -> Callable[[object, object], dict]:
    def apply(a: object, b: object) -> dict:
        other = b * _NANO if isinstance(b, int) and not isinstance(b, bool) else _nanos(b)
        return _q(_nanos(a) + sign * other)
    return apply


def _semver(text: str, normalize: bool = False) -> dict:
    return _v(semver.parse(text, normalize))


def _part(name: str) -> Callable[[object], int]:
    return lambda value: getattr(_version(value), name)


_M, _S, _B, _I, _D = cel.Type.MAP, cel.Type.STRING, cel.Type.BOOL, cel.Type.INT, cel.Type.DOUBLE


def _decl(name: str, *overloads: tuple) -> cel.FunctionDecl:
    return cel.FunctionDecl(name, [cel.Overload(oid, ret, params, is_member=member, impl=impl)
                                   for oid, ret, params, member, impl in overloads])


_LIBRARY = [
    _decl("quantity", ("k8s_string_to_quantity", _M, [_S], False, lambda s: _q(parse_quantity(s)))),
    _decl("isQuantity", ("k8s_is_quantity_string", _B, [_S], False, _is_quantity)),
    _decl("sign", ("k8s_quantity_sign", _I, [_M], False, lambda q: (_nanos(q) > 0) - (_nanos(q) < 0))),
    _decl("asInteger", ("k8s_quantity_as_integer", _I, [_M], True, _as_integer)),
    _decl("isInteger", ("k8s_quantity_is_integer", _B, [_M], True, _is_integer)),
    _decl("asApproximateFloat", ("k8s_quantity_as_float", _D, [_M], True,
                                 lambda q: float(Fraction(_nanos(q), _NANO)))),
    _decl("add", ("k8s_quantity_add", _M, [_M, _M], True, _plus(1)),
          ("k8s_quantity_add_int", _M, [_M, _I], True, _plus(1))),
    _decl("sub", ("k8s_quantity_sub", _M, [_M, _M], True, _plus(-1)),
          ("k8s_quantity_sub_int", _M, [_M, _I], True, _plus(-1))),
    # Quantities and versions are both maps to the type checker: one overload each, by tag.
    _decl("compareTo", ("k8s_compare_to", _I, [_M, _M], True, _compare)),
    _decl("isGreaterThan", ("k8s_is_greater_than", _B, [_M, _M], True, lambda a, b: _compare(a, b) == 1)),
    _decl("isLessThan", ("k8s_is_less_than", _B, [_M, _M], True, lambda a, b: _compare(a, b) == -1)),
    _decl("semver", ("k8s_string_to_semver", _M, [_S], False, _semver),
          ("k8s_string_bool_to_semver", _M, [_S, _B], False, _semver)),
    _decl("isSemver", ("k8s_is_semver_string", _B, [_S], False, semver.is_semver),
          ("k8s_is_semver_string_bool", _B, [_S, _B], False, semver.is_semver)),
    _decl("major", ("k8s_semver_major", _I, [_M], True, _part("major"))),
    _decl("minor", ("k8s_semver_minor", _I, [_M], True, _part("minor"))),
    _decl("patch", ("k8s_semver_patch", _I, [_M], True, _part("patch"))),
]

_DOMAIN = re.compile(r"""\b(?:attributes|capacity)\s*\[\s*\??\s*(?:"([^"\\]*)"|'([^'\\]*)')\s*\]""")
_STATUS = re.compile(r"^[A-Z_]+: ")
_NO_KEY = re.compile(r'Key not found in map : "(.*)"', re.S)


def _runtime_message(raw: str) -> str:
    """cel-cpp's message in cel-go's words where they differ (``no such key: x``)."""
    text = _STATUS.sub("", raw, count=1)
    m = _NO_KEY.fullmatch(text)
    if m:
        return f"no such key: {m.group(1)}"
    if text.startswith("No matching overloads found"):
        return "no such overload" + text[len("No matching overloads found"):].replace(" : ", ": ", 1)
    return text


# --- selectors and devices -------------------------------------------------------------------------


class Selector:
    """One compiled selector (by its text)."""

    __slots__ = ("text", "_expr")

    def __init__(self, text: str, expr: cel.Expression) -> None:
        self.text = text
        self._expr = expr


class DeviceInput:
    """One device as every selector sees it: built once (``CelEnv.device_input``), it keeps
    its CEL activation and each selector's answer (True, False, or the runtime error)."""

    __slots__ = ("driver", "data", "problem", "_gen", "_activation", "_answers")

    def __init__(self, driver: str, data: dict, problem: str) -> None:
        self.driver = driver
        self.data = data
        self.problem = problem
        self._gen = -1
        self._activation: cel.Activation | None = None
        self._answers: dict[str, bool | str] = {}


def split_name(name: str, driver: str) -> tuple[str, str]:
    """A qualified attribute or capacity name as (domain, id); no domain: the driver's."""
    domain, sep, ident = name.partition("/")
    return (domain, ident) if sep else (driver, name)


class CelEnv:
    """The DRA selector environment: compile (cached), build device inputs, evaluate."""

    def __init__(self, max_expressions: int = MAX_EXPRESSIONS) -> None:
        self._env = cel.NewEnv(
            variables={"device": cel.Type.Map(cel.Type.STRING, cel.Type.DYN)},
            functions=_LIBRARY,
            extensions=[ext_bindings.ExtBindings(), ext_strings.ExtStrings(), ext_optional.ExtOptional()],
        )
        self._max = max_expressions
        self._compiled: OrderedDict[str, Selector | CelCompileError] = OrderedDict()
        self._domains: set[str] = set()
        self._gen = 0

    def compile(self, text: str) -> Selector:
        """The compiled selector, or ``CelCompileError`` (a parse or type error, or a result
        type other than bool or dynamic)."""
        hit = self._compiled.get(text)
        if hit is None:
            hit = self._compile(text)
            self._compiled[text] = hit
            if len(self._compiled) > self._max:
                self._compiled.popitem(last=False)
        else:
            self._compiled.move_to_end(text)
        if isinstance(hit, CelCompileError):
            raise hit
        return hit

    def _compile(self, text: str) -> Selector | CelCompileError:
        try:
            expr = self._env.compile(text)
        except Exception as e:  # cel-cpp reports parse and check errors as RuntimeError
            return CelCompileError(f"compilation failed: {_STATUS.sub('', str(e), count=1).strip()}")
        out = expr.return_type()
        if out != cel.Type.BOOL and out != cel.Type.DYN:
            return CelCompileError(f"must evaluate to bool or the unknown type, not {out.name().lower()}")
        domains = {a or b for a, b in _DOMAIN.findall(text)} - self._domains
        if domains:
            self._domains |= domains
            self._gen += 1
        return Selector(text, expr)

    def device_input(self, driver: str, device: Device) -> DeviceInput:
        """``device`` of ``driver`` as selectors see it. A version attribute that is not a
        semantic version, or an attribute with no value, makes every selector fail on this
        device with upstream's message (``attribute X: parse semantic version: ...``)."""
        attributes: dict[str, dict] = {driver: {}}
        problem = ""
        for name, attr in device.attributes.items():
            domain, ident = split_name(name, driver)
            value: object
            if attr.version is not None:
                try:
                    value = _v(semver.parse(attr.version))
                except semver.SemverError as e:
                    problem = problem or f"attribute {name}: parse semantic version: {e}"
                    continue
            else:
                value = attr.value()
                if value is None:
                    problem = problem or f"attribute {name}: unsupported attribute value"
                    continue
            attributes.setdefault(domain, {})[ident] = value
        capacity: dict[str, dict] = {driver: {}}
        for name, cap in device.capacity.items():
            domain, ident = split_name(name, driver)
            parsed = quantity.parse(cap.value, name)
            if isinstance(parsed, quantity.Quantity):
                capacity.setdefault(domain, {})[ident] = _q(parsed.nanos)
            else:
                problem = problem or f"capacity {name}: {parsed.rule}"
        data = {"driver": driver, "allowMultipleAllocations": device.allow_multiple_allocations,
                "attributes": attributes, "capacity": capacity}
        return DeviceInput(driver, data, problem)

    def matches(self, selector: Selector, device: DeviceInput) -> bool:
        """Does ``device`` pass ``selector``? ``CelRuntimeError`` when the evaluation fails
        (a missing key, a bad argument, a result that is not a bool): that is not "no"."""
        if device._gen != self._gen:
            device._activation, device._gen = None, self._gen
            device._answers.clear()
        answer = device._answers.get(selector.text)
        if answer is None:
            answer = self._evaluate(selector, device)
            device._answers[selector.text] = answer
        if isinstance(answer, str):
            raise CelRuntimeError(answer)
        return answer

    def _evaluate(self, selector: Selector, device: DeviceInput) -> bool | str:
        if device.problem:
            return device.problem
        if device._activation is None:
            data = device.data
            attributes, capacity = dict(data["attributes"]), dict(data["capacity"])
            for domain in self._domains:
                attributes.setdefault(domain, {})
                capacity.setdefault(domain, {})
            device._activation = self._env.Activation({"device": {**data, "attributes": attributes,
                                                                  "capacity": capacity}})
        result = selector._expr.eval(device._activation)
        kind = result.type()
        if kind == cel.Type.BOOL:
            return bool(result.value())
        if kind == cel.Type.ERROR:
            return _runtime_message(str(result.value()))
        return f"CEL result of type {kind.name().lower()} could not be converted to bool"


ENV = CelEnv()
"""The process's environment (compiled selectors are shared by every node and claim)."""
