"""`.ci/suite_runs.py` reads each run's JUnit report: every failed or errored test, by
name, with the first line of why, and how many ran."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[1] / ".ci" / "suite_runs.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("suite_runs", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_failures_are_read_from_the_junit_report(tmp_path: Path) -> None:
    report = tmp_path / "run.xml"
    report.write_text(
        """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="3">
<testcase classname="tests.a" name="test_fine" time="0.1"/>
<testcase classname="tests.b" name="test_flaky" time="2.0">
<failure message="AssertionError: late by 3 s&#10;more">trace</failure></testcase>
<testcase classname="tests.c" name="test_setup" time="0.0">
<error message="fixture failed">trace</error></testcase>
</testsuite></testsuites>"""
    )
    tests, failed = _script().failures_of(report)
    assert tests == 3
    assert failed == [
        "tests.b::test_flaky: AssertionError: late by 3 s",
        "tests.c::test_setup: fixture failed",
    ]
    assert _script().failures_of(tmp_path / "missing.xml") == (0, [])
