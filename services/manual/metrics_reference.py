"""`docs/reference/metrics.md`: what each process exports at `GET /metrics`, and the
shipped Prometheus alert rules.

Three kinds of series, each read from the code that makes it:

- the process's own collector and the latency histograms: the objects registered in
  `services.observability.metrics.REGISTRY`;
- the status numbers (`services/observability/metrics.py`, `StatusCollector`): each
  service's `oms.v1.Status/GetStatus` counters, exported under `oms_`. Their names
  are read from the code that makes them (`NUMBER_SOURCES`: a counters dataclass,
  a declared tuple of names, the keys of the dict a `*_numbers` function returns, the
  names a service's code adds to its counters), then run through the real
  `StatusCollector`, so the metric names, types and labels are the endpoint's own;
- the alert rules: `k8s/monitoring/oms-alerts.rules.yaml`, with the comments that
  explain each rule.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import importlib
import inspect
import io
import re
import textwrap
import threading
import tokenize
import typing
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.metrics import MetricWrapperBase

from services.manual.markdown import cell, code, generated_note, table
from services.observability import metrics

PAGE = Path("docs/reference/metrics.md")
ROOT = Path(__file__).resolve().parents[2]
ALERT_RULES = Path("k8s/monitoring/oms-alerts.rules.yaml")
CODE_FOLDERS = ("services", "gateway", "bridge", "persister", "k8s")


# What the `key` label of a keyed status number holds, by its name; one without an
# entry here is shown with the code that makes its key.
KEY_HINTS = {
    "requests": "the gRPC method called (`PlaceOrder`, `Trade`, ...)",
    "errors": "the `GatewayErrorReason` of a refused call, without its"
    " `GATEWAY_ERROR_REASON_` prefix",
    "trade_requests": "the kind of a Trade stream's request: `place`, `cancel` (or `empty`)",
}


@dataclass(frozen=True)
class Number:
    """One status number: its name (`requests.` for a keyed family) and what it counts."""

    name: str
    note: str = ""
    key: str = ""  # for a keyed name: what its `key` label holds


# --- reading names and their comments from the code ---------------------------------


@dataclass(frozen=True)
class _Source:
    tree: ast.AST
    comments: dict[int, str]  # line -> comment text
    comment_only: frozenset[int]  # lines holding nothing but a comment


def _source(obj: Any) -> _Source:
    text = textwrap.dedent(inspect.getsource(obj))
    comments: dict[int, str] = {}
    code_lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
        elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            code_lines.add(token.start[0])
    only = frozenset(line for line in comments if line not in code_lines)
    return _Source(ast.parse(text), comments, only)


def _note(source: _Source, line: int) -> str:
    """The comment on `line`, after the comment lines just above it."""
    above: list[str] = []
    previous = line - 1
    while previous in source.comment_only:
        above.insert(0, source.comments[previous])
        previous -= 1
    trailing = source.comments.get(line, "") if line not in source.comment_only else ""
    return " ".join([*above, trailing]).strip()


def fields_of(cls: type[Any], *, kind: type | None = None) -> list[Number]:
    """The fields of dataclass `cls` (those annotated `kind`, if given), with comments."""
    source = _source(cls)
    hints = typing.get_type_hints(cls)
    lines = {
        node.target.id: node.lineno
        for node in ast.walk(source.tree)
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    }
    return [
        Number(field.name, _note(source, lines.get(field.name, 0)))
        for field in dataclasses.fields(cls)
        if kind is None or hints[field.name] is kind
    ]


def returned_keys(function: Callable[..., Any]) -> list[Number]:
    """The names a numbers function makes: the string keys of the dict it returns (or
    of the first dict of the tuple it returns), and those it assigns to `counters[...]`
    or `numbers[...]`."""
    source = _source(function)
    found: list[tuple[int, int, str]] = []  # (line, column, name)

    def keys_of(node: ast.AST) -> None:
        if isinstance(node, ast.Dict):
            for key in node.keys:
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    found.append((key.lineno, key.col_offset, key.value))

    for node in ast.walk(source.tree):
        if isinstance(node, ast.Return) and node.value is not None:
            value = node.value
            keys_of(value.elts[0] if isinstance(value, ast.Tuple) and value.elts else value)
        targets = node.targets if isinstance(node, ast.Assign) else []
        for target in targets:
            if (
                isinstance(target, ast.Subscript)
                and isinstance(target.value, ast.Name)
                and target.value.id in ("counters", "numbers")
                and isinstance(target.slice, ast.Constant)
                and isinstance(target.slice.value, str)
            ):
                found.append((target.lineno, target.col_offset, target.slice.value))
    return [Number(name, _note(source, line)) for line, _, name in sorted(found)]


def _names_in(expression: ast.expr, functions: dict[str, ast.FunctionDef]) -> Iterator[Number]:
    """The counter names an argument of `counters.add(...)` can be."""
    if isinstance(expression, ast.Constant) and isinstance(expression.value, str):
        yield Number(expression.value)
    elif isinstance(expression, ast.IfExp):
        yield from _names_in(expression.body, functions)
        yield from _names_in(expression.orelse, functions)
    elif isinstance(expression, ast.JoinedStr) and expression.values:
        head = expression.values[0]
        if isinstance(head, ast.Constant) and str(head.value).endswith("."):
            rest = ast.unparse(ast.JoinedStr(expression.values[1:]))
            yield Number(str(head.value).rstrip("."), key=rest[2:-1])
    elif (
        isinstance(expression, ast.BinOp)
        and isinstance(expression.op, ast.Add)
        and isinstance(expression.left, ast.Constant)
        and str(expression.left.value).endswith(".")
    ):
        yield Number(str(expression.left.value).rstrip("."), key=ast.unparse(expression.right))
    elif isinstance(expression, ast.Call):
        called = expression.func
        name = called.attr if isinstance(called, ast.Attribute) else getattr(called, "id", "")
        function = functions.get(name)
        if function is not None:
            for node in ast.walk(function):
                if isinstance(node, ast.Return) and node.value is not None:
                    yield from _names_in(node.value, functions)


def added_names(package: str) -> list[Number]:
    """Every name the package's code adds to a counters object (`counters.add(name)`),
    in file order."""
    found: list[Number] = []
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text())
        functions = {
            node.name: node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add"
                and ast.unparse(node.func.value).endswith("counters")
                and node.args
            ):
                found += _names_in(node.args[0], functions)
    return found


def declared_counters(cls: type[Any], method: str = "__init__") -> list[Number]:
    """The names given to `Counters((...))` in `cls.method`: literal names, and the
    `COUNTERS` tuples of the modules it names (`*module.COUNTERS`)."""
    module = importlib.import_module(cls.__module__)
    tree = _source(getattr(cls, method)).tree
    names: list[Number] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Counters"):
            continue
        for element in getattr(node.args[0], "elts", []):
            if isinstance(element, ast.Starred):
                names += [Number(name) for name in eval_attribute(module, element.value)]
            elif isinstance(element, ast.Constant):
                names.append(Number(str(element.value)))
    return names


def eval_attribute(module: Any, expression: ast.expr) -> Any:
    """`a.b.c` looked up from `module`'s globals (no code run)."""
    if isinstance(expression, ast.Name):
        return getattr(module, expression.id)
    if isinstance(expression, ast.Attribute):
        return getattr(eval_attribute(module, expression.value), expression.attr)
    raise ValueError(f"not a name: {ast.unparse(expression)}")


