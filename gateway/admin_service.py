"""`oms.v1.AdminGateway`: accounts, transfers, halts and kill-switches (admin key only).

- CreateUser: the persister creates the account and its API key (the secret is
  shown once, in this answer).
- Deposit / Withdraw: logged shard commands keyed by `transfer_id`, so a retry
  is answered with the original result and moves no money twice.
- HaltSymbol / ResumeSymbol: the matcher group that owns the symbol.
- KillSwitch: every matcher group (a user's orders may rest in any of them).
- CreateApiKey / ListApiKeys / RevokeApiKey / RotateApiKey: a user's keys
  (`gateway/key_admin.py`).
- SetRiskLimits / HaltUser / ResumeUser / RestartUser / ListUsers / ListAdminAudit:
  an operator's controls of one user, logged and audited (`gateway/user_admin.py`).
"""

from __future__ import annotations

from typing import Any

import grpc

from gateway.authentication import caller
from gateway.clusters import PersisterPool
from gateway.core.acks import transfer_ack, transfer_command
from gateway.core.validation import RequestValidator, check_user_id
from gateway.key_admin import KeyAdmin
from gateway.matcher_control import MatcherControl
from gateway.routing import ShardRouter
from gateway.user_admin import UserAdmin
from protos.oms.v1 import gateway_pb2, matcher_pb2, persister_pb2

SERVICE_NAME = "oms.v1.AdminGateway"
Context = Any  # grpc.aio.ServicerContext (grpc ships no type information)


def _outcome(result: matcher_pb2.MatcherCommandResult) -> tuple[bool, str]:
    if result.reject_reason:
        return False, matcher_pb2.MatcherRejectReason.Name(result.reject_reason)
    return True, ""


class AdminService:
    def __init__(
        self,
        *,
        validator: RequestValidator,
        router: ShardRouter,
        persister: PersisterPool,
        matchers: MatcherControl,
    ) -> None:
        self.validator = validator
        self.router = router
        self.persister = persister
        self.matchers = matchers
        self.keys = KeyAdmin(persister)
        self.users = UserAdmin(router, persister)

    async def create_user(
        self, request: gateway_pb2.CreateUserRequest, context: Context
    ) -> gateway_pb2.CreateUserResponse:
        self.validator.new_user(request)
        new_user = persister_pb2.NewUser(
            user_id=request.user_id, tier=request.tier, actor=caller.get().api_key
        )
        new_user.risk_limits.CopyFrom(request.risk_limits)
        created = await self.persister.create_user(new_user)
        return gateway_pb2.CreateUserResponse(
            user_id=created.user_id, api_key=created.api_key, api_secret=created.api_secret
        )

    async def deposit(
        self, request: gateway_pb2.TransferRequest, context: Context
    ) -> gateway_pb2.TransferAck:
        self.validator.transfer(request)
        command = transfer_command(request, deposit=True)
        return transfer_ack(await self.router.execute(request.user_id, command))

    async def withdraw(
        self, request: gateway_pb2.TransferRequest, context: Context
    ) -> gateway_pb2.TransferAck:
        self.validator.transfer(request)
        command = transfer_command(request, deposit=False)
        return transfer_ack(await self.router.execute(request.user_id, command))

    async def halt_symbol(
        self, request: gateway_pb2.HaltSymbolRequest, context: Context
    ) -> gateway_pb2.AdminAck:
        market = self.validator.market(request.symbol)
        command = matcher_pb2.MatcherCommand()
        command.halt.symbol = market.symbol
        command.halt.cancel_resting = request.cancel_resting
        accepted, detail = _outcome(await self.matchers.execute(market.matcher_group, command))
        return gateway_pb2.AdminAck(accepted=accepted, detail=detail or f"{market.symbol} halted")

    async def resume_symbol(
        self, request: gateway_pb2.ResumeSymbolRequest, context: Context
    ) -> gateway_pb2.AdminAck:
        market = self.validator.market(request.symbol)
        command = matcher_pb2.MatcherCommand()
        command.resume.symbol = market.symbol
        accepted, detail = _outcome(await self.matchers.execute(market.matcher_group, command))
        return gateway_pb2.AdminAck(accepted=accepted, detail=detail or f"{market.symbol} resumed")

    async def kill_switch(
        self, request: gateway_pb2.KillSwitchRequest, context: Context
    ) -> gateway_pb2.AdminAck:
        check_user_id(request.user_id)
        command = matcher_pb2.MatcherCommand()
        command.kill_switch.user_id = request.user_id
        command.kill_switch.enable = request.enable
        results = await self.matchers.execute_everywhere(command)
        refused = {
            group: _outcome(result)[1] for group, result in results.items() if _outcome(result)[1]
        }
        if refused:
            detail = ", ".join(f"{group}: {reason}" for group, reason in refused.items())
            return gateway_pb2.AdminAck(accepted=False, detail=detail)
        state = "on" if request.enable else "off"
        return gateway_pb2.AdminAck(
            accepted=True,
            detail=f"kill-switch {state} for user {request.user_id} in {', '.join(results)}",
        )

    def register(self, server: grpc.aio.Server) -> None:
        g = gateway_pb2

        def call(handler: Any, request: Any, response: Any) -> Any:
            return grpc.unary_unary_rpc_method_handler(
                handler,
                request_deserializer=request.FromString,
                response_serializer=response.SerializeToString,
            )

        handlers = {
            "CreateUser": call(self.create_user, g.CreateUserRequest, g.CreateUserResponse),
            "Deposit": call(self.deposit, g.TransferRequest, g.TransferAck),
            "Withdraw": call(self.withdraw, g.TransferRequest, g.TransferAck),
            "HaltSymbol": call(self.halt_symbol, g.HaltSymbolRequest, g.AdminAck),
            "ResumeSymbol": call(self.resume_symbol, g.ResumeSymbolRequest, g.AdminAck),
            "KillSwitch": call(self.kill_switch, g.KillSwitchRequest, g.AdminAck),
            "CreateApiKey": call(self.keys.create, g.CreateApiKeyRequest, g.ApiKeyCreated),
            "ListApiKeys": call(self.keys.list, g.ListApiKeysRequest, g.ApiKeys),
            "RevokeApiKey": call(self.keys.revoke, g.RevokeApiKeyRequest, g.ApiKey),
            "RotateApiKey": call(self.keys.rotate, g.RotateApiKeyRequest, g.ApiKeyCreated),
            "SetRiskLimits": call(self.users.set_risk_limits, g.SetRiskLimitsRequest, g.AdminAck),
            "HaltUser": call(self.users.halt_user, g.UserControlRequest, g.AdminAck),
            "ResumeUser": call(self.users.resume_user, g.UserControlRequest, g.AdminAck),
            "RestartUser": call(self.users.restart_user, g.UserControlRequest, g.AdminAck),
            "ListUsers": call(self.users.list_users, g.ListUsersRequest, g.UserSummaries),
            "ListAdminAudit": call(
                self.users.list_admin_audit, g.ListAdminAuditRequest, g.AdminAuditEntries
            ),
        }
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),)
        )
