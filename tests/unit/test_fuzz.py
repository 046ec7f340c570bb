"""Fuzz tests, in-process: ``phalanx validate``, ``phalanx topology show`` and every wire decoder
``phalanx_proto`` exports get generated input - random bytes and text, Kubernetes-shaped trees
with hostile leaves, mutated YAML, matrices with hostile cells, schema-guided events with deep
nesting - and must answer with a result: never a traceback, a hang or unbounded memory.

The inputs come from Hypothesis strategies (below), so a failure is shrunk to a small input,
printed, and saved in the example database (``.hypothesis/``), which replays it first on the
next run. The profiles are registered in ``tests/unit/conftest.py``: ``phalanx`` (``make
test``: ``PHALANX_FUZZ_EXAMPLES`` inputs per target, default 10000, derandomized so every run
tries the same inputs) and ``fuzz`` (``make fuzz``: 200000 inputs per target from a fresh seed,
with the database). The counts are printed at the end of the run.
"""

from __future__ import annotations

import argparse
import contextlib
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
from hypothesis import given, settings
from hypothesis import strategies as st

import phalanx_proto.events
import phalanx_proto.state
from phalanx_cli import cmd_topology, cmd_validate
from phalanx_proto.codec import Decoder

pytestmark = pytest.mark.fuzz

MAX_GROWTH_KIB = 256 * 1024  # peak RSS may grow at most this much over a whole target
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


def dump(tree: object) -> str:
    return yaml.safe_dump(tree, allow_unicode=True)


def text(most: int = 12) -> st.SearchStrategy[str]:
    return st.text(alphabet=ALPHABET, max_size=most)


SCALARS = st.one_of(st.sampled_from(TRICKY), st.none(), st.booleans(), st.integers(-5, 100),
                    st.integers(-10**25, 10**25), st.floats(-1e6, 1e6), st.sampled_from([float("nan"), float("inf")]),
                    text())


def trees(depth: int = 0) -> st.SearchStrategy[object]:
    """Nested lists and mappings (Kubernetes keys mostly) with scalars at the leaves; a deeper
    start (``depth``) gives smaller trees, as the leaves of a pod or an event's fields."""
    keys = st.one_of(st.sampled_from(KEYS), text(6), st.integers(-3, 3))
    return st.recursive(SCALARS, lambda child: st.lists(child, max_size=4) | st.dictionaries(keys, child, max_size=5),
                        max_leaves=(24, 12, 6, 3, 1)[min(depth, 4)])


TREES, SUBTREES = trees(), trees(1)  # built once: a strategy is validated on first use
LEAVES = st.one_of(trees(2), st.sampled_from(TRICKY))


@st.composite
def pods(draw) -> dict:
    limits = draw(st.dictionaries(st.sampled_from(RESOURCES), LEAVES, max_size=3))
    labels = draw(st.dictionaries(st.sampled_from(["replica", "aliyun.com/min-member", "app", *TRICKY[:8]]), LEAVES,
                                  max_size=2))
    spec: dict = {"schedulerName": "phalanx", "containers": [{"name": "app", "resources": {"limits": limits}}]}
    if draw(st.booleans()):
        spec[draw(st.sampled_from(["initContainers", "containers", "hostNetwork", "schedulerName"]))] = draw(LEAVES)
    return {"kind": "Pod", "metadata": {"name": draw(LEAVES), "labels": labels}, "spec": spec}


POD = pods()
WORKLOADS = st.one_of(
    POD,
    st.builds(lambda p, pod: {"kind": "Job", "metadata": {"name": "j"}, "spec": {"parallelism": p, "template": pod}},
              LEAVES, POD),
    st.builds(lambda name, jobs: {"kind": "JobSet", "metadata": {"name": name}, "spec": {"replicatedJobs": jobs}},
              LEAVES, st.one_of(st.builds(lambda n, p, pod: [{"name": n, "template": {"spec": {
                  "parallelism": p, "template": pod}}}], LEAVES, LEAVES, POD), SUBTREES)),
    st.builds(lambda specs: {"kind": "MPIJob", "spec": {"mpiReplicaSpecs": specs}},
              st.one_of(POD.map(lambda pod: {"Worker": {"template": pod}}), SUBTREES)),
    st.builds(lambda items: {"kind": "List", "items": items}, st.one_of(st.lists(POD, max_size=2), SUBTREES)),
)


@st.composite
def mutated(draw, texts: st.SearchStrategy[str]) -> str:
    """Text from ``texts``, sometimes with a YAML-significant piece inserted or a run cut out."""
    value = draw(texts)
    if not draw(st.booleans()):
        return value
    at = draw(st.integers(0, len(value)))
    if draw(st.booleans()):
        return value[:at] + draw(st.sampled_from(PIECES)) + value[at:]
    return value[:at] + value[at + draw(st.integers(0, 19)):]


YAML_TEXT = mutated(st.one_of(text(200), WORKLOADS.map(dump), TREES.map(dump)))
VALIDATE_INPUTS = st.one_of(st.binary(max_size=300), YAML_TEXT.map(lambda s: s.encode("utf-8", "surrogatepass")))


