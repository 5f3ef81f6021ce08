"""The guarantee map (docs/development/guarantees.md) names only tests that exist.

The page is a set of tables, each with the header `| Guarantee | Proved by |` (the
format is also written in an HTML comment at the top of the page). Each row is one
guarantee: its first cell says it; its second cell is either one to four tests
separated by `<br>`, each opening with its reference in backticks
(`tests/<path>.py::<function>`, or `tests/<path>.py::<Class>::<method>`) and
optionally followed by `: ` and a few words, or `no test` and why, naming no test.

A reference holds when its file exists, lies where pytest collects (under the
`testpaths` of pyproject.toml, named by its `python_files` patterns), and defines
that test function (or that class with that method), read with `ast`: a name
in a comment or a string is not a definition.
"""

from __future__ import annotations

import ast
import fnmatch
import re
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "development" / "guarantees.md"
HEADER = ("Guarantee", "Proved by")
MAX_TESTS = 4
NO_TEST = "no test"

_SEPARATOR = re.compile(r"^\|\s*:?-{3,}:?\s*\|\s*:?-{3,}:?\s*\|$")
# Any reference to a test, wherever it is in a cell.
_REFERENCE = re.compile(r"`(tests/[^`\s]*::[^`\s]*)`")
# One entry of the tests cell: the reference first, then optionally ": words".
_ENTRY = re.compile(r"^`(tests/[^`\s]*::[^`\s]*)`(?:: \S.*)?$")
_TARGET = re.compile(r"^(tests/[\w/]+\.py)::(\w+)(?:::(\w+))?$")


class MapFormatError(Exception):
    """A line of the page breaks the map's format."""


@dataclass(frozen=True)
class Guarantee:
    line: int
    text: str
    tests: tuple[str, ...]  # the references, in the page's order; empty when untested
    reason_untested: str  # what follows "no test", when it is untested


def _cells(line: str, number: int) -> tuple[str, str]:
    stripped = line.strip()
    if not stripped.endswith("|"):
        raise MapFormatError(f"line {number}: a table row must end with '|'")
    cells = [cell.strip() for cell in stripped[1:-1].split("|")]
    if len(cells) != len(HEADER):
        raise MapFormatError(
            f"line {number}: {len(cells)} cells, expected {len(HEADER)} (a '|' in the text?)"
        )
    return cells[0], cells[1]


def _guarantee(line: str, number: int) -> Guarantee:
    text, proof = _cells(line, number)
    if not text:
        raise MapFormatError(f"line {number}: the guarantee's cell is empty")
    if proof.startswith(NO_TEST):
        if _REFERENCE.search(proof):
            raise MapFormatError(f"line {number}: a 'no test' row names a test")
        return Guarantee(number, text, (), proof[len(NO_TEST) :].strip(" :,."))
    if not proof:
        raise MapFormatError(f"line {number}: names no test and does not say 'no test'")
    entries = [entry.strip() for entry in proof.split("<br>")]
    if len(entries) > MAX_TESTS:
        raise MapFormatError(f"line {number}: {len(entries)} tests, at most {MAX_TESTS}")
    tests: list[str] = []
    for entry in entries:
        match = _ENTRY.match(entry)
        if match is None:
            raise MapFormatError(
                f"line {number}: {entry!r} does not open with a test reference in backticks"
            )
        tests.append(match.group(1))
    # A reference inside an entry's words is checked as well.
    named = _REFERENCE.findall(proof)
    return Guarantee(number, text, tuple(dict.fromkeys([*tests, *named])), "")


def parse_map(text: str) -> list[Guarantee]:
    """Every guarantee row of the page, in order; MapFormatError at the first break."""
    guarantees: list[Guarantee] = []
    lines = text.splitlines()
    in_table = False
    index = 0
    while index < len(lines):
        line = lines[index]
        number = index + 1
        if not line.lstrip().startswith("|"):
            in_table = False
            index += 1
            continue
        if not in_table:
            if _cells(line, number) != HEADER:
                raise MapFormatError(f"line {number}: a table's header must be {HEADER}")
            if index + 1 >= len(lines) or not _SEPARATOR.match(lines[index + 1].strip()):
                raise MapFormatError(f"line {number + 1}: the header's separator row is missing")
            in_table = True
            index += 2
            continue
        guarantees.append(_guarantee(line, number))
        index += 1
    return guarantees


@cache
def _pytest_collection() -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], str]:
    """testpaths, python_files, python_classes and the python_functions prefix, from
    pyproject.toml, with pytest's defaults for what it leaves out."""
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    testpaths = tuple(options.get("testpaths", ["."]))
    files = tuple(options.get("python_files", ["test_*.py", "*_test.py"]))
    classes = tuple(options.get("python_classes", ["Test"]))
    functions = tuple(options.get("python_functions", ["test"]))
    assert len(functions) == 1 and "*" not in functions[0], "a function prefix, as pytest's"
    return testpaths, files, classes, functions[0]


