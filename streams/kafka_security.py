"""How every client reaches Kafka and the Schema Registry, in each library's own terms.

The settings (``WFJOBS_KAFKA_*`` and ``WFJOBS_SCHEMA_REGISTRY_*``, read by
``streams.settings``) describe the security of the connection once; the
functions here spell it in each client library's own terms:

* ``librdkafka_config`` - confluent-kafka's producers, consumers and admin
  clients (the relay, ``wfjobs produce`` / ``events``, the dead-letter verbs):
  ``security.protocol``, ``sasl.*``, ``ssl.*`` properties, then every property
  of ``WFJOBS_KAFKA_PROPERTIES`` on top;
* ``faust_credentials`` - Faust's ``broker_credentials`` (the request agent's
  consumer and producer, and the topics it declares);
* ``aiokafka_options`` - the aiokafka clients outside Faust (the broker probe,
  the ownership reader);
* ``registry_config`` - confluent-kafka's Schema Registry client.

Secrets may come from files (``..._FILE``), as mounted secrets do; a file is
read when the settings are checked and again whenever a client is built, so a
new client picks up a rotated secret.

``WFJOBS_KAFKA_PROPERTIES`` reaches the librdkafka clients only; the aiokafka
clients take what the settings above describe.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiokafka.abc import AbstractTokenProvider  # type: ignore[import-untyped]

from schemas.errors import InvalidArgument

if TYPE_CHECKING:
    from faust.types.auth import CredentialsT

    from streams.settings import Settings

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
# Schemes a bootstrap server may be written with; they are dropped, since the
# security protocol is a setting of its own.
_SCHEMES = frozenset({"kafka", "aiokafka", *(protocol.lower() for protocol in PROTOCOLS)})
# What the settings own, and what every producer of ours keeps (the relay's
# at-least-once delivery in commit order rests on it): a pass-through
# property, applied last, may not say otherwise. Each key names why.
_ORDERED_DELIVERY = (
    "every producer here is idempotent, with acks=all and at most five requests in "
    "flight, which at-least-once delivery in commit order per job rests on"
)
_OWNED_PROPERTIES: dict[str, str] = {
    "bootstrap.servers": "KAFKA_BOOTSTRAP_SERVERS does",
    "security.protocol": "WFJOBS_KAFKA_SECURITY_PROTOCOL does",
    # The relay's lease is checked against this deadline (WFJOBS_RELAY_LEASE_S).
    "message.timeout.ms": "WFJOBS_RELAY_MESSAGE_TIMEOUT_MS does",
    "delivery.timeout.ms": "WFJOBS_RELAY_MESSAGE_TIMEOUT_MS does",
    "enable.idempotence": _ORDERED_DELIVERY,
    "acks": _ORDERED_DELIVERY,
    "request.required.acks": _ORDERED_DELIVERY,
    "max.in.flight.requests.per.connection": _ORDERED_DELIVERY,
    "max.in.flight": _ORDERED_DELIVERY,
}
# A token is fetched again once this share of its lifetime has passed.
TOKEN_REFRESH_SHARE = 0.8
TOKEN_TIMEOUT_S = 10.0
DEFAULT_TOKEN_LIFETIME_S = 300.0


# --------------------------------------------------------------------------- values


class SecuritySettingsError(InvalidArgument):
    """A security setting is missing, malformed or unreadable; the message names it.

    ``streams.settings`` reports it as its own ``SettingsError``.
    """


@dataclass(frozen=True)
class OAuthClient:
    """An OAuth 2 client-credentials grant at ``token_url`` (OAUTHBEARER)."""

    token_url: str
    client_id: str
    client_secret: str = field(repr=False)
    scope: str = ""
    # The variable the secret came from, for error messages.
    secret_env: str = "WFJOBS_KAFKA_OAUTH_CLIENT_SECRET"


@dataclass(frozen=True)
class KafkaSecurity:
    """The resolved security settings: secrets read, names checked."""

    protocol: str = "PLAINTEXT"
    mechanism: str = "PLAIN"
    username: str = ""
    password: str = field(default="", repr=False)
    oauth: OAuthClient | None = None
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    key_password: str = field(default="", repr=False)
    check_hostname: bool = True
    properties: Mapping[str, Any] = field(default_factory=dict)
    # The variables the credentials came from, for error messages.
    username_env: str = "WFJOBS_KAFKA_SASL_USERNAME"
    password_env: str = "WFJOBS_KAFKA_SASL_PASSWORD"
    key_password_env: str = "WFJOBS_KAFKA_SSL_KEY_PASSWORD"

    @property
    def uses_sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def uses_ssl(self) -> bool:
        return self.protocol in {"SSL", "SASL_SSL"}

    def librdkafka(self) -> dict[str, Any]:
        """librdkafka's properties for this security, the pass-through ones last."""
        config: dict[str, Any] = {"security.protocol": self.protocol}
        if self.uses_sasl:
            config["sasl.mechanisms"] = self.mechanism
            if self.oauth is not None:
                config.update(
                    {
                        "sasl.oauthbearer.method": "oidc",
                        "sasl.oauthbearer.token.endpoint.url": self.oauth.token_url,
                        "sasl.oauthbearer.client.id": self.oauth.client_id,
                        "sasl.oauthbearer.client.secret": self.oauth.client_secret,
                    }
                )
                if self.oauth.scope:
                    config["sasl.oauthbearer.scope"] = self.oauth.scope
            else:
                config["sasl.username"] = self.username
                config["sasl.password"] = self.password
        if self.uses_ssl:
            if self.ca_file:
                config["ssl.ca.location"] = self.ca_file
            if self.cert_file:
                config["ssl.certificate.location"] = self.cert_file
                config["ssl.key.location"] = self.key_file
            if self.key_password:
                config["ssl.key.password"] = self.key_password
            config["ssl.endpoint.identification.algorithm"] = (
                "https" if self.check_hostname else "none"
            )
        config.update(self.properties)
        return config

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of the Python clients; ``None`` without TLS."""
        if not self.uses_ssl:
            return None
        context = ssl.create_default_context(cafile=self.ca_file or None)
        context.check_hostname = self.check_hostname
        if self.cert_file:
            # Always a password, if only an empty one: without it OpenSSL asks
            # for an encrypted key's on the terminal, and the process waits there.
            context.load_cert_chain(self.cert_file, self.key_file, password=self.key_password)
        return context

    def aiokafka(self) -> dict[str, Any]:
        """aiokafka client keyword arguments for this security."""
        options: dict[str, Any] = {"security_protocol": self.protocol}
        context = self.ssl_context()
        if context is not None:
            options["ssl_context"] = context
        if self.uses_sasl:
            options["sasl_mechanism"] = self.mechanism
            if self.oauth is not None:
                options["sasl_oauth_token_provider"] = ClientCredentialsTokenProvider(self.oauth)
            else:
                options["sasl_plain_username"] = self.username
                options["sasl_plain_password"] = self.password
        return options

    def faust_credentials(self) -> CredentialsT | None:
        """Faust's ``broker_credentials``; ``None`` for PLAINTEXT."""
        import faust

        context = self.ssl_context()
        if not self.uses_sasl:
            return faust.SSLCredentials(context) if context is not None else None
        if self.oauth is not None:
            return faust.OAuthCredentials(
                oauth_cb=ClientCredentialsTokenProvider(self.oauth), ssl_context=context
            )
        return faust.SASLCredentials(
            username=self.username,
            password=self.password,
            ssl_context=context,
            mechanism=self.mechanism,
        )

    def explain(self, error: Any, servers: str) -> str | None:
        """A one-line message naming the settings to fix, when ``error`` is theirs.

        Refused credentials and a certificate that does not verify are
        configuration, not an outage: retrying cannot help. Anything else
        gives ``None``.
        """
        if isinstance(error, TokenError) and error.refused:
            return str(error)
        detail = _error_text(error)
        if _is_authentication_failure(error):
            if self.oauth is not None:
                names = f"WFJOBS_KAFKA_OAUTH_CLIENT_ID and {self.oauth.secret_env}"
                who = f"client {self.oauth.client_id!r}"
            else:
                names = f"{self.username_env} and {self.password_env}"
                who = f"user {self.username!r}"
            return (
                f"Kafka at {servers} refused the {self.mechanism} credentials of {who}: "
                f"check {names} ({detail})"
            )
        if _is_certificate_failure(error):
            return (
                f"the certificate of Kafka at {servers} does not verify: check "
                f"WFJOBS_KAFKA_SSL_CA_FILE and WFJOBS_KAFKA_SSL_CHECK_HOSTNAME ({detail})"
            )
        return None


