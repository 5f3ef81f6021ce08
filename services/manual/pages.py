"""The generated reference pages: each page's path and the function that renders it.

`write()` rewrites every page; `differing()` names those whose file is not what the
code generates now (`python -m services.manual --check`, and the test
tests/manual/test_reference_pages.py).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# page -> module whose `render()` makes it (imported when that page is made)
PAGES: dict[str, str] = {
    "docs/reference/commands.md": "services.manual.command_reference",
    "docs/reference/settings.md": "services.manual.settings_reference",
    "docs/reference/metrics.md": "services.manual.metrics_reference",
    "docs/reference/grpc-api.md": "services.manual.api_reference",
}


def renderer(page: str) -> Callable[[], str]:
    render: Callable[[], str] = importlib.import_module(PAGES[page]).render
    return render


def generate(page: str) -> str:
    return renderer(page)()


def write(root: Path = ROOT) -> list[str]:
    """Rewrite every page; the pages whose content changed."""
    changed = []
    for page in PAGES:
        text = generate(page)
        path = root / page
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            changed.append(page)
    return changed


def differing(root: Path = ROOT) -> list[str]:
    """The pages whose file differs from what the code generates."""
    return [
        page
        for page in PAGES
        if not (root / page).exists() or (root / page).read_text() != generate(page)
    ]
