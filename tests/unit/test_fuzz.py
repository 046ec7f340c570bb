"""Fuzz tests, in-process: ``phalanx validate``, ``phalanx topology show`` and every wire decoder
``phalanx_proto`` exports get generated input - random bytes and text, Kubernetes-shaped trees
with hostile leaves, mutated YAML, matrices with hostile cells, schema-guided events with deep
nesting - and must answer with a result: never a traceback, a hang or unbounded memory.

The generators (``Gen``) make every choice - a branch, a length, a character, a hostile leaf -
through Hypothesis (``DrawnRandom``), so Hypothesis records the choices of every input: a
failure is shrunk to a small input, printed with the blob that replays it, and (profile
``fuzz``) saved in the example database (``.hypothesis/examples``), which replays it first on the next
run. The choices are read from pools of bytes Hypothesis draws, a few draws an input instead
of hundreds, so thousands of inputs per target fit in ``make test``. The profiles are registered in ``tests/unit/conftest.py``: ``phalanx`` (``make
test``: ``PHALANX_FUZZ_EXAMPLES`` inputs per target, default 4000, derandomized so every run
tries the same inputs) and ``fuzz`` (``make fuzz``: 200000 inputs per target from a fresh seed,
with the database). The counts are printed at the end of the run.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import resource
import time
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest
import yaml
from hypothesis import given, seed, settings
from hypothesis import strategies as st

import phalanx_proto.events
import phalanx_proto.state
from phalanx_cli import cmd_topology, cmd_validate
from phalanx_proto.codec import Decoder

pytestmark = pytest.mark.fuzz

MAX_GROWTH_KIB = 256 * 1024  # the checks may grow peak RSS at most this much over a whole target
MAX_SECONDS = 10.0  # one input taking longer is a hang, whatever the machine's load
CONTROL = {chr(c) for c in (*range(0x20), 0x7F)} - {"\n"}

TRICKY = ["٤", "８", "²", "1e3", "1E", "100000000000000000000", "1e999999999", "0.5", "-1", "4Gi", "+", ".", "",
          " 7 ", "0x10", "NV99999999999999999999", "0-99999999999", "\x1b[2J", "\u202e", "a" * 300, "\U0001f680",
          "phalanx", "List", "Pod", "Job", "JobSet", "MPIJob", "Deployment", "nvidia", "amd", "1", "7", "64", "65",
          "&a", "*a", "null", "true", "~", "- x", "{", "'"]
KEYS = ["kind", "apiVersion", "metadata", "name", "namespace", "generateName", "labels", "annotations", "spec",
        "containers", "initContainers", "resources", "limits", "requests", "schedulerName", "hostNetwork",
        "securityContext", "capabilities", "add", "replicatedJobs", "template", "parallelism", "items",
        "mpiReplicaSpecs", "Worker", "runtimeClassName", "replica", "aliyun.com/min-member", "phalanx.io/gpu-vendor",
        "nvidia.com/gpu", "aliyun.com/gpu", "aliyun.com/gpu-core", "aliyun.com/gpu-memory",
        "aliyun.com/gpu-memory-mib", "aliyun.com/gpu-slice", "aliyun.com/rdma"]
RESOURCES = KEYS[-6:]
ALPHABET = "az09AZ-_./: \t\n#&*!|>'\"{}[],%@`\x00\x1b\x7f\u0085\u202e٤８²é\U0001f680\ufeff"
PIECES = ["&a ", "*a", "*b", "<<: ", "[", "]", "{", "}", ": ", "- ", "!!binary ", "!!set ", "!!python/object:x ",
          "'", '"', "\t", "\n  ", "---\n", "\x00", "\x1b", "%YAML 1.1\n", "? ", "|\n", "&a [*a]"]


POOL = 64
"""Bytes per Hypothesis draw behind the generators' numeric choices (``DrawnRandom``)."""