# --------------------------------------------------------------------------- from settings


def bootstrap_servers(settings: Settings) -> list[str]:
    """``KAFKA_BOOTSTRAP_SERVERS`` as ``host:port`` items, any ``scheme://`` dropped.

    A scheme naming a security protocol must agree with
    ``WFJOBS_KAFKA_SECURITY_PROTOCOL``: the protocol is that setting's alone.
    """
    protocol = settings.kafka_security_protocol.strip().upper()
    servers = []
    for item in settings.kafka_bootstrap_servers.split(","):
        server = item.strip()
        if not server:
            continue
        scheme, sep, rest = server.partition("://")
        if sep:
            if scheme.lower() not in _SCHEMES:
                raise SecuritySettingsError(
                    f"KAFKA_BOOTSTRAP_SERVERS: unknown scheme {scheme!r} in {server!r} "
                    "(write host:port)"
                )
            if scheme.upper() in PROTOCOLS and scheme.upper() != protocol:
                raise SecuritySettingsError(
                    f"KAFKA_BOOTSTRAP_SERVERS names {server!r}, but "
                    f"WFJOBS_KAFKA_SECURITY_PROTOCOL is {protocol}: set the protocol there"
                )
            server = rest
        if not server or "/" in server or not _valid_host_port(server):
            raise SecuritySettingsError(
                f"KAFKA_BOOTSTRAP_SERVERS must be host:port items, got {item.strip()!r}"
            )
        servers.append(server)
    return servers


