"""Mutual TLS between the mesh's services, against a real `oms matcher` process.

The matcher runs with `OMS_TLS=on` and a certificate from a test authority, and a
plaintext health-only port (`OMS_HEALTH_LISTEN`). A caller holding a certificate from
that authority is served; a plaintext caller, a TLS caller without a certificate,
one with another authority's certificate and one with an expired certificate fail
the handshake (UNAVAILABLE: no call reaches the service), and so does one whose
certificate is the authority's but for a server only. A service whose own
certificate expired is refused by its callers, and a service told to use TLS without
its files does not start.
"""

from __future__ import annotations

import datetime
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos.oms.v1 import matcher_pb2, matcher_pb2_grpc
from services.infra.ports import LOOPBACK, free_port
from services.transport.certificates import Identity, issue, mesh_identity, new_authority
from services.transport.tls import MeshTransport
from tests.matcher_service.matcher_process import MatcherProcess
from tests.service_process import CHANNEL_OPTIONS, POLL_INTERVAL_S, ROOT, START_TIMEOUT_S

CALL_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Pki:
    folder: Path
    authority: Identity
    other_authority: Identity

    def files(self, name: str, identity: Identity) -> dict[str, str]:
        certificate, key = self.folder / f"{name}.pem", self.folder / f"{name}.key"
        identity.write(certificate, key)
        authority = self.folder / "ca.pem"
        authority.write_bytes(self.authority.certificate_pem)
        return {
            "OMS_TLS": "on",
            "OMS_TLS_CA": str(authority),
            "OMS_TLS_CERT": str(certificate),
            "OMS_TLS_KEY": str(key),
        }

    def transport(self, identity: Identity, *, trusting: Identity | None = None) -> MeshTransport:
        return MeshTransport.mutual((trusting or self.authority).certificate_pem, identity)


