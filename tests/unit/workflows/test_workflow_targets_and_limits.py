"""Rule caps, target patterns and the bounded channel cache, without a network."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.certificates import ServerCertificates, make_client_certificate, make_server_certificates
from workflows.invokers import GrpcChannels
from workflows.rules import RuleError, RuleLimits, check_limits
from workflows.targets import TargetPattern, TargetPolicy, TlsRule


@pytest.mark.parametrize(
    ("rule", "deepest"),
    [
        ("input.ids.all(x, x > 0)", 1),
        ("input.ids.all(x, input.ids.exists(y, y == x))", 2),
        ("a.map(x, b.map(y, c.filter(z, z))) + d.map(w, w)", 3),
        ("'.map(' + input.text", 0),  # inside a string literal: not a macro
        ("r'.map(' + '\\'.map(' + input.text", 0),
        # A raw string takes a backslash as itself, so it ends at its second quote,
        # and a triple-quoted one escapes as a quoted one does: the macros between
        # such literals are code, and count.
        ("size(r'\\') + size(a.map(x, b.map(y, y))) + size(r'\\') > 0", 2),
        ('size(br"\\") + size(a.map(x, b.map(y, y))) + size(R"\\") > 0', 2),
        ("size('''a\\'''') + size(a.map(x, b.map(y, y))) + size('z') > 0", 2),
        # A comment runs to the end of its line, quotes in it included; `//` in a
        # literal starts none.
        ("size(a.map(x, // '''\n b.map(y, y))) + size('''x''') > 0", 2),
        ("size(a.map(x, x)) > 0 // or b.map(y, c.map(z, z))", 1),
        ("size('//' + string(a.map(x, b.map(y, y)))) > 0", 2),
        ("size(input.ids) > 0 && (input.text != '')", 0),
    ],
)
def test_macro_nesting_is_counted(rule: str, deepest: int) -> None:
    check_limits(rule, RuleLimits(max_nesting=max(deepest, 1)))
    if deepest > 1:
        with pytest.raises(RuleError, match=f"{deepest} deep; at most {deepest - 1} "):
            check_limits(rule, RuleLimits(max_nesting=deepest - 1))


def test_a_long_rule_is_refused_before_it_is_parsed() -> None:
    with pytest.raises(RuleError, match="at most 20"):
        check_limits("input.text + " + "'x' + " * 10 + "''", RuleLimits(max_chars=20))


@pytest.mark.parametrize(
    ("pattern", "target", "allowed"),
    [
        ("127.0.0.1:*", "127.0.0.1:50051", True),
        ("127.0.0.1:*", "127.0.0.2:50051", False),
        ("*.svc.cluster.local:443", "embed.ml.svc.cluster.local:443", True),
        ("*.svc.cluster.local:443", "svc.cluster.local:443", False),
        ("*.svc.cluster.local:443", "evil.svc.cluster.local.attacker.io:443", False),
        ("*.svc.cluster.local:443", "embed.ml.svc.cluster.local:444", False),
        ("Embedder.Internal:50051", "embedder.internal:50051", True),
        ("[::1]:*", "[::1]:7000", True),
        ("*:8443", "anything:8443", True),
    ],
)
def test_target_patterns(pattern: str, target: str, allowed: bool) -> None:
    assert TargetPolicy.parse([pattern]).allows(target) is allowed


@pytest.mark.parametrize("bad", ["127.0.0.1", "host:0", "host:http", "a b:1", "**:1"])
def test_malformed_patterns_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match=r"target pattern|port"):
        TargetPattern.parse(bad)


@pytest.mark.parametrize("never", ["unix:*", "UNIX-ABSTRACT:443", "dns:53", "xds:*"])
def test_a_pattern_whose_host_no_target_may_name_is_refused(never: str) -> None:
    # Such a target is refused whatever the patterns say: the pattern could
    # only ever look like it allowed something.
    with pytest.raises(ValueError, match=r"can never match: .*resolver scheme"):
        TargetPattern.parse(never)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> ServerCertificates:
    return make_server_certificates(tmp_path_factory.mktemp("tls"))


def test_tls_rules_read_their_files_and_pair_cert_with_key(certs: ServerCertificates) -> None:
    ca = certs.ca_file
    rule = TlsRule.parse(f"*.internal:443;ca={ca};authority=svc.internal")
    assert rule.ca == ca.read_bytes() and rule.cert is None and rule.authority == "svc.internal"
    client = TlsRule.parse(f"*.internal:443;cert={certs.certificate_file};key={certs.key_file}")
    assert client.key == certs.key_file.read_bytes()
    with pytest.raises(ValueError, match="needs both cert= and key="):
        TlsRule.parse(f"*.internal:443;cert={ca}")
    with pytest.raises(ValueError, match="cannot read"):
        TlsRule.parse("*.internal:443;ca=/no/such/file")


def test_tls_files_a_channel_could_not_use_are_refused_when_parsed(
    certs: ServerCertificates, tmp_path: Path
) -> None:
    # gRPC reads them only when a call dials, and every call would then fail
    # as if the target could not be reached.
    bogus = tmp_path / "bogus.pem"
    bogus.write_text("not a certificate")
    encrypted = make_client_certificate(
        certs, tmp_path / "client", common_name="worker", key_password="key-secret"
    )
    cert, key = certs.certificate_file, certs.key_file
    for rule, refusal in (
        (f"*.internal:443;ca={bogus}", "ca= holds no PEM certificate"),
        (f"*.internal:443;ca={key}", "ca= holds no PEM certificate"),
        (f"*.internal:443;cert={cert};key={bogus}", "are not a PEM certificate and its key"),
        (f"*.internal:443;cert={bogus};key={key}", "are not a PEM certificate and its key"),
        (f"*.internal:443;cert={cert};key={certs.ca_key_file}", "not a PEM certificate and its"),
        (
            f"*.internal:443;cert={encrypted.certificate_file};key={encrypted.key_file}",
            "key= is encrypted, and gRPC takes no password for it",
        ),
    ):
        with pytest.raises(ValueError, match=re.escape(refusal)):
            TlsRule.parse(rule)


async def test_the_channel_cache_closes_the_least_recently_used() -> None:
    channels = GrpcChannels(max_channels=2, close_grace_s=0.1)
    channels.unary("127.0.0.1:1001", "/a.B/C")
    channels.unary("127.0.0.1:1002", "/a.B/C")
    channels.unary("127.0.0.1:1001", "/a.B/C")  # used again: now the newest
    channels.unary("127.0.0.1:1003", "/a.B/C")
    assert list(channels._channels) == ["127.0.0.1:1001", "127.0.0.1:1003"]
    retired = list(channels._closing)
    assert len(retired) == 1
    await channels.close()
    assert len(channels) == 0 and all(task.done() for task in retired)