def _valid_host_port(server: str) -> bool:
    """``host``, ``host:port`` or ``[v6]:port``, the port a TCP port when written.

    Every client takes a missing port as 9092; a port that is not a number
    would otherwise stop Faust's URL parser with a traceback at import.
    """
    if server.startswith("["):
        host, bracket, rest = server[1:].partition("]")
        if not bracket or not host:
            return False
        if not rest:
            return True
        if not rest.startswith(":"):
            return False
        port = rest[1:]
    else:
        host, colon, port = server.rpartition(":")
        if not colon:
            return True
    return bool(host) and port.isascii() and port.isdigit() and 0 < int(port) < 65536


def kafka_security(settings: Settings) -> KafkaSecurity:
    """The settings' Kafka security, secrets read from their files."""
    protocol = settings.kafka_security_protocol.strip().upper()
    if protocol not in PROTOCOLS:
        raise SecuritySettingsError(
            f"WFJOBS_KAFKA_SECURITY_PROTOCOL must be one of {', '.join(PROTOCOLS)}, "
            f"got {settings.kafka_security_protocol!r}"
        )
    mechanism = settings.kafka_sasl_mechanism.strip().upper()
    if mechanism not in MECHANISMS:
        raise SecuritySettingsError(
            f"WFJOBS_KAFKA_SASL_MECHANISM must be one of {', '.join(MECHANISMS)}, "
            f"got {settings.kafka_sasl_mechanism!r}"
        )
    username, username_env = _secret(settings, "kafka_sasl_username")
    password, password_env = _secret(settings, "kafka_sasl_password")
    client_secret, client_secret_env = _secret(settings, "kafka_oauth_client_secret")
    key_password, key_password_env = _secret(settings, "kafka_ssl_key_password")
    sasl = protocol.startswith("SASL_")
    tls = protocol in {"SSL", "SASL_SSL"}

    password_given = {username_env: username, password_env: password}
    oauth_given = {
        "WFJOBS_KAFKA_OAUTH_TOKEN_URL": settings.kafka_oauth_token_url,
        "WFJOBS_KAFKA_OAUTH_CLIENT_ID": settings.kafka_oauth_client_id,
        client_secret_env: client_secret,
        "WFJOBS_KAFKA_OAUTH_SCOPE": settings.kafka_oauth_scope,
    }
    sasl_given = {**password_given, **oauth_given}
    tls_given = {
        "WFJOBS_KAFKA_SSL_CA_FILE": settings.kafka_ssl_ca_file,
        "WFJOBS_KAFKA_SSL_CERT_FILE": settings.kafka_ssl_cert_file,
        "WFJOBS_KAFKA_SSL_KEY_FILE": settings.kafka_ssl_key_file,
        key_password_env: key_password,
    }
    # A credential the protocol never sends is a mistake that would otherwise go unnoticed.
    for given, needed, kind in ((sasl_given, sasl, "SASL"), (tls_given, tls, "TLS")):
        stray = sorted(name for name, value in given.items() if value and not needed)
        if stray:
            raise SecuritySettingsError(
                f"{', '.join(stray)} set, but WFJOBS_KAFKA_SECURITY_PROTOCOL is {protocol}, "
                f"which uses no {kind}"
            )

    if sasl:
        unsent = password_given if mechanism == "OAUTHBEARER" else oauth_given
        stray = sorted(name for name, value in unsent.items() if value)
        if stray:
            raise SecuritySettingsError(
                f"{', '.join(stray)} set, but WFJOBS_KAFKA_SASL_MECHANISM is {mechanism}, "
                "which never sends it"
            )

    oauth = None
    if sasl and mechanism == "OAUTHBEARER":
        _require(
            {
                "WFJOBS_KAFKA_OAUTH_TOKEN_URL": settings.kafka_oauth_token_url,
                "WFJOBS_KAFKA_OAUTH_CLIENT_ID": settings.kafka_oauth_client_id,
                client_secret_env: client_secret,
            },
            "SASL mechanism OAUTHBEARER",
        )
        if urllib.parse.urlsplit(settings.kafka_oauth_token_url).scheme not in {"http", "https"}:
            raise SecuritySettingsError(
                "WFJOBS_KAFKA_OAUTH_TOKEN_URL must be an http(s) URL, "
                f"got {settings.kafka_oauth_token_url!r}"
            )
        oauth = OAuthClient(
            token_url=settings.kafka_oauth_token_url,
            client_id=settings.kafka_oauth_client_id,
            client_secret=client_secret,
            scope=settings.kafka_oauth_scope,
            secret_env=client_secret_env,
        )
    elif sasl:
        _require({username_env: username, password_env: password}, f"SASL mechanism {mechanism}")

    if bool(settings.kafka_ssl_cert_file) != bool(settings.kafka_ssl_key_file):
        raise SecuritySettingsError(
            "WFJOBS_KAFKA_SSL_CERT_FILE and WFJOBS_KAFKA_SSL_KEY_FILE go together: set both or none"
        )
    if key_password and not settings.kafka_ssl_key_file:
        raise SecuritySettingsError(
            f"{key_password_env} set, but WFJOBS_KAFKA_SSL_KEY_FILE is not: there is no key "
            "for it to open"
        )
    for name in ("kafka_ssl_ca_file", "kafka_ssl_cert_file", "kafka_ssl_key_file"):
        _check_readable(settings, name)

    return KafkaSecurity(
        protocol=protocol,
        mechanism=mechanism,
        username=username,
        password=password,
        oauth=oauth,
        ca_file=settings.kafka_ssl_ca_file,
        cert_file=settings.kafka_ssl_cert_file,
        key_file=settings.kafka_ssl_key_file,
        key_password=key_password,
        check_hostname=settings.kafka_ssl_check_hostname,
        properties=pass_through_properties(settings),
        username_env=username_env,
        password_env=password_env,
        key_password_env=key_password_env,
    )


