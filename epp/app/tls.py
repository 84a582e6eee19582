"""TLS on the ext_proc port, on by default as upstream's picker: gateways such as kgateway and Envoy AI Gateway dial
the picker over TLS and never verify it, so a self-signed certificate made at start is enough unless the operator
mounts one (`--cert-path DIR` with `tls.crt` and `tls.key`, e.g. a cert-manager Secret).

With `--enable-cert-reload` the server's credentials are dynamic: gRPC asks `_Reloader.fetch` for the certificate
at every new handshake, and the reloader answers with a new pair only when the files' stat signature (mtime, size,
inode; a Kubernetes Secret swap renames a symlink, which changes the inode) has changed *and* the new key matches
the new certificate. A half-written pair is therefore never served: established connections keep theirs, new
ones get the old pair until both files agree.

What grpcio can enforce of upstream's TLS knobs is mapped here; the rest is accepted with one warning that says why
(`tls_policy`).
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import ssl
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from epp.app.ticket_keys import share_ticket_keys
from epp.errors import ConfigError

if TYPE_CHECKING:  # imported where used: `tls_policy` must run before gRPC's first import (see there)
    import grpc

log = logging.getLogger("epp.tls")

CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
_SELF_SIGNED_DAYS = 3650  # upstream's self-signed certificate is long-lived too; nothing verifies it

# Upstream's --tls-min-version values (Go crypto/tls constant names).
TLS_VERSIONS = ("VersionTLS10", "VersionTLS11", "VersionTLS12", "VersionTLS13")

# Go crypto/tls names of the TLS 1.2 suites gRPC's TLS stack (BoringSSL) offers, and their OpenSSL names, which is
# what gRPC's GRPC_SSL_CIPHER_SUITES takes. TLS 1.3 suites are not configurable, in Go as in gRPC.
GO_TO_OPENSSL_SUITES = {
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
}
# TLS 1.3 suite names Go also accepts in the list (and ignores for 1.3, as gRPC does).
_TLS13_SUITES = ("TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256")


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """The TLS flags of `epp serve` (upstream's names); `enabled` False is `--secure-serving=false`."""

    enabled: bool = True
    cert_dir: str = ""
    reload: bool = False
    min_version: str = ""
    cipher_suites: tuple[str, ...] = ()
    # Without --cert-path: the self-signed (key, certificate) pair, made once by the control process and served by
    # every serving worker, so that a client pinning the certificate it saw first can connect to any of them.
    self_signed: tuple[bytes, bytes] | None = field(default=None, repr=False)  # a private key: never in a log
    # With serving workers: the session-ticket keys every worker's context shares (made once by the control
    # process, `epp.app.ticket_keys`), so a reconnect that lands on another worker still resumes its session.
    ticket_keys: bytes | None = field(default=None, repr=False)  # a secret too


def parse_cipher_suites(text: str) -> tuple[str, ...]:
    """Upstream's comma list of Go suite names; an unknown name is refused, as upstream refuses it."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    for name in names:
        if name not in GO_TO_OPENSSL_SUITES and name not in _TLS13_SUITES:
            known = ", ".join(sorted(GO_TO_OPENSSL_SUITES))
            raise ConfigError(f"--tls-cipher-suites: unknown or unsupported suite {name!r} (known: {known})")
    return names


def tls_policy(settings: TlsSettings, native: bool = False) -> list[str]:
    """Apply what gRPC can enforce of --tls-min-version / --tls-cipher-suites; return one warning per thing it
    cannot. Must run before gRPC is first imported: gRPC reads its cipher list (GRPC_SSL_CIPHER_SUITES) then.
    `native`: the ext_proc port is the native front's, whose OpenSSL context (`server_context`) enforces both as
    given; only the refusal below TLS 1.2 is said."""
    warnings: list[str] = []
    if settings.min_version and settings.min_version not in TLS_VERSIONS:
        raise ConfigError(f"--tls-min-version: {settings.min_version!r} is not one of {', '.join(TLS_VERSIONS)}")
    if native:
        if settings.min_version in ("VersionTLS10", "VersionTLS11"):
            warnings.append(
                f"--tls-min-version={settings.min_version}: accepted; the ext_proc port still requires TLS 1.2 or newer"
            )
        return warnings
    if settings.min_version in ("VersionTLS10", "VersionTLS11"):
        warnings.append(
            f"--tls-min-version={settings.min_version}: accepted; the ext_proc port still requires TLS 1.2 or newer "
            "(gRPC's TLS stack never negotiates older versions)"
        )
    elif settings.min_version == "VersionTLS13":
        warnings.append(
            "--tls-min-version=VersionTLS13: accepted but not enforced; grpcio's server credentials cannot set a "
            "minimum version, so TLS 1.2 clients are still served (TLS 1.3 is preferred when the client offers it)"
        )
    suites = [GO_TO_OPENSSL_SUITES[n] for n in settings.cipher_suites if n in GO_TO_OPENSSL_SUITES]
    if suites:
        if "grpc" in sys.modules:
            warnings.append("--tls-cipher-suites: not applied, gRPC was loaded before the flags were read")
        # gRPC's one knob for its TLS 1.2 suites; TLS 1.3 suites stay gRPC's defaults (not configurable in Go either).
        os.environ["GRPC_SSL_CIPHER_SUITES"] = ":".join(dict.fromkeys(suites))
    elif settings.cipher_suites:
        warnings.append("--tls-cipher-suites: only TLS 1.3 suites listed; they are not configurable, defaults apply")
    return warnings


def self_signed_pair(hostnames: tuple[str, ...] = ("localhost",)) -> tuple[bytes, bytes]:
    """A fresh RSA-2048 key and a self-signed certificate for it (PEM key, PEM certificate).

    RSA rather than ECDSA so that any suite an operator lists (ECDHE-RSA ones are the common choice) can be served.
    """
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "epp"), x509.NameAttribute(NameOID.COMMON_NAME, "epp")]
    )
    now = datetime.datetime.now(datetime.UTC)
    alt: list[x509.GeneralName] = []
    for host in hostnames:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            alt.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=_SELF_SIGNED_DAYS))
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return key_pem, cert.public_bytes(serialization.Encoding.PEM)


def _matching_pair(key_pem: bytes, cert_pem: bytes) -> bool:
    """The key is the certificate's (a file pair caught mid-swap is not)."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        return False
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    return bool(cert.public_key().public_bytes(*spki) == key.public_key().public_bytes(*spki))


def read_pair(cert_dir: str) -> tuple[bytes, bytes]:
    """(key PEM, certificate PEM) from DIR/tls.key and DIR/tls.crt; ConfigError names the problem."""
    directory = Path(cert_dir)
    try:
        key_pem = (directory / KEY_FILE).read_bytes()
        cert_pem = (directory / CERT_FILE).read_bytes()
    except OSError as exc:
        raise ConfigError(f"--cert-path {cert_dir}: cannot read {exc.filename}: {exc.strerror}") from None
    if not _matching_pair(key_pem, cert_pem):
        raise ConfigError(
            f"--cert-path {cert_dir}: {KEY_FILE} and {CERT_FILE} are not a matching PEM key and certificate"
        )
    return key_pem, cert_pem


def _signature(cert_dir: Path) -> tuple[tuple[int, int, int], ...] | None:
    try:
        stats = [os.stat(cert_dir / name) for name in (CERT_FILE, KEY_FILE)]
    except OSError:
        return None
    return tuple((s.st_mtime_ns, s.st_size, s.st_ino) for s in stats)


class _Reloader:
    """The certificate-configuration fetcher of gRPC's dynamic server credentials.

    gRPC calls `fetch` from its own threads before each new handshake: two stat calls when nothing changed; a read
    and a key/certificate check only after a change. None means "keep the current certificate".
    """

    def __init__(self, cert_dir: str, signature: tuple[tuple[int, int, int], ...] | None) -> None:
        self._dir = Path(cert_dir)
        self._lock = threading.Lock()
        self._served = signature
        self._refused: tuple[tuple[int, int, int], ...] | None = None
        self.reloads = 0

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        import grpc

        pair = self.changed_pair()
        return None if pair is None else grpc.ssl_server_certificate_configuration([pair])

    def changed_pair(self) -> tuple[bytes, bytes] | None:
        """(key, certificate) when the files changed to a matching pair since the last one served; else None."""
        with self._lock:
            current = _signature(self._dir)
            if current is None or current == self._served or current == self._refused:
                return None
            try:
                key_pem = (self._dir / KEY_FILE).read_bytes()
                cert_pem = (self._dir / CERT_FILE).read_bytes()
            except OSError:
                return None
            if _signature(self._dir) != current or not _matching_pair(key_pem, cert_pem):
                self._refused = current  # mid-swap or a bad pair: keep serving the old one, look again on change
                log.warning(
                    "--cert-path %s: the files changed but are not a matching pair yet; keeping the old one", self._dir
                )
                return None
            self._served, self._refused = current, None
            self.reloads += 1
            log.info("--cert-path %s: new certificate loaded for new connections", self._dir)
            return key_pem, cert_pem


def server_credentials(settings: TlsSettings, hostnames: tuple[str, ...] = ("localhost",)) -> grpc.ServerCredentials:
    """The ext_proc port's credentials: the mounted pair (reloaded on change with --enable-cert-reload) or a
    self-signed one made now."""
    import grpc

    if not settings.cert_dir:
        if settings.reload:
            log.warning("--enable-cert-reload: ignored without --cert-path (the self-signed certificate never changes)")
        key_pem, cert_pem = settings.self_signed or self_signed_pair(hostnames)
        log.info("TLS on the ext_proc port with a self-signed certificate (no --cert-path)")
        return grpc.ssl_server_credentials([(key_pem, cert_pem)])
    signature = _signature(Path(settings.cert_dir))
    key_pem, cert_pem = read_pair(settings.cert_dir)
    if not settings.reload:
        return grpc.ssl_server_credentials([(key_pem, cert_pem)])
    reloader = _Reloader(settings.cert_dir, signature)
    initial = grpc.ssl_server_certificate_configuration([(key_pem, cert_pem)])
    # gRPC documents None from the fetcher as "keep the current certificate"; grpc-stubs types it without None.
    fetch = reloader.fetch
    return grpc.dynamic_ssl_server_credentials(initial, fetch, require_client_authentication=False)  # type: ignore[arg-type]


def server_context(settings: TlsSettings, hostnames: tuple[str, ...] = ("localhost",)) -> ssl.SSLContext:
    """The ext_proc port's TLS for the native front (Python's ssl over the loop's sockets): the same pair as
    `server_credentials` serves, ALPN h2, upstream's --tls-min-version and --tls-cipher-suites applied as given
    (OpenSSL can enforce both). With --enable-cert-reload each handshake looks at the files first (two stat calls)
    and a changed, matching pair is served from then on."""
    if settings.cert_dir:
        signature = _signature(Path(settings.cert_dir))
        key_pem, cert_pem = read_pair(settings.cert_dir)
    else:
        if settings.reload:
            log.warning("--enable-cert-reload: ignored without --cert-path (the self-signed certificate never changes)")
        key_pem, cert_pem = settings.self_signed or self_signed_pair(hostnames)
        log.info("TLS on the ext_proc port with a self-signed certificate (no --cert-path)")
    context = _context(settings, key_pem, cert_pem)
    if settings.cert_dir and settings.reload:
        reloader = _Reloader(settings.cert_dir, signature)
        current = [context]

        def pick(sock: ssl.SSLObject, _name: str | None, _base: ssl.SSLContext) -> None:
            pair = reloader.changed_pair()
            if pair is not None:
                current[0] = _context(settings, *pair)
                current[0].sni_callback = pick
            if sock.context is not current[0]:
                sock.context = current[0]

        context.sni_callback = pick
    return context


def _context(settings: TlsSettings, key_pem: bytes, cert_pem: bytes) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _MIN_VERSIONS.get(settings.min_version, ssl.TLSVersion.TLSv1_2)
    suites = [GO_TO_OPENSSL_SUITES[n] for n in settings.cipher_suites if n in GO_TO_OPENSSL_SUITES]
    if suites:
        context.set_ciphers(":".join(dict.fromkeys(suites)))
    context.set_alpn_protocols(["h2"])
    with tempfile.TemporaryDirectory(prefix="epp-tls-") as tmp:  # ssl loads a pair from files only; 0700, gone at once
        key_file, cert_file = Path(tmp, KEY_FILE), Path(tmp, CERT_FILE)
        key_file.touch(0o600)
        key_file.write_bytes(key_pem)
        cert_file.write_bytes(cert_pem)
        context.load_cert_chain(cert_file, key_file)
    if settings.ticket_keys is not None and not share_ticket_keys(context, settings.ticket_keys):
        log.info(
            "TLS session tickets: this Python's ssl cannot take shared keys (%s); each serving worker keeps its own, "
            "so a reconnect that reaches another worker makes a full handshake",
            ssl.OPENSSL_VERSION,
        )
    return context


# gRPC's TLS stack never negotiates below 1.2, and the native front keeps that floor too.
_MIN_VERSIONS = {"VersionTLS12": ssl.TLSVersion.TLSv1_2, "VersionTLS13": ssl.TLSVersion.TLSv1_3}
