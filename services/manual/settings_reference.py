"""`docs/reference/settings.md`: every environment variable the mesh's code reads
through a settings class, grouped by that class, from its `setting(...)` declarations.

`SECTIONS` names every settings class in the repository, with who reads it; a test
fails when a class declares a setting this list does not reach. A variable read by
several classes (`OMS_ETCD_ENDPOINTS`, say) is listed under each, with what that
reader does with it, and the page ends with a table of every such variable's readers.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from services.manual.markdown import cell, code, generated_note, table
from services.manual.settings_help import (
    SettingsSource,
    format_default,
    resolve,
    settings_of,
)
from services.settings import SettingDescription

PAGE = Path("docs/reference/settings.md")
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Section:
    anchor: str
    title: str
    source: SettingsSource  # "module:Class"
    read_by: str  # Markdown


SECTIONS: tuple[Section, ...] = (
    Section("gateway", "Gateway", "gateway.settings:GatewaySettings", "`oms gateway`"),
    Section(
        "marketdata",
        "Market data",
        "services.market_data.settings:MarketDataSettings",
        "`oms marketdata`",
    ),
    Section("shard", "User shard", "services.shard.settings:ShardServiceSettings", "`oms shard`"),
    Section(
        "matcher",
        "Matcher group",
        "services.matcher.settings:MatcherServiceSettings",
        "`oms matcher`",
    ),
    Section(
        "persister",
        "Persister",
        "persister.settings:PersisterSettings",
        "`oms persister`, and `oms shard --colocate` for the persister it runs",
    ),
    Section(
        "bridge",
        "Bridge",
        "bridge.settings:BridgeSettings",
        "`oms bridge`, and `oms shard --colocate` for the bridge it runs",
    ),
    Section(
        "reconciler",
        "Reconciler",
        "services.reconciler.settings:ReconcilerSettings",
        "`oms reconciler`, and `oms shard --colocate` for the reconciler it runs",
    ),
    Section(
        "tls",
        "TLS",
        "services.transport.tls:TransportSettings",
        "every process that serves or opens a gRPC link or an etcd connection: the seven"
        " services, `oms operator`, `oms client`, `oms status`, `omsctl` and the other tools",
    ),
    Section(
        "metrics",
        "Metrics endpoint",
        "services.observability.metrics:MetricsSettings",
        "the gateway, shard, matcher, persister, bridge and reconciler ([metrics](metrics.md))",
    ),
    Section(
        "tracing",
        "Tracing",
        "services.observability.tracing:TracingSettings",
        "the gateway, shard, matcher, persister and bridge",
    ),
    Section(
        "health-probe",
        "Health probe",
        "services.serving.health_probe:HealthProbeSettings",
        "the gateway, shard, matcher, persister, bridge and reconciler",
    ),
    Section(
        "channelz",
        "Channelz",
        "services.serving.channelz:ChannelzSettings",
        "the gateway, shard, matcher, persister, bridge and reconciler",
    ),
    Section(
        "infra",
        "Local etcd and PostgreSQL",
        "services.infra.settings:InfraSettings",
        "`oms infra`, `oms up`, and the benchmarks that start servers of their own",
    ),
    Section("client", "Client", "gateway.settings:ClientSettings", "`oms client`"),
    Section("omsctl", "omsctl", "services.routing.omsctl:OmsctlSettings", "`omsctl`"),
    Section("operator", "Operator", "k8s.operator.handlers:OperatorSettings", "`oms operator`"),
    Section(
        "etcd-access",
        "etcd access",
        "services.coordination.access_command:AccessSettings",
        "`oms etcd-access`",
    ),
    Section(
        "benchmarks",
        "Benchmarks",
        "services.bench.failover_bench:CatalogSetting",
        "`oms bench failover` and `oms bench upgrade`",
    ),
)

_INTRO = """\
Every setting is an environment variable, read once when a process starts
(`services/settings.py`). Where a command has a flag for the same setting, the flag
takes precedence. A boolean is `1`, `true`, `yes` or `on` (or `0`, `false`, `no`,
`off`); a list is comma-separated; an optional path left empty means none. A name
ending in `_MS` holds milliseconds, one ending in `_S` seconds. Each command's
`--help` ends with the variables it reads ([commands](commands.md)).

A variable read by several settings classes is listed under each, with what that
reader does with it; [the last table](#read-by-several) names every reader of each
such variable."""


def _location(source: SettingsSource) -> str:
    cls = resolve(source)
    path = Path(inspect.getfile(cls)).resolve().relative_to(ROOT).as_posix()
    return f"`{path}`, `{cls.__name__}`"


def _row(described: SettingDescription) -> list[str]:
    default = format_default(described.default)
    return [
        code(described.env),
        cell(described.type),
        default if default in ("empty", "unset", "required") else code(default),
        cell(described.help),
    ]


def variables() -> Iterator[tuple[Section, SettingDescription]]:
    """Every (section, setting) the page lists, in its order."""
    for section in SECTIONS:
        for described in settings_of(section.source):
            yield section, described


def render() -> str:
    listed = list(variables())
    names = sorted({described.env for _, described in listed})
    lines = [
        generated_note(
            "services/manual/settings_reference.py",
            "the settings classes' `setting(...)` declarations",
        ),
        "# Settings",
        "",
        _INTRO,
        "",
        f"The mesh reads {len(names)} variables through {len(SECTIONS)} settings classes"
        f" ({sum(name.startswith('OMS_') for name in names)} named `OMS_*`, and"
        f" {', '.join(f'`{name}`' for name in names if not name.startswith('OMS_'))}).",
        "",
    ]
    for section in SECTIONS:
        lines += [
            f"## {section.title} {{#{section.anchor}}}",
            "",
            f"Read by {section.read_by}; declared in {_location(section.source)}.",
            "",
            *table(
                ("Variable", "Type", "Default", "Meaning"),
                [_row(described) for described in settings_of(section.source)],
            ),
            "",
        ]
    readers: dict[str, list[Section]] = {}
    for section, described in listed:
        readers.setdefault(described.env, []).append(section)
    shared = [(env, sections) for env, sections in sorted(readers.items()) if len(sections) > 1]
    lines += [
        "## Read by several {#read-by-several}",
        "",
        *table(
            ("Variable", "Read by"),
            [
                [code(env), ", ".join(f"[{s.title}](#{s.anchor})" for s in sections)]
                for env, sections in shared
            ],
        ),
    ]
    return "\n".join(lines) + "\n"