def _load(path: str) -> Any:
    module_name, _, attribute = path.partition(":")
    found = importlib.import_module(module_name)
    for part in attribute.split("."):
        found = getattr(found, part)
    return found


# --- the status numbers, by the `service` label they carry -------------------------


@dataclass(frozen=True)
class NumberSource:
    service: str  # the `service` label
    exported_by: str  # Markdown
    declared_in: str  # Markdown: where the names come from
    names: Callable[[], list[Number]]


def _gateway() -> list[Number]:
    return [*added_names("gateway"), *returned_keys(_load("gateway.service:Gateway.status"))]


def _shard() -> list[Number]:
    statistics = _load("services.shard.core.statistics:ShardStatistics")
    counter_names = _load("services.shard.core.statistics:COUNTER_NAMES")
    return [
        *fields_of(statistics, kind=int),
        *(Number(name) for name in counter_names),
        *returned_keys(_load("services.shard.service:ShardServicer.metric_numbers")),
    ]


def _leader_only() -> list[Number]:
    wrap = _load("services.serving.leader_only:LeaderOnly.wrap")
    return [
        dataclasses.replace(
            number,
            note="with the leader lease on: 1 while this instance holds the role"
            if number.name == "leading"
            else "with the leader lease on: the lease's term while it holds the role",
        )
        for number in returned_keys(wrap)
    ]


