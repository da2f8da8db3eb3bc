"""A secret's file that becomes unreadable while the worker runs is an outage.

The settings read it at start, where an unreadable file stops the process
naming the variable. The dead-letter verbs build new clients per call and read
it again: by then a missing file is the mount's outage, not the caller's bad
request, and the caller should retry.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from schemas.errors import Unavailable
from streams.requests_dlq import RequestsDeadLetters
from streams.settings import Settings
from tests.integration.streams.conftest import serve

pytestmark = pytest.mark.asyncio

SASL = {
    "WFJOBS_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
    "WFJOBS_KAFKA_SASL_MECHANISM": "PLAIN",
    "WFJOBS_KAFKA_SASL_USERNAME": "wfjobs",
}


def _password_file(tmp_path: Path) -> Path:
    path = tmp_path / "kafka-password"
    path.write_text("secret\n")
    return path


async def test_the_dead_letter_verbs_call_a_vanished_secret_an_outage(tmp_path: Path) -> None:
    password = _password_file(tmp_path)
    settings = Settings.from_env({**SASL, "WFJOBS_KAFKA_SASL_PASSWORD_FILE": str(password)})
    dead_letters = RequestsDeadLetters.from_settings(settings)
    password.unlink()
    with pytest.raises(Unavailable, match="WFJOBS_KAFKA_SASL_PASSWORD_FILE"):
        await dead_letters.list_messages()
    with pytest.raises(Unavailable, match="WFJOBS_KAFKA_SASL_PASSWORD_FILE"):
        await dead_letters.redrive(None)


async def test_the_dead_letter_endpoints_answer_503_naming_the_setting(
    make_database: Callable[..., str], tmp_path: Path
) -> None:
    password = _password_file(tmp_path)
    env = {
        "DATABASE_URL": make_database(migrated=True),
        **SASL,
        "WFJOBS_KAFKA_SASL_PASSWORD_FILE": str(password),
    }
    async with serve(env) as (client, _):
        password.unlink()
        for response in (
            await client.get("/v1/requests-dlq"),
            await client.post("/v1/requests-dlq:redrive", json={"all": True}),
        ):
            body = await response.json()
            assert response.status == 503, body
            assert body["code"] == "UNAVAILABLE", body
            assert "WFJOBS_KAFKA_SASL_PASSWORD_FILE" in body["message"], body
