"""`oms up`'s development PKI (`services/transport/development.py`), on disk."""

from __future__ import annotations

import stat
from pathlib import Path

from cryptography import x509

from services.transport.certificates import MESH_SERVER_NAME, needs_renewal
from services.transport.development import DevelopmentTls


def test_a_deep_state_folder_gets_an_authority_and_a_certificate_per_service(
    tmp_path: Path,
) -> None:
    # A path longer than a certificate's common name may be (64 characters).
    state_dir = tmp_path / ("deep-" * 20) / "state"
    tls = DevelopmentTls.under(state_dir)
    shard = tls.service_environment("shard-s1")
    assert shard["OMS_TLS"] == "on"
    certificate = x509.load_pem_x509_certificate(Path(shard["OMS_TLS_CERT"]).read_bytes())
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert names.value.get_values_for_type(x509.DNSName) == ["shard-s1", MESH_SERVER_NAME]
    authority_pem = Path(shard["OMS_TLS_CA"]).read_bytes()
    assert not needs_renewal(Path(shard["OMS_TLS_CERT"]).read_bytes(), authority_pem)
    for key in (shard["OMS_TLS_KEY"], str(tls.authority_path.with_suffix(".key"))):
        assert stat.S_IMODE(Path(key).stat().st_mode) == 0o600
    assert stat.S_IMODE(tls.folder.stat().st_mode) == 0o700


def test_certificates_are_kept_across_starts_and_issued_again_for_another_authority(
    tmp_path: Path,
) -> None:
    tls = DevelopmentTls.under(tmp_path)
    first = Path(tls.service_environment("bridge")["OMS_TLS_CERT"]).read_bytes()
    assert Path(tls.service_environment("bridge")["OMS_TLS_CERT"]).read_bytes() == first
    assert not needs_renewal(first, tls.authority_path.read_bytes())
    # A new authority (its files removed): what the old one issued is issued again.
    tls.authority_path.unlink()
    tls.authority_path.with_suffix(".key").unlink()
    again = Path(tls.service_environment("bridge")["OMS_TLS_CERT"]).read_bytes()
    assert again != first
    assert needs_renewal(first, tls.authority_path.read_bytes())
    assert not needs_renewal(again, tls.authority_path.read_bytes())