class Budget:
    """Counts the inputs of one target and checks time per input and memory over the target."""

    def __init__(self, name: str, counts: dict[str, int]) -> None:
        self.name, self.counts = name, counts
        counts[name] = 0
        self.rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        self.slowest = 0.0

    def run(self, inputs: st.SearchStrategy, check: Callable[[object], None]) -> None:
        """``check`` every input Hypothesis draws from ``inputs`` (the profile's count); a failure
        is shrunk and reported by Hypothesis."""
        @given(inputs)
        def target(case: object) -> None:
            started = time.monotonic()
            check(case)
            self.counts[self.name] += 1
            self.slowest = max(self.slowest, time.monotonic() - started)

        target()
        grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - self.rss_kib
        assert self.counts[self.name] >= settings.default.max_examples, self.counts[self.name]
        assert self.slowest < MAX_SECONDS, f"{self.name}: one input took {self.slowest:.1f}s"
        assert grew < MAX_GROWTH_KIB, f"{self.name}: peak memory grew by {grew} KiB"


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

    Budget("validate", fuzz_counts).run(VALIDATE_INPUTS, check)


DEVICES = ["GPU0", "GPU1", "GPU2", "GPU3", "mlx5_0", "mlx5_1", "NIC0"]
GOOD_CELLS = ["NV1", "NV2", "NV4", "NV12", "NV18", "PIX", "PXB", "PHB", "NODE", "SYS", "SOC"]
CELLS = [*GOOD_CELLS, "X", "NV19", "NV99999999999999999999", "QPI", "GPU63", "GPU64", "GPU٣", "0-7", "8-15",
         "0-99999999999", "N/A", "0", "1", "٣", "99999", "", "\x1b[2J", "Legend:", "CPU Affinity"]


@st.composite
def matrices(draw) -> str:
    """``nvidia-smi topo -m`` text: a well-formed frame with some cells replaced by hostile ones."""
    names = draw(st.lists(st.sampled_from(DEVICES), min_size=1, max_size=5, unique=True))
    extras = draw(st.sampled_from([[], ["CPU Affinity"], ["CPU Affinity", "NUMA Affinity"]]))
    lines = ["\t" + "\t".join(names + extras)]
    for a in names:
        cells = ["X" if a == b else draw(st.sampled_from(GOOD_CELLS)) for b in names] + [
            draw(st.sampled_from(["0-7", "0", "N/A"])) for _ in extras]
        for at, cell in draw(st.lists(st.tuples(st.integers(0, len(cells) - 1), st.sampled_from(CELLS)), max_size=2)):
            cells[at] = cell
        lines.append(a + "\t" + "\t".join(cells))
    if draw(st.booleans()):
        lines += ["", "NIC Legend:", "  NIC0: " + draw(st.sampled_from(["mlx5_0", "\x1b", "x" * 300, ""]))]
    return "\n".join(lines) + "\n"


@st.composite
def topology_yamls(draw) -> str:
    doc = {"apiVersion": draw(st.sampled_from(["phalanx.io/v1alpha1", "x"])), "kind": "NodeTopology",
           "node": draw(LEAVES)}
    for key in ("gpus", "nics", "matrix", "generation", "nvswitch"):
        if draw(st.booleans()):
            doc[key] = draw(SUBTREES)
    if draw(st.booleans()):
        doc["gpus"] = draw(st.lists(st.fixed_dictionaries({
            "index": st.sampled_from([0, 1, 63, 64, 10**20, -1, "0"]), "numa": LEAVES, "memory_mib": LEAVES,
            "cpu_affinity": LEAVES}), max_size=2))
    return dump(doc)


TOPOLOGY_INPUTS = st.one_of(
    st.tuples(st.just(".txt"), mutated(matrices())), st.tuples(st.just(".yaml"), mutated(topology_yamls())),
    st.tuples(st.sampled_from([".txt", ".yaml"]), mutated(text(200))))


def test_fuzz_topology_show_answers_every_input_with_an_exit_code(fuzz_counts: dict[str, int],
                                                                  tmp_path: Path) -> None:
    def check(case: object) -> None:
        suffix, text = typing.cast(tuple[str, str], case)
        path = tmp_path / f"topo{suffix}"
        path.write_bytes(text.encode("utf-8", "surrogatepass"))
        with captured() as (out, err):
            code = cmd_topology._show(argparse.Namespace(file=str(path), node=None, json=len(text) % 2 == 0))
        assert code in (0, 1, 2), err.getvalue()

    Budget("topology show", fuzz_counts).run(TOPOLOGY_INPUTS, check)


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


FIELD_NAMES = {s: [f.encode_name for f in msgspec.structs.fields(s)]
               for d in DECODERS.values() for s in _structs(d.type)}


@st.composite
def event_bytes(draw, structs: list[type]) -> bytes:
    """Random bytes, random JSON, or an object with a real tag and the struct's own field
    names (up to four of them) holding random values, one of them sometimes nested thousands of
    levels deep."""
    shape = draw(st.sampled_from(["bytes", "json", "nested", "struct", "struct", "struct", "struct"]))
    if shape == "bytes":
        return draw(st.binary(max_size=200))
    if shape == "json":
        return json_bytes(draw(TREES))
    struct = draw(st.sampled_from(structs))
    config = struct.__struct_config__
    doc = {config.tag_field: config.tag} if config.tag_field else {}
    for name in draw(st.lists(st.sampled_from(FIELD_NAMES[struct]), max_size=4, unique=True)):
        doc[name] = draw(SUBTREES)  # a few fields an input: each is a recursive draw, the costly part
    body = json_bytes(doc)
    if shape == "nested" and doc:
        depth = draw(st.integers(1, 20000))
        nest = draw(st.sampled_from([b"[" * depth + b"]" * depth, b'{"a":' * depth + b"1" + b"}" * depth]))
        key = json_bytes(draw(st.sampled_from(sorted(doc))))
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

    Budget(f"wire {name}", fuzz_counts).run(event_bytes(structs), check)
