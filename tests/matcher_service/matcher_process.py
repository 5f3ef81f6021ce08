"""A real `oms matcher` subprocess for tests (see tests/service_process.py)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tests.service_process import CHANNEL_OPTIONS, ServiceProcess, ServiceProcessError, aio_channel

SERVICE_NAME = "oms.v1.Matcher"
MatcherProcessError = ServiceProcessError

__all__ = [
    "CHANNEL_OPTIONS",
    "SERVICE_NAME",
    "MatcherProcess",
    "MatcherProcessError",
    "aio_channel",
]


class MatcherProcess(ServiceProcess):
    """One matcher group served by a child process; restartable on the same data and port."""

    subcommand = "matcher"
    service_name = SERVICE_NAME

    def __init__(
        self,
        data_dir: Path,
        *,
        group: str = "g1",
        port: int | None = None,
        environment: Mapping[str, str] | None = None,
        markets_file: Path | None = None,
    ) -> None:
        super().__init__(data_dir, port=port, environment=environment)
        self.group = group
        self.markets_file = markets_file

    def service_arguments(self) -> list[str]:
        arguments = ["--group", self.group]
        if self.markets_file is not None:
            arguments += ["--markets-file", str(self.markets_file)]
        return arguments
