"""`gpufleet server init`: the head's own certificate authority and its server certificate.

The CA key never leaves the head's data directory; agents pin the CA's fingerprint from their join
token (see core.tls). Running init again keeps the CA, so pinned agents keep trusting the head, and
only re-issues the server certificate when asked to (new host names, or before it expires).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpufleet.core import tls
from gpufleet.core.errors import ConfigError, InvalidInput

CA_DAYS = 3650
SERVER_DAYS = 397  # what browsers accept for a server certificate


@dataclass(frozen=True)
class PkiFiles:
    directory: Path

    @property
    def ca_cert(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def cert(self) -> Path:
        return self.directory / "server.pem"

    @property
    def key(self) -> Path:
        return self.directory / "server.key"


@dataclass(frozen=True)
class InitResult:
    files: PkiFiles
    ca_fingerprint: str
    created_ca: bool
    issued_cert: bool
    names: tuple[str, ...]


def default_names() -> list[str]:
    """The names agents and browsers are likely to use for this host."""
    names = [socket.gethostname(), socket.getfqdn(), "localhost", "127.0.0.1", "::1"]
    return list(dict.fromkeys(n for n in names if n))


def _write_private(path: Path, data: bytes) -> None:
    """Write atomically with mode 0600 from the start: a key must never be readable, even briefly."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _subject_alt_names(names: list[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for name in names:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            if not name or any(c.isspace() for c in name) or len(name) > 253:
                raise InvalidInput(f"invalid host name for the certificate: {name!r}") from None
            entries.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(entries)


def _new_ca(now: dt.datetime) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpufleet cluster CA")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _server_cert(
    ca_key: ec.EllipticCurvePrivateKey, ca: x509.Certificate, names: list[str], now: dt.datetime
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=SERVER_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_subject_alt_names(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def _load_ca(files: PkiFiles) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    try:
        key = serialization.load_pem_private_key(files.ca_key.read_bytes(), password=None)
        cert = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the CA in {files.directory}: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ConfigError(f"{files.ca_key} is not the EC key `gpufleet server init` makes")
    return key, cert


def init_pki(directory: Path, names: list[str], *, reissue: bool = False) -> InitResult:
    """Create the CA (unless there is one) and the server certificate (unless there is one, or `reissue`).

    Raises InvalidInput for a bad host name and ConfigError for an unreadable or half-made directory.
    """
    files = PkiFiles(directory)
    names = list(dict.fromkeys(names))
    if not names:
        raise InvalidInput("the server certificate needs at least one host name")
    _subject_alt_names(names)  # check the names before anything is written
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise ConfigError(f"cannot create {directory}: {exc.strerror}") from None
    if files.ca_cert.exists() != files.ca_key.exists():
        raise ConfigError(f"{directory} holds half a CA (ca.pem or ca.key missing); restore it or remove both")
    now = dt.datetime.now(dt.UTC)
    created_ca = not files.ca_cert.exists()
    if created_ca:
        ca_key, ca = _new_ca(now)
        _write_private(files.ca_key, _key_pem(ca_key))
        _write_private(files.ca_cert, ca.public_bytes(serialization.Encoding.PEM))
    else:
        ca_key, ca = _load_ca(files)
    issued = created_ca or reissue or not files.cert.exists() or not files.key.exists()
    if issued:
        key, cert = _server_cert(ca_key, ca, names, now)
        # Key first: a crash in between leaves a new key with the old certificate, which fails loudly
        # at start (uvicorn checks they match), never a certificate nobody holds the key to.
        _write_private(files.key, _key_pem(key))
        _write_private(files.cert, cert.public_bytes(serialization.Encoding.PEM) + files.ca_cert.read_bytes())
    ca_fingerprint = tls.fingerprint(files.ca_cert.read_text())
    return InitResult(files, ca_fingerprint, created_ca, issued, tuple(names))
