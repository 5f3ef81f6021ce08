"""The protos' breaking check (`make protocheck`) catches what breaks existing clients.

protos/oms/v1 and the repository's buf.yaml are copied into a git repository of their
own and committed; a copy is then changed in its working tree and compared with that
commit as the Makefile does (`buf breaking --against .git#ref=...`): a renumbered field
and a field whose type changed are refused, naming the field; an added field passes.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONTRACT = Path("protos/oms/v1")
COMMON = CONTRACT / "common.proto"
# LogStamp in common.proto, as published.
POSITION = "uint64 position = 1;"
CONSENSUS_TIME = "uint64 consensus_time_ms = 2;"


def buf() -> str:
    beside = Path(sys.executable).with_name("buf")  # the venv's, from the buf-bin wheel
    found = str(beside) if beside.exists() else shutil.which("buf")
    assert found, "buf not found: `make install` installs buf-bin"
    return found


# Whatever the machine's git configuration says, commits here need no identity, key or hook.
GIT_CONFIG = {
    "user.name": "test",
    "user.email": "test@example.invalid",
    "commit.gpgsign": "false",
    "core.hooksPath": "/dev/null",
}
GIT = ["git", *(arg for key, value in GIT_CONFIG.items() for arg in ("-c", f"{key}={value}"))]
# As the Makefile's protocheck: the checked-in configuration for both sides.
BREAKING = ["breaking", "--against-config", "buf.yaml", "--error-format", "json"]


def _git(repo: Path, *arguments: str) -> str:
    done = subprocess.run(
        [*GIT, *arguments],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    )
    return done.stdout.strip()


@pytest.fixture
def released(tmp_path: Path) -> tuple[Path, str]:
    """A git repository holding the contract and buf.yaml as committed, and its commit."""
    (tmp_path / CONTRACT).mkdir(parents=True)
    for proto in (ROOT / CONTRACT).glob("*.proto"):  # not the generated code beside them
        shutil.copy(proto, tmp_path / CONTRACT / proto.name)
    shutil.copy(ROOT / "buf.yaml", tmp_path / "buf.yaml")
    _git(tmp_path, "init", "--quiet")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "--quiet", "-m", "the release")
    return tmp_path, _git(tmp_path, "rev-parse", "HEAD")


def _edit(repo: Path, old: str, new: str) -> None:
    path = repo / COMMON
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} is no longer in {COMMON}: update this test"
    path.write_text(text.replace(old, new))


def _breaking(repo: Path, commit: str) -> list[dict[str, object]]:
    """buf breaking's findings for the working tree against `commit`, as the Makefile
    runs it; none when it passes."""
    done = subprocess.run(
        [buf(), *BREAKING, "--against", f".git#ref={commit}"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,  # its exit status is checked against its findings below
    )
    findings = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    assert done.returncode == (100 if findings else 0), done.stdout + done.stderr
    return findings


@pytest.mark.parametrize(
    ("old", "new", "rule", "words"),
    [
        # A renumbered field: clients built from the release read it as gone.
        (
            CONSENSUS_TIME,
            "uint64 consensus_time_ms = 3;",
            "FIELD_NO_DELETE",
            ['"2"', '"consensus_time_ms"', '"LogStamp"'],
        ),
        # A changed type: the same number, decoded as something else.
        (
            POSITION,
            "string position = 1;",
            "FIELD_SAME_TYPE",
            ['"position"', '"LogStamp"', '"uint64"', '"string"'],
        ),
    ],
    ids=["renumbered", "retyped"],
)
def test_a_change_that_breaks_clients_is_refused_naming_the_field(
    released: tuple[Path, str], old: str, new: str, rule: str, words: list[str]
) -> None:
    repo, commit = released
    assert _breaking(repo, commit) == []  # unchanged, it passes
    _edit(repo, old, new)
    findings = _breaking(repo, commit)
    assert [finding["type"] for finding in findings] == [rule], findings
    assert findings[0]["path"] == str(COMMON)
    message = str(findings[0]["message"])
    assert all(word in message for word in words), message


def test_an_added_field_passes(released: tuple[Path, str]) -> None:
    repo, commit = released
    _edit(repo, CONSENSUS_TIME, CONSENSUS_TIME + "\n  uint64 batch_size = 3;")
    assert _breaking(repo, commit) == []