def pass_through_properties(settings: Settings) -> dict[str, Any]:
    """``WFJOBS_KAFKA_PROPERTIES``: a JSON object of librdkafka properties."""
    raw = settings.kafka_properties.strip()
    if not raw:
        return {}
    try:
        parsed = json.loads(raw)
    except ValueError as exc:
        raise SecuritySettingsError(
            f"WFJOBS_KAFKA_PROPERTIES must be a JSON object: {exc}"
        ) from None
    if not isinstance(parsed, dict):
        raise SecuritySettingsError(
            f"WFJOBS_KAFKA_PROPERTIES must be a JSON object, got {type(parsed).__name__}"
        )
    for key, value in parsed.items():
        if key in _OWNED_PROPERTIES:
            raise SecuritySettingsError(
                f"WFJOBS_KAFKA_PROPERTIES may not set {key!r}: {_OWNED_PROPERTIES[key]}"
            )
        if not isinstance(value, str | int | float | bool):
            raise SecuritySettingsError(
                f"WFJOBS_KAFKA_PROPERTIES[{key!r}] must be a string, number or boolean"
            )
    return dict(parsed)


def librdkafka_config(settings: Settings) -> dict[str, Any]:
    """``bootstrap.servers`` and the security properties of a librdkafka client."""
    return {
        "bootstrap.servers": ",".join(bootstrap_servers(settings)),
        **kafka_security(settings).librdkafka(),
    }


