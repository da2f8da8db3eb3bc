"""A throwaway certificate authority and a server certificate for 127.0.0.1, as PEM files.

The suite's Apache Kafka serves a SASL_SSL listener with these (Kafka 4 reads
PEM keystores); clients trust the CA file. A listener that wants clients'
certificates too (mutual TLS) trusts the same CA for the ones
:func:`make_client_certificate` signs. EC P-256 keys: generated in
milliseconds, and read by the JVM, OpenSSL and Python's ssl alike.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class ServerCertificates:
    """What a TLS server and its clients need, all in ``directory``."""

    directory: Path
    # The CA certificate clients verify the server with.
    ca_file: Path
    # The server's private key (PKCS#8, unencrypted) followed by its certificate.
    keystore_file: Path
    certificate_file: Path
    key_file: Path
    # The CA's private key, to sign client certificates with.
    ca_key_file: Path


@dataclass(frozen=True)
class ClientCertificate:
    """A client's certificate and its private key (PKCS#8, encrypted only if asked)."""

    certificate_file: Path
    key_file: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_server_certificates(
    directory: Path, *, host: str = "127.0.0.1", days: int = 2
) -> ServerCertificates:
    """A new CA and a certificate for ``host`` (an IP address or a DNS name) signed by it."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    not_before, not_after = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("workflow-jobs test CA")
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
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
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )

    try:
        alt_name: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        alt_name = x509.DNSName(host)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(_name(host))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([alt_name]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )

    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
    cert_pem = server_cert.public_bytes(serialization.Encoding.PEM)
    key_pem = _private_pem(server_key)
    ca_file = directory / "ca.pem"
    certificate_file = directory / "server.crt.pem"
    key_file = directory / "server.key.pem"
    keystore_file = directory / "server.keystore.pem"
    ca_key_file = directory / "ca.key.pem"
    ca_key_file.write_bytes(_private_pem(ca_key))
    ca_key_file.chmod(0o600)
    ca_file.write_bytes(ca_pem)
    certificate_file.write_bytes(cert_pem)
    key_file.write_bytes(key_pem)
    key_file.chmod(0o600)
    keystore_file.write_bytes(key_pem + cert_pem)
    keystore_file.chmod(0o600)
    return ServerCertificates(
        directory=directory,
        ca_file=ca_file,
        keystore_file=keystore_file,
        certificate_file=certificate_file,
        key_file=key_file,
        ca_key_file=ca_key_file,
    )


def make_client_certificate(
    ca: ServerCertificates,
    directory: Path,
    *,
    common_name: str,
    days: int = 2,
    key_password: str | None = None,
) -> ClientCertificate:
    """A certificate for TLS client authentication as ``common_name``, signed by ``ca``;
    its key encrypted with ``key_password`` when one is given."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_cert = x509.load_pem_x509_certificate(ca.ca_file.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.ca_key_file.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    certificate_file = directory / f"{common_name}.crt.pem"
    key_file = directory / f"{common_name}.key.pem"
    certificate_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(_private_pem(key, key_password))
    key_file.chmod(0o600)
    return ClientCertificate(certificate_file=certificate_file, key_file=key_file)


def _private_pem(key: ec.EllipticCurvePrivateKey, password: str | None = None) -> bytes:
    encryption: serialization.KeySerializationEncryption = (
        serialization.NoEncryption()
        if password is None
        else serialization.BestAvailableEncryption(password.encode())
    )
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    )