@cache
def _definitions(path: Path) -> dict[str, frozenset[str]]:
    """Top-level functions (to an empty set) and classes (to their methods) of a module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: dict[str, frozenset[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found[node.name] = frozenset()
        elif isinstance(node, ast.ClassDef):
            found[node.name] = frozenset(
                item.name
                for item in node.body
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
            )
    return found


def reference_problem(reference: str, root: Path = ROOT) -> str | None:
    """Why `reference` names no test pytest collects, or None when it does."""
    match = _TARGET.match(reference)
    if match is None:
        return "not tests/<path>.py::<function> nor tests/<path>.py::<Class>::<method>"
    relative, first, second = match.groups()
    path = root / relative
    if not path.is_file():
        return f"{relative} does not exist"
    testpaths, files, classes, prefix = _pytest_collection()
    if not any(Path(relative).is_relative_to(folder) for folder in testpaths):
        return f"{relative} is outside pytest's testpaths {testpaths}"
    if not any(fnmatch.fnmatch(path.name, pattern) for pattern in files):
        return f"{path.name} matches none of pytest's python_files {files}"
    definitions = _definitions(path)
    if first not in definitions:
        return f"{relative} defines no {first}"
    if second is None:
        if definitions[first] or not first.startswith(prefix):
            return f"{first} is not a test function of {relative}"
        return None
    if not any(first.startswith(name) for name in classes):
        return f"{first} is not a test class by pytest's python_classes {classes}"
    if second not in definitions[first] or not second.startswith(prefix):
        return f"{first} in {relative} has no test method {second}"
    return None


def test_the_page_is_a_map_of_many_guarantees() -> None:
    guarantees = parse_map(PAGE.read_text())
    assert len(guarantees) >= 60, f"only {len(guarantees)} guarantee rows were read"
    assert sum(len(guarantee.tests) for guarantee in guarantees) >= 150


def test_every_guarantee_names_a_test_or_says_why_it_has_none() -> None:
    for guarantee in parse_map(PAGE.read_text()):
        if not guarantee.tests:
            assert guarantee.reason_untested, f"line {guarantee.line}: 'no test' says not why"


def test_every_named_test_exists_where_pytest_collects_it() -> None:
    problems = [
        f"line {guarantee.line}: `{reference}`: {problem}"
        for guarantee in parse_map(PAGE.read_text())
        for reference in guarantee.tests
        if (problem := reference_problem(reference)) is not None
    ]
    assert not problems, "\n".join(problems)


_GOOD_TABLE = (
    "| Guarantee | Proved by |\n"
    "| --- | --- |\n"
    "| Retries are safe. | `tests/gateway/test_orders.py::test_status_counts_requests`: how |\n"
    "| Nobody looked. | no test: the reason |\n"
)


@pytest.mark.parametrize(
    ("page", "complaint"),
    [
        (_GOOD_TABLE.replace("Proved by", "Tests"), "header"),
        (_GOOD_TABLE.replace("| --- | --- |\n", ""), "separator"),
        (_GOOD_TABLE.replace("no test: the reason", ""), "does not say 'no test'"),
        (
            _GOOD_TABLE.replace("`tests/gateway", "tests/gateway").replace("s`: how", "s: how"),
            "open with",
        ),
        (_GOOD_TABLE.replace("the reason", "see `tests/gateway/test_orders.py::test_x`"), "names"),
        (_GOOD_TABLE.replace("Retries are safe.", "Retries | safe."), "cells"),
        (
            _GOOD_TABLE.replace(
                ": how |", "<br>" + "<br>".join(["`tests/a.py::test_a`"] * MAX_TESTS) + " |"
            ),
            "at most",
        ),
    ],
)
def test_the_parser_refuses_a_page_that_breaks_the_format(page: str, complaint: str) -> None:
    assert len(parse_map(_GOOD_TABLE)) == 2
    with pytest.raises(MapFormatError, match=complaint):
        parse_map(page)


@pytest.mark.parametrize(
    ("reference", "complaint"),
    [
        ("tests/gateway/test_orders.py::test_status_counts_requests", None),
        ("tests/gateway/test_nothing_here.py::test_x", "does not exist"),
        ("tests/gateway/test_orders.py::test_that_was_never_written", "defines no"),
        ("tests/gateway/test_orders.py::open_account", "defines no"),
        ("tests/gateway/accounts.py::open_account", "python_files"),
        ("tests/gateway/test_orders.py::test_a::b::c", "not tests/"),
        ("services/shard/core/actor.py::test_x", "not tests/"),
    ],
)
def test_a_reference_holds_only_for_a_collected_test(reference: str, complaint: str | None) -> None:
    problem = reference_problem(reference)
    if complaint is None:
        assert problem is None, problem
    else:
        assert problem is not None and complaint in problem, problem


def test_a_test_is_read_from_the_syntax_tree_not_the_text(tmp_path: Path) -> None:
    module = tmp_path / "tests" / "test_sample.py"
    module.parent.mkdir()
    module.write_text(
        '"""def test_in_a_docstring(): it is no test."""\n'
        "# def test_in_a_comment(): neither\n"
        "def helper() -> None: ...\n"
        "async def test_real() -> None: ...\n"
        "class TestGroup:\n"
        "    def test_method(self) -> None: ...\n"
    )
    ok = "tests/test_sample.py::test_real"
    assert reference_problem(ok, tmp_path) is None
    assert reference_problem("tests/test_sample.py::TestGroup::test_method", tmp_path) is None
    for absent in ("test_in_a_docstring", "test_in_a_comment", "TestGroup::test_other"):
        assert reference_problem(f"tests/test_sample.py::{absent}", tmp_path) is not None
    assert "not a test function" in str(reference_problem("tests/test_sample.py::helper", tmp_path))
