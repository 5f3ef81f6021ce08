"""Where the PostgreSQL binaries shipped by the `pgserver` package live."""

from __future__ import annotations

import functools
import warnings
from pathlib import Path
from types import ModuleType

from services.infra.errors import InfraError


@functools.cache
def pgserver_module(name: str) -> ModuleType:
    """Import `pgserver.<name>`.

    Importing any part of pgserver runs its package `__init__`, which asks platformdirs for a
    runtime folder and warns when XDG_RUNTIME_DIR is unset (containers, CI). We never use
    that folder, so the warning is noise.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
        try:
            module = __import__(f"pgserver.{name}", fromlist=[name])
        except ImportError as error:
            raise InfraError(
                "PostgreSQL binaries not found: install the `pgserver` package"
            ) from error
    return module


def postgres_bin_path() -> Path:
    """The folder holding initdb, postgres, pg_isready, psql, pgbench."""
    return Path(pgserver_module("_commands").POSTGRES_BIN_PATH)


def postgres_binary(name: str) -> Path:
    binary = postgres_bin_path() / name
    if not binary.is_file():
        raise InfraError(f"{name} not found in {binary.parent}: reinstall the `pgserver` package")
    return binary
