"""The getting-started page, run as a newcomer would: its "Quick start" (`oms up`, then
`oms demo` and `oms status` in a second terminal) and its "Trade from a terminal"
lines, each as written, in a fresh folder; the key its `keys create` prints fills the
page's `<...>` placeholders."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from services.infra.local_infra import LocalInfra
from tests.manual.docs_text import ROOT
from tests.mesh.up_process import output_lines, up_environment, wait_for_line

PAGE = ROOT / "docs" / "getting-started.md"
OMS = ".venv/bin/oms"


def console_lines(section: str) -> list[str]:
    """The `$ ` lines of the console blocks under the page's `## <section>` heading."""
    text = PAGE.read_text()
    start = text.index(f"\n## {section}\n")
    end = text.find("\n## ", start + 1)
    body = text[start : end if end >= 0 else len(text)]
    lines: list[str] = []
    inside = False
    for line in body.splitlines():
        if line.startswith("```"):
            inside = not inside and line.strip() == "```console"
            continue
        if inside and line.startswith("$ "):
            lines.append(line[2:].split("  #")[0].strip())
    return lines


def _oms_command(line: str) -> list[str]:
    words = shlex.split(line)
    assert words[0] == OMS, line
    return [sys.executable, "-m", "services.command_line", *words[1:]]


def _run(line: str, environment: dict[str, str], folder: Path) -> str:
    done = subprocess.run(
        _oms_command(line),
        check=False,
        capture_output=True,
        text=True,
        env=environment,
        cwd=folder,
        timeout=180,
    )
    assert done.returncode == 0, f"{line}\n{done.stdout}{done.stderr}"
    assert "Traceback" not in done.stderr, done.stderr
    return done.stdout


def _exported(line: str, values: dict[str, str]) -> dict[str, str]:
    """`export A=1 B=<...>`: the assignments, placeholders replaced from `values`."""
    assignments: dict[str, str] = {}
    for word in shlex.split(line)[1:]:
        name, _, value = word.partition("=")
        if value.startswith("<"):
            value = values[name]
        assignments[name] = value
    return assignments


def test_the_quick_start_is_the_three_commands() -> None:
    assert console_lines("Quick start") == [f"{OMS} up", f"{OMS} demo", f"{OMS} status"]


@pytest.mark.slow
def test_a_newcomer_runs_the_quick_start_and_trades(tmp_path: Path) -> None:
    folder = tmp_path / "clone"
    folder.mkdir()
    # A newcomer's shell: none of the mesh's settings.
    environment = {k: v for k, v in up_environment().items() if not k.startswith("OMS_")}
    up_line, demo_line, status_line = console_lines("Quick start")
    process = subprocess.Popen(
        _oms_command(up_line),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=environment,
        cwd=folder,
        start_new_session=True,
    )
    seen: list[str] = []
    try:
        lines = output_lines(process)
        # What the page tells the reader to wait for.
        wait_for_line(lines, "[mesh] ready", seen, 180)
        shown = _run(demo_line, environment, folder)
        assert "alice   update ORDER_STATUS_FILLED" in shown, shown
        assert "bob     update ORDER_STATUS_CANCELLED" in shown, shown
        table = _run(status_line, environment, folder)
        assert re.search(r"(\d+) of \1 processes answered", table), table

        values: dict[str, str] = {}
        for line in console_lines("Trade from a terminal"):
            if line.startswith("export "):
                environment.update(_exported(line, values))
                continue
            said = _run(line, environment, folder)
            if " keys create" in line:
                values["OMS_API_KEY"] = re.search(r"\b(ak_\w+)", said).group(1)  # type: ignore[union-attr]
                values["OMS_API_SECRET"] = said.split("secret (shown once):")[1].split()[0]
            if " place " in line:
                assert "accepted" in said and "my-first" in said, said
            if line.endswith((" orders", " history")):
                # Open, or already cancelled: the cancel's answer means "on its way".
                assert "my-first" in said, said
        assert values, "the page's keys create line was not run"
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        LocalInfra(folder / "state").down()