@functools.cache
def _floats(lo: float, hi: float) -> st.SearchStrategy[float]:
    return st.floats(lo, hi)


@functools.cache
def _bytes(n: int) -> st.SearchStrategy[bytes]:
    return st.binary(min_size=n, max_size=n)


class DrawnRandom:
    """The part of ``random.Random`` the generators use, every choice drawn through Hypothesis,
    so Hypothesis records the choices of every input, shrinks them and replays them.

    A number (``random``, ``randrange``, ``sample``, a text's length and characters) is read
    from a pool of ``POOL`` bytes, one Hypothesis draw, drawn again when it runs out: a draw
    costs Hypothesis tens of microseconds of bookkeeping whatever its size, and an input makes
    hundreds of choices, so one draw per choice spent ~90% of a target's time in Hypothesis
    rather than in the code under test. Shrinking a pool towards zero bytes shrinks its choices
    towards 0 (the first branch, the shortest length, the first character), as before. The
    numbers are uniform, as the generators' thresholds assume (a Hypothesis integer draw leans
    towards small numbers and constants: ``random() < 0.4`` held for 59% of draws, so trees came
    out smaller than ``Gen`` says). A float or random bytes stays one draw of its own strategy,
    with Hypothesis's awkward values."""

    def __init__(self, draw: Callable) -> None:
        self.draw = draw
        self.pool, self.at = b"", 0

    def _below(self, n: int) -> int:
        """A number in ``[0, n)`` read from the next bytes of the pool: enough for ``n`` and six
        bits more, so the modulo favours no number by more than 1/64 of its chance."""
        size = ((n - 1).bit_length() + 6 + 7) // 8
        if self.at + size > len(self.pool):
            self.pool, self.at = self.draw(_bytes(max(POOL, size))), 0
        value = int.from_bytes(self.pool[self.at:self.at + size], "big")
        self.at += size
        return value % n

    def random(self) -> float:
        return self._below(1000) / 1000

    def randrange(self, a: int, b: int | None = None) -> int:
        lo, hi = (0, a) if b is None else (a, b)
        return lo + self._below(hi - lo)

    def uniform(self, a: float, b: float) -> float:
        return self.draw(_floats(a, b))

    def randbytes(self, n: int) -> bytes:
        return self.draw(_bytes(n))

    def sample(self, population: typing.Sequence, k: int) -> list:
        """``k`` distinct items of ``population``, in a drawn order (a partial Fisher-Yates)."""
        items = list(population)
        for i in range(k):
            j = i + self._below(len(items) - i)
            items[i], items[j] = items[j], items[i]
        return items[:k]

    def text(self, most: int) -> str:
        """Up to ``most`` characters of ``ALPHABET``."""
        return "".join([ALPHABET[self._below(len(ALPHABET))] for _ in range(self._below(most + 1))])


