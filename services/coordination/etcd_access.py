"""Who may do what in etcd: the mesh's role over its own keys, and auth by certificate.

With etcd's client port on mutual TLS (`--client-cert-auth`) and its auth enabled,
etcd takes the common name of the caller's certificate as the user. A mesh gets one
role, `oms-<mesh id>`, with read and write over its own keys (`/oms/v1/<mesh id>/`,
`group_keys.mesh_prefix`) and nothing else; each service's certificate name is a
user without a password (a certificate is the only way in) granted that role.
etcd's administrator is the user `root` (a certificate named `root`), which exists
before auth is enabled, as etcd requires.

`grant_mesh_access` is run as root at every start (`oms up`) and changes only what is
missing: users and grants already there stay, nothing is revoked. Leases, compaction
and the cluster's status need no permission on keys; a lease's revocation needs
write permission on the keys attached to it (the mesh's own).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from protos.etcd.authpb import auth_pb2
from protos.etcd.etcdserverpb import rpc_pb2 as rpc
from services.coordination.etcd_channel import EtcdChannel, prefix_end
from services.coordination.etcd_session import EtcdSession
from services.coordination.group_keys import mesh_prefix

ROOT = "root"


def mesh_role(mesh_id: str) -> str:
    return f"oms-{mesh_id}"


@dataclass(frozen=True, slots=True)
class AccessReport:
    """What `grant_mesh_access` found and changed."""

    role: str
    users_added: tuple[str, ...]
    auth_enabled_now: bool


async def grant_mesh_access(
    session: EtcdSession, mesh_id: str, users: Iterable[str]
) -> AccessReport:
    """As etcd's root: the mesh's role over its keys, `users` granted it, auth on."""
    role = mesh_role(mesh_id)
    prefix = mesh_prefix(mesh_id)
    wanted = sorted(set(users) | {ROOT})
    timeout_s = session.timeout_s

    async def existing_users(channel: EtcdChannel) -> set[str]:
        answer = await channel.auth.UserList(rpc.AuthUserListRequest(), timeout=timeout_s)
        return set(answer.users)

    async def existing_roles(channel: EtcdChannel) -> set[str]:
        answer = await channel.auth.RoleList(rpc.AuthRoleListRequest(), timeout=timeout_s)
        return set(answer.roles)

    async def auth_enabled(channel: EtcdChannel) -> bool:
        answer = await channel.auth.AuthStatus(rpc.AuthStatusRequest(), timeout=timeout_s)
        return bool(answer.enabled)

    users_now = await session.call(existing_users)
    roles_now = await session.call(existing_roles)
    added = [user for user in wanted if user not in users_now]
    requests: list[AuthRequest] = [
        rpc.AuthUserAddRequest(name=user, options=auth_pb2.UserAddOptions(no_password=True))
        for user in added
    ]
    requests += [
        rpc.AuthRoleAddRequest(name=name) for name in (ROOT, role) if name not in roles_now
    ]
    permission = auth_pb2.Permission(
        permType=auth_pb2.Permission.READWRITE, key=prefix, range_end=prefix_end(prefix)
    )
    requests.append(rpc.AuthRoleGrantPermissionRequest(name=role, perm=permission))
    requests += [
        rpc.AuthUserGrantRoleRequest(user=user, role=ROOT if user == ROOT else role)
        for user in wanted
    ]
    for request in requests:
        await session.call(_sender(request, timeout_s))
    enabled_before = await session.call(auth_enabled)
    if not enabled_before:
        await session.call(_sender(rpc.AuthEnableRequest(), timeout_s))
    return AccessReport(role, tuple(added), not enabled_before)


AuthRequest = (
    rpc.AuthUserAddRequest
    | rpc.AuthRoleAddRequest
    | rpc.AuthRoleGrantPermissionRequest
    | rpc.AuthUserGrantRoleRequest
    | rpc.AuthEnableRequest
)


def _sender(request: AuthRequest, timeout_s: float) -> Callable[[EtcdChannel], Awaitable[object]]:
    """The call of etcd's Auth service that takes `request`."""

    async def send(channel: EtcdChannel) -> object:
        auth = channel.auth
        if isinstance(request, rpc.AuthUserAddRequest):
            return await auth.UserAdd(request, timeout=timeout_s)
        if isinstance(request, rpc.AuthRoleAddRequest):
            return await auth.RoleAdd(request, timeout=timeout_s)
        if isinstance(request, rpc.AuthRoleGrantPermissionRequest):
            return await auth.RoleGrantPermission(request, timeout=timeout_s)
        if isinstance(request, rpc.AuthUserGrantRoleRequest):
            return await auth.UserGrantRole(request, timeout=timeout_s)
        return await auth.AuthEnable(request, timeout=timeout_s)

    return send
