"""`oms client` against a local mesh with no flags: the state folder `oms up` keeps.

When neither `--gateway` nor `OMS_GATEWAY_ADDRESS` says where the gateway is, and
the state folder (`--state-dir`, `OMS_STATE_DIR`, else `state/`) holds a mesh, the
gateway is that mesh's, checked by its development authority, and `oms client admin`
and `oms client keys` sign with its admin key unless one is given. A user's own key
is never in the folder: `--api-key` or `OMS_API_KEY` as always.

`gateway_named` says which gateway a command called and, when it did not answer, what
to run: start the folder's mesh, or name a gateway.
"""

from __future__ import annotations

import argparse
import os

from gateway.settings import ClientSettings
from services.mesh.local_mesh import LocalMesh, state_dir_of
from services.settings import load_settings


def adopt_local_mesh(arguments: argparse.Namespace) -> LocalMesh | None:
    """The local mesh, adopted (its gateway's address in `arguments.gateway`), when no
    gateway was named; else None."""
    if arguments.gateway or os.environ.get("OMS_GATEWAY_ADDRESS"):
        return None
    local = LocalMesh.find(state_dir_of(arguments.state_dir))
    if local is None:
        return None
    local.adopt()
    arguments.gateway = local.record.gateway
    arguments.adopted_state_dir = local.state_dir
    return local


def gateway_named(arguments: argparse.Namespace) -> tuple[str, str]:
    """The gateway a command called, and what to run when it did not answer."""
    adopted = getattr(arguments, "adopted_state_dir", None)
    if adopted is not None:
        return arguments.gateway, (
            f"is the mesh under {adopted} running? (`oms status --state-dir {adopted}`;"
            " `oms up` starts it)"
        )
    if arguments.gateway or os.environ.get("OMS_GATEWAY_ADDRESS"):
        gateway = arguments.gateway or os.environ["OMS_GATEWAY_ADDRESS"]
        return gateway, "is the address right (--gateway, OMS_GATEWAY_ADDRESS)?"
    return load_settings(ClientSettings).gateway_address, (
        f"no mesh under {state_dir_of(arguments.state_dir)}: start one with `make run`"
        " (or `oms up`), or name a gateway (--gateway, OMS_GATEWAY_ADDRESS)"
    )


def admin_key_of(arguments: argparse.Namespace) -> tuple[str, str]:
    """The admin key: flags, else OMS_ADMIN_API_KEY/_SECRET, else the local mesh's."""
    local = adopt_local_mesh(arguments)
    key = arguments.admin_key or os.environ.get("OMS_ADMIN_API_KEY", "")
    secret = arguments.admin_secret or os.environ.get("OMS_ADMIN_API_SECRET", "")
    if not (key or secret) and local is not None:
        return local.record.admin_api_key, local.record.admin_api_secret
    return key, secret
