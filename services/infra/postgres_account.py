"""The operating-system account PostgreSQL runs as.

PostgreSQL refuses to run as root. When we are root (containers, CI), it runs as the
unprivileged `pgserver` account instead, the same one the pgserver package would use; that
account must be able to reach the binaries and own the data folder.
"""

from __future__ import annotations

import functools
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from services.infra.postgres_binaries import pgserver_module, postgres_bin_path

ACCOUNT_NAME = "pgserver"


@dataclass(frozen=True)
class PostgresAccount:
    name: str
    uid: int
    gid: int

    def hand_over(self, folder: Path) -> None:
        """Let this account own `folder` and traverse every folder above it."""
        pgserver_module("utils").ensure_prefix_permissions(folder)
        os.chown(folder, self.uid, self.gid)


def postgres_account() -> PostgresAccount | None:
    """The account to run PostgreSQL as, or None to run it as ourselves."""
    if os.geteuid() != 0:
        return None
    return _root_substitute()


@functools.cache
def _root_substitute() -> PostgresAccount:
    utils = pgserver_module("utils")
    entry = utils.ensure_user_exists(ACCOUNT_NAME)
    bin_path = postgres_bin_path()
    readable = stat.S_IRGRP | stat.S_IROTH
    executable = stat.S_IXGRP | stat.S_IXOTH
    # Some images install packages readable by root only; the account needs to run the
    # binaries and load their shared libraries.
    utils.ensure_prefix_permissions(bin_path)
    utils.ensure_folder_permissions(bin_path, readable | executable)
    utils.ensure_folder_permissions(bin_path.parent / "lib", readable)
    utils.ensure_folder_permissions(bin_path.parent / "share", readable)
    return PostgresAccount(name=ACCOUNT_NAME, uid=entry.pw_uid, gid=entry.pw_gid)
