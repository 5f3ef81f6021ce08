"""`oms client keys ...`: a user's API keys through the admin API, with the admin key.

    oms client --user-id 7 keys create [--ed25519-public-key-file F] [--scope read]...
                                       [--expires-in-s N] [--label TEXT]
    oms client --user-id 7 keys list
    oms client keys revoke ak_...
    oms client keys rotate ak_... [--ed25519-public-key-file F]
    oms client keys new-ed25519 --out F     a private key (PEM, 0600); its public key

The admin key is `--admin-key/--admin-secret` or OMS_ADMIN_API_KEY/OMS_ADMIN_API_SECRET,
else a local mesh's (its state folder, when no gateway is named).
An HMAC key's secret is printed once, at creation or rotation. With an Ed25519 key,
`oms client --api-key ak_... --private-key-file F ...` signs with the private key.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from gateway.client import AdminClient, GatewayCallError
from gateway.client_waits import refusal, through_elections
from gateway.local_mesh_client import admin_key_of, gateway_named
from gateway.settings import ClientSettings
from protos.oms.v1 import common_pb2, gateway_pb2
from services.settings import SettingsError, load_settings

SCOPES = {"read": common_pb2.API_KEY_SCOPE_READ, "trade": common_pb2.API_KEY_SCOPE_TRADE}


def add_admin_key_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--admin-key", default=None, dest="admin_key", help="env OMS_ADMIN_API_KEY")
    parser.add_argument(
        "--admin-secret", default=None, dest="admin_secret", help="env OMS_ADMIN_API_SECRET"
    )


def register_keys(actions: Any) -> None:
    keys = actions.add_parser("keys", help="a user's API keys (the admin key is needed)")
    add_admin_key_arguments(keys)
    verbs = keys.add_subparsers(dest="verb", required=True, metavar="VERB")
    create = verbs.add_parser("create", help="a new key for --user-id")
    create.add_argument("--ed25519-public-key-file", type=Path, default=None, dest="public_key")
    create.add_argument(
        "--scope", action="append", choices=sorted(SCOPES), default=[], dest="scopes"
    )
    create.add_argument("--expires-in-s", type=int, default=0, dest="expires_in_s")
    create.add_argument("--label", default="")
    create.set_defaults(handler=run_create)
    verbs.add_parser("list", help="the keys of --user-id").set_defaults(handler=run_list)
    revoke = verbs.add_parser("revoke", help="revoke a key (never undone)")
    revoke.add_argument("api_key")
    revoke.set_defaults(handler=run_revoke)
    rotate = verbs.add_parser("rotate", help="a key like this one; this one revoked")
    rotate.add_argument("api_key")
    rotate.add_argument("--ed25519-public-key-file", type=Path, default=None, dest="public_key")
    rotate.set_defaults(handler=run_rotate)
    generate = verbs.add_parser("new-ed25519", help="make an Ed25519 private key file")
    generate.add_argument("--out", type=Path, required=True)
    generate.set_defaults(handler=run_new_ed25519)


def read_private_key(path: Path) -> Ed25519PrivateKey:
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise SettingsError(f"{path}: not an Ed25519 private key")
    return key


def _raw_public_key(path: Path | None) -> bytes:
    """A public key file (PEM), or a private key file whose public half is meant."""
    if path is None:
        return b""
    data = path.read_bytes()
    try:
        key: Any = serialization.load_pem_public_key(data)
    except ValueError:
        key = read_private_key(path).public_key()
    if not isinstance(key, Ed25519PublicKey):
        raise SettingsError(f"{path}: not an Ed25519 key")
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def admin_client(arguments: argparse.Namespace) -> AdminClient:
    key, secret = admin_key_of(arguments)  # the local mesh's gateway too, if none named
    settings = load_settings(ClientSettings, overrides={"gateway_address": arguments.gateway})
    if not (key and secret):
        raise SettingsError(
            "the admin key: --admin-key/--admin-secret or OMS_ADMIN_API_KEY/_SECRET"
            " (or a local mesh's state folder)"
        )
    return AdminClient(settings.gateway_address, api_key=key, api_secret=secret)


def _user_id(arguments: argparse.Namespace) -> int:
    user_id = arguments.user_id or int(os.environ.get("OMS_USER_ID", "0") or 0)
    if not user_id:
        raise SettingsError("whose keys: --user-id (before `keys`) or OMS_USER_ID")
    return int(user_id)


def run_admin(
    arguments: argparse.Namespace,
    action: Callable[[AdminClient], Awaitable[int | None]],
    command: str = "oms client keys",
    *,
    repeatable: bool = False,
) -> int:
    """Run `action` with the admin client: its status (0 if None), 1 refused, 2 bad usage.
    `repeatable`: safe to send again, so sent again through an election
    (`client_waits.py`); a key's creation, rotation or revocation is not."""

    async def call() -> int | None:
        async with admin_client(arguments) as admin:
            if repeatable:
                return await through_elections(lambda: action(admin), command)
            return await action(admin)

    try:
        return asyncio.run(call()) or 0
    except (SettingsError, OSError) as error:
        print(f"{command}: {error}", file=sys.stderr)
        return 2
    except GatewayCallError as error:
        print(refusal(error, command, *gateway_named(arguments)), file=sys.stderr)
        return 1