def aiokafka_options(settings: Settings) -> dict[str, Any]:
    """``bootstrap_servers`` and the security keyword arguments of an aiokafka client."""
    return {
        "bootstrap_servers": bootstrap_servers(settings),
        **kafka_security(settings).aiokafka(),
    }


def faust_credentials(settings: Settings) -> CredentialsT | None:
    return kafka_security(settings).faust_credentials()


def registry_config(settings: Settings) -> dict[str, Any]:
    """The Schema Registry client's settings besides its URL: basic auth and TLS."""
    config: dict[str, Any] = {}
    user_info, user_info_env = _secret(settings, "schema_registry_basic_auth")
    if user_info:
        if ":" not in user_info:
            raise SecuritySettingsError(f"{user_info_env} must be USER:PASSWORD")
        config["basic.auth.user.info"] = user_info
    if bool(settings.schema_registry_cert_file) != bool(settings.schema_registry_key_file):
        raise SecuritySettingsError(
            "WFJOBS_SCHEMA_REGISTRY_CERT_FILE and WFJOBS_SCHEMA_REGISTRY_KEY_FILE go together: "
            "set both or none"
        )
    for name, key in (
        ("schema_registry_ca_file", "ssl.ca.location"),
        ("schema_registry_cert_file", "ssl.certificate.location"),
        ("schema_registry_key_file", "ssl.key.location"),
    ):
        value = _check_readable(settings, name)
        if value:
            config[key] = value
    return config


def check(settings: Settings) -> None:
    """Every Kafka and registry security setting, checked; raises ``SecuritySettingsError``."""
    bootstrap_servers(settings)
    security = kafka_security(settings)
    try:
        security.ssl_context()
    except (ssl.SSLError, OSError) as exc:
        if security.cert_file and _is_encrypted_key(security.key_file):
            if not security.key_password:
                raise SecuritySettingsError(
                    "WFJOBS_KAFKA_SSL_KEY_FILE holds an encrypted key: set "
                    "WFJOBS_KAFKA_SSL_KEY_PASSWORD or WFJOBS_KAFKA_SSL_KEY_PASSWORD_FILE"
                ) from None
            raise SecuritySettingsError(
                f"{security.key_password_env} does not open the encrypted key in "
                f"WFJOBS_KAFKA_SSL_KEY_FILE, or that key is not WFJOBS_KAFKA_SSL_CERT_FILE's: {exc}"
            ) from None
        raise SecuritySettingsError(
            "WFJOBS_KAFKA_SSL_CA_FILE, WFJOBS_KAFKA_SSL_CERT_FILE, WFJOBS_KAFKA_SSL_KEY_FILE: "
            f"not usable as PEM files: {exc}"
        ) from None
    registry_config(settings)
    _check_registry_tls(settings)


def _check_registry_tls(settings: Settings) -> None:
    """The registry's TLS files as its client loads them, when a process first opens
    it: a file that is not PEM would fail there, and an encrypted key would have
    OpenSSL ask for its password on the terminal, the client having no setting for one."""
    ca, cert = settings.schema_registry_ca_file, settings.schema_registry_cert_file
    key = settings.schema_registry_key_file
    if cert and _is_encrypted_key(key):
        raise SecuritySettingsError(
            "WFJOBS_SCHEMA_REGISTRY_KEY_FILE holds an encrypted key, which the registry "
            "client cannot open: give it the key unencrypted"
        )
    try:
        context = ssl.create_default_context(cafile=ca or None)
        if cert:
            context.load_cert_chain(cert, key, password="")
    except (ssl.SSLError, OSError) as exc:
        raise SecuritySettingsError(
            "WFJOBS_SCHEMA_REGISTRY_CA_FILE, WFJOBS_SCHEMA_REGISTRY_CERT_FILE, "
            f"WFJOBS_SCHEMA_REGISTRY_KEY_FILE: not usable as PEM files: {exc}"
        ) from None


