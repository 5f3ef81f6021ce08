"""The settings a command reads, listed at the end of its `--help`.

A service's `register(subparsers)` calls `list_settings(parser, SettingsClass)`: its
`--help` then ends with every environment variable the class reads, its default and
its help, built from the class's `setting(...)` declarations (`describe_settings`),
the same rows the settings reference page (`docs/reference/settings.md`) is made of.

A class may be named as "module:Class" instead: it is imported only when the help is
shown, so a command whose settings live beside heavy imports (the operator's, beside
kopf) still registers without them. This module imports no service's code.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from services.settings import SettingDescription, describe_settings

# A settings dataclass, or "module:Class" (imported when the help is shown).
SettingsSource = type[Any] | str

# What every service process reads besides its own class: TLS, its metrics endpoint,
# its tracing (all but the reconciler), its health probe and channelz
# (services/serving/service_host.py, services/runtime/hosting.py).
TRANSPORT = "services.transport.tls:TransportSettings"
METRICS = "services.observability.metrics:MetricsSettings"
TRACING = "services.observability.tracing:TracingSettings"
HEALTH_PROBE = "services.serving.health_probe:HealthProbeSettings"
CHANNELZ = "services.serving.channelz:ChannelzSettings"
SERVICE_SHARED: tuple[str, ...] = (TRANSPORT, METRICS, TRACING, HEALTH_PROBE, CHANNELZ)
SETTINGS_PAGE = "docs/reference/settings.md"

# The epilog of a parser that lists its settings; the formatter writes them in its place.
_EPILOG = "\x00settings"
_HELP_INDENT = 6


def resolve(source: SettingsSource) -> type[Any]:
    """The settings class `source` names."""
    if isinstance(source, str):
        module_name, _, class_name = source.partition(":")
        found: type[Any] = getattr(importlib.import_module(module_name), class_name)
        return found
    return source


def settings_of(source: SettingsSource) -> list[SettingDescription]:
    """Each setting of `source`, in declaration order."""
    return describe_settings(resolve(source))


def format_default(value: Any) -> str:
    """A default as one would write it in the environment: `on`, `127.0.0.1:7000`, ..."""
    if value is dataclasses.MISSING:
        return "required"
    if value is None:
        return "unset"
    if value in ("", ()):
        return "empty"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ",".join(str(item) for item in value)
    if isinstance(value, Path):
        return value.as_posix()
    return str(value)


def settings_text(
    sources: Sequence[SettingsSource], shared: Sequence[SettingsSource], width: int
) -> str:
    """The settings block of a `--help`, lines at most `width` wide (where words allow)."""
    lines = ["environment variables (a flag above, when given, takes precedence):"]
    seen: set[str] = set()
    for source in sources:
        for described in settings_of(source):
            if described.env in seen:
                continue
            seen.add(described.env)
            lines.append(f"  {described.env} (default: {format_default(described.default)})")
            lines += textwrap.wrap(
                described.help,
                width=max(width, 40),
                initial_indent=" " * _HELP_INDENT,
                subsequent_indent=" " * _HELP_INDENT,
                break_on_hyphens=False,
            )
    also = [
        described.env
        for source in shared
        for described in settings_of(source)
        if described.env not in seen
    ]
    lines.append("")
    if also:
        text = f"Also read, as described in {SETTINGS_PAGE}: {', '.join(dict.fromkeys(also))}"
    else:
        text = f"Every setting of the mesh: {SETTINGS_PAGE}"
    lines += textwrap.wrap(text, width=max(width, 40), break_on_hyphens=False)
    return "\n".join(lines)


class SettingsHelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, with the parser's settings written where its epilog is."""

    def __init__(
        self,
        prog: str,
        *,
        sources: Sequence[SettingsSource] = (),
        shared: Sequence[SettingsSource] = (),
        **options: Any,
    ) -> None:
        super().__init__(prog, **options)
        self.sources = tuple(sources)
        self.shared = tuple(shared)

    def add_text(self, text: str | None) -> None:
        if text == _EPILOG:
            block = settings_text(self.sources, self.shared, self._width)
            self._add_item(lambda: block + "\n", [])
        else:
            super().add_text(text)


def list_settings(
    parser: argparse.ArgumentParser,
    *sources: SettingsSource,
    shared: Sequence[SettingsSource] = (),
) -> None:
    """End `parser`'s `--help` with the settings of `sources` (each variable, its default
    and its help), then the names of those in `shared` not listed already."""
    parser.formatter_class = functools.partial(
        SettingsHelpFormatter, sources=sources, shared=tuple(shared)
    )
    parser.epilog = _EPILOG


def listed_settings(parser: argparse.ArgumentParser) -> tuple[SettingsSource, ...]:
    """The settings sources `list_settings` gave `parser` (none: empty)."""
    formatter = parser.formatter_class
    if isinstance(formatter, functools.partial) and formatter.func is SettingsHelpFormatter:
        return tuple(formatter.keywords.get("sources", ()))
    return ()


def is_settings_epilog(text: str | None) -> bool:
    return text == _EPILOG
