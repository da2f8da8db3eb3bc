"""`wfjobs produce-completion`: a StepCompletion on the completions topic, framed."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

import pytest

from cli.main import main as cli_main
from schemas.contract import StepCompletion
from schemas.serde import MessageDecoder, open_registry
from tests.integration.delivery.test_cli_settings import read_one


def test_produce_completion_frames_a_step_completion(
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    topic = new_topic(kafka_bootstrap, 1)
    registry_url = f"mock://{uuid.uuid4().hex}"
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.setenv("WFJOBS_COMPLETIONS_TOPIC", topic)
    monkeypatch.setenv("WFJOBS_SCHEMA_REGISTRY_URL", registry_url)
    job_id = str(uuid.uuid4())

    capsys.readouterr()
    code = cli_main(
        [
            "--json",
            "produce-completion",
            job_id,
            "review",
            "--response",
            '{"approved": true, "reviewer": "ann"}',
            "--request-id",
            "r-1",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out) == {"job_id": job_id, "request_id": "r-1", "topic": topic}

    key, value = read_one(kafka_bootstrap, topic)
    assert key == job_id.encode() and value[0] == 0, "framed for the registry"
    # A separate client stands for the worker reading it.
    reader = open_registry(registry_url, completions_topic=topic)
    completion = MessageDecoder(StepCompletion, reader, topic=topic).decode(value)
    assert (completion.job_id, completion.step_name, completion.request_id) == (
        job_id,
        "review",
        "r-1",
    )
    assert dict(completion.response) == {"approved": True, "reviewer": "ann"}

    code = cli_main(["produce-completion", "not-a-uuid", "review", "--response", "{}"])
    assert code != 0
    assert "job id must be a UUID" in capsys.readouterr().err