def _expired(authority: Identity, name: str) -> Identity:
    now = datetime.datetime.now(datetime.UTC)
    return mesh_identity(
        authority,
        name,
        not_before=now - datetime.timedelta(days=2),
        not_after=now - datetime.timedelta(hours=1),
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(
        tmp_path_factory.mktemp("pki"),
        new_authority("test mesh authority"),
        new_authority("another authority"),
    )


@pytest.fixture(scope="module")
def matcher(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[MatcherProcess]:
    probe_port = free_port()
    process = MatcherProcess(
        tmp_path_factory.mktemp("matcher") / "data",
        environment={
            **pki.files("matcher", mesh_identity(pki.authority, "matcher-g1")),
            "OMS_HEALTH_LISTEN": f"{LOOPBACK}:{probe_port}",
        },
    )
    process.transport = pki.transport(mesh_identity(pki.authority, "operator"))
    process.probe_address = f"{LOOPBACK}:{probe_port}"  # type: ignore[attr-defined]
    with process:  # started, and SERVING to `process.transport`
        yield process


def _health(channel: grpc.Channel) -> int:
    reply = health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(), timeout=CALL_TIMEOUT_S
    )
    return int(reply.status)


def _refused(channel: grpc.Channel) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as refused:
        _health(channel)
    return refused.value.code()


def test_a_peer_with_a_certificate_from_the_mesh_authority_is_served(
    matcher: MatcherProcess, pki: Pki
) -> None:
    operator = pki.transport(mesh_identity(pki.authority, "operator"))
    with operator.blocking_channel(matcher.address, CHANNEL_OPTIONS) as channel:
        assert _health(channel) == health_pb2.HealthCheckResponse.SERVING
        # The service itself, not only health: a query of the matcher's.
        snapshot = matcher_pb2_grpc.MatcherStub(channel).GetOpenOrders(
            matcher_pb2.OpenOrdersQuery(oms_shard="s1", user_id=7), timeout=CALL_TIMEOUT_S
        )
        assert list(snapshot.orders) == []


def test_a_plaintext_caller_is_refused(matcher: MatcherProcess) -> None:
    with grpc.insecure_channel(matcher.address, options=CHANNEL_OPTIONS) as channel:
        assert _refused(channel) == grpc.StatusCode.UNAVAILABLE


def test_a_caller_without_a_client_certificate_is_refused(
    matcher: MatcherProcess, pki: Pki
) -> None:
    credentials = grpc.ssl_channel_credentials(root_certificates=pki.authority.certificate_pem)
    options = [*CHANNEL_OPTIONS, ("grpc.ssl_target_name_override", "oms-mesh")]
    with grpc.secure_channel(matcher.address, credentials, options=options) as channel:
        assert _refused(channel) == grpc.StatusCode.UNAVAILABLE


def test_a_caller_with_another_authoritys_certificate_is_refused(
    matcher: MatcherProcess, pki: Pki
) -> None:
    # It trusts the mesh's authority, so only its own certificate is wrong.
    stranger = pki.transport(mesh_identity(pki.other_authority, "stranger"))
    with stranger.blocking_channel(matcher.address, CHANNEL_OPTIONS) as channel:
        assert _refused(channel) == grpc.StatusCode.UNAVAILABLE


def test_a_caller_with_an_expired_certificate_is_refused(matcher: MatcherProcess, pki: Pki) -> None:
    expired = pki.transport(_expired(pki.authority, "gateway"))
    with expired.blocking_channel(matcher.address, CHANNEL_OPTIONS) as channel:
        assert _refused(channel) == grpc.StatusCode.UNAVAILABLE


def test_a_server_only_certificate_from_the_mesh_authority_is_no_client_of_the_mesh(
    matcher: MatcherProcess, pki: Pki
) -> None:
    # The gateway's public certificate (`oms up`, `oms tls issue --host`): its holder
    # serves clients but cannot call the mesh's services.
    public = issue(pki.authority, "gateway-public", hosts=("localhost",), server_only=True)
    with pki.transport(public).blocking_channel(matcher.address, CHANNEL_OPTIONS) as channel:
        assert _refused(channel) == grpc.StatusCode.UNAVAILABLE


def test_a_caller_checks_the_server_by_its_own_authority(matcher: MatcherProcess, pki: Pki) -> None:
    # A valid client certificate, but the matcher's is not from the authority it trusts.
    doubting = pki.transport(mesh_identity(pki.authority, "operator"), trusting=pki.other_authority)
    with doubting.blocking_channel(matcher.address, CHANNEL_OPTIONS) as channel:
        assert _refused(channel) == grpc.StatusCode.UNAVAILABLE


def test_a_service_with_an_expired_certificate_is_refused_by_its_callers(
    tmp_path: Path, pki: Pki
) -> None:
    stale = MatcherProcess(
        tmp_path / "stale",
        group="g2",
        environment=pki.files("stale", _expired(pki.authority, "matcher-g2")),
    )
    stale.start()  # not `with stale`: that waits for SERVING, which never comes
    try:
        # It runs (nothing checks its own certificate at start): once it says it
        # listens, a caller's refusal is the handshake's.
        deadline = time.monotonic() + START_TIMEOUT_S
        while "service.serving" not in stale.log_path.read_text(errors="replace"):
            assert stale.running() and time.monotonic() < deadline, stale.log_tail()
            time.sleep(POLL_INTERVAL_S)
        operator = pki.transport(mesh_identity(pki.authority, "operator"))
        with operator.blocking_channel(stale.address, CHANNEL_OPTIONS) as channel:
            assert _refused(channel) == grpc.StatusCode.UNAVAILABLE
        assert stale.running()
    finally:
        stale.stop()


def test_the_probe_port_answers_health_in_plaintext_and_nothing_else(
    matcher: MatcherProcess,
) -> None:
    address = matcher.probe_address  # type: ignore[attr-defined]
    with grpc.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        assert _health(channel) == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as refused:
            matcher_pb2_grpc.MatcherStub(channel).GetOpenOrders(
                matcher_pb2.OpenOrdersQuery(oms_shard="s1", user_id=7), timeout=CALL_TIMEOUT_S
            )
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_a_service_told_to_use_tls_without_its_files_does_not_start(tmp_path: Path) -> None:
    environment = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(ROOT),
        "OMS_TLS": "on",
        "HOME": str(tmp_path),
    }
    finished = subprocess.run(
        [
            sys.executable,
            "-m",
            "services.command_line",
            "matcher",
            "--listen",
            f"{LOOPBACK}:{free_port()}",
            "--data-dir",
            str(tmp_path / "data"),
        ],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert finished.returncode == 2, finished.stderr
    assert "OMS_TLS_CA is not set" in finished.stderr