def describe(key: gateway_pb2.ApiKey) -> str:
    kind = common_pb2.ApiKeyKind.Name(key.kind).removeprefix("API_KEY_KIND_").lower()
    scopes = ",".join(
        common_pb2.ApiKeyScope.Name(scope).removeprefix("API_KEY_SCOPE_").lower()
        for scope in key.scopes
    )
    expires = f" expires_at_ms={key.expires_at_ms}" if key.expires_at_ms else ""
    revoked = f" REVOKED at {key.revoked_at_ms}" if key.revoked_at_ms else ""
    label = f" label={key.label!r}" if key.label else ""
    return f"{key.api_key} user {key.user_id} {kind} [{scopes}]{expires}{label}{revoked}"


def _print_created(created: gateway_pb2.ApiKeyCreated) -> None:
    print(describe(created.key))
    if created.api_secret:
        print(f"secret (shown once): {created.api_secret}")


def run_create(arguments: argparse.Namespace) -> int:
    async def action(admin: AdminClient) -> None:
        public_key = _raw_public_key(arguments.public_key)
        expires = time.time_ns() // 1_000_000 + arguments.expires_in_s * 1000
        created = await admin.create_api_key(
            _user_id(arguments),
            kind=common_pb2.API_KEY_KIND_ED25519 if public_key else common_pb2.API_KEY_KIND_HMAC,
            public_key=public_key,
            scopes=[SCOPES[scope] for scope in arguments.scopes],
            expires_at_ms=expires if arguments.expires_in_s else 0,
            label=arguments.label,
        )
        _print_created(created)

    return run_admin(arguments, action)


def run_list(arguments: argparse.Namespace) -> int:
    async def action(admin: AdminClient) -> None:
        for key in await admin.list_api_keys(_user_id(arguments)):
            print(describe(key))

    return run_admin(arguments, action, repeatable=True)  # a read


def run_revoke(arguments: argparse.Namespace) -> int:
    async def action(admin: AdminClient) -> None:
        print(describe(await admin.revoke_api_key(arguments.api_key)))

    return run_admin(arguments, action)


def run_rotate(arguments: argparse.Namespace) -> int:
    async def action(admin: AdminClient) -> None:
        public_key = _raw_public_key(arguments.public_key)
        _print_created(await admin.rotate_api_key(arguments.api_key, public_key=public_key))

    return run_admin(arguments, action)


def run_new_ed25519(arguments: argparse.Namespace) -> int:
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    descriptor = os.open(arguments.out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as out:
        out.write(pem)
    public = key.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    print(f"{arguments.out}: Ed25519 private key; public key {public.hex()}")
    return 0
