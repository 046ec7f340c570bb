"""Every command that reads a file, fed what a new or hostile user feeds it: a clear line, exit
2 for "cannot read" and 1 for "read but invalid", never a traceback, bounded memory.
(``phalanx validate``, ``topology show``, ``place``, ``up --cluster-file/--workload``.)"""

from __future__ import annotations

import io
import tracemalloc
from pathlib import Path

import pytest

from phalanx_cli.main import main
from phalanx_input import MAX_DEPTH, Invalid, Unreadable, read_text, yaml_documents
from phalanx_localstack.inputs import ClusterFile, load_workload

ROOT = Path(__file__).resolve().parents[2]
PODS = ROOT / "examples" / "pods"
V100 = ROOT / "tests" / "fixtures" / "topology" / "dgx1v-like_8xV100-SXM2_mlx5_oneflow.txt"
BINARY = b"\x7fELF\x02\x01\x01\x00\x00\x00garbage\xff\xfe"


def cases(*rows: tuple) -> list:
    return [pytest.param(*row, id=row[0]) for row in rows]


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """The billion-laughs shape: each level lists the previous one ``width`` times (~2 KB)."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\nkind: Pod\n"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


# --- the reader --------------------------------------------------------------------------------


@pytest.mark.parametrize("case,text,message", cases(
    ("a self-referencing sequence", "&a [*a]\n",
     "line 1: the alias *a refers to a structure that contains it (a self-referencing structure)"),
    ("a self-referencing List object", "&l {kind: List, items: [*l]}\n",
     "line 1: the alias *l refers to a structure that contains it (a self-referencing structure)"),
    ("nesting deeper than the bound", "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1),
     f"line 1: nested deeper than {MAX_DEPTH} levels"),
    ("a duplicate key", "kind: Pod\nkind: Job\n", "line 2: not valid YAML (duplicate key 'kind')"),
    ("a Python object tag", "a: !!python/object/apply:os.system [ls]\n",
     "line 1: not valid YAML (could not determine a constructor for the tag"),
    ("an integer too long to convert", "replicas: " + "9" * 5000 + "\n", "not valid YAML (Exceeds the limit"),
    ("a date that is not one", "at: 2001-13-45\n", "not valid YAML (month must be in 1..12)"),
))
def test_input_yaml_that_phalanx_refuses_to_build_is_unreadable(case: str, text: str, message: str) -> None:
    with pytest.raises(Unreadable) as info:
        yaml_documents(text)
    assert str(info.value).startswith(message)


def test_input_a_2_kb_alias_bomb_is_refused_in_bounded_memory() -> None:
    bomb = alias_bomb()
    assert len(bomb) < 2048
    tracemalloc.start()
    try:
        with pytest.raises(Unreadable, match="more than 1000000 YAML nodes once aliases are expanded"):
            yaml_documents(bomb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 5 * 1024 * 1024


@pytest.mark.parametrize("case,data,message", cases(
    ("binary data", BINARY, "not a text file (a NUL byte at offset 7)"),
    ("a NUL byte in text", b"kind: Pod\x00\n", "not a text file (a NUL byte at offset 9)"),
    ("Latin-1 bytes", b"name: caf\xe9\n", "not UTF-8 text (invalid continuation byte at byte 9)"),
))
def test_input_bytes_that_are_not_text_are_unreadable(case: str, data: bytes, message: str, tmp_path: Path) -> None:
    path = tmp_path / "f.yaml"
    path.write_bytes(data)
    with pytest.raises(Unreadable) as info:
        read_text(path)
    assert str(info.value) == message


def test_input_a_file_over_the_size_limit_is_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_bytes(b"#" * 101)
    with pytest.raises(Unreadable, match="^larger than 100 bytes$"):
        read_text(path, limit=100)


# --- phalanx validate ------------------------------------------------------------------------


def test_validate_a_binary_file_exits_2_with_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "a.out"
    path.write_bytes(BINARY)
    assert run(capsys, "validate", str(path)) == (2, "", f"{path}: cannot read: not a text file (a NUL byte at "
                                                          "offset 7)\n")


def test_validate_the_same_bytes_on_stdin_exit_2_the_same_way(capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    stdin = io.TextIOWrapper(io.BytesIO(BINARY), encoding="utf-8", errors="surrogateescape")
    monkeypatch.setattr("sys.stdin", stdin)
    assert run(capsys, "validate", "-") == (2, "", "-: cannot read: not a text file (a NUL byte at offset 7)\n")


def test_validate_an_alias_bomb_exits_2_at_once(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb())
    code, out, err = run(capsys, "validate", str(path))
    assert (code, out) == (2, "")
    assert err.startswith(f"{path}: cannot read: line 7: more than 1000000 YAML nodes once aliases are expanded")


def _pod_with(**spec: object) -> str:
    import yaml

    body = {"schedulerName": "phalanx", "containers": [{"name": "app", "image": "i",
                                                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}], **spec}
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": body})


@pytest.mark.parametrize("case,text,code,err", cases(
    ("a JobSet whose replicatedJobs is an int", "kind: JobSet\nmetadata: {name: js}\nspec: {replicatedJobs: 5}\n", 1,
     "#1: INVALID JobSet/js:\n  - spec.replicatedJobs = '5': must be a list of replicated jobs\n"),
    ("a List whose items is an int", "kind: List\nitems: 5\n", 1,
     "#1: INVALID List (unnamed):\n  - items = '5': must be a list of objects\n"),
    ("a Pod whose initContainers is an int", _pod_with(initContainers=5), 1,
     "#1: INVALID Pod/p:\n  - spec.initContainers = '5': must be a list of containers\n"),
    ("a self-referencing List", "&l {kind: List, items: [*l]}\n", 2,
     ": cannot read: line 1: the alias *l refers to a structure that contains it (a self-referencing structure)\n"),
    ("a document that is a list, not an object", "- a\n- b\n", 1,
     "#1: INVALID: not a Kubernetes object (a list, not a mapping)\n"),
    ("a GPU count in Arabic-Indic digits", _pod_with().replace("'1'", "'٤'"), 1,
     "#1: INVALID Pod/p:\n  - spec.containers[app].resources.limits[nvidia.com/gpu] = '٤': a Kubernetes quantity "
     "is ASCII digits with an optional sign and decimal point and an optional suffix (Ki Mi Gi Ti Pi Ei, n u m k M "
     "G T P E, or an exponent such as e3); the API server rejects anything else\n"),
    ("a pod name with an escape sequence is printed escaped",
     _pod_with().replace("name: p", 'name: "p\\e[2J"'), 1,
     "#1: INVALID Pod/p\\x1b[2J:\n  - metadata.name = 'p\\x1b[2J': must be a DNS-1123 subdomain: at most 253 "
     "characters, lower-case ASCII letters, digits, '-' and '.', each part starting and ending with a letter or "
     "digit\n"),
))
def test_validate_malformed_documents_never_raise(case: str, text: str, code: int, err: str,
                                                  capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "in.yaml"
    path.write_text(text)
    assert run(capsys, "validate", str(path)) == (code, "", f"{path}{err}")


# --- phalanx topology show / place -----------------------------------------------------------


def test_topology_show_a_binary_file_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "topo.txt"
    path.write_bytes(BINARY)
    assert run(capsys, "topology", "show", str(path)) == (
        2, "", f"phalanx topology show: cannot read {path}: not a text file (a NUL byte at offset 7)\n")


@pytest.mark.parametrize("case,argv,err", cases(
    ("a range of 10^11 GPUs is refused before it is expanded", ["--free", "0-99999999999", "--count", "1"],
     "argument --free: GPU index '99999999999': must be at most 63: a GPU index is below 64 (no node has more GPUs)"),
    ("a GPU count in full-width digits is refused", ["--count", "８"],
     "argument --count: GPU count '８': must be a whole number written with ASCII digits 0-9 only"),
    ("10^20 GPUs are refused", ["--count", "100000000000000000000"],
     "argument --count: GPU count '100000000000000000000': must be at most 64: no node has more than 64 GPUs"),
))
def test_place_bad_flags_exit_2_naming_the_rule(case: str, argv: list[str], err: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["place", "--topology", str(V100), *argv])
    assert info.value.code == 2
    assert err in capsys.readouterr().err


def test_place_names_unknown_nics_in_free_nics(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["place", "--topology", str(V100), "--count", "2", "--rdma", "--free-nics", "mlx5_0,mlx5_9,ib7"]
    assert run(capsys, *argv) == (2, "", "phalanx place: --free-nics: unknown NIC(s) ib7, mlx5_9 on "
                                         "dgx1v-like_8xV100-SXM2_mlx5_oneflow (its NICs: mlx5_0)\n")


# --- phalanx up: cluster and workload files --------------------------------------------------


@pytest.mark.parametrize("case,content,error", cases(
    ("a scalar", b"42\n", Invalid),
    ("a list of integers", b"[1, 2, 3]\n", Invalid),
    ("binary garbage", BINARY, Unreadable),
    ("a node that is an integer", b"nodes: [5]\n", Invalid),
    ("a node name with emoji", "nodes: [{name: \"n\U0001f680\", topology: t.txt}]\n".encode(), Invalid),
    ("gpuMemoryMiB of 10^20", b"nodes: [{name: n, topology: t.txt, gpuMemoryMiB: 100000000000000000000}]\n", Invalid),
    ("an alias bomb", alias_bomb().encode(), Unreadable),
))
def test_up_cluster_file_errors_are_values(case: str, content: bytes, error: type, tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_bytes(content)
    with pytest.raises(error):
        ClusterFile.load(path)


@pytest.mark.parametrize("case,content,error", cases(
    ("a scalar", b"42\n", Invalid),
    ("a list of integers", b"[1, 2, 3]\n", Invalid),
    ("binary garbage", BINARY, Unreadable),
    ("a List whose items is an int", b"kind: List\nitems: 5\n", Invalid),
    ("a pod without a name", b"kind: Pod\nspec: {containers: [{name: a}]}\n", Invalid),
    ("a pod whose name is 200,000 characters", b"kind: Pod\nmetadata: {name: " + b"a" * 200_000 + b"}\n", Invalid),
    ("a pod whose spec is an int", b"kind: Pod\nmetadata: {name: p}\nspec: 5\n", Invalid),
))
def test_up_workload_file_errors_are_values(case: str, content: bytes, error: type, tmp_path: Path) -> None:
    path = tmp_path / "workload.yaml"
    path.write_bytes(content)
    with pytest.raises(error):
        load_workload(path)


@pytest.mark.parametrize("case,flag,content,code,err", cases(
    ("a cluster file that is a scalar exits 1", "--cluster-file", b"42\n", 1,
     "phalanx: {path}: Expected `object`, got `int`\n"),
    ("a cluster file of binary garbage exits 2", "--cluster-file", BINARY, 2,
     "phalanx: cannot read: cluster file {path}: not a text file (a NUL byte at offset 7)\n"),
    ("a workload of integers exits 1", "--workload", b"[1, 2]\n", 1,
     "phalanx: {path}#1: not a Kubernetes object (a list, not a mapping)\n"),
    ("a workload of binary garbage exits 2", "--workload", BINARY, 2,
     "phalanx: cannot read: workload file {path}: not a text file (a NUL byte at offset 7)\n"),
))
def test_up_refuses_bad_files_before_starting_anything(case: str, flag: str, content: bytes, code: int, err: str,
                                                        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "in.yaml"
    path.write_bytes(content)
    assert run(capsys, "up", flag, str(path)) == (code, "", err.format(path=path))


def test_up_a_bad_synthetic_spec_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "up", "--synthetic", "٤x8v100")
    assert (code, out) == (2, "")
    assert err.startswith("phalanx: --synthetic '٤x8v100': ") and err.count("\n") == 1