class Gen:
    """Hostile inputs, every choice a Hypothesis draw."""

    def __init__(self, draw: Callable) -> None:
        self.r = DrawnRandom(draw)

    def pick(self, items: typing.Sequence) -> typing.Any:
        return items[self.r.randrange(len(items))]

    def text(self, most: int = 12) -> str:
        return self.r.text(most)

    def scalar(self) -> object:
        r = self.r.random()
        if r < 0.3:
            return self.pick(TRICKY)
        make = self.pick([lambda: None, lambda: True, lambda: False, lambda: self.r.randrange(-5, 100),
                          lambda: self.r.randrange(-10**25, 10**25), lambda: self.r.uniform(-1e6, 1e6),
                          lambda: float("nan"), lambda: float("inf"), self.text])
        return make()  # only the chosen kind is drawn

    def tree(self, depth: int = 0) -> object:
        r = self.r.random()
        if depth >= 4 or r < 0.4:
            return self.scalar()
        if r < 0.7:
            return [self.tree(depth + 1) for _ in range(self.r.randrange(5))]
        keys = [self.pick(KEYS) if self.r.random() < 0.7 else self.pick([self.text(6), self.r.randrange(-3, 4)])
                for _ in range(self.r.randrange(6))]
        return {k: self.tree(depth + 1) for k in keys}

    def leaf(self) -> object:
        return self.tree(2) if self.r.random() < 0.5 else self.pick(TRICKY)

    def pod(self) -> dict:
        limits = {self.pick(RESOURCES): self.leaf() for _ in range(self.r.randrange(4))}
        labels = {self.pick(["replica", "aliyun.com/min-member", "app", *TRICKY[:8]]): self.leaf()
                  for _ in range(self.r.randrange(3))}
        spec: dict = {"schedulerName": "phalanx", "containers": [{"name": "app", "resources": {"limits": limits}}]}
        if self.r.random() < 0.3:
            spec[self.pick(["initContainers", "containers", "hostNetwork", "schedulerName"])] = self.leaf()
        return {"kind": "Pod", "metadata": {"name": self.leaf(), "labels": labels}, "spec": spec}

    def workload(self) -> dict:
        kind = self.pick(["Pod", "Job", "JobSet", "MPIJob", "List"])
        if kind == "Pod":
            return self.pod()
        if kind == "Job":
            return {"kind": "Job", "metadata": {"name": "j"}, "spec": {"parallelism": self.leaf(), "template": self.pod()}}
        if kind == "JobSet":
            jobs = [{"name": self.leaf(), "template": {"spec": {"parallelism": self.leaf(), "template": self.pod()}}}]
            return {"kind": "JobSet", "metadata": {"name": self.leaf()},
                    "spec": {"replicatedJobs": jobs if self.r.random() < 0.7 else self.tree(1)}}
        if kind == "MPIJob":
            return {"kind": "MPIJob", "spec": {"mpiReplicaSpecs": {"Worker": {"template": self.pod()}}
                                               if self.r.random() < 0.7 else self.tree(1)}}
        return {"kind": "List", "items": [self.pod() for _ in range(self.r.randrange(3))]
                if self.r.random() < 0.7 else self.tree(1)}

    def mutate(self, text: str) -> str:
        at = self.r.randrange(len(text) + 1)
        if self.r.random() < 0.5:
            return text[:at] + self.pick(PIECES) + text[at:]
        return text[:at] + text[at + self.r.randrange(20):]

    def yaml_text(self) -> str:
        r = self.r.random()
        text = self.text(200) if r < 0.15 else dump(self.workload() if r < 0.7 else self.tree())
        return self.mutate(text) if self.r.random() < 0.35 else text

    def validate_input(self) -> bytes:
        if self.r.random() < 0.1:
            return self.r.randbytes(self.r.randrange(300))
        return self.yaml_text().encode("utf-8", "surrogatepass")


def dump(tree: object) -> str:
    return yaml.safe_dump(tree, allow_unicode=True)


ROUND = 10000
"""Inputs per Hypothesis run: a longer target runs several rounds, each a fresh run, since a run
keeps every input's choices in memory."""


class Budget:
    """Counts the inputs of one target and checks time and peak memory per input."""

    def __init__(self, name: str, counts: dict[str, int]) -> None:
        self.name, self.counts = name, counts
        counts[name] = 0
        self.slowest = 0.0
        self.grew_kib = 0
        """Peak RSS growth during the checks themselves (not Hypothesis's own bookkeeping)."""

    def run(self, make: Callable[[Gen], object], check: Callable[[object], None]) -> None:
        """``check`` every input ``make`` generates, the profile's ``max_examples`` in all; a
        failure is shrunk and reported by Hypothesis."""
        total = settings.default.max_examples

        def target(case: object) -> None:
            peak, started = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.monotonic()
            check(case)
            self.slowest = max(self.slowest, time.monotonic() - started)
            self.grew_kib += resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak
            self.counts[self.name] += 1

        inputs = st.composite(lambda draw: make(Gen(draw)))()
        for done in range(0, total, ROUND):
            if settings.default.derandomize and done:  # a derandomized profile: another fixed seed a round
                seed(done)(settings(max_examples=min(ROUND, total - done), derandomize=False, database=None)(
                    given(inputs)(target)))()
            else:
                settings(max_examples=min(ROUND, total - done))(given(inputs)(target))()
        assert self.counts[self.name] >= total, self.counts[self.name]
        assert self.slowest < MAX_SECONDS, f"{self.name}: one input took {self.slowest:.1f}s"
        assert self.grew_kib < MAX_GROWTH_KIB, f"{self.name}: the checks grew peak memory by {self.grew_kib} KiB"


