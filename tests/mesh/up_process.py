"""`oms up` as a test runs it: a subprocess with its output read line by line, and
`oms demo` against it; `running_up`, a mesh serving for a block (the fixture
`running_mesh` in `tests/mesh/conftest.py`), with the tools run against it."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from services.infra.local_infra import LocalInfra

ROOT = Path(__file__).resolve().parents[2]
UP_TIMEOUT_S = 150.0  # embedded etcd and PostgreSQL made, every service serving
STOP_TIMEOUT_S = 60.0
TOOL_TIMEOUT_S = 60.0


def up_environment() -> dict[str, str]:
    """This process's environment without the settings `oms up` makes itself."""
    environment = {
        key: value
        for key, value in os.environ.items()
        if key not in ("OMS_ETCD_ENDPOINTS", "OMS_DATABASE_URL")
    }
    environment["PYTHONPATH"] = str(ROOT)
    return environment


def output_lines(process: subprocess.Popen[str]) -> queue.Queue[str]:
    """The process's output, each line as it comes (read by a thread of its own)."""
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        if process.stdout is None:
            return
        for line in process.stdout:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def wait_for_line(lines: queue.Queue[str], needle: str, seen: list[str], deadline_s: float) -> None:
    """Wait until a line holding `needle` is printed; `seen` keeps every line read."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            break
        seen.append(line)
        if needle in line:
            return
    raise AssertionError(f"{needle!r} not printed; output so far:\n{''.join(seen)}")


def run_demo(state_dir: Path, environment: dict[str, str]) -> str:
    """`oms demo` against the mesh of `state_dir`, checked; what it printed."""
    demo = subprocess.run(
        [sys.executable, "-m", "services.command_line", "demo", "--state-dir", str(state_dir)],
        check=False,
        capture_output=True,
        text=True,
        env=environment,
        cwd=ROOT,
        timeout=120,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "alice   update ORDER_STATUS_FILLED" in demo.stdout, demo.stdout
    assert "bob     update ORDER_STATUS_CANCELLED" in demo.stdout, demo.stdout
    return demo.stdout


@dataclass
class RunningMesh:
    """A mesh `oms up` runs in `state_dir` (its own embedded etcd and PostgreSQL, TLS: as
    `make run`), and the tools run against it as an operator runs them: `environment`
    names the folder (`OMS_STATE_DIR`), so a command needs no `--state-dir`."""

    state_dir: Path
    environment: dict[str, str]
    process: subprocess.Popen[str]
    lines: queue.Queue[str]
    seen: list[str] = field(default_factory=list)

    def oms(self, *arguments: str, timeout_s: float = TOOL_TIMEOUT_S) -> Ran:
        """`oms ARGUMENTS`, as a subprocess (the folder: `OMS_STATE_DIR`, or a flag given)."""
        return self._run([sys.executable, "-m", "services.command_line", *arguments], timeout_s)

    def omsctl(self, *arguments: str, timeout_s: float = TOOL_TIMEOUT_S) -> Ran:
        """`omsctl ARGUMENTS`, as a subprocess (the folder: `OMS_STATE_DIR`)."""
        return self._run([sys.executable, "-m", "services.routing.omsctl", *arguments], timeout_s)

    def _run(self, command: list[str], timeout_s: float) -> Ran:
        done = subprocess.run(
            command,
            check=False,
            capture_output=True,
            text=True,
            env=self.environment,
            cwd=ROOT,
            timeout=timeout_s,
        )
        return Ran(done.returncode, done.stdout, done.stderr)


@dataclass(frozen=True)
class Ran:
    """A tool's exit status and what it printed."""

    code: int
    out: str
    err: str

    @property
    def printed(self) -> str:
        return self.out + self.err


@contextlib.contextmanager
def running_up(state_dir: Path, *flags: str) -> Iterator[RunningMesh]:
    """`oms up FLAGS --state-dir STATE_DIR`, serving until the block ends; then Ctrl-C
    (SIGINT), and its etcd and PostgreSQL stopped whatever happened."""
    environment = up_environment()
    for name in ("OMS_STATE_DIR", "OMS_MESH_ID", "OMS_SHARDS", "OMS_GATEWAY_ADDRESS"):
        environment.pop(name, None)  # the tools find everything in the folder
    command = [sys.executable, "-m", "services.command_line", "up", *flags]
    process = subprocess.Popen(
        [*command, "--state-dir", str(state_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=environment,
        cwd=ROOT,
    )
    # The tools find the mesh with no flag, as from the folder where `oms up` runs.
    tools = {**environment, "OMS_STATE_DIR": str(state_dir)}
    mesh = RunningMesh(state_dir, tools, process, output_lines(process))
    try:
        wait_for_line(mesh.lines, "[mesh] all services serving", mesh.seen, UP_TIMEOUT_S)
        yield mesh
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        LocalInfra(state_dir).down()
