"""What the documents show is what the code does: every `oms` and `omsctl` line in a
fenced shell block parses with the real parsers, and every repository path named in
inline code exists (with the test or name after `::`, if any)."""

from __future__ import annotations

import ast
import contextlib
import io
import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

from services.command_line import build_parser
from services.routing.omsctl import parser as omsctl_parser
from tests.manual.docs_text import (
    ROOT,
    CommandLine,
    NamedPath,
    command_lines,
    documents,
    named_paths,
)


def _all_command_lines() -> list[CommandLine]:
    return [line for page in documents() for line in command_lines(page, ("oms", "omsctl"))]


def _all_named_paths() -> list[NamedPath]:
    return [named for page in documents() for named in named_paths(page)]


def _parse(words: tuple[str, ...]) -> str | None:
    """None if the line parses, else what the parser said."""
    program, *arguments = words
    parser = build_parser(arguments) if program == "oms" else omsctl_parser()
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(arguments)
    except SystemExit as stop:
        if stop.code not in (0, None):  # --help exits 0
            return said.getvalue().strip().splitlines()[-1]
    return None


def test_the_documents_show_commands() -> None:
    """The check below sees the documents' commands at all (a change to how fences are
    read must not make it vacuous)."""
    lines = _all_command_lines()
    assert len(lines) >= 20, [line.where() for line in lines]
    assert {line.words[0] for line in lines} == {"oms", "omsctl"}


def test_every_documented_command_line_parses() -> None:
    refused = []
    for line in _all_command_lines():
        said = _parse(line.words)
        if said is not None:
            refused.append(f"{line.where()}\n    {said}")
    assert not refused, "documented commands the parsers refuse:\n" + "\n".join(refused)


@cache
def _definitions(path: Path) -> dict[str, ast.AST]:
    tree = ast.parse(path.read_text())
    found: dict[str, ast.AST] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.setdefault(node.name, node)
    return found


def _member_exists(path: Path, member: tuple[str, ...]) -> bool:
    """`path::A::b`: a class or function A defined in the module, and b defined in A."""
    if not member:
        return True
    if path.suffix != ".py":
        return False
    name = member[0].split("[")[0]  # a parametrised id: test_x[case]
    node = _definitions(path).get(name)
    for inner in member[1:]:
        if node is None:
            return False
        inner_name = inner.split("[")[0]
        node = next(
            (
                child
                for child in ast.walk(node)
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                and child.name == inner_name
            ),
            None,
        )
    return node is not None


def test_the_documents_name_paths() -> None:
    assert len(_all_named_paths()) >= 50


def test_every_named_path_exists() -> None:
    missing = []
    for named in _all_named_paths():
        target = ROOT / named.path
        if not target.exists():
            missing.append(named.where())
        elif not _member_exists(target, named.member):
            missing.append(named.where() + "  (no such definition)")
    assert not missing, "paths named in the documents that do not exist:\n" + "\n".join(missing)


@pytest.mark.parametrize(
    "text",
    [
        "$ oms up --replicas 3",
        "$ .venv/bin/omsctl show",
        "$ OMS_API_KEY=k oms client balances | head",
    ],
)
def test_a_console_line_is_read_as_the_shell_would(text: str, tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"```console\n{text}\n```\n")
    [line] = list(command_lines(page, ("oms", "omsctl")))
    assert line.words[0] in ("oms", "omsctl")
    assert _parse(line.words) is None


def test_a_wrong_flag_is_caught(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```console\n$ oms up --replics 3\n$ omsctl shw\n```\n")
    lines = list(command_lines(page, ("oms", "omsctl")))
    assert [_parse(line.words) is not None for line in lines] == [True, True]


# How the project is being developed is told by CHANGELOG.md and the commit messages,
# never by the manual (its readers need what runs today).
PROCESS_TALK = (
    re.compile(r"\bissues? #?\d+", re.IGNORECASE),
    re.compile(r"\.\./shared"),
    re.compile(r"\bblocked on\b", re.IGNORECASE),
    re.compile(r"\bearlier (run|measurement)s?\b", re.IGNORECASE),
    re.compile(r"\b(this|last|previous|next) session\b", re.IGNORECASE),
    re.compile(r"\((?:measured |run )?(?:on )?20\d\d-\d\d-\d\d\)"),
)
_HEX = re.compile(r"(?<![\w-])[0-9a-f]{7,40}(?![\w-])")


def _commits_named(text: str) -> list[str]:
    """The tokens of `text` that name a commit of this repository (none without git)."""
    candidates = sorted({token for token in _HEX.findall(text) if re.search(r"[a-f]", token)})
    if not candidates or not (ROOT / ".git").exists():
        return []
    asked = subprocess.run(
        ["git", "cat-file", "--batch-check"],
        input="".join(f"{token}^{{commit}}\n" for token in candidates),
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    answers = asked.stdout.splitlines()
    return [
        token for token, answer in zip(candidates, answers, strict=False) if " commit " in answer
    ]


def test_the_documents_speak_of_what_runs_today() -> None:
    """No issue numbers, sessions, dated runs or links to the development notes; commit
    hashes only on the benchmark pages (the commit each figure was measured at)."""
    found = []
    for page in documents():
        text = page.read_text()
        name = str(page.relative_to(ROOT))
        for pattern in PROCESS_TALK:
            found += [f"{name}: {match.group(0)!r}" for match in pattern.finditer(text)]
        if not name.startswith("docs/benchmarks/"):
            found += [f"{name}: commit {commit}" for commit in _commits_named(text)]
    assert not found, "process talk in the documents:\n" + "\n".join(found)