def _persister() -> list[Number]:
    service = _load("persister.service:PersisterService")
    return [*declared_counters(service), *returned_keys(service.status)]


def _market_data() -> list[Number]:
    feed = fields_of(_load("services.market_data.market_mirror:FeedStatistics"))
    return [
        *(dataclasses.replace(number, name=f"feed_{number.name}") for number in feed),
        *returned_keys(_load("services.market_data.service:MarketDataService.status")),
        Number("matcher_connected", "1 while the group's feed is followed", key="matcher group"),
        Number("matcher_breaks", "times the group's feed broke off", key="matcher group"),
        Number("calls", "calls received", key="method"),
        Number("refused", "calls refused", key="method"),
    ]


NUMBER_SOURCES: tuple[NumberSource, ...] = (
    NumberSource(
        "gateway",
        "`oms gateway`",
        "the names `gateway/` adds to its counters, and `Gateway.status` in `gateway/service.py`",
        _gateway,
    ),
    NumberSource(
        "marketdata",
        "`oms marketdata`",
        "`FeedStatistics` in `services/market_data/market_mirror.py` (as `feed_<name>`), and"
        " `MarketDataService.status` in `services/market_data/service.py`",
        _market_data,
    ),
    NumberSource(
        "shard",
        "`oms shard` (every replica; a follower's are those of the log it has applied)",
        "`ShardStatistics` and `COUNTER_NAMES` in `services/shard/core/statistics.py`,"
        " `ShardServicer.metric_numbers` in `services/shard/service.py`",
        _shard,
    ),
    NumberSource(
        "matcher",
        "`oms matcher` (every replica; a follower's are those of the log it has applied)",
        "`MatcherStatistics` in `services/matcher/core/machine.py`",
        lambda: fields_of(_load("services.matcher.core.machine:MatcherStatistics")),
    ),
    NumberSource(
        "sequencer",
        "`oms shard` and `oms matcher`, the replica that leads (a follower has no sequencer)",
        "`RuntimeHost.sequencer_numbers` in `services/runtime/hosting.py`",
        lambda: returned_keys(_load("services.runtime.hosting:RuntimeHost.sequencer_numbers")),
    ),
    NumberSource(
        "snapshot",
        "`oms shard` and `oms matcher`, every replica",
        "`RuntimeHost.snapshot_numbers` in `services/runtime/hosting.py`",
        lambda: returned_keys(_load("services.runtime.hosting:RuntimeHost.snapshot_numbers")),
    ),
    NumberSource(
        "replica",
        "`oms shard` and `oms matcher` in a replicated group (`OMS_SHARD_LOG=etcd`,"
        " `OMS_MATCHER_LOG=etcd`), every replica",
        "`ReplicatedHost.replica_numbers` in `services/runtime/replicated_host.py`",
        lambda: returned_keys(
            _load("services.runtime.replicated_host:ReplicatedHost.replica_numbers")
        ),
    ),
    NumberSource(
        "persister",
        "`oms persister` (and `oms shard --colocate`)",
        "the `Counters` of `PersisterService` and its `status`, in `persister/service.py`",
        _persister,
    ),
    NumberSource(
        "bridge",
        "`oms bridge` (and `oms shard --colocate`)",
        "`BridgeCounters` in `bridge/statistics.py`; `leading` and `term` from"
        " `services/serving/leader_only.py`",
        lambda: [*fields_of(_load("bridge.statistics:BridgeCounters")), *_leader_only()],
    ),
    NumberSource(
        "reconciler",
        "`oms reconciler` (and `oms shard --colocate`)",
        "`ReconcilerCounters` in `services/reconciler/sweep.py`; `leading` and `term` from"
        " `services/serving/leader_only.py`",
        lambda: [
            *fields_of(_load("services.reconciler.sweep:ReconcilerCounters")),
            *_leader_only(),
        ],
    ),
)


