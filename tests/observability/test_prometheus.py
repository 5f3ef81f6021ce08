"""Debian's Prometheus scraping an `oms up` mesh: its targets from the file `oms up`
writes, the shipped rules loaded, the series moving as the demo trades, every
dashboard query answered, and an alert firing when a persister is stopped (SIGSTOP:
its scrapes time out) and resolving when it runs again.

The rules are loaded as shipped except each `for:`, shortened to a few seconds so the
test need not wait minutes; `promtool test rules` (test_alert_rules.py) checks the
durations themselves. Skipped where Prometheus is not installed (`make install`
installs Debian's package where it runs as root with apt).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from services.infra.local_infra import LocalInfra
from services.infra.ports import LOOPBACK, free_port
from services.mesh.mesh_record import MeshRecord, read_mesh_record
from services.mesh.prometheus_targets import TARGETS_NAME
from tests.mesh.up_process import ROOT, output_lines, run_demo, up_environment, wait_for_line

PROMETHEUS = shutil.which("prometheus")
MONITORING = ROOT / "k8s" / "monitoring"
RULE_FOR = "3s"
# A one-replica mesh exports no replica series: these dashboard queries answer empty.
REPLICATED_ONLY = ("oms_leading", "oms_applied_position")
# Counters of events the demo does not cause: no series until the first one.
NOT_CAUSED = ("oms_orders_refused_total", "oms_evictions_completed_total")
T = TypeVar("T")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        PROMETHEUS is None,
        reason="no prometheus on PATH: apt-get install prometheus (Debian; `make install` "
        "does it where it runs as root)",
    ),
]


def _until(probe: Callable[[], T | None], what: str, deadline_s: float = 60.0) -> T:
    """Poll `probe` until it returns something other than None."""
    deadline = time.monotonic() + deadline_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last is not None:
            return last
        time.sleep(0.25)
    raise AssertionError(f"{what}: not within {deadline_s:.0f} s")


class PrometheusServer:
    """A Prometheus of this test's own, on a free loopback port, over a fresh TSDB."""

    def __init__(self, folder: Path, targets: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        rules = yaml.safe_load((MONITORING / "oms-alerts.rules.yaml").read_text())
        for group in rules["groups"]:
            group["interval"] = "1s"
            for rule in group["rules"]:
                if "for" in rule:
                    rule["for"] = RULE_FOR
        (folder / "rules.yaml").write_text(yaml.safe_dump(rules))
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "800ms"},
            "rule_files": [str(folder / "rules.yaml")],
            "scrape_configs": [
                {
                    "job_name": "oms",
                    "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}],
                }
            ],
        }
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.address = f"{LOOPBACK}:{free_port()}"
        self.log = (folder / "prometheus.log").open("w")
        assert PROMETHEUS is not None
        self.process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={folder / 'prometheus.yml'}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address={self.address}",
                "--web.enable-lifecycle",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=folder,
        )
        self.folder = folder

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()

    def api(self, path: str, **query: str) -> Any:
        url = f"http://{self.address}/api/v1/{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"prometheus exited:\n{self.output()}")
        try:
            with urllib.request.urlopen(f"http://{self.address}/-/ready", timeout=2) as reply:
                return bool(reply.status == 200)
        except OSError:
            return False

    def query(self, expression: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expression)
        assert data["resultType"] == "vector", data
        return list(data["result"])

    def firing(self, alert: str) -> list[dict[str, str]]:
        """The labels of each instance of `alert` that is firing now."""
        return [
            item["labels"]
            for item in self.api("alerts")["alerts"]
            if item["labels"]["alertname"] == alert and item["state"] == "firing"
        ]

    def output(self) -> str:
        self.log.flush()
        return (self.folder / "prometheus.log").read_text()[-4000:]


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[tuple[Path, MeshRecord]]:
    """`oms up` (TLS, one replica), serving; stopped with Ctrl-C after the test."""
    state_dir = tmp_path / "state"
    process = subprocess.Popen(
        [sys.executable, "-m", "services.command_line", "up", "--state-dir", str(state_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=up_environment(),
        cwd=ROOT,
    )
    seen: list[str] = []
    try:
        lines = output_lines(process)
        wait_for_line(lines, "[mesh] all services serving", seen, 120)
        record = read_mesh_record(state_dir)
        assert record is not None
        yield state_dir, record
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        LocalInfra(state_dir).down()


@pytest.fixture
def prometheus(tmp_path: Path, mesh: tuple[Path, MeshRecord]) -> Iterator[PrometheusServer]:
    state_dir, _ = mesh
    server = PrometheusServer(tmp_path / "prometheus", state_dir / TARGETS_NAME)
    try:
        _until(lambda: True if server.ready() else None, "prometheus ready")
        yield server
    finally:
        server.stop()


def _answer_of(
    server: PrometheusServer, expression: str
) -> Callable[[], list[dict[str, Any]] | None]:
    """A probe: `expression`'s answer, None while it is empty."""
    return lambda: server.query(expression) or None


def _pid_serving(address: str, subcommand: str) -> int:
    """The pid of the `oms <subcommand>` process started with `--listen <address>`."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [word.decode(errors="replace") for word in argv]
        listening = "--listen" in words and words[words.index("--listen") + 1] == address
        if subcommand in words and listening:
            return int(entry.name)
    raise AssertionError(f"no `oms {subcommand}` listening on {address}")


def test_prometheus_scrapes_the_mesh_the_series_move_and_a_stopped_persister_fires(
    mesh: tuple[Path, MeshRecord], prometheus: PrometheusServer
) -> None:
    state_dir, record = mesh

    # Every process is a target, up, labelled with its group (`job`) and its name.
    def all_up() -> list[dict[str, Any]] | None:
        active = prometheus.api("targets", state="active")["activeTargets"]
        healthy = [target for target in active if target["health"] == "up"]
        return active if len(healthy) == len(record.metrics) == len(active) else None

    targets = _until(all_up, f"{len(record.metrics)} targets up")
    processes = {target["labels"]["process"]: target["labels"] for target in targets}
    assert set(processes) == set(record.metrics)
    assert processes["gateway"]["job"] == "gateway"
    assert processes["persister"]["mesh"] == record.mesh_id

    # The demo trades; the series move in Prometheus.
    run_demo(state_dir, up_environment())

    def placed() -> float | None:
        found = prometheus.query('sum(oms_requests_total{service="gateway",key="PlaceOrder"})')
        return float(found[0]["value"][1]) if found and float(found[0]["value"][1]) >= 2 else None

    _until(placed, "PlaceOrder requests counted")
    _until(
        lambda: prometheus.query('oms_fills_settled_total{service="shard"} > 0') or None,
        "fills settled",
    )
    for duplicate in ("command", "order", "fill"):
        found = prometheus.query(f"oms_duplicate_{duplicate}_reached_db_total")
        assert [float(item["value"][1]) for item in found] == [0.0], (duplicate, found)

    # Every query of the dashboard is valid PromQL and, but for a replica's and a count
    # of something the demo never causes (a counter is exported once it moved), answers.
    dashboard = json.loads((MONITORING / "oms-dashboard.json").read_text())
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    allowed = (*REPLICATED_ONLY, *NOT_CAUSED)
    for expression in expressions:
        answered = prometheus.query(expression)  # raises unless valid PromQL
        if not answered and not any(name in expression for name in allowed):
            _until(_answer_of(prometheus, expression), expression, deadline_s=30)
    # No invariant pages on a healthy mesh.
    invariants = yaml.safe_load((MONITORING / "oms-alerts.rules.yaml").read_text())["groups"][0]
    for rule in invariants["rules"]:
        assert not prometheus.firing(rule["alert"]), rule["alert"]
    assert not prometheus.firing("OmsServiceDown")

    # A persister stopped: its scrapes time out, OmsServiceDown fires for it alone.
    persister = _pid_serving(record.persister, "persister")
    os.kill(persister, signal.SIGSTOP)
    try:
        fired = _until(lambda: prometheus.firing("OmsServiceDown") or None, "OmsServiceDown")
        assert [(labels["job"], labels["process"]) for labels in fired] == [
            ("persister", "persister")
        ], fired
        assert fired[0]["severity"] == "page"
    finally:
        os.kill(persister, signal.SIGCONT)
    _until(
        lambda: True if not prometheus.firing("OmsServiceDown") else None,
        "OmsServiceDown resolved once the persister runs again",
    )