def _is_encrypted_key(path: str) -> bool:
    """Whether the PEM file at ``path`` holds a key that takes a password: PKCS#8's
    ``ENCRYPTED PRIVATE KEY`` or the traditional form's ``Proc-Type: 4,ENCRYPTED``."""
    try:
        text = Path(path).read_bytes()
    except OSError:
        return False
    return b"-----BEGIN ENCRYPTED PRIVATE KEY-----" in text or b"Proc-Type: 4,ENCRYPTED" in text


def _secret(settings: Settings, attribute: str) -> tuple[str, str]:
    """A value given inline or by ``<attribute>_file``, and the variable it came from."""
    inline = str(getattr(settings, attribute))
    path = str(getattr(settings, f"{attribute}_file"))
    name, file_name = settings.env_name(attribute), settings.env_name(f"{attribute}_file")
    if inline and path:
        raise SecuritySettingsError(f"set {name} or {file_name}, not both")
    if not path:
        return inline, name
    try:
        # Mounted secrets often end with a newline that is not part of the secret.
        return Path(path).read_text().rstrip("\r\n"), file_name
    except (OSError, UnicodeDecodeError) as exc:
        raise SecuritySettingsError(f"{file_name}: cannot read {path}: {exc}") from None


def _require(values: Mapping[str, str], what: str) -> None:
    missing = [name for name, value in values.items() if not value]
    if missing:
        raise SecuritySettingsError(f"{what} needs {' and '.join(missing)}")


def _check_readable(settings: Settings, attribute: str) -> str:
    path = str(getattr(settings, attribute))
    if path:
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            raise SecuritySettingsError(
                f"{settings.env_name(attribute)}: cannot read {path}: {exc.strerror}"
            ) from None
    return path


# --------------------------------------------------------------------------- failures

# aiokafka's names for a refused handshake; compared by name so the CLI, which
# only speaks librdkafka, need not import aiokafka's error module.
_AIOKAFKA_AUTH_ERRORS = frozenset(
    {
        "SaslAuthenticationFailed",
        "AuthenticationFailedError",
        "AuthenticationMethodNotSupported",
        "UnsupportedSaslMechanismError",
        "IllegalSaslStateError",
    }
)
# librdkafka's codes: _AUTHENTICATION (-169) and SASL_AUTHENTICATION_FAILED (58).
_LIBRDKAFKA_AUTH_CODES = frozenset({-169, 58})
# librdkafka's _SSL (-181): a handshake that failed on our side, such as verification.
_LIBRDKAFKA_SSL_CODE = -181


def _kafka_error_code(error: Any) -> int | None:
    code = getattr(error, "code", None)
    if callable(code) and type(error).__name__ == "KafkaError":
        result = code()
        return result if isinstance(result, int) else None
    return None


def _is_authentication_failure(error: Any) -> bool:
    if _kafka_error_code(error) in _LIBRDKAFKA_AUTH_CODES:
        return True
    return any(cls.__name__ in _AIOKAFKA_AUTH_ERRORS for cls in type(error).__mro__)


def _is_certificate_failure(error: Any) -> bool:
    if isinstance(error, ssl.SSLCertVerificationError):
        return True
    code = _kafka_error_code(error)
    if code == _LIBRDKAFKA_SSL_CODE:
        return "certificate verify failed" in _error_text(error).lower()
    return False


def _error_text(error: Any) -> str:
    text = getattr(error, "str", None)
    if callable(text) and type(error).__name__ == "KafkaError":
        return str(text())
    if isinstance(error, BaseException):
        message, name = str(error), type(error).__name__
        if not message:
            return name
        # aiokafka's messages already start with their error's name.
        return message if name in message else f"{name}: {message}"
    return str(error)


# --------------------------------------------------------------------------- OAUTHBEARER


class TokenError(RuntimeError):
    """The token endpoint gave no token; ``refused`` when it turned the client down."""

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