@dataclass(frozen=True)
class Series:
    name: str  # as scraped: a counter's with `_total`
    kind: str
    labels: tuple[str, ...]
    number: Number


def _unique(numbers: Iterable[Number]) -> list[Number]:
    seen: dict[str, Number] = {}
    for number in numbers:
        earlier = seen.get(number.name)
        if earlier is None or (not earlier.note and number.note):
            seen[number.name] = number
    return list(seen.values())


def status_series(source: NumberSource) -> list[Series]:
    """`source`'s numbers as the real `StatusCollector` exports them."""
    numbers = _unique(source.names())
    sample = {(f"{n.name}.KEY" if n.key else n.name): 0 for n in numbers}
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="metrics-reference", daemon=True)
    thread.start()
    try:
        collector = metrics.StatusCollector()
        collector.sources[source.service] = (lambda: sample, loop)
        families = {family.documentation: family for family in collector.collect()}
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
    series = []
    for number in numbers:
        family = families[f"status number {number.name}"]
        exported = family.name + ("_total" if family.type == "counter" else "")
        labels = tuple(sorted({label for s in family.samples for label in s.labels}))
        series.append(Series(exported, family.type, labels, number))
    return series


# --- the registry's own series -------------------------------------------------------


def _observed_in(variable: str) -> list[str]:
    """The modules that use the metric object named `variable` (besides its own)."""
    pattern = re.compile(rf"\b{variable}\b")
    own = Path(metrics.__file__).resolve()
    found = []
    for folder in CODE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.resolve() != own and pattern.search(path.read_text()):
                found.append(path.relative_to(ROOT).as_posix())
    return found


def _registry_rows() -> list[list[str]]:
    declared = {
        wrapper._name: (variable, wrapper)
        for variable, wrapper in vars(metrics).items()
        if isinstance(wrapper, MetricWrapperBase)
    }
    rows = []
    for family in metrics.REGISTRY.collect():
        if family.name in declared:
            variable, wrapper = declared[family.name]
            labels = ", ".join(f"`{label}`" for label in wrapper._labelnames)
            users = ", ".join(f"`{path}`" for path in _observed_in(variable))
            meaning = f"{cell(family.documentation)} (observed in {users})"
            kind = family.type
        else:
            labels, meaning = "", cell(family.documentation)
            kind = family.type
        exported = family.name + ("_total" if kind == "counter" else "")
        rows.append([code(exported), kind, labels, meaning])
    return rows


# --- alert rules ---------------------------------------------------------------------


@dataclass(frozen=True)
class Alert:
    group: str
    name: str
    expression: str
    wait: str
    severity: str
    annotations: dict[str, str]
    notes: str


def alerts(path: Path = ROOT / ALERT_RULES) -> list[Alert]:
    text = path.read_text()
    lines = text.splitlines()
    found = []
    for group in yaml.safe_load(text)["groups"]:
        for rule in group["rules"]:
            if "alert" not in rule:
                continue
            start = next(
                index
                for index, line in enumerate(lines)
                if line.strip() == f"- alert: {rule['alert']}"
            )
            notes = []
            for line in lines[start + 1 :]:
                if not line.strip().startswith("#"):
                    break
                notes.append(line.strip().lstrip("#").strip())
            found.append(
                Alert(
                    group=group["name"],
                    name=rule["alert"],
                    expression=str(rule["expr"]).strip(),
                    wait=str(rule.get("for", "")),
                    severity=str(rule.get("labels", {}).get("severity", "")),
                    annotations={k: str(v) for k, v in rule.get("annotations", {}).items()},
                    notes=" ".join(notes),
                )
            )
    return found


