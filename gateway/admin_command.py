"""`oms client admin ...`: an operator's controls of one user, with the admin key.

    oms client admin users [--after USER] [--limit N]      users and their state
    oms client admin limits USER [--max-open-orders N ...] [--clear-reduce-only]
    oms client admin halt USER        refuse the user's places and withdrawals
    oms client admin resume USER      undo halt
    oms client admin restart USER     flush a flat user to PostgreSQL and drop it: its
                                      next command hydrates it afresh and healthy
    oms client admin kill-switch USER on|off   the matchers cancel what rests, refuse more
    oms client admin audit [--user USER] [--before ID] [--limit N]

Every control takes `--note TEXT` (at most 256 characters), kept in the audit with the
admin key id and the command's log position. `limits` changes only the limits given:
the others stay what the user has now (0 means no limit). Each control is one request,
decided once: its id (made here, the same on every retry through an election) and the
user's control version it is decided against (`--if-control-version N`, from `users`;
by default `limits` pins the version it read the limits at, and the gateway pins the
others to the version it reads). Refused CONTROL_VERSION_STALE: another control was
decided since; look at the user again. The admin key is
`--admin-key/--admin-secret` or OMS_ADMIN_API_KEY/OMS_ADMIN_API_SECRET, else a local
mesh's (its state folder, when no gateway is named). Exit status: 0 done, 1 refused,
2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import uuid
from typing import Any

from gateway.client import AdminClient
from gateway.key_command import add_admin_key_arguments, run_admin
from protos.oms.v1 import gateway_pb2, shard_pb2
from services.settings import SettingsError

COMMAND = "oms client admin"
LIMIT_FIELDS = (
    "max_order_notional",
    "max_position_lots",
    "max_open_orders",
    "price_band_bps",
    "max_drawdown",
)


def register_admin(actions: Any) -> None:
    admin = actions.add_parser("admin", help="an operator's controls (the admin key is needed)")
    add_admin_key_arguments(admin)
    verbs = admin.add_subparsers(dest="verb", required=True, metavar="VERB")
    users = verbs.add_parser("users", help="users and their state, by user id")
    users.add_argument("--after", type=int, default=0, help="after this user id")
    users.add_argument("--limit", type=int, default=0, help="1..1000 (default 100)")
    users.set_defaults(handler=run_users)
    limits = verbs.add_parser("limits", help="change a user's risk limits")
    limits.add_argument("user_id", type=int)
    for name in LIMIT_FIELDS:
        limits.add_argument(f"--{name.replace('_', '-')}", type=int, default=None, dest=name)
    limits.add_argument("--clear-reduce-only", action="store_true", dest="clear_reduce_only")
    limits.set_defaults(handler=run_limits)
    for verb, text in (
        ("halt", "halt a user's trading (cancels still pass)"),
        ("resume", "resume a halted user's trading"),
        ("restart", "re-hydrate a flat user from PostgreSQL (out of quarantine or halt)"),
    ):
        control = verbs.add_parser(verb, help=text)
        control.add_argument("user_id", type=int)
        control.set_defaults(handler=run_control)
    kill = verbs.add_parser("kill-switch", help="cancel a user's resting orders everywhere")
    kill.add_argument("user_id", type=int)
    kill.add_argument("state", choices=("on", "off"))
    kill.set_defaults(handler=run_kill_switch)
    controls = (limits, *(verbs.choices[verb] for verb in ("halt", "resume", "restart")))
    for parser in (kill, *controls):
        parser.add_argument("--note", default="", help="why, for the audit")
    for parser in controls:
        parser.add_argument(
            "--if-control-version",
            type=int,
            default=None,
            dest="if_control_version",
            help="decide it only if the user's control version is still N (see users)",
        )
    audit = verbs.add_parser("audit", help="the audit of administrative changes, newest first")
    audit.add_argument("--user", type=int, default=0, dest="audit_user")
    audit.add_argument("--before", type=int, default=0, help="older than this audit id")
    audit.add_argument("--limit", type=int, default=0, help="1..1000 (default 100)")
    audit.set_defaults(handler=run_audit)


def _print_ack(ack: gateway_pb2.AdminAck) -> int:
    print(("done: " if ack.accepted else "refused: ") + ack.detail)
    return 0 if ack.accepted else 1


def run_control(arguments: argparse.Namespace) -> int:
    request_id = uuid.uuid4().hex  # one request, however often it is sent

    async def action(admin: AdminClient) -> int:
        call = {"halt": admin.halt_user, "resume": admin.resume_user}.get(
            arguments.verb, admin.restart_user
        )
        ack = await call(
            arguments.user_id,
            note=arguments.note,
            request_id=request_id,
            if_control_version=arguments.if_control_version,
        )
        return _print_ack(ack)

    return run_admin(arguments, action, COMMAND, repeatable=True)


def run_kill_switch(arguments: argparse.Namespace) -> int:
    async def action(admin: AdminClient) -> int:
        ack = await admin.kill_switch(arguments.user_id, enable=arguments.state == "on")
        return _print_ack(ack)

    return run_admin(arguments, action, COMMAND, repeatable=True)


async def current_user(admin: AdminClient, user_id: int) -> gateway_pb2.UserSummary:
    page = await admin.list_users(after_user_id=user_id - 1, limit=1)
    if not page.users or page.users[0].user_id != user_id:
        raise SettingsError(f"user {user_id} has no account")
    return page.users[0]


def run_limits(arguments: argparse.Namespace) -> int:
    request_id = uuid.uuid4().hex  # one request, however often it is sent

    async def action(admin: AdminClient) -> int:
        user = await current_user(admin, arguments.user_id)
        limits = shard_pb2.RiskLimits()
        limits.CopyFrom(user.risk_limits)
        for name in LIMIT_FIELDS:
            value = getattr(arguments, name)
            if value is not None:
                setattr(limits, name, value)
        # Read, modify, write: decided only if no other control came between.
        pinned = arguments.if_control_version
        ack = await admin.set_risk_limits(
            arguments.user_id,
            limits,
            clear_reduce_only=arguments.clear_reduce_only,
            note=arguments.note,
            request_id=request_id,
            if_control_version=user.control_version if pinned is None else pinned,
        )
        return _print_ack(ack)

    return run_admin(arguments, action, COMMAND, repeatable=True)


def describe_user(user: gateway_pb2.UserSummary) -> str:
    limits = {name: getattr(user.risk_limits, name) for name in LIMIT_FIELDS}
    set_limits = ",".join(f"{name}={value}" for name, value in limits.items() if value) or "none"
    flags = [
        flag
        for flag, on in (("TRADING_HALTED", user.trading_halted), ("REDUCE_ONLY", user.reduce_only))
        if on
    ]
    balances = " ".join(f"{b.asset}={b.total}" for b in user.balances) or "-"
    return (
        f"user {user.user_id} {user.lifecycle} {user.health}"
        f" cluster={user.cluster or '-'} open_orders={user.open_orders}"
        f" control_version={user.control_version}"
        f" limits[{set_limits}] {' '.join(flags)} balances: {balances}"
    ).replace("  ", " ")


def run_users(arguments: argparse.Namespace) -> int:
    async def action(admin: AdminClient) -> int:
        page = await admin.list_users(after_user_id=arguments.after, limit=arguments.limit)
        for user in page.users:
            print(describe_user(user))
        if page.more and page.users:
            print(f"more: --after {page.users[-1].user_id}")
        return 0

    return run_admin(arguments, action, COMMAND, repeatable=True)


def describe_audit(entry: gateway_pb2.AdminAuditEntry) -> str:
    place = f" at {entry.shard_id}@{entry.position}" if entry.shard_id else ""
    outcome = "" if entry.accepted else f" REFUSED {entry.reject_reason}"
    note = f" note={json.dumps(entry.note)}" if entry.note else ""
    subject = f" {entry.subject}" if entry.subject else ""
    return (
        f"#{entry.audit_id} {entry.at_ms} {entry.actor} {entry.action}"
        f" user {entry.user_id}{subject}{outcome}{place} {entry.detail}{note}"
    )


def run_audit(arguments: argparse.Namespace) -> int:
    async def action(admin: AdminClient) -> int:
        page = await admin.list_admin_audit(
            user_id=arguments.audit_user, before_audit_id=arguments.before, limit=arguments.limit
        )
        for entry in page.entries:
            print(describe_audit(entry))
        if page.more and page.entries:
            print(f"more: --before {page.entries[-1].audit_id}")
        return 0

    return run_admin(arguments, action, COMMAND, repeatable=True)
