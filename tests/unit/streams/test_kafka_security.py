"""One set of security settings, spelled in each client library's terms (no broker needed)."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import faust
import pytest
from aiokafka.errors import SaslAuthenticationFailed
from confluent_kafka import KafkaError, Producer
from faust.types.auth import AuthProtocol, SASLMechanism

from schemas.contract import WorkflowRunRequest
from schemas.serde import RequestDecoder, encode_request, open_registry
from store.outbox import Backlog, RelayResult
from streams.kafka_security import (
    ClientCredentialsTokenProvider,
    OAuthClient,
    TokenError,
    registry_config,
)
from streams.relay import build_relay
from streams.request_agent import RequestHandler
from streams.settings import Settings, SettingsError
from tests.certificates import (
    ClientCertificate,
    ServerCertificates,
    make_client_certificate,
    make_server_certificates,
)
from tests.http_stub import serving

SCRAM = {
    "KAFKA_BOOTSTRAP_SERVERS": "k1:9093,k2:9093",
    "WFJOBS_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
    "WFJOBS_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
    "WFJOBS_KAFKA_SASL_USERNAME": "alice",
    "WFJOBS_KAFKA_SASL_PASSWORD": "alice-secret",
}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> ServerCertificates:
    return make_server_certificates(tmp_path_factory.mktemp("certs"))


def settings(env: Mapping[str, str]) -> Settings:
    return Settings.from_env(dict(env))


# --------------------------------------------------------------------------- PLAINTEXT


def test_plaintext_is_the_default_and_adds_nothing() -> None:
    plain = settings({"KAFKA_BOOTSTRAP_SERVERS": "k:9092"})
    assert plain.kafka_client_config() == {
        "bootstrap.servers": "k:9092",
        "security.protocol": "PLAINTEXT",
    }
    assert plain.kafka_security().aiokafka() == {"security_protocol": "PLAINTEXT"}
    assert plain.kafka_security().faust_credentials() is None


# --------------------------------------------------------------------------- SASL


def test_sasl_ssl_with_scram_maps_onto_librdkafka(certs: ServerCertificates) -> None:
    scram = settings({**SCRAM, "WFJOBS_KAFKA_SSL_CA_FILE": str(certs.ca_file)})
    assert scram.kafka_client_config() == {
        "bootstrap.servers": "k1:9093,k2:9093",
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "alice",
        "sasl.password": "alice-secret",
        "ssl.ca.location": str(certs.ca_file),
        "ssl.endpoint.identification.algorithm": "https",
    }


def test_sasl_ssl_with_scram_maps_onto_aiokafka(certs: ServerCertificates) -> None:
    scram = settings({**SCRAM, "WFJOBS_KAFKA_SSL_CA_FILE": str(certs.ca_file)})
    options = scram.kafka_security().aiokafka()
    context = options.pop("ssl_context")
    assert options == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "alice",
        "sasl_plain_password": "alice-secret",
    }
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert len(context.get_ca_certs()) == 1


def test_sasl_ssl_with_scram_maps_onto_faust_credentials(certs: ServerCertificates) -> None:
    scram = settings({**SCRAM, "WFJOBS_KAFKA_SSL_CA_FILE": str(certs.ca_file)})
    credentials = scram.kafka_security().faust_credentials()
    assert isinstance(credentials, faust.SASLCredentials)
    assert credentials.protocol is AuthProtocol.SASL_SSL
    assert credentials.mechanism is SASLMechanism.SCRAM_SHA_512
    assert (credentials.username, credentials.password) == ("alice", "alice-secret")
    assert isinstance(credentials.ssl_context, ssl.SSLContext)


def test_sasl_plaintext_with_plain_uses_no_tls() -> None:
    plain = settings(
        {
            **SCRAM,
            "WFJOBS_KAFKA_SECURITY_PROTOCOL": "sasl_plaintext",
            "WFJOBS_KAFKA_SASL_MECHANISM": "plain",
        }
    )
    config = plain.kafka_client_config()
    assert config["security.protocol"] == "SASL_PLAINTEXT"
    assert config["sasl.mechanisms"] == "PLAIN"
    assert not any(key.startswith("ssl.") for key in config)
    credentials = plain.kafka_security().faust_credentials()
    assert isinstance(credentials, faust.SASLCredentials)
    assert credentials.protocol is AuthProtocol.SASL_PLAINTEXT
    assert credentials.ssl_context is None
    assert "ssl_context" not in plain.kafka_security().aiokafka()


def test_the_password_may_come_from_a_file(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    # Mounted secrets often end with a newline that is not part of the password.
    secret.write_text("from-a-file\n")
    env = {k: v for k, v in SCRAM.items() if k != "WFJOBS_KAFKA_SASL_PASSWORD"}
    from_file = settings({**env, "WFJOBS_KAFKA_SASL_PASSWORD_FILE": str(secret)})
    assert from_file.kafka_client_config()["sasl.password"] == "from-a-file"
    assert from_file.kafka_security().password_env == "WFJOBS_KAFKA_SASL_PASSWORD_FILE"
    # The secret is read when a client is built, so a rotated one is picked up.
    secret.write_text("rotated")
    assert from_file.kafka_client_config()["sasl.password"] == "rotated"


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"WFJOBS_KAFKA_SASL_PASSWORD": ""}, "WFJOBS_KAFKA_SASL_PASSWORD"),
        ({"WFJOBS_KAFKA_SASL_PASSWORD_FILE": "/nonexistent/pw"}, "WFJOBS_KAFKA_SASL_PASSWORD"),
        ({"WFJOBS_KAFKA_SASL_MECHANISM": "GSSAPI"}, "WFJOBS_KAFKA_SASL_MECHANISM"),
        ({"WFJOBS_KAFKA_SECURITY_PROTOCOL": "TLS"}, "WFJOBS_KAFKA_SECURITY_PROTOCOL"),
        ({"WFJOBS_KAFKA_SECURITY_PROTOCOL": "PLAINTEXT"}, "WFJOBS_KAFKA_SASL_PASSWORD"),
        ({"WFJOBS_KAFKA_SSL_CA_FILE": "/nonexistent/ca.pem"}, "WFJOBS_KAFKA_SSL_CA_FILE"),
        ({"WFJOBS_KAFKA_SSL_CERT_FILE": "/etc/hostname"}, "WFJOBS_KAFKA_SSL_KEY_FILE"),
        ({"KAFKA_BOOTSTRAP_SERVERS": "SSL://k:9093"}, "WFJOBS_KAFKA_SECURITY_PROTOCOL"),
        ({"KAFKA_BOOTSTRAP_SERVERS": "http://k:9093"}, "KAFKA_BOOTSTRAP_SERVERS"),
        ({"KAFKA_BOOTSTRAP_SERVERS": "k:abc"}, "KAFKA_BOOTSTRAP_SERVERS must be host:port"),
        ({"KAFKA_BOOTSTRAP_SERVERS": "k1:9093,k2:"}, "KAFKA_BOOTSTRAP_SERVERS must be host:port"),
        ({"KAFKA_BOOTSTRAP_SERVERS": "k:70000"}, "KAFKA_BOOTSTRAP_SERVERS must be host:port"),
        ({"KAFKA_BOOTSTRAP_SERVERS": ":9093"}, "KAFKA_BOOTSTRAP_SERVERS must be host:port"),
        ({"KAFKA_BOOTSTRAP_SERVERS": "[::1:9093"}, "KAFKA_BOOTSTRAP_SERVERS must be host:port"),
        (
            {"KAFKA_BOOTSTRAP_SERVERS": "SASL_SSL://k:x"},
            "KAFKA_BOOTSTRAP_SERVERS must be host:port",
        ),
    ],
)
def test_a_bad_security_setting_is_refused_by_name(env: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError, match=named):
        settings({**SCRAM, **env})


@pytest.mark.parametrize(
    ("servers", "kept"),
    [
        ("k1:9093, k2:9094", ["k1:9093", "k2:9094"]),
        ("kafka", ["kafka"]),
        ("[::1]:9093,[fe80::1]", ["[::1]:9093", "[fe80::1]"]),
        ("SASL_SSL://k:9093", ["k:9093"]),
    ],
)
def test_bootstrap_servers_the_clients_take_are_kept(servers: str, kept: list[str]) -> None:
    assert settings({**SCRAM, "KAFKA_BOOTSTRAP_SERVERS": servers}).kafka_servers == kept


def test_a_secret_given_twice_is_refused(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("x")
    with pytest.raises(SettingsError, match="WFJOBS_KAFKA_SASL_PASSWORD_FILE"):
        settings({**SCRAM, "WFJOBS_KAFKA_SASL_PASSWORD_FILE": str(tmp_path / "pw")})


def test_secrets_stay_out_of_the_settings_repr(tmp_path: Path) -> None:
    assert "alice-secret" not in repr(settings(SCRAM))
    assert "alice-secret" not in repr(settings(SCRAM).kafka_security())
    # The URLs that may carry a password in their user part.
    urls = settings(
        {
            "DATABASE_URL": "postgresql://wfjobs:db-secret@db/wfjobs",
            "WFJOBS_SCHEMA_REGISTRY_URL": "https://sr:registry-secret@registry.example",
        }
    )
    assert "db-secret" not in repr(urls) and "registry-secret" not in repr(urls)


# --------------------------------------------------------------------------- TLS only


def test_ssl_with_a_client_certificate(certs: ServerCertificates) -> None:
    mutual = settings(
        {
            "KAFKA_BOOTSTRAP_SERVERS": "k:9093",
            "WFJOBS_KAFKA_SECURITY_PROTOCOL": "SSL",
            "WFJOBS_KAFKA_SSL_CA_FILE": str(certs.ca_file),
            "WFJOBS_KAFKA_SSL_CERT_FILE": str(certs.certificate_file),
            "WFJOBS_KAFKA_SSL_KEY_FILE": str(certs.key_file),
            "WFJOBS_KAFKA_SSL_CHECK_HOSTNAME": "false",
        }
    )
    config = mutual.kafka_client_config()
    assert config["security.protocol"] == "SSL"
    assert config["ssl.certificate.location"] == str(certs.certificate_file)
    assert config["ssl.key.location"] == str(certs.key_file)
    assert config["ssl.endpoint.identification.algorithm"] == "none"
    assert not any(key.startswith("sasl.") for key in config)
    credentials = mutual.kafka_security().faust_credentials()
    assert isinstance(credentials, faust.SSLCredentials)
    assert credentials.context.check_hostname is False
    assert mutual.kafka_security().aiokafka()["security_protocol"] == "SSL"


def test_a_file_that_is_not_pem_is_refused_at_start(tmp_path: Path) -> None:
    bogus = tmp_path / "ca.pem"
    bogus.write_text("not a certificate")
    with pytest.raises(SettingsError, match="WFJOBS_KAFKA_SSL_CA_FILE"):
        settings({**SCRAM, "WFJOBS_KAFKA_SSL_CA_FILE": str(bogus)})


KEY_PASSWORD = "key-secret"


@pytest.fixture(scope="module")
def encrypted_client(
    certs: ServerCertificates, tmp_path_factory: pytest.TempPathFactory
) -> ClientCertificate:
    return make_client_certificate(
        certs, tmp_path_factory.mktemp("client"), common_name="worker", key_password=KEY_PASSWORD
    )


def mutual_tls(certs: ServerCertificates, client: ClientCertificate) -> dict[str, str]:
    return {
        "KAFKA_BOOTSTRAP_SERVERS": "k:9093",
        "WFJOBS_KAFKA_SECURITY_PROTOCOL": "SSL",
        "WFJOBS_KAFKA_SSL_CA_FILE": str(certs.ca_file),
        "WFJOBS_KAFKA_SSL_CERT_FILE": str(client.certificate_file),
        "WFJOBS_KAFKA_SSL_KEY_FILE": str(client.key_file),
    }


@pytest.mark.parametrize("from_file", [False, True])
def test_an_encrypted_key_opens_with_its_password_in_every_client(
    certs: ServerCertificates, encrypted_client: ClientCertificate, tmp_path: Path, from_file: bool
) -> None:
    if from_file:
        secret = tmp_path / "key-password"
        secret.write_text(KEY_PASSWORD + "\n")
        given = {"WFJOBS_KAFKA_SSL_KEY_PASSWORD_FILE": str(secret)}
    else:
        given = {"WFJOBS_KAFKA_SSL_KEY_PASSWORD": KEY_PASSWORD}
    mutual = settings({**mutual_tls(certs, encrypted_client), **given})
    config = mutual.kafka_client_config()
    assert config["ssl.key.password"] == KEY_PASSWORD
    # librdkafka reads the key when a client is made: it must open with the password.
    Producer(config).flush(0)
    security = mutual.kafka_security()
    assert isinstance(security.aiokafka()["ssl_context"], ssl.SSLContext)
    assert isinstance(security.faust_credentials(), faust.SSLCredentials)


def test_a_wrong_key_password_is_refused_naming_it(
    certs: ServerCertificates, encrypted_client: ClientCertificate, tmp_path: Path
) -> None:
    env = mutual_tls(certs, encrypted_client)
    with pytest.raises(SettingsError, match="WFJOBS_KAFKA_SSL_KEY_PASSWORD does not open"):
        settings({**env, "WFJOBS_KAFKA_SSL_KEY_PASSWORD": "not-it"})
    (tmp_path / "key-password").write_text("not-it")
    with pytest.raises(SettingsError, match="WFJOBS_KAFKA_SSL_KEY_PASSWORD_FILE does not open"):
        settings({**env, "WFJOBS_KAFKA_SSL_KEY_PASSWORD_FILE": str(tmp_path / "key-password")})


def test_a_key_password_without_a_key_is_refused(certs: ServerCertificates) -> None:
    tls = {
        "KAFKA_BOOTSTRAP_SERVERS": "k:9093",
        "WFJOBS_KAFKA_SECURITY_PROTOCOL": "SSL",
        "WFJOBS_KAFKA_SSL_CA_FILE": str(certs.ca_file),
        "WFJOBS_KAFKA_SSL_KEY_PASSWORD": KEY_PASSWORD,
    }
    with pytest.raises(SettingsError, match=r"WFJOBS_KAFKA_SSL_KEY_PASSWORD set, but .*KEY_FILE"):
        settings(tls)


# Checks the settings of an encrypted key without its password, in a process
# whose controlling terminal is ``pty``: nothing may ask for the password there.
_WITHOUT_PASSWORD = """
import fcntl, json, sys, termios
fcntl.ioctl(0, termios.TIOCSCTTY, 0)
from streams.settings import Settings, SettingsError
try:
    Settings.from_env(json.loads(sys.argv[1]))