class _Unfollowed(urllib.request.HTTPRedirectHandler):
    """Answers a redirect as the error it is: urllib would send the client secret
    on to wherever it points (as a GET, which no token endpoint answers)."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_NO_REDIRECTS = urllib.request.build_opener(_Unfollowed())


class ClientCredentialsTokenProvider(AbstractTokenProvider):  # type: ignore[misc]
    """aiokafka's OAUTHBEARER token: a client-credentials grant, reused until near expiry.

    librdkafka fetches its own (``sasl.oauthbearer.method=oidc``); this is the
    same grant for the aiokafka clients. The request runs in a worker thread,
    so it never blocks an event loop; Faust calls this from two loops (its
    consumer's thread and the main one), hence a thread lock.
    """

    def __init__(self, client: OAuthClient, *, clock: Any = time.monotonic) -> None:
        self._client = client
        self._clock = clock
        self._lock = threading.Lock()
        self._token = ""
        self._refresh_at = 0.0

    async def token(self) -> str:
        if self._token and self._clock() < self._refresh_at:
            return self._token
        return await asyncio.to_thread(self._fetch)

    def _fetch(self) -> str:
        with self._lock:
            if self._token and self._clock() < self._refresh_at:
                return self._token
            started = self._clock()
            answer = self._request()
            token = answer.get("access_token")
            if not isinstance(token, str) or not token:
                raise TokenError(
                    f"the token endpoint WFJOBS_KAFKA_OAUTH_TOKEN_URL={self._client.token_url} "
                    "answered without an access_token"
                )
            lifetime = answer.get("expires_in", DEFAULT_TOKEN_LIFETIME_S)
            if not isinstance(lifetime, int | float) or lifetime <= 0:
                lifetime = DEFAULT_TOKEN_LIFETIME_S
            self._token = token
            self._refresh_at = started + float(lifetime) * TOKEN_REFRESH_SHARE
            return token

    def _request(self) -> dict[str, Any]:
        form = {"grant_type": "client_credentials"}
        if self._client.scope:
            form["scope"] = self._client.scope
        # client_secret_basic (RFC 6749, 2.3.1): the form-encoded id and secret.
        pair = (
            f"{urllib.parse.quote(self._client.client_id, safe='')}:"
            f"{urllib.parse.quote(self._client.client_secret, safe='')}"
        )
        request = urllib.request.Request(
            self._client.token_url,
            data=urllib.parse.urlencode(form).encode(),
            method="POST",
            headers={
                "Authorization": "Basic " + base64.b64encode(pair.encode()).decode(),
                "Content-Type": "application/x-www-form-urlencoded",
                "Accept": "application/json",
            },
        )
        try:
            with _NO_REDIRECTS.open(request, timeout=TOKEN_TIMEOUT_S) as response:
                body = json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            if 300 <= exc.code < 400:
                raise TokenError(
                    f"the token endpoint WFJOBS_KAFKA_OAUTH_TOKEN_URL={self._client.token_url} "
                    f"answered HTTP {exc.code}, a redirect, which is not followed with the "
                    "client secret: set the endpoint's own URL"
                ) from None
            raise TokenError(
                f"the token endpoint WFJOBS_KAFKA_OAUTH_TOKEN_URL={self._client.token_url} "
                f"refused client {self._client.client_id!r} (HTTP {exc.code}): check "
                f"WFJOBS_KAFKA_OAUTH_CLIENT_ID and {self._client.secret_env}",
                refused=400 <= exc.code < 500,
            ) from None
        except (OSError, ValueError) as exc:
            raise TokenError(
                f"no token from WFJOBS_KAFKA_OAUTH_TOKEN_URL={self._client.token_url}: {exc}"
            ) from None
        if not isinstance(body, dict):
            raise TokenError(
                f"the token endpoint WFJOBS_KAFKA_OAUTH_TOKEN_URL={self._client.token_url} "
                "answered with something other than a JSON object"
            )
        return body


__all__ = [
    "MECHANISMS",
    "PROTOCOLS",
    "ClientCredentialsTokenProvider",
    "KafkaSecurity",
    "OAuthClient",
    "SecuritySettingsError",
    "TokenError",
    "aiokafka_options",
    "bootstrap_servers",
    "check",
    "faust_credentials",
    "kafka_security",
    "librdkafka_config",
    "pass_through_properties",
    "registry_config",
]
