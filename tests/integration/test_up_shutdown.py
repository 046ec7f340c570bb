"""``phalanx up`` as systemd, ``timeout`` and CI stop it: SIGTERM stops every process of the
stack and removes its temp dir; a killed nats-server is restarted on the same store; even a
``kill -9`` of ``up`` leaves no orphan (real processes, real nats-server)."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


class Up:
    """``phalanx up`` in a subprocess whose temp dirs go under ``tmp``; stderr read by a thread."""

    def __init__(self, tmp: Path) -> None:
        env = {**os.environ, "TMPDIR": str(tmp)}
        self.tmp = tmp
        self.proc = subprocess.Popen([sys.executable, "-m", "phalanx_cli.main", "up"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=env)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.put(line)

    def wait_for(self, text: str, timeout: float = 180) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1)
            except queue.Empty:
                assert self.proc.poll() is None, f"phalanx up exited with {self.proc.returncode}: {self.seen}"
                continue
            self.seen.append(line)
            if text in line:
                return line
        raise AssertionError(f"no line with {text!r} within {timeout}s: {self.seen}")

    def exit_code(self, timeout: float) -> int | None:
        """The exit code, or None (with what it printed so far) if it has not exited in time."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            while not self.lines.empty():
                self.seen.append(self.lines.get())
            print("phalanx up did not exit; it printed:", *self.seen, sep="\n", file=sys.stderr)
            return None

    def descendants(self) -> set[int]:
        return descendants(self.proc.pid)

    def stack_dirs(self) -> list[Path]:
        return sorted(self.tmp.glob("phalanx-stack-*"))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


def descendants(root: int) -> set[int]:
    """Every live process below ``root`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


def alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped, does not count)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def wait_gone(pids: set[int], timeout: float = 60) -> set[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.2)
    return {p for p in pids if alive(p)}


def nats_pid(pids: set[int]) -> int:
    found = [p for p in pids if Path(f"/proc/{p}/comm").read_text().strip() == "nats-server"]
    assert len(found) == 1, found
    return found[0]


def test_up_restarts_a_dead_nats_server_and_sigterm_leaves_no_process_and_no_temp_dir(tmp_path: Path) -> None:
    up = Up(tmp_path)
    try:
        up.wait_for("ready in")
        stack = up.descendants()
        assert len(stack) == 8  # nats-server + 2 nodes x 2 agents + placement, binder, gang-coordinator
        assert len(up.stack_dirs()) == 1
        old_nats = nats_pid(stack)
        os.kill(old_nats, signal.SIGKILL)
        up.wait_for("nats-server exited with code -9; restarting it on the same store")
        up.wait_for("nats-server restarted")
        stack = up.descendants()
        assert nats_pid(stack) != old_nats and len(stack) == 8
        up.proc.send_signal(signal.SIGTERM)
        assert up.exit_code(120) == 0
        up.wait_for("stopped 7 services")
        assert wait_gone(stack | up.descendants()) == set()
        assert up.stack_dirs() == []
    finally:
        up.kill()


def test_a_killed_up_takes_its_children_with_it(tmp_path: Path) -> None:
    up = Up(tmp_path)
    stack: set[int] = set()
    try:
        up.wait_for("ready in")
        stack = up.descendants()
        assert len(stack) == 8
        up.proc.kill()
        up.proc.wait(30)
        assert wait_gone(stack) == set()
    finally:
        up.kill()
        for pid in stack:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
