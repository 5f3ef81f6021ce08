"""`oms --help` groups the subcommands by task and names omsctl; each service's
`--help` ends with every environment variable its settings class reads."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from services.command_line import COMMAND_GROUPS, SUBCOMMANDS, build_parser
from services.manual.settings_help import resolve, settings_of
from services.routing.omsctl import parser as omsctl_parser

ROOT = Path(__file__).resolve().parents[2]

# subcommand -> the settings classes its --help lists in full
SERVICE_SETTINGS = {
    "gateway": ("gateway.settings:GatewaySettings",),
    "shard": ("services.shard.settings:ShardServiceSettings",),
    "matcher": ("services.matcher.settings:MatcherServiceSettings",),
    "persister": ("persister.settings:PersisterSettings",),
    "bridge": ("bridge.settings:BridgeSettings",),
    "reconciler": ("services.reconciler.settings:ReconcilerSettings",),
    "infra": ("services.infra.settings:InfraSettings",),
    "operator": ("k8s.operator.handlers:OperatorSettings",),
    "client": ("gateway.settings:ClientSettings",),
    "etcd-access": ("services.coordination.access_command:AccessSettings",),
}


def subcommand(name: str) -> argparse.ArgumentParser:
    parser = build_parser([name])
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    chosen: argparse.ArgumentParser = action.choices[name]
    return chosen


def test_every_subcommand_is_in_exactly_one_group() -> None:
    grouped = [name for _, _, names in COMMAND_GROUPS for name in names]
    assert sorted(grouped) == sorted(name for name, _ in SUBCOMMANDS)
    assert len(grouped) == len(set(grouped))


def test_oms_help_lists_the_commands_by_task_and_names_omsctl(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    text = build_parser([]).format_help()
    assert "omsctl" in text
    sections = {}
    for heading, _, names in COMMAND_GROUPS:
        start = text.index(f"\n{heading}:\n")
        sections[heading] = (start, names)
    starts = sorted(start for start, _ in sections.values())
    for heading, (start, names) in sections.items():
        following = [s for s in starts if s > start]
        body = text[start : following[0] if following else len(text)]
        for name in names:
            assert f"\n  {name} " in body, (heading, name)
    assert "positional arguments" not in text  # each command once, under its task


def test_the_grouped_help_still_parses_every_subcommand() -> None:
    parser = build_parser(["infra", "status"])
    assert parser.parse_args(["infra", "status"]).command == "infra"


@pytest.mark.parametrize("name", sorted(SERVICE_SETTINGS))
def test_a_service_help_lists_every_variable_it_reads(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    text = subcommand(name).format_help()
    for source in SERVICE_SETTINGS[name]:
        for described in settings_of(source):
            assert f"\n  {described.env} (default: " in text, (name, described.env)
    assert "docs/reference/settings.md" in text


def test_omsctl_help_lists_its_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    text = omsctl_parser().format_help()
    for described in settings_of(resolve("services.routing.omsctl:OmsctlSettings")):
        assert f"\n  {described.env} (default: " in text


def test_a_usage_error_shows_no_settings(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        subcommand("gateway").parse_args(["--no-such-flag"])
    assert "OMS_GATEWAY_LISTEN" not in capsys.readouterr().err


def test_the_operator_registers_without_kopf() -> None:
    """Its settings live beside kopf: they are imported only when its help is shown."""
    script = (
        "import sys\n"
        "from services.command_line import build_parser\n"
        "build_parser(['operator'])\n"
        "print('kopf' in sys.modules)\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert loaded.stdout.strip() == "False"