except SettingsError as exc:
    print("refused:", exc.message, flush=True)
"""


def on_a_terminal(code: str, env: Mapping[str, str]) -> bytes:
    """What ``python -c code <env as JSON>`` writes to its terminal, a pty it controls,
    until it exits, asks for a pass phrase, or 30 s pass."""
    controller, terminal = pty.openpty()
    child = subprocess.Popen(
        [sys.executable, "-c", code, json.dumps(dict(env))],
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[3])},
    )
    os.close(terminal)
    said = b""
    try:
        deadline = time.monotonic() + 30
        while b"pass phrase" not in said and time.monotonic() < deadline:
            if select.select([controller], [], [], 0.2)[0]:
                try:
                    said += os.read(controller, 4096)
                except OSError:  # the child is gone and the terminal with it
                    break
    finally:
        child.kill()
        child.wait()
        os.close(controller)
    return said


def test_an_encrypted_key_without_its_password_is_refused_not_prompted_for(
    certs: ServerCertificates, encrypted_client: ClientCertificate
) -> None:
    said = on_a_terminal(_WITHOUT_PASSWORD, mutual_tls(certs, encrypted_client))
    assert b"pass phrase" not in said, said
    assert (
        b"refused: WFJOBS_KAFKA_SSL_KEY_FILE holds an encrypted key: set "
        b"WFJOBS_KAFKA_SSL_KEY_PASSWORD or WFJOBS_KAFKA_SSL_KEY_PASSWORD_FILE"
    ) in said, said


# --------------------------------------------------------------------------- OAUTHBEARER

OAUTH = {
    "KAFKA_BOOTSTRAP_SERVERS": "k:9093",
    "WFJOBS_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
    "WFJOBS_KAFKA_SASL_MECHANISM": "OAUTHBEARER",
    "WFJOBS_KAFKA_OAUTH_TOKEN_URL": "https://idp.example/oauth2/token",
    "WFJOBS_KAFKA_OAUTH_CLIENT_ID": "workflow-jobs",
    "WFJOBS_KAFKA_OAUTH_CLIENT_SECRET": "client-secret",
    "WFJOBS_KAFKA_OAUTH_SCOPE": "kafka",
}


def test_oauthbearer_maps_onto_librdkafka_oidc() -> None:
    config = settings(OAUTH).kafka_client_config()
    assert config == {
        "bootstrap.servers": "k:9093",
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "OAUTHBEARER",
        "sasl.oauthbearer.method": "oidc",
        "sasl.oauthbearer.token.endpoint.url": "https://idp.example/oauth2/token",
        "sasl.oauthbearer.client.id": "workflow-jobs",
        "sasl.oauthbearer.client.secret": "client-secret",
        "sasl.oauthbearer.scope": "kafka",
        "ssl.endpoint.identification.algorithm": "https",
    }


def test_oauthbearer_maps_onto_a_token_provider_for_aiokafka_and_faust() -> None:
    security = settings(OAUTH).kafka_security()
    options = security.aiokafka()
    assert options["sasl_mechanism"] == "OAUTHBEARER"
    assert isinstance(options["sasl_oauth_token_provider"], ClientCredentialsTokenProvider)
    assert "sasl_plain_password" not in options
    credentials = security.faust_credentials()
    assert isinstance(credentials, faust.OAuthCredentials)
    assert credentials.protocol is AuthProtocol.SASL_SSL
    assert isinstance(credentials.oauth_cb, ClientCredentialsTokenProvider)


def test_oauthbearer_needs_its_endpoint_and_client() -> None:
    with pytest.raises(SettingsError, match="WFJOBS_KAFKA_OAUTH_CLIENT_SECRET"):
        settings({**OAUTH, "WFJOBS_KAFKA_OAUTH_CLIENT_SECRET": ""})
    with pytest.raises(SettingsError, match="WFJOBS_KAFKA_OAUTH_TOKEN_URL"):
        settings({**OAUTH, "WFJOBS_KAFKA_OAUTH_TOKEN_URL": "idp.example/token"})


@pytest.mark.parametrize(
    ("env", "named"),
    [
        (
            {**SCRAM, "WFJOBS_KAFKA_OAUTH_TOKEN_URL": "https://idp.example/oauth2/token"},
            "WFJOBS_KAFKA_OAUTH_TOKEN_URL set, but WFJOBS_KAFKA_SASL_MECHANISM is SCRAM-SHA-512",
        ),
        (
            {**SCRAM, "WFJOBS_KAFKA_OAUTH_CLIENT_ID": "c", "WFJOBS_KAFKA_OAUTH_SCOPE": "kafka"},
            "WFJOBS_KAFKA_OAUTH_CLIENT_ID, WFJOBS_KAFKA_OAUTH_SCOPE set, but "
            "WFJOBS_KAFKA_SASL_MECHANISM is SCRAM-SHA-512",
        ),
        (
            {**OAUTH, "WFJOBS_KAFKA_SASL_USERNAME": "alice"},
            "WFJOBS_KAFKA_SASL_USERNAME set, but WFJOBS_KAFKA_SASL_MECHANISM is OAUTHBEARER",
        ),
        (
            {**OAUTH, "WFJOBS_KAFKA_SASL_PASSWORD": "pw"},
            "WFJOBS_KAFKA_SASL_PASSWORD set, but WFJOBS_KAFKA_SASL_MECHANISM is OAUTHBEARER",
        ),
        (
            {"KAFKA_BOOTSTRAP_SERVERS": "k:9092", "WFJOBS_KAFKA_OAUTH_SCOPE": "kafka"},
            "WFJOBS_KAFKA_OAUTH_SCOPE set, but WFJOBS_KAFKA_SECURITY_PROTOCOL is PLAINTEXT",
        ),
    ],
)
def test_credentials_the_mechanism_never_sends_are_refused(env: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError, match=re.escape(named)):
        settings(env)


class _TokenEndpoint(BaseHTTPRequestHandler):
    grants: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"])).decode()
        type(self).grants.append({"body": body, "authorization": self.headers["Authorization"]})
        if self.headers["Authorization"] != "Basic d29ya2Zsb3ctam9iczpjbGllbnQtc2VjcmV0":
            self.send_response(401)
            self.end_headers()
            return
        answer = json.dumps({"access_token": f"token-{len(type(self).grants)}", "expires_in": 60})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(answer.encode())

    def log_message(self, format: str, *args: Any) -> None:
        return None


@pytest.fixture
def token_endpoint() -> Iterator[str]:
    _TokenEndpoint.grants = []
    with serving(_TokenEndpoint) as url:
        yield f"{url}/token"


async def test_the_token_provider_makes_a_client_credentials_grant_and_reuses_it(
    token_endpoint: str,
) -> None:
    now = [100.0]
    provider = ClientCredentialsTokenProvider(
        OAuthClient(token_endpoint, "workflow-jobs", "client-secret", scope="kafka"),
        clock=lambda: now[0],
    )
    assert await provider.token() == "token-1"
    assert await provider.token() == "token-1"
    assert _TokenEndpoint.grants[0]["body"] == "grant_type=client_credentials&scope=kafka"
    now[0] += 60 * 0.8  # the token's lifetime is 60s; it is replaced before it runs out
    assert await provider.token() == "token-2"


async def test_a_refused_client_names_its_settings(token_endpoint: str) -> None:
    provider = ClientCredentialsTokenProvider(OAuthClient(token_endpoint, "workflow-jobs", "bad"))
    with pytest.raises(TokenError, match="WFJOBS_KAFKA_OAUTH_CLIENT_SECRET") as refused:
        await provider.token()
    assert refused.value.refused
    security = settings(OAUTH).kafka_security()
    assert security.explain(refused.value, "k:9093") == str(refused.value)


async def test_the_client_secret_may_come_from_a_file(token_endpoint: str, tmp_path: Path) -> None:
    secret = tmp_path / "client-secret"
    secret.write_text("client-secret\n")
    env = {k: v for k, v in OAUTH.items() if k != "WFJOBS_KAFKA_OAUTH_CLIENT_SECRET"}
    from_file = settings(
        {
            **env,
            "WFJOBS_KAFKA_OAUTH_TOKEN_URL": token_endpoint,
            "WFJOBS_KAFKA_OAUTH_CLIENT_SECRET_FILE": str(secret),
        }
    )
    assert from_file.kafka_client_config()["sasl.oauthbearer.client.secret"] == "client-secret"
    # The endpoint grants a token only to the secret the file holds.
    provider = from_file.kafka_security().aiokafka()["sasl_oauth_token_provider"]
    assert await provider.token() == "token-1"

    # Refused, the secret to check is the file the process read it from.
    secret.write_text("rotated-but-wrong")
    refusing = from_file.kafka_security()
    with pytest.raises(TokenError) as refused:
        await refusing.aiokafka()["sasl_oauth_token_provider"].token()
    assert "WFJOBS_KAFKA_OAUTH_CLIENT_SECRET_FILE" in str(refused.value)
    explained = refusing.explain(KafkaError(58, "Authentication failed"), "k:9093")
    assert explained is not None and "WFJOBS_KAFKA_OAUTH_CLIENT_SECRET_FILE" in explained


@pytest.mark.parametrize(
    ("env", "named"),
    [
        (
            {**SCRAM, "WFJOBS_KAFKA_OAUTH_CLIENT_SECRET_FILE": "SECRET"},
            "WFJOBS_KAFKA_OAUTH_CLIENT_SECRET_FILE set, but WFJOBS_KAFKA_SASL_MECHANISM is "
            "SCRAM-SHA-512",
        ),
        (
            {
                **{k: v for k, v in OAUTH.items() if k != "WFJOBS_KAFKA_OAUTH_CLIENT_SECRET"},
                "WFJOBS_KAFKA_OAUTH_CLIENT_SECRET_FILE": "EMPTY",
            },
            "SASL mechanism OAUTHBEARER needs WFJOBS_KAFKA_OAUTH_CLIENT_SECRET_FILE",
        ),
        (
            {
                **{k: v for k, v in SCRAM.items() if k != "WFJOBS_KAFKA_SASL_USERNAME"},
                "WFJOBS_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                "WFJOBS_KAFKA_SASL_USERNAME_FILE": "SECRET",
                "WFJOBS_KAFKA_SSL_KEY_PASSWORD_FILE": "SECRET",
            },
            "WFJOBS_KAFKA_SSL_KEY_PASSWORD_FILE set, but WFJOBS_KAFKA_SECURITY_PROTOCOL is "
            "SASL_PLAINTEXT, which uses no TLS",
        ),
        (
            {**OAUTH, "WFJOBS_KAFKA_SASL_USERNAME_FILE": "SECRET"},
            "WFJOBS_KAFKA_SASL_USERNAME_FILE set, but WFJOBS_KAFKA_SASL_MECHANISM is OAUTHBEARER",
        ),
    ],
)
def test_a_secret_from_a_file_is_named_by_its_file_variable(
    env: dict[str, str], named: str, tmp_path: Path
) -> None:
    (tmp_path / "secret").write_text("s3cret\n")
    (tmp_path / "empty").write_text("")
    files = {"SECRET": str(tmp_path / "secret"), "EMPTY": str(tmp_path / "empty")}
    env = {name: files.get(value, value) for name, value in env.items()}
    with pytest.raises(SettingsError, match=re.escape(named)):
        settings(env)


class _Elsewhere(BaseHTTPRequestHandler):
    """Another host's server: records the Authorization header of whatever reaches it."""

    seen: list[str | None] = []

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self._answer()

    def _answer(self) -> None:
        type(self).seen.append(self.headers.get("Authorization"))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"access_token": "stolen", "expires_in": 60}')

    def log_message(self, format: str, *args: Any) -> None:
        return None


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
async def test_a_token_endpoint_that_redirects_is_not_followed_with_the_secret(
    status: int,
) -> None:
    _Elsewhere.seen = []
    with serving(_Elsewhere) as elsewhere:

        class Redirecting(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.send_response(status)
                self.send_header("Location", f"{elsewhere}/token")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return None

        with serving(Redirecting) as url:
            provider = ClientCredentialsTokenProvider(
                OAuthClient(f"{url}/token", "workflow-jobs", "client-secret")
            )
            with pytest.raises(TokenError, match="WFJOBS_KAFKA_OAUTH_TOKEN_URL") as failed:
                await provider.token()
    assert _Elsewhere.seen == [], "the client secret followed the redirect"
    assert f"HTTP {status}" in str(failed.value) and "client-secret" not in str(failed.value)


# --------------------------------------------------------------------------- failures


@pytest.mark.parametrize(
    "error",
    [
        KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error: invalid credentials"),
        SaslAuthenticationFailed("invalid credentials"),
    ],
    ids=["librdkafka", "aiokafka"],
)
def test_refused_credentials_are_explained_by_the_settings_to_check(error: Any) -> None:
    explained = settings(SCRAM).kafka_security().explain(error, "k1:9093")
    assert explained is not None and "\n" not in explained
    assert "WFJOBS_KAFKA_SASL_USERNAME and WFJOBS_KAFKA_SASL_PASSWORD" in explained
    assert "alice-secret" not in explained


def test_a_broker_that_is_away_is_not_a_settings_problem() -> None:
    security = settings(SCRAM).kafka_security()
    assert security.explain(KafkaError(KafkaError._TRANSPORT, "down"), "k:1") is None
    assert security.explain(ConnectionRefusedError(111, "refused"), "k:1") is None
    assert security.explain(ssl.SSLCertVerificationError("certificate verify failed"), "k:1")


# --------------------------------------------------------------------------- pass-through


def test_other_librdkafka_properties_pass_through_last() -> None:
    extra = settings(
        {
            **SCRAM,
            "WFJOBS_KAFKA_PROPERTIES": json.dumps(
                {
                    "client.dns.lookup": "use_all_dns_ips",
                    "ssl.endpoint.identification.algorithm": "none",
                }
            ),
        }
    ).kafka_client_config()
    assert extra["client.dns.lookup"] == "use_all_dns_ips"
    assert extra["ssl.endpoint.identification.algorithm"] == "none"


@pytest.mark.parametrize(
    "raw", ['["a"]', "{not json", '{"bootstrap.servers": "x:1"}', '{"a": {"b": 1}}']
)
def test_pass_through_properties_must_be_a_flat_json_object(raw: str) -> None:
    with pytest.raises(SettingsError, match="WFJOBS_KAFKA_PROPERTIES"):
        settings({"WFJOBS_KAFKA_PROPERTIES": raw})


@pytest.mark.parametrize(
    ("properties", "named"),
    [
        ({"acks": "1"}, "acks=all"),
        ({"request.required.acks": 1}, "acks=all"),
        ({"enable.idempotence": False}, "idempotent"),
        ({"max.in.flight.requests.per.connection": 10}, "in flight"),
        ({"max.in.flight": 10}, "in flight"),
        ({"message.timeout.ms": 120000}, "WFJOBS_RELAY_MESSAGE_TIMEOUT_MS"),
        ({"delivery.timeout.ms": 120000}, "WFJOBS_RELAY_MESSAGE_TIMEOUT_MS"),
    ],
)
def test_pass_through_properties_cannot_loosen_what_delivery_rests_on(
    properties: dict[str, object], named: str
) -> None:
    # Applied last, they would have overridden the relay producer's own
    # settings: acks from one replica, or retries that reorder a job's events,
    # or a delivery deadline past the lease the settings check it against.
    (key,) = properties
    with pytest.raises(SettingsError, match=f"may not set '{key}'.*{named}"):
        settings({"WFJOBS_KAFKA_PROPERTIES": json.dumps(properties)})


# --------------------------------------------------------------------------- bootstrap servers


def test_a_server_written_with_a_scheme_reaches_faust_as_host_and_port() -> None:
    # Faust reads "kafka://SASL_SSL://k1:9093" as host "sasl_ssl" on the default port.
    scheme = settings({**SCRAM, "KAFKA_BOOTSTRAP_SERVERS": "SASL_SSL://k1:9093, kafka://k2:9094"})
    assert scheme.broker_url == "kafka://k1:9093;kafka://k2:9094"
    assert scheme.kafka_client_config()["bootstrap.servers"] == "k1:9093,k2:9094"


class NoOutbox:
    async def relay_batch(
        self, publish: object, limit: int = 100, *, owner: str = "relay"
    ) -> RelayResult:
        raise AssertionError("not used here")

    async def backlog(self) -> Backlog:
        raise AssertionError("not used here")


def test_the_relay_producer_gets_the_security_and_pass_through_properties() -> None:
    relay = build_relay(
        settings({**SCRAM, "WFJOBS_KAFKA_PROPERTIES": '{"socket.keepalive.enable": true}'}),
        NoOutbox(),
    )
    config = relay.producer_config
    assert config["bootstrap.servers"] == "k1:9093,k2:9093"
    assert config["security.protocol"] == "SASL_SSL"
    assert config["sasl.username"] == "alice"
    assert config["socket.keepalive.enable"] is True
    # Its own guarantees stay.
    assert config["enable.idempotence"] is True


# --------------------------------------------------------------------------- registry


def test_registry_client_settings(tmp_path: Path, certs: ServerCertificates) -> None:
    user_info = tmp_path / "registry-user"
    user_info.write_text("svc:registry-secret\n")
    registry = settings(
        {
            "WFJOBS_SCHEMA_REGISTRY_URL": "https://registry.example",
            "WFJOBS_SCHEMA_REGISTRY_BASIC_AUTH_FILE": str(user_info),
            "WFJOBS_SCHEMA_REGISTRY_CA_FILE": str(certs.ca_file),
            "WFJOBS_SCHEMA_REGISTRY_CERT_FILE": str(certs.certificate_file),
            "WFJOBS_SCHEMA_REGISTRY_KEY_FILE": str(certs.key_file),
        }
    )
    assert registry_config(registry) == {
        "basic.auth.user.info": "svc:registry-secret",
        "ssl.ca.location": str(certs.ca_file),
        "ssl.certificate.location": str(certs.certificate_file),
        "ssl.key.location": str(certs.key_file),
    }
    client = registry.open_registry()
    assert client is not None


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"WFJOBS_SCHEMA_REGISTRY_BASIC_AUTH": "no-colon"}, "WFJOBS_SCHEMA_REGISTRY_BASIC_AUTH"),
        ({"WFJOBS_SCHEMA_REGISTRY_CERT_FILE": "/etc/hostname"}, "WFJOBS_SCHEMA_REGISTRY_KEY_FILE"),
        ({"WFJOBS_SCHEMA_REGISTRY_CA_FILE": "/nonexistent"}, "WFJOBS_SCHEMA_REGISTRY_CA_FILE"),
    ],
)
def test_bad_registry_settings_are_refused_by_name(env: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError, match=named):
        settings(env)


