"""The alert rules checked by Debian's `promtool`: they parse, and each alert's unit tests
in `k8s/monitoring/oms-alerts.tests.yaml` pass (it fires on the series that should fire
it, stays quiet on healthy ones and while its `for:` runs). An alert added without a
case of each kind fails here. Skipped, saying why, where promtool is not installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

MONITORING = Path(__file__).resolve().parents[2] / "k8s" / "monitoring"
RULES = MONITORING / "oms-alerts.rules.yaml"
RULE_TESTS = MONITORING / "oms-alerts.tests.yaml"
PROMTOOL = shutil.which("promtool")

needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="no promtool on PATH: apt-get install prometheus (Debian; `make install` "
    "does it where it runs as root)",
)


def _promtool(*arguments: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *arguments],
        capture_output=True,
        text=True,
        check=False,
        cwd=MONITORING,
        timeout=120,
    )


@needs_promtool
def test_the_rules_parse() -> None:
    checked = _promtool("check", "rules", RULES.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout


@needs_promtool
def test_each_alerts_unit_tests_pass() -> None:
    tested = _promtool("test", "rules", RULE_TESTS.name)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_alert_has_a_firing_case_and_a_quiet_one() -> None:
    rules = yaml.safe_load(RULES.read_text())
    alerts = {rule["alert"] for group in rules["groups"] for rule in group["rules"]}
    cases: list[dict[str, Any]] = [
        case
        for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    ]
    firing = {case["alertname"] for case in cases if case.get("exp_alerts")}
    quiet = {case["alertname"] for case in cases if not case.get("exp_alerts")}
    assert alerts, "no alerts found"
    assert not alerts - firing, f"alerts never shown firing: {sorted(alerts - firing)}"
    assert not alerts - quiet, f"alerts never shown quiet: {sorted(alerts - quiet)}"
    assert not (firing | quiet) - alerts, "tests name alerts that do not exist"
