"""`gpufleet server init`: a CA and a server certificate that chain, private files, a kept CA."""

import stat
from pathlib import Path

import pytest
from cryptography import x509

from gpufleet.api.pki import init_pki
from gpufleet.core.errors import ConfigError, InvalidInput


def test_init_makes_a_ca_and_a_server_certificate_for_the_names(tmp_path: Path) -> None:
    result = init_pki(tmp_path / "tls", ["head.example.org", "10.0.0.5", "localhost"])
    assert result.created_ca
    assert result.issued_cert
    for path in (result.files.ca_key, result.files.key, result.files.ca_cert, result.files.cert):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    ca = x509.load_pem_x509_certificate(result.files.ca_cert.read_bytes())
    server = x509.load_pem_x509_certificate(result.files.cert.read_bytes())
    server.verify_directly_issued_by(ca)
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["head.example.org", "localhost"]
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["10.0.0.5"]
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_init_again_keeps_the_ca_so_pinned_agents_still_trust_the_head(tmp_path: Path) -> None:
    first = init_pki(tmp_path, ["localhost"])
    cert_before = first.files.cert.read_bytes()
    again = init_pki(tmp_path, ["localhost"])
    assert (again.created_ca, again.issued_cert) == (False, False)
    assert again.ca_fingerprint == first.ca_fingerprint
    assert first.files.cert.read_bytes() == cert_before
    reissued = init_pki(tmp_path, ["localhost", "new.example.org"], reissue=True)
    assert reissued.ca_fingerprint == first.ca_fingerprint
    assert first.files.cert.read_bytes() != cert_before


def test_a_bad_name_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="invalid host name"):
        init_pki(tmp_path / "tls", ["good.example.org", "bad name"])
    assert not (tmp_path / "tls").exists()


def test_half_a_ca_is_refused(tmp_path: Path) -> None:
    made = init_pki(tmp_path, ["localhost"])
    made.files.ca_key.unlink()
    with pytest.raises(ConfigError, match="half a CA"):
        init_pki(tmp_path, ["localhost"])
