"""Make a private CA and the certificates of a secured deployment (``conf/secure/``).

Writes PEM files into ``--out`` (default ``conf/secure/certs``)::

    ca.pem, ca.key                     the CA (kept, so later runs issue more from it)
    broker.pem, broker.key             the broker: every --san as a subject alternative name
    <name>.pem, <name>.key             one per --client: a client certificate for mutual TLS
                                       whose first (DNS) name is the principal <name>

Run from the repository root::

    python scripts/make_certs.py --san localhost --san 127.0.0.1 \\
        --client producer-app --client consumer-app

``--san`` takes host names and IP addresses: every name clients use to reach
the broker (its Flight ``advertised_host`` and the host of its NATS URL).  A
client certificate proves the principal named by its first subject
alternative name, so ``--client`` names must be principals of the ACL.  Keys
are ECDSA P-256, unencrypted (gRPC and nats-server read them as they are),
written with mode 0600; certificates are valid for ``--days`` (default 365).
An existing CA in ``--out`` is reused; a broker or client file is replaced.
Keep ``ca.key`` offline once you have issued what you need.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

PrivateKey = ec.EllipticCurvePrivateKey
BACKDATE = datetime.timedelta(minutes=5)
"""Certificates start a little in the past, so a peer whose clock runs behind accepts them."""


def _write_key(path: Path, key: PrivateKey) -> None:
    data = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "pyspark-jetstream"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _general_name(san: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(san))
    except ValueError:
        return x509.DNSName(san)


def load_or_make_ca(out: Path, days: int) -> tuple[x509.Certificate, PrivateKey]:
    """The CA in ``out`` (``ca.pem``, ``ca.key``), made first if it is not there."""
    cert_path, key_path = out / "ca.pem", out / "ca.key"
    if cert_path.exists() and key_path.exists():
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        if not isinstance(key, PrivateKey):
            raise SystemExit(f"make_certs: {key_path} is not an ECDSA key made by this script")
        print(f"make_certs: reusing the CA in {cert_path}")
        return cert, key
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    name = _name("pyspark-jetstream private CA")
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
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
    _write_key(key_path, key)
    _write_cert(cert_path, cert)
    print(f"make_certs: wrote a new CA: {cert_path} (and its key {key_path})")
    return cert, key


def issue(
    ca: tuple[x509.Certificate, PrivateKey],
    out: Path,
    stem: str,
    sans: list[str],
    *,
    server: bool,
    days: int,
) -> None:
    """Write ``<stem>.pem`` and ``<stem>.key``: a certificate for ``sans`` signed by ``ca``.

    Every certificate may authenticate a client (a broker is one to its peers);
    ``server`` ones may also serve TLS.
    """
    ca_cert, ca_key = ca
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if server:
        usages.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(sans[0]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(min(now + datetime.timedelta(days=days), ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([_general_name(s) for s in sans]), critical=False)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write_key(out / f"{stem}.key", key)
    _write_cert(out / f"{stem}.pem", cert)
    print(f"make_certs: wrote {out / stem}.pem and .key for {', '.join(sans)}")


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments and write the files; return the exit status."""
    parser = argparse.ArgumentParser(
        prog="python scripts/make_certs.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, default=Path("conf/secure/certs"), help="directory to write")
    parser.add_argument(
        "--san",
        action="append",
        required=True,
        help="a host name or IP address of the broker (repeat: every name clients use)",
    )
    parser.add_argument(
        "--client",
        action="append",
        default=[],
        help="a principal to issue a client certificate for (repeat for more)",
    )
    parser.add_argument("--broker-name", default="broker", help="file stem of the broker's pair")
    parser.add_argument("--days", type=int, default=365, help="validity of new certificates (days)")
    args = parser.parse_args(argv)
    if not 1 <= args.days <= 3650:
        parser.error(f"--days must be 1 to 3650, got {args.days}")
    stems = [args.broker_name, *args.client]
    if len(set(stems)) != len(stems) or "ca" in stems:
        parser.error(f"--client names and --broker-name must differ from each other and from 'ca': {stems}")
    args.out.mkdir(parents=True, exist_ok=True)
    ca = load_or_make_ca(args.out, args.days)
    issue(ca, args.out, args.broker_name, args.san, server=True, days=args.days)
    for principal in args.client:
        issue(ca, args.out, principal, [principal], server=False, days=args.days)
    return 0


if __name__ == "__main__":
    sys.exit(main())
