"""Shared-secret auth on the websocket handshake, and TLS contexts.

The edge sends ``Authorization: Bearer <token>`` on the HTTP upgrade request; the cloud compares
it with ``hmac.compare_digest`` in ``process_request`` and answers HTTP 401 before the handshake
completes, so an unauthenticated client never reaches a frame handler or the model. A request
with more than one ``Authorization`` header is refused (401) as well.

The token comes from ``--token-file`` (first line, stripped) or the ``RAPID_TOKEN`` environment
variable. With neither, the server runs open (local development) and logs a warning.
"""

from __future__ import annotations

import datetime
import hmac
import ipaddress
import logging
import os
import ssl
from collections.abc import Sequence
from pathlib import Path

from rapid.core.errors import RapidError
from rapid.core.logsafe import register_secret
from rapid.core.optional import import_optional

ENV_VAR = "RAPID_TOKEN"
log = logging.getLogger("rapid.core.auth")


class AuthConfigError(RapidError):
    """The token file or TLS material cannot be used."""


def load_token(token_file: str | os.PathLike[str] | None = None, env: str = ENV_VAR) -> str | None:
    """The shared secret from ``token_file`` or ``$RAPID_TOKEN``; None = no auth. The token is
    registered with ``rapid.core.logsafe`` so that no log line ever shows it."""
    token = _read_token(token_file, env)
    register_secret(token)
    return token


def _read_token(token_file: str | os.PathLike[str] | None, env: str) -> str | None:
    if token_file:
        try:
            text = Path(token_file).read_text(encoding="utf-8").strip()
        except OSError as e:
            raise AuthConfigError(f"cannot read token file {token_file}: {e}") from None
        except UnicodeDecodeError:
            raise AuthConfigError(f"token file {token_file} is not text: {_TOKEN_RULE}") from None
        if not text:
            raise AuthConfigError(f"token file {token_file} is empty")
        return _checked_token(text.splitlines()[0].strip(), f"token file {token_file}")
    token = os.environ.get(env, "").strip()
    return _checked_token(token, env) if token else None


_TOKEN_RULE = "a token is one line of printable Latin-1 text (it travels in an HTTP header)"


def _checked_token(token: str, source: str) -> str:
    """``token`` if an HTTP header can carry it (websockets writes headers as Latin-1), else
    AuthConfigError naming ``source``, before anything connects."""
    try:
        token.encode("latin-1")
    except UnicodeEncodeError:
        raise AuthConfigError(f"{source}: {_TOKEN_RULE}") from None
    if not token.isprintable():
        raise AuthConfigError(f"{source}: {_TOKEN_RULE}")
    return token


def bearer(token: str | None) -> dict[str, str]:
    """Headers for a client handshake."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def check_authorization(header: str | None, token: str | None) -> bool:
    """True when ``header`` carries ``token`` (always True when no token is configured)."""
    if token is None:
        return True
    if not header:
        return False
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(value.strip().encode("utf-8", "replace"), token.encode("utf-8"))


def check_authorization_headers(values: Sequence[str], token: str | None) -> bool:
    """True when the request's ``Authorization`` headers (all of them, in order) carry ``token``:
    exactly one header, since with two a proxy and this server could each check a different one."""
    if token is None:
        return True
    return len(values) == 1 and check_authorization(values[0], token)


def server_ssl_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    if not cert and not key:
        return None
    if not (cert and key):
        raise AuthConfigError("TLS needs both --cert and --key")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise AuthConfigError(f"cannot load TLS certificate/key: {e}") from None
    return ctx


def client_ssl_context(url: str, cafile: str | None = None) -> ssl.SSLContext | None:
    """For ``wss://`` URLs: system trust store, plus ``cafile`` (e.g. a self-signed cert)."""
    if not url.startswith("wss://"):
        return None
    ctx = ssl.create_default_context()
    if cafile:
        try:
            ctx.load_verify_locations(cafile)
        except (OSError, ssl.SSLError) as e:
            raise AuthConfigError(f"cannot load CA file {cafile}: {e}") from None
    return ctx


def write_self_signed(folder: str | os.PathLike[str], days: int = 2) -> tuple[str, str]:
    """A self-signed certificate for ``localhost`` / 127.0.0.1 and its key, written to
    ``folder/cert.pem`` and ``folder/key.pem`` (for tests, the soak and trying ``--cert`` out;
    needs ``cryptography``, in ``.[dev]``). Returns (cert path, key path)."""
    x509 = import_optional("cryptography.x509", "dev")
    hashes = import_optional("cryptography.hazmat.primitives.hashes", "dev")
    serialization = import_optional("cryptography.hazmat.primitives.serialization", "dev")
    ec = import_optional("cryptography.hazmat.primitives.asymmetric.ec", "dev")
    oid = import_optional("cryptography.x509.oid", "dev")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(oid.NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    hosts = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(hosts), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True).sign(key, hashes.SHA256()))
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = out / "cert.pem", out / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)
