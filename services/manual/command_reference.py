"""`docs/reference/commands.md`: every `oms` and `omsctl` command, from their argparse
parsers (`services.command_line.build_parser`, `services.routing.omsctl.parser`).

Each command, at every depth, gets its usage line, its description and a table of its
arguments (with their defaults and help). The page is grouped by task as `oms --help`
is (`COMMAND_GROUPS`). Whatever the terminal, the text is formatted `WIDTH` columns
wide, so the page is the same on every machine; usage lines are argparse's, as the
Python of `make install` (3.11) formats them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from services.command_line import COMMAND_GROUPS, build_parser
from services.manual.markdown import cell, code, generated_note, table
from services.manual.settings_help import listed_settings, resolve
from services.manual.settings_reference import SECTIONS
from services.routing.omsctl import parser as omsctl_parser

PAGE = Path("docs/reference/commands.md")
WIDTH = 100  # columns of the usage lines and of `--help` shown on the page

_INTRO = """\
`oms` runs every service and tool of the mesh; `omsctl` changes the routing document in
etcd (which shard cluster owns which users) and moves users between clusters. Every
command also takes `-h` / `--help`, which prints what this page shows for it; a
service's `--help` ends with the environment variables it reads
([settings](settings.md))."""


@contextlib.contextmanager
def fixed_width(columns: int = WIDTH) -> Iterator[None]:
    """argparse sizes its text by the terminal (`COLUMNS`, through shutil): fix it."""
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(columns)
    try:
        yield
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction[Any] | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def _one_line_helps(action: argparse._SubParsersAction[Any]) -> dict[str, str]:
    return {entry.dest: entry.help or "" for entry in action._choices_actions}


def _anchor(prog: str) -> str:
    return "-".join(prog.split())


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(parser.prog, width=WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip("\n")


def _default(action: argparse.Action) -> str:
    value = action.default
    if value is None or value is argparse.SUPPRESS or value is False or value == []:
        return ""
    if action.nargs == 0:  # store_true and friends: the flag's presence is the value
        return ""
    if isinstance(value, Path):
        value = value.as_posix()
    return code(str(value))


def _arguments(parser: argparse.ArgumentParser) -> list[list[str]]:
    formatter = argparse.HelpFormatter(parser.prog, width=WIDTH)
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        if action.help is argparse.SUPPRESS:
            continue
        invocation = formatter._format_action_invocation(action)
        meaning = cell(formatter._expand_help(action)) if action.help else ""
        if action.option_strings and action.choices is not None and action.nargs != 0:
            # A flag's choices in its meaning: in its name they make one long word.
            metavar = action.metavar or action.dest.upper()
            invocation = f"{', '.join(action.option_strings)} {metavar}"
            choices = ", ".join(f"`{choice}`" for choice in action.choices)
            meaning = f"{meaning} (one of {choices})" if meaning else f"one of {choices}"
        if action.required and action.option_strings:
            meaning = f"required; {meaning}" if meaning else "required"
        rows.append([code(invocation), _default(action), meaning])
    return rows


def _description(parser: argparse.ArgumentParser) -> list[str]:
    description = parser.description
    if not description:
        return []
    if parser.formatter_class in (
        argparse.RawDescriptionHelpFormatter,
        argparse.RawTextHelpFormatter,
    ):
        return ["```text", description.strip("\n"), "```", ""]
    return [cell(description), ""]


def _settings_line(parser: argparse.ArgumentParser) -> list[str]:
    sources = listed_settings(parser)
    if not sources:
        return []
    anchors = {resolve(section.source): section for section in SECTIONS}
    links = [
        f"[{anchors[resolve(source)].title}](settings.md#{anchors[resolve(source)].anchor})"
        for source in sources
    ]
    return [f"Environment variables: {', '.join(links)} (listed at the end of its `--help`).", ""]


def _command(
    parser: argparse.ArgumentParser, one_line: str, depth_headings: str = "###"
) -> list[str]:
    """The section of one command, then those of its subcommands."""
    lines = [f"{depth_headings} {parser.prog} {{#{_anchor(parser.prog)}}}", ""]
    if one_line:
        lines += [cell(one_line[:1].upper() + one_line[1:]) + ".", ""]
    lines += _description(parser)
    lines += ["```text", _usage(parser), "```", ""]
    arguments = _arguments(parser)
    if arguments:
        lines += [*table(("Argument", "Default", "Meaning"), arguments), ""]
    lines += _settings_line(parser)
    action = _subcommands(parser)
    if action is None:
        return lines
    helps = _one_line_helps(action)
    children: dict[str, argparse.ArgumentParser] = {}
    for name, child in action.choices.items():
        children.setdefault(name, child)  # an alias names the same parser again
    lines += [
        *table(
            ("Subcommand", "What it does"),
            [
                [f"[`{name}`](#{_anchor(child.prog)})", cell(helps.get(name, ""))]
                for name, child in children.items()
            ],
        ),
        "",
    ]
    for name, child in children.items():
        lines += _command(child, helps.get(name, ""), depth_headings)
    return lines


def _help_block(parser: argparse.ArgumentParser) -> list[str]:
    return ["```text", parser.format_help().rstrip("\n"), "```", ""]


def render() -> str:
    with fixed_width():
        oms = build_parser([])
        omsctl = omsctl_parser()
        oms_help = _help_block(oms)
        oms_commands = _subcommands(oms)
        assert oms_commands is not None
        helps = _one_line_helps(oms_commands)
        lines = [
            generated_note(
                "services/manual/command_reference.py",
                "the argparse parsers of `services/command_line.py` (every subcommand's"
                " `register`) and `services/routing/omsctl.py`",
            ),
            "# Commands",
            "",
            _INTRO,
            "",
            "## oms",
            "",
            "`oms --help` lists the commands by task, as this page does:",
            "",
            *oms_help,
        ]
        for heading, description, names in COMMAND_GROUPS:
            lines += [f"## {heading[:1].upper()}{heading[1:]}", ""]
            if description:
                lines += [cell(description), ""]
            for name in names:
                lines += _command(oms_commands.choices[name], helps[name])
        lines += [
            "## omsctl",
            "",
            *_command(omsctl, "", "###")[2:],
        ]
    return "\n".join(lines).rstrip("\n") + "\n"
