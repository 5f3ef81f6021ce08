"""`oms up` as a test runs it: a subprocess with its output read line by line, and
`oms demo` against it."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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