def test_registry_files_that_are_not_pem_are_refused_at_start(
    tmp_path: Path, certs: ServerCertificates
) -> None:
    bogus = tmp_path / "bogus.pem"
    bogus.write_text("not a certificate")
    for env in (
        {"WFJOBS_SCHEMA_REGISTRY_CA_FILE": str(bogus)},
        {
            "WFJOBS_SCHEMA_REGISTRY_CERT_FILE": str(certs.certificate_file),
            "WFJOBS_SCHEMA_REGISTRY_KEY_FILE": str(bogus),
        },
    ):
        with pytest.raises(SettingsError, match=r"WFJOBS_SCHEMA_REGISTRY_CA_FILE, .*not usable"):
            settings({"WFJOBS_SCHEMA_REGISTRY_URL": "https://registry.example", **env})


# Opens the registry client of an encrypted key, in a process whose controlling
# terminal is ``pty``: nothing may ask for the key's password there.
_REGISTRY_WITH_AN_ENCRYPTED_KEY = """
import fcntl, json, sys, termios
fcntl.ioctl(0, termios.TIOCSCTTY, 0)
from streams.settings import Settings, SettingsError
try:
    Settings.from_env(json.loads(sys.argv[1])).open_registry()
    print("refused: nothing", flush=True)
except SettingsError as exc:
    print("refused:", exc.message, flush=True)
"""


