"""The state-machine cores stay pure: checked by reading their source.

import-linter (`make lint`) checks the import graph; this test also catches
what an import graph cannot see: `__import__`, `importlib`, and attribute calls
on clocks or random sources reached through any name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE_PACKAGES = [
    ROOT / "services" / "runtime" / "core",
    ROOT / "services" / "shard" / "core",
    ROOT / "services" / "matcher" / "core",
    ROOT / "services" / "routing" / "core",
    ROOT / "auditor" / "core",
    ROOT / "gateway" / "core",
]
FORBIDDEN_MODULES = {
    "asyncio",
    "grpc",
    "asyncpg",
    "time",
    "random",
    "os",
    "socket",
    "datetime",
    "uuid",
    "secrets",
    "threading",
    "subprocess",
    "importlib",
    "structlog",
    "opentelemetry",
    "uvloop",
}
FORBIDDEN_CALLS = {
    "time.time",
    "time.monotonic",
    "time.perf_counter",
    "time.time_ns",
    "datetime.now",
    "datetime.utcnow",
    "date.today",
    "uuid.uuid4",
    "uuid.uuid1",
    "os.urandom",
    "os.getenv",
    "os.environ",
}
FORBIDDEN_BUILTINS = {"__import__", "open", "input", "hash", "id"}


def core_modules() -> list[Path]:
    return sorted(
        path for package in CORE_PACKAGES if package.exists() for path in package.rglob("*.py")
    )


def dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    return ""


def violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in FORBIDDEN_MODULES:
                    found.append(f"{path.name}:{node.lineno} imports {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            module = (node.module or "").split(".")[0]
            if module in FORBIDDEN_MODULES:
                found.append(f"{path.name}:{node.lineno} imports from {node.module}")
        elif isinstance(node, ast.Attribute):
            name = dotted(node)
            if any(name == call or name.endswith("." + call) for call in FORBIDDEN_CALLS):
                found.append(f"{path.name}:{node.lineno} uses {name}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in FORBIDDEN_BUILTINS
        ):
            found.append(f"{path.name}:{node.lineno} calls {node.func.id}()")
    return found


def test_cores_exist() -> None:
    assert core_modules(), "no core modules found: the purity check would pass vacuously"


@pytest.mark.parametrize("path", core_modules(), ids=lambda path: str(path.relative_to(ROOT)))
def test_core_module_is_pure(path: Path) -> None:
    assert violations(path) == []


def test_checker_catches_violations(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import time\nfrom os import environ\nimport datetime as dt\n"
        "x = dt.datetime.now()\ny = hash('a')\nz = __import__('random')\n"
    )
    messages = violations(bad)
    assert len(messages) == 6, messages
