"""The ``wfjobs`` commands that use the settings directly: migrate, produce, events.

Real Postgres and the real Apache Kafka; the registry is confluent's ``mock://``,
opened separately by the command and by the test, as two processes would.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from cli.main import main as cli_main
from schemas.contract import EventType, build_event, encode_event, with_event_id
from schemas.serde import RequestDecoder, event_serializer, open_registry

# The broker fixtures mark their tests (tests/conftest.py): some read from Tansu.


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli_main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_migrate_applies_once(
    make_database: Callable[[], str], capsys: pytest.CaptureFixture[str]
) -> None:
    dsn = make_database()
    code, out, _ = run(capsys, "--json", "migrate", "--dsn", dsn)
    assert code == 0
    applied = json.loads(out)["applied"]
    assert applied and applied == sorted(applied)
    code, out, _ = run(capsys, "--json", "migrate", "--dsn", dsn)
    assert (code, json.loads(out)) == (0, {"applied": []})


def read_one(bootstrap: str, topic: str, timeout_s: float = 30.0) -> tuple[bytes, bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex})
    partitions = consumer.list_topics(topic, timeout=15).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                return message.key(), message.value()
    finally:
        consumer.close()
    raise AssertionError(f"nothing on {topic}")


def test_produce_frames_the_request_for_the_registry(
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    topic = new_topic(kafka_bootstrap)
    registry_url = f"mock://{uuid.uuid4().hex}"
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.setenv("WFJOBS_REQUESTS_TOPIC", topic)
    monkeypatch.setenv("WFJOBS_SCHEMA_REGISTRY_URL", registry_url)
    job_id = str(uuid.uuid4())

    code, out, err = run(
        capsys,
        "--json",
        "produce",
        "--workflow-name",
        "embed-and-review",
        "--input",
        '{"text": "hi"}',
        "--job-id",
        job_id,
    )
    assert code == 0, err
    assert json.loads(out) == {"job_id": job_id, "topic": topic}

    key, value = read_one(kafka_bootstrap, topic)
    assert key == job_id.encode()
    assert value[0] == 0, "framed for the registry"
    # A separate client stands for the worker process reading the request.
    reader = open_registry(registry_url, requests_topic=topic)
    request = RequestDecoder(reader, topic=topic).decode(value)
    assert (request.job_id, request.workflow_name) == (job_id, "embed-and-review")
    assert dict(request.input) == {"text": "hi"}


def test_events_prints_each_event_once(
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    topic = new_topic(kafka_bootstrap)
    registry_url = f"mock://{uuid.uuid4().hex}"
    # The "relay process": its own mock client, framing two events, one of them twice
    # (a republish after a lost ack).
    serializer = event_serializer(
        registry=open_registry(registry_url, events_topic=topic), topic=topic
    )
    serializer.prepare()
    job_id = uuid.uuid4()
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for event_id, kind in ((1, "TYPE_ACCEPTED"), (2, "TYPE_WAITING"), (2, "TYPE_WAITING")):
        event = build_event(
            job_id=job_id,
            event_type=EventType.Value(kind),
            workflow_name="embed-and-review",
            attempt=1,
            occurred_at=datetime.now(UTC),
            step_name="review" if kind == "TYPE_WAITING" else "",
        )
        value = serializer.serialize(with_event_id(encode_event(event), event_id))
        producer.produce(topic, key=str(job_id).encode(), value=value)
    assert producer.flush(30) == 0

    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.setenv("WFJOBS_EVENTS_TOPIC", topic)
    monkeypatch.setenv("WFJOBS_SCHEMA_REGISTRY_URL", registry_url)
    code, out, err = run(capsys, "--json", "events", "--from-beginning", "--timeout", "8")
    assert code == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert [(event["event_id"], event["type"]) for event in events] == [
        ("1", "TYPE_ACCEPTED"),
        ("2", "TYPE_WAITING"),
    ]
    assert {event["job_id"] for event in events} == {str(job_id)}


class EventsTopic:
    """An events topic with a "relay" framing events on it, and the settings that
    point ``wfjobs events`` at it."""

    def __init__(self, bootstrap: str, topic: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.topic = topic
        registry_url = f"mock://{uuid.uuid4().hex}"
        self._serializer = event_serializer(
            registry=open_registry(registry_url, events_topic=topic), topic=topic
        )
        self._serializer.prepare()
        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50})
        monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", bootstrap)
        monkeypatch.setenv("WFJOBS_EVENTS_TOPIC", topic)
        monkeypatch.setenv("WFJOBS_SCHEMA_REGISTRY_URL", registry_url)

    def publish(self, job_id: uuid.UUID, event_ids: range, **fields: Any) -> None:
        """Checkpoint events, produced together: one batch on the partition."""
        for event_id in event_ids:
            event = build_event(
                job_id=job_id,
                event_type=EventType.TYPE_STEP_CHECKPOINT,
                workflow_name="embed-and-review",
                attempt=1,
                occurred_at=datetime.now(UTC),
                step_name="embed",
                **fields,
            )
            value = self._serializer.serialize(with_event_id(encode_event(event), event_id))
            self._producer.produce(self.topic, key=str(job_id).encode(), value=value)
        assert self._producer.flush(30) == 0


def test_events_json_keeps_whole_numbers_whole(
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events = EventsTopic(kafka_bootstrap, new_topic(kafka_bootstrap, 1), monkeypatch)
    events.publish(uuid.uuid4(), range(1, 2), response={"dimensions": 8, "scale": 0.5})
    code, out, err = run(
        capsys, "--json", "events", "--from-beginning", "--max", "1", "--timeout", "30"
    )
    assert code == 0, err
    assert '"dimensions":8,' in out or '"dimensions":8}' in out, out
    response = json.loads(out)["response"]
    assert response == {"dimensions": 8, "scale": 0.5}
    assert isinstance(response["dimensions"], int)


def test_events_job_prints_only_that_jobs_events(
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events = EventsTopic(kafka_bootstrap, new_topic(kafka_bootstrap, 1), monkeypatch)
    wanted, other = uuid.uuid4(), uuid.uuid4()
    # One partition: the other job's events come first, so --max stops only
    # once the filter has passed over them.
    events.publish(other, range(1, 4))
    events.publish(wanted, range(4, 6))
    events.publish(other, range(6, 8))
    code, out, err = run(
        capsys,
        "--json",
        "events",
        "--from-beginning",
        "--job",
        str(wanted),
        "--max",
        "2",
        "--timeout",
        "30",
    )
    assert code == 0, err
    printed = [json.loads(line) for line in out.splitlines()]
    assert [(event["job_id"], event["event_id"]) for event in printed] == [
        (str(wanted), "4"),
        (str(wanted), "5"),
    ]


def test_events_without_from_beginning_prints_only_new_events(
    tansu_bootstrap: str,
    new_topic: Callable[..., str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Tansu: its answer to "where does the partition end" lies inside the last
    # batch, which is where the old events came from.
    events = EventsTopic(tansu_bootstrap, new_topic(tansu_bootstrap, 1), monkeypatch)
    job_id = uuid.uuid4()
    events.publish(job_id, range(1, 4))
    events.publish(job_id, range(4, 9))

    code, out, err = run(capsys, "--json", "events", "--timeout", "3")
    assert (code, out) == (0, ""), err

    result: list[tuple[int, str, str]] = []
    reader = threading.Thread(
        target=lambda: result.append(
            run(capsys, "--json", "events", "--max", "1", "--timeout", "60")
        )
    )
    reader.start()
    # New events until the reader has seen one: it may still be finding the end.
    event_id = 100
    while reader.is_alive():
        events.publish(job_id, range(event_id, event_id + 1))
        event_id += 1
        reader.join(timeout=0.5)
    [(code, out, err)] = result
    assert code == 0, err
    printed = [json.loads(line) for line in out.splitlines()]
    assert len(printed) == 1 and int(printed[0]["event_id"]) >= 100, printed


def test_events_stopped_by_ctrl_c_exits_130_without_a_traceback(
    kafka_bootstrap: str, new_topic: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # It exited 0, as if it had stopped by itself: `wfjobs events && next` ran
    # the next command after the user had interrupted the first.
    EventsTopic(kafka_bootstrap, new_topic(kafka_bootstrap, 1), monkeypatch)
    command = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "events"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert command.stderr is not None
        reading = command.stderr.readline()
        assert "Ctrl-C to stop" in reading, reading
        command.send_signal(signal.SIGINT)
        out, err = command.communicate(timeout=30)
    finally:
        if command.poll() is None:
            command.kill()
            command.wait()
    assert command.returncode == 130, err
    assert (out, err) == ("", ""), err


def test_tokens_on_a_database_not_yet_migrated_say_to_migrate(
    make_database: Callable[[], str], capsys: pytest.CaptureFixture[str]
) -> None:
    dsn = make_database()
    for argv in (
        ["tokens", "create", "--principal", "ci", "--scope", "read"],
        ["tokens", "list"],
        ["tokens", "revoke", "0123456789ab"],
    ):
        code, out, err = run(capsys, *argv, "--dsn", dsn)
        assert (code, out) == (1, ""), argv
        assert len(err.strip().splitlines()) == 1, err
        assert err.startswith("FAILED_PRECONDITION: ") and "wfjobs migrate" in err, err