def test_an_encrypted_registry_key_is_refused_at_start_not_prompted_for(
    certs: ServerCertificates, encrypted_client: ClientCertificate
) -> None:
    env = {
        "WFJOBS_SCHEMA_REGISTRY_URL": "https://registry.example",
        "WFJOBS_SCHEMA_REGISTRY_CA_FILE": str(certs.ca_file),
        "WFJOBS_SCHEMA_REGISTRY_CERT_FILE": str(encrypted_client.certificate_file),
        "WFJOBS_SCHEMA_REGISTRY_KEY_FILE": str(encrypted_client.key_file),
    }
    said = on_a_terminal(_REGISTRY_WITH_AN_ENCRYPTED_KEY, env)
    assert b"pass phrase" not in said, said
    assert (
        b"refused: WFJOBS_SCHEMA_REGISTRY_KEY_FILE holds an encrypted key, which the registry "
        b"client cannot open"
    ) in said, said


def test_without_auto_register_requests_are_framed_with_the_latest_version() -> None:
    topic = f"requests-{uuid.uuid4().hex[:8]}"
    registry = open_registry(f"mock://{uuid.uuid4().hex[:8]}", requests_topic=topic)
    request = WorkflowRunRequest(job_id=str(uuid.uuid4()), workflow_name="w")
    registered = encode_request(request, registry=registry, topic=topic)
    latest = encode_request(request, registry=registry, topic=topic, auto_register=False)
    assert latest == registered


# --------------------------------------------------------------------------- off the loop


class ThreadNotingDecoder(RequestDecoder):
    def __init__(self) -> None:
        super().__init__(None)
        self.threads: list[int] = []

    def decode(self, data: bytes | None, *, topic: str | None = None) -> WorkflowRunRequest:
        self.threads.append(threading.get_ident())
        return super().decode(data, topic=topic)


async def test_a_framed_request_is_decoded_off_the_event_loop() -> None:
    decoder = ThreadNotingDecoder()
    rejected: list[str] = []

    async def dead_letter(key: bytes | None, value: bytes | None, reason: str) -> None:
        rejected.append(reason)

    # Nothing is submitted here: the request never decodes.
    runtime = cast(Any, SimpleNamespace(settings=Settings.from_env({})))
    handler = RequestHandler(
        runtime, decoder=decoder, dead_letter=dead_letter, topic="r", jobs=cast(Any, object())
    )
    # Framed (magic byte 0): the registry may be asked for the writer schema.
    outcome = await handler.handle(b"k", b"\x00\x00\x00\x00\x07\x00garbage")
    assert outcome.kind == "dead_lettered" and rejected
    assert decoder.threads and decoder.threads[0] != threading.get_ident()
