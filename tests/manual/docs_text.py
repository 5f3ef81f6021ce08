"""The documents' text as the checks read it: which files are documents, their fenced
command lines, and the repository paths they name in inline code."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The CHANGELOG is history: it may name what no longer exists.
TOP_LEVEL_DOCUMENTS = ("README.md", "ARCHITECTURE.md", "tests/README.md", "k8s/README.md")

# Folders and files of the repository a document may name in backticks.
PATH_ROOTS = (
    "services/",
    "gateway/",
    "bridge/",
    "persister/",
    "k8s/",
    "auditor/",
    "simulation/",
    "tests/",
    "protos/",
    "docs/",
    ".ci/",
)
TOP_LEVEL_FILES = (
    "Makefile",
    "mkdocs.yml",
    "pyproject.toml",
    "requirements.lock",
    "buf.yaml",
    "README.md",
    "ARCHITECTURE.md",
    "CHANGELOG.md",
)

_FENCE = re.compile(r"^(\s*)(```|~~~)\s*([\w+-]*)")
_INLINE_CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
_SHELL_LANGUAGES = {"console", "bash", "shell", "sh", "shell-session"}


def documents() -> list[Path]:
    """Every document a reader meets: the top-level pages and the manual's."""
    pages = [ROOT / name for name in TOP_LEVEL_DOCUMENTS if (ROOT / name).exists()]
    return pages + sorted((ROOT / "docs").rglob("*.md"))


@dataclass(frozen=True)
class CommandLine:
    """One command of a shell line in a fenced block, as its words."""

    page: Path
    line_number: int
    text: str
    words: tuple[str, ...]

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line_number}: {self.text}"


def _fenced_blocks(text: str) -> Iterator[tuple[str, int, list[str]]]:
    """(language, first line number, lines) of each fenced block."""
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        fence = opening.group(2)
        language = opening.group(3).lower()
        body: list[str] = []
        start = index + 2
        index += 1
        while index < len(lines) and not lines[index].strip().startswith(fence):
            body.append(lines[index])
            index += 1
        index += 1
        yield language, start, body


def _shell_commands(line: str) -> Iterator[list[str]]:
    """The simple commands of one shell line: split on pipes, `&&`, `||` and `;`, with
    leading variable assignments dropped."""
    try:
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError:
        return
    command: list[str] = []
    for token in [*tokens, ";"]:
        if token in ("|", "||", "&&", ";", "&"):
            while command and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", command[0]):
                command.pop(0)
            if command:
                yield command
            command = []
        elif token.startswith("#"):
            break
        else:
            command.append(token)


def command_lines(page: Path, programs: tuple[str, ...]) -> Iterator[CommandLine]:
    """Each command of `programs` (by its name, also as `.venv/bin/<name>`) run on a
    shell line of a fenced block: in a console block, the lines after a `$ ` prompt;
    in a bash or sh block, every line."""
    for language, start, body in _fenced_blocks(page.read_text()):
        if language not in _SHELL_LANGUAGES:
            continue
        for offset, raw in enumerate(body):
            line = raw.strip()
            if language in ("console", "shell-session"):
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            for words in _shell_commands(line):
                program = words[0].rsplit("/", 1)[-1]
                if program in programs:
                    yield CommandLine(page, start + offset, line, (program, *words[1:]))


def _outside_fences(text: str) -> Iterator[tuple[int, str]]:
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        opening = _FENCE.match(line)
        if opening is not None:
            if fence is None:
                fence = opening.group(2)
                continue
            if line.strip().startswith(fence):
                fence = None
                continue
        if fence is None:
            yield number, line


@dataclass(frozen=True)
class NamedPath:
    """A repository path named in inline code, with the test it names, if any."""

    page: Path
    line_number: int
    path: str
    member: tuple[str, ...]

    def where(self) -> str:
        member = "::" + "::".join(self.member) if self.member else ""
        return f"{self.page.relative_to(ROOT)}:{self.line_number}: {self.path}{member}"


def named_paths(page: Path) -> Iterator[NamedPath]:
    """Each repository path in an inline code span outside fenced blocks. A span is
    read as a path when it starts with one of the repository's folders or is one of
    its top-level files; placeholders (`<mesh>`, `{name}`, `...`) and globs are left
    out, as are spans with spaces (commands, not paths)."""
    for number, line in _outside_fences(page.read_text()):
        for match in _INLINE_CODE.finditer(line):
            span = match.group(1).strip()
            if " " in span or not span:
                continue
            if not (span.startswith(PATH_ROOTS) or span in TOP_LEVEL_FILES):
                continue
            if any(mark in span for mark in ("<", "{", "...", "…", "*", "$")):
                continue
            path, *member = span.split("::")
            path = re.sub(r":\d+(-\d+)?$", "", path).rstrip(",.;")
            yield NamedPath(page, number, path, tuple(member))