def _alert_section(alert: Alert) -> list[str]:
    facts = [f"Severity `{alert.severity}`" if alert.severity else "No severity"]
    facts.append(f"fires when true for `{alert.wait}`" if alert.wait else "fires as soon as true")
    lines = [f"#### {alert.name}", ""]
    summary = alert.annotations.get("summary", "")
    if summary:
        lines += [cell(summary) + ".", ""]
    lines += [", ".join(facts) + ".", ""]
    for key, value in sorted(alert.annotations.items()):
        if key != "summary":
            lines += [f"{key.capitalize()}: {cell(value)}", ""]
    if alert.notes:
        lines += [cell(alert.notes), ""]
    lines += ["```text", alert.expression, "```", ""]
    return lines


# --- the page ------------------------------------------------------------------------

_INTRO = """\
Every service process serves its metrics at `GET /metrics` on the address in
`OMS_METRICS_LISTEN` (HTTPS with the mesh's certificates when `OMS_METRICS_TLS` is on:
[settings](settings.md#metrics)); `oms up` turns it on for every process it starts.
The numbers are read at scrape time from the same counters `oms.v1.Status/GetStatus`
answers (`oms status` shows them too), so the two never disagree."""

_STATUS_RULE = """\
A service's status number `name` is exported as `oms_name`, with a `service` label
saying which part of the process counted it (the tables below, one per label). A
number in `GAUGES` (`services/observability/metrics.py`) goes down as well as up and
is a gauge; every other only grows and is a counter, scraped as `oms_name_total`. A
dotted name (`requests.PlaceOrder`) is one metric, `oms_requests_total`, whose `key`
label holds the part after the dot. A counter that never moved may be absent until it
does. A process that runs several parts (a shard with `--colocate`, a replica with its
sequencer) exports each part's numbers under its own `service` label."""


def _status_section(source: NumberSource) -> list[str]:
    rows = []
    for series in status_series(source):
        labels = ", ".join(f"`{label}`" for label in series.labels)
        meaning = cell(series.number.note)
        if series.number.key:
            hint = KEY_HINTS.get(series.number.name)
            key = f"`key`: {hint or code(series.number.key)}"
            meaning = f"{meaning} ({key})" if meaning else key
        rows.append([code(series.name), series.kind, labels, meaning])
    return [
        f'### service="{source.service}" {{#service-{source.service}}}',
        "",
        f"Exported by {source.exported_by}. Names from {source.declared_in}.",
        "",
        *table(("Metric", "Type", "Labels", "Meaning"), rows),
        "",
    ]


def render() -> str:
    rules = alerts()
    status = {source.service: status_series(source) for source in NUMBER_SOURCES}
    distinct = {series.name for found in status.values() for series in found}
    registry = _registry_rows()
    lines = [
        generated_note(
            "services/manual/metrics_reference.py",
            "`services/observability/metrics.py`, the code that makes each service's status"
            f" numbers, and `{ALERT_RULES.as_posix()}`",
        ),
        "# Metrics and alerts",
        "",
        _INTRO,
        "",
        f"This page lists {len(registry)} series every process exports,"
        f" {len(distinct)} status-number metrics under {len(NUMBER_SOURCES)} `service`"
        f" labels, and {len(rules)} alert rules.",
        "",
        "## Every process",
        "",
        "The process's own numbers and the latency histograms, from the registry in"
        " `services/observability/metrics.py` (a histogram is scraped as its `_bucket`,"
        " `_sum` and `_count` series; one with labels appears once it has observed a value).",
        "",
        *table(("Metric", "Type", "Labels", "Meaning"), registry),
        "",
        "## Status numbers",
        "",
        _STATUS_RULE,
        "",
    ]
    for source in NUMBER_SOURCES:
        lines += _status_section(source)
    lines += [
        "## Alerts",
        "",
        f"The rules in `{ALERT_RULES.as_posix()}` (a `rule_files:` entry of"
        " `prometheus.yml`, or the `spec` of a prometheus-operator `PrometheusRule`);"
        " `k8s/monitoring/oms-alerts.tests.yaml` tests them with `promtool test rules`.",
        "",
    ]
    for group in dict.fromkeys(alert.group for alert in rules):
        lines += [f"### {group}", ""]
        for alert in rules:
            if alert.group == group:
                lines += _alert_section(alert)
    return "\n".join(lines).rstrip("\n") + "\n"