@contextlib.contextmanager
def captured() -> Iterator[tuple[io.StringIO, io.StringIO]]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        yield out, err


def no_raw_control(text: str) -> bool:
    return not (set(text) & CONTROL)


def test_fuzz_validate_answers_every_input_with_an_exit_code(fuzz_counts: dict[str, int]) -> None:
    args = argparse.Namespace(files=["-"], gpu_model="", gpu_vendor="nvidia", gpu_memory_mib=0)

    def check(data: object) -> None:
        assert isinstance(data, bytes)
        with captured() as (out, err):
            code = cmd_validate.run(args, stdin=io.BytesIO(data), out=out, err=err)
        assert code in (0, 1, 2)
        assert no_raw_control(out.getvalue()) and no_raw_control(err.getvalue())

    Budget("validate", fuzz_counts).run(Gen.validate_input, check)


DEVICES = ["GPU0", "GPU1", "GPU2", "GPU3", "mlx5_0", "mlx5_1", "NIC0"]
GOOD_CELLS = ["NV1", "NV2", "NV4", "NV12", "NV18", "PIX", "PXB", "PHB", "NODE", "SYS", "SOC"]
CELLS = [*GOOD_CELLS, "X", "NV19", "NV99999999999999999999", "QPI", "GPU63", "GPU64", "GPU٣", "0-7", "8-15",
         "0-99999999999", "N/A", "0", "1", "٣", "99999", "", "\x1b[2J", "Legend:", "CPU Affinity"]


def matrix(gen: Gen) -> str:
    """``nvidia-smi topo -m`` text: a well-formed frame with some cells replaced by hostile ones."""
    names = gen.r.sample(DEVICES, gen.r.randrange(1, 6))
    extras = gen.pick([[], ["CPU Affinity"], ["CPU Affinity", "NUMA Affinity"]])
    lines = ["\t" + "\t".join(names + extras)]
    for a in names:
        cells = ["X" if a == b else gen.pick(GOOD_CELLS) for b in names] + [gen.pick(["0-7", "0", "N/A"])
                                                                            for _ in extras]
        for _ in range(gen.r.randrange(3)):
            cells[gen.r.randrange(len(cells))] = gen.pick(CELLS)
        lines.append(a + "\t" + "\t".join(cells))
    if gen.r.random() < 0.3:
        lines += ["", "NIC Legend:", "  NIC0: " + gen.pick(["mlx5_0", "\x1b", "x" * 300, ""])]
    return "\n".join(lines) + "\n"


def topology_yaml(gen: Gen) -> str:
    doc = {"apiVersion": gen.pick(["phalanx.io/v1alpha1", "x"]), "kind": "NodeTopology", "node": gen.leaf()}
    for key in ("gpus", "nics", "matrix", "generation", "nvswitch"):
        if gen.r.random() < 0.6:
            doc[key] = gen.tree(1)
    if gen.r.random() < 0.5:
        doc["gpus"] = [{"index": gen.pick([0, 1, 63, 64, 10**20, -1, "0"]), "numa": gen.leaf(),
                        "memory_mib": gen.leaf(), "cpu_affinity": gen.leaf()} for _ in range(gen.r.randrange(3))]
    return dump(doc)


