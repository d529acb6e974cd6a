"""Throwaway certificates for the engine's TLS tests: a CA, a server certificate for 127.0.0.1 and
localhost, a client certificate signed by the CA, and one signed by a stranger CA."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from launcher.stack import TLSFiles


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(subject: str, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    return (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer).public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1)))


def write_pair(folder: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> tuple[str, str]:
    cert_path, key_path = folder / f"{stem}.pem", folder / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


class CertificateAuthority:
    def __init__(self, name: str) -> None:
        self.key = _key()
        self.name = _name(name)
        self.cert = (_builder(name, self.name, self.key.public_key())
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                  content_commitment=False, key_encipherment=False,
                                                  data_encipherment=False, key_agreement=False,
                                                  encipher_only=False, decipher_only=False), critical=True)
                     .sign(self.key, hashes.SHA256()))

    def issue(self, common_name: str, *, server: bool,
              ip: bool = True) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        """A server certificate names localhost, and 127.0.0.1 unless `ip` is false."""
        key = _key()
        builder = _builder(common_name, self.name, key.public_key()).add_extension(
            x509.BasicConstraints(ca=False, path_length=None), critical=True)
        if server:
            names = [x509.DNSName("localhost")] + ([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))] if ip else [])
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        return builder.sign(self.key, hashes.SHA256()), key

    def write(self, folder: Path) -> str:
        path = folder / f"{self.name.rfc4514_string().split('=')[1]}.pem"
        path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        return str(path)


def make_tls_files(folder: Path) -> tuple[TLSFiles, TLSFiles]:
    """(files for mutual TLS signed by one CA, files whose client certificate a stranger CA signed).

    Both share the CA and the server certificate; `TLSFiles(ca, server_cert, server_key)` without
    a client certificate is plain TLS."""
    folder.mkdir(parents=True, exist_ok=True)
    ca, stranger = CertificateAuthority("conduit-test-ca"), CertificateAuthority("stranger-ca")
    ca_path = ca.write(folder)
    server_cert, server_key = write_pair(folder, "server", *ca.issue("conduit-engine", server=True))
    client_cert, client_key = write_pair(folder, "client", *ca.issue("conduit-shim", server=False))
    rogue_cert, rogue_key = write_pair(folder, "rogue-client", *stranger.issue("rogue", server=False))
    return (TLSFiles(ca_path, server_cert, server_key, client_cert, client_key),
            TLSFiles(ca_path, server_cert, server_key, rogue_cert, rogue_key))
