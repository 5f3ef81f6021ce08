#!/usr/bin/env python3.11
"""The suite's flake rate as a measured figure: `make test` N times, each on a fresh clone.

    .ci/suite_runs.py [-n N] [--repo PATH] [--ref REF] [--log-dir DIR]

Each run clones REF (default: HEAD of the repository this script is in) into a new
temporary folder, runs the README's test command there (`make test`, with pytest's
JUnit report added through PYTEST_ADDOPTS), and reports its exit status, its time and
every test that failed or errored, by name. The summary counts the failed runs and
each failing test across runs, so "fails one time in five" is a number, not a memory.
Runs are sequential: the suite is sized for two cores, and two at once would measure
the machine, not the tests. Standard library only; a clone is removed after its run
(its log and report stay in --log-dir).
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from xml.etree import ElementTree

HERE = Path(__file__).resolve().parent.parent


@dataclass
class SuiteRun:
    number: int
    exit_status: int
    seconds: float
    tests: int = 0
    failed: list[str] = field(default_factory=list)  # "path::name: first line of why"


def failures_of(report: Path) -> tuple[int, list[str]]:
    """(tests run, each failed or errored test with the first line of why) from JUnit XML."""
    if not report.exists():
        return 0, []
    root = ElementTree.parse(report).getroot()
    tests, failed = 0, []
    for case in root.iter("testcase"):
        tests += 1
        for outcome in ("failure", "error"):
            problem = case.find(outcome)
            if problem is not None:
                why = (problem.get("message") or "").strip().splitlines()
                name = f"{case.get('classname', '')}::{case.get('name', '')}"
                failed.append(f"{name}: {why[0][:160] if why else outcome}")
    return tests, failed


def run_once(number: int, repo: Path, ref: str, log_dir: Path) -> SuiteRun:
    clone = Path(tempfile.mkdtemp(prefix=f"suite-run-{number}-"))
    log = log_dir / f"run-{number}.log"
    report = log_dir / f"run-{number}.xml"
    started = time.monotonic()
    try:
        subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
        subprocess.run(["git", "-C", str(clone), "checkout", "-q", ref], check=True)
        environment = {**os.environ, "PYTEST_ADDOPTS": f"--junitxml={report}"}
        with log.open("w") as output:
            done = subprocess.run(
                ["make", "test"], cwd=clone, stdout=output, stderr=subprocess.STDOUT,
                env=environment, check=False,
            )  # fmt: skip
    finally:
        shutil.rmtree(clone, ignore_errors=True)
    tests, failed = failures_of(report)
    return SuiteRun(number, done.returncode, time.monotonic() - started, tests, failed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=3, help="runs (default 3)")
    parser.add_argument("--repo", type=Path, default=HERE, help="the repository to clone")
    parser.add_argument("--ref", default="", help="what to check out (default: its HEAD)")
    parser.add_argument("--log-dir", type=Path, default=None, help="each run's log and report")
    arguments = parser.parse_args()
    ref = arguments.ref or subprocess.run(
        ["git", "-C", str(arguments.repo), "rev-parse", "HEAD"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    log_dir = arguments.log_dir or Path(tempfile.mkdtemp(prefix="suite-runs-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    print(f"{arguments.n} run(s) of `make test` on fresh clones of {ref[:12]}; logs in {log_dir}")
    runs = []
    for number in range(1, arguments.n + 1):
        run = run_once(number, arguments.repo, ref, log_dir)
        runs.append(run)
        verdict = "passed" if run.exit_status == 0 else f"FAILED (exit {run.exit_status})"
        print(f"run {number}: {verdict}, {run.tests} tests, {run.seconds:.0f} s", flush=True)
        for failure in run.failed:
            print(f"  {failure}", flush=True)
    failed_runs = [run for run in runs if run.exit_status != 0]
    by_test = collections.Counter(f.split(": ", 1)[0] for run in runs for f in run.failed)
    print(f"{len(failed_runs)} of {len(runs)} run(s) failed")
    for name, count in by_test.most_common():
        print(f"  {count} of {len(runs)}: {name}")
    return 1 if failed_runs else 0


if __name__ == "__main__":
    sys.exit(main())
