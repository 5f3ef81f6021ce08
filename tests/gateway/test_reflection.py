"""gRPC server reflection on the gateway: what `grpcurl list` and `grpcurl describe` ask.

A tool with no protos learns the services, then the files that define them, and can
build every request from those descriptors alone. Reflection is unsigned (like
health), and learning the API grants nothing: a call built from it still needs its
signature.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from services.clients.channels import mesh_channel
from tests.full_mesh import FullMesh

U = grpc.StatusCode.UNAUTHENTICATED


async def ask(
    stub: reflection_pb2_grpc.ServerReflectionStub,
    *requests: reflection_pb2.ServerReflectionRequest,
) -> list[reflection_pb2.ServerReflectionResponse]:
    async def outgoing() -> AsyncIterator[reflection_pb2.ServerReflectionRequest]:
        for request in requests:
            yield request

    return [response async for response in stub.ServerReflectionInfo(outgoing(), timeout=10)]


async def test_reflection_lists_the_gateway_and_describes_it_well_enough_to_call_it(
    shared_mesh: FullMesh,
) -> None:
    async with mesh_channel(shared_mesh.gateway.address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        (listed,) = await ask(stub, reflection_pb2.ServerReflectionRequest(list_services=""))
        names = {service.name for service in listed.list_services_response.service}
        assert {"oms.v1.OrderGateway", "oms.v1.AdminGateway", "grpc.health.v1.Health"} <= names

        (described,) = await ask(
            stub,
            reflection_pb2.ServerReflectionRequest(file_containing_symbol="oms.v1.OrderGateway"),
        )
        # The file and everything it imports, as serialized FileDescriptorProtos: a pool
        # built from them alone knows every method and message.
        pool = descriptor_pool.DescriptorPool()
        files = [
            descriptor_pb2.FileDescriptorProto.FromString(raw)
            for raw in described.file_descriptor_response.file_descriptor_proto
        ]
        pending = {file.name: file for file in files}
        while pending:
            for name, file in list(pending.items()):
                if all(dependency not in pending for dependency in file.dependency):
                    pool.Add(file)
                    del pending[name]
        service = pool.FindServiceByName("oms.v1.OrderGateway")
        place = service.methods_by_name["PlaceOrder"]
        assert {"Trade", "CancelOrder", "GetOrder", "ListFills"} <= set(service.methods_by_name)

        # A PlaceOrder built from the descriptors only, sent unsigned: refused for want of
        # a key, so the API is described to anyone but usable only with a signature.
        request_class = message_factory.GetMessageClass(place.input_type)
        response_class = message_factory.GetMessageClass(place.output_type)
        # Fields set by name, as a client knowing only the descriptors would (ParseDict
        # rather than keyword arguments, which the Message stubs do not type).
        request = json_format.ParseDict(
            {"client_order_id": "from-reflection", "symbol": "BTC-USDT"}, request_class()
        )
        call = channel.unary_unary(
            "/oms.v1.OrderGateway/PlaceOrder",
            request_serializer=request_class.SerializeToString,
            response_deserializer=response_class.FromString,
        )
        try:
            await call(request, timeout=10)
        except grpc.aio.AioRpcError as error:
            assert error.code() == U, error
        else:
            raise AssertionError("an unsigned call was served")
