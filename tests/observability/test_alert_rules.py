"""The alert rules checked by Debian's `promtool`: they parse, and each alert's unit tests
in `k8s/monitoring/oms-alerts.tests.yaml` pass (it fires on the series that should fire
it, stays quiet on healthy ones and while its `for:` runs). An alert added without a
firing case, a quiet case and, if it has a `for:`, a case showing it pending fails here.
The promtool tests skip, saying why, where promtool is not installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "k8s" / "monitoring" / "oms-alerts.rules.yaml"
RULE_TESTS = ROOT / "k8s" / "monitoring" / "oms-alerts.tests.yaml"
PROMTOOL = shutil.which("promtool")
PROMTOOL_TIMEOUT_S = 120

needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="no promtool on PATH: apt-get install prometheus (Debian), run as root by "
    "`make debian-packages` (part of `make install`)",
)


def _promtool(*arguments: str) -> subprocess.CompletedProcess[str]:
    """promtool run from the repository root (the tests file names its rules relative to
    itself, as promtool resolves them: the directory it runs in does not matter)."""
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *arguments],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        timeout=PROMTOOL_TIMEOUT_S,
    )


def _output(done: subprocess.CompletedProcess[str]) -> str:
    command = " ".join(done.args[1:])
    return f"promtool {command} exited {done.returncode}:\n{done.stdout}{done.stderr}"


def _alert_rules() -> dict[str, dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {rule["alert"]: rule for group in groups for rule in group["rules"] if "alert" in rule}


def _unit_tests() -> list[dict[str, Any]]:
    tests: list[dict[str, Any]] = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    return tests


@needs_promtool
def test_the_rules_parse() -> None:
    checked = _promtool("check", "rules", str(RULES.relative_to(ROOT)))
    assert checked.returncode == 0, _output(checked)
    assert "SUCCESS" in checked.stdout, _output(checked)


@needs_promtool
def test_each_alerts_unit_tests_pass() -> None:
    tested = _promtool("test", "rules", str(RULE_TESTS.relative_to(ROOT)))
    assert tested.returncode == 0, _output(tested)
    assert "SUCCESS" in tested.stdout, _output(tested)


def test_the_unit_tests_load_the_shipped_rules() -> None:
    rule_files = yaml.safe_load(RULE_TESTS.read_text())["rule_files"]
    assert [(RULE_TESTS.parent / name).resolve() for name in rule_files] == [RULES]


def test_every_alert_has_a_firing_case_and_a_quiet_one() -> None:
    alerts = _alert_rules()
    cases = [case for test in _unit_tests() for case in test.get("alert_rule_test", [])]
    firing = {case["alertname"] for case in cases if case.get("exp_alerts")}
    quiet = {case["alertname"] for case in cases if not case.get("exp_alerts")}
    names = set(alerts)
    assert names, "no alerts found"
    assert not names - firing, f"alerts never shown firing: {sorted(names - firing)}"
    assert not names - quiet, f"alerts never shown quiet: {sorted(names - quiet)}"
    assert not (firing | quiet) - names, f"tests name no alert: {sorted((firing | quiet) - names)}"


def test_each_firing_case_checks_the_alerts_labels_and_annotations() -> None:
    alerts = _alert_rules()
    for test in _unit_tests():
        for case in test.get("alert_rule_test", []):
            rule = alerts[case["alertname"]]
            for expected in case.get("exp_alerts") or []:
                where = f"{case['alertname']} at {case['eval_time']}"
                labels = expected.get("exp_labels", {})
                annotations = expected.get("exp_annotations", {})
                assert rule.get("labels", {}).items() <= labels.items(), where
                assert annotations.keys() == rule.get("annotations", {}).keys(), where


def test_every_alert_with_a_for_is_shown_pending() -> None:
    """promtool's `exp_alerts` lists only firing alerts: an alert is shown pending by an
    `ALERTS` expression test expecting it with `alertstate="pending"`."""
    waiting = {name for name, rule in _alert_rules().items() if "for" in rule}
    pending = {
        name
        for test in _unit_tests()
        for case in test.get("promql_expr_test", [])
        for sample in case.get("exp_samples") or []
        for name in waiting
        if 'alertstate="pending"' in sample["labels"] and f'alertname="{name}"' in sample["labels"]
    }
    assert waiting, "no alert has a for:"
    assert not waiting - pending, f"alerts never shown pending: {sorted(waiting - pending)}"