def topology_input(gen: Gen) -> tuple[str, str]:
    r = gen.r.random()
    suffix, text = (".txt", matrix(gen)) if r < 0.5 else (".yaml", topology_yaml(gen)) if r < 0.9 else (
        gen.pick([".txt", ".yaml"]), gen.text(200))
    return suffix, gen.mutate(text) if gen.r.random() < 0.3 else text


def test_fuzz_topology_show_answers_every_input_with_an_exit_code(fuzz_counts: dict[str, int],
                                                                  tmp_path: Path) -> None:
    def check(case: object) -> None:
        suffix, text = typing.cast(tuple[str, str], case)
        path = tmp_path / f"topo{suffix}"
        path.write_bytes(text.encode("utf-8", "surrogatepass"))
        with captured() as (out, err):
            code = cmd_topology._show(argparse.Namespace(file=str(path), node=None, json=len(text) % 2 == 0))
        assert code in (0, 1, 2), err.getvalue()

    Budget("topology show", fuzz_counts).run(topology_input, check)


PROTO_MODULES = (phalanx_proto.events, phalanx_proto.state)


def _decoders(kind: type) -> dict[str, typing.Any]:
    """Every decoder of ``kind`` that ``phalanx_proto`` exports: the wire contract's entry points."""
    return {f"{m.__name__.rsplit('.', 1)[1]}.{name}": value for m in PROTO_MODULES
            for name, value in vars(m).items() if isinstance(value, kind)}


DECODERS = _decoders(Decoder)


def test_fuzz_proto_exports_only_decoders_that_refuse_with_msgspec_errors() -> None:
    """A bare msgspec decoder raises RecursionError on deep nesting; proto exports codec.Decoder."""
    assert _decoders(msgspec.json.Decoder) == {}
    assert len(DECODERS) >= 5


def _structs(tp: object) -> list[type]:
    members = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
    return [m for m in members if isinstance(m, type) and issubclass(m, msgspec.Struct)]


@functools.cache
def _field_names(struct: type) -> tuple[str, ...]:
    """The wire names of ``struct``'s fields (``msgspec.structs.fields`` resolves the type hints
    on every call)."""
    return tuple(f.encode_name for f in msgspec.structs.fields(struct))


def event_bytes(gen: Gen, structs: list[type]) -> bytes:
    """Random bytes, random JSON, or an object with a real tag and the struct's own field
    names holding random values, one of them sometimes nested thousands of levels deep."""
    r = gen.r.random()
    if r < 0.15:
        return gen.r.randbytes(gen.r.randrange(200))
    if r < 0.3:
        return json_bytes(gen.tree())
    struct = gen.pick(structs)
    config = struct.__struct_config__
    doc = {config.tag_field: config.tag} if config.tag_field else {}
    for name in _field_names(struct):
        if gen.r.random() < 0.75:
            doc[name] = gen.tree(1)
    body = json_bytes(doc)
    if r < 0.45 and doc:
        depth = gen.r.randrange(1, 20000)
        nest = gen.pick([b"[" * depth + b"]" * depth, b'{"a":' * depth + b"1" + b"}" * depth])
        key = json_bytes(gen.pick(sorted(doc)))
        body = body[:-1] + b"," + key + b":" + nest + b"}"  # a later duplicate key wins in msgspec
    return body


def json_bytes(tree: object) -> bytes:
    try:
        return msgspec.json.encode(tree)
    except (TypeError, ValueError, OverflowError):
        return msgspec.json.encode(repr(tree))


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_fuzz_wire_decoders_decode_or_refuse_every_input(name: str, fuzz_counts: dict[str, int]) -> None:
    decoder = DECODERS[name]
    structs = _structs(decoder.type)

    def check(data: object) -> None:
        try:
            decoder.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            pass

    Budget(f"wire {name}", fuzz_counts).run(lambda gen: event_bytes(gen, structs), check)
