"""Filling an event's Struct and Timestamp: protobuf's helpers beside the wire-format filler.

``python -m benchmarks.events [--rounds 30] [--events 200]``

Every commit point builds a ``WorkflowRunEvent`` whose ``response`` is the
step's answer as a ``google.protobuf.Struct``, stamped with ``occurred_at``.
This fills the same events both ways in one process: ``Struct.update`` and
``Timestamp.FromDatetime`` (what ``build_event`` used before), and
``schemas.struct_wire`` (what it uses now), for the peers benchmark's three
step answers and for an embedding-sized one. CPU microseconds per event, the
median of ``--rounds`` rounds of ``--events`` events; nothing is asserted.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from google.protobuf.struct_pb2 import Struct
from google.protobuf.timestamp_pb2 import Timestamp

from schemas.contract import EventType, WorkflowRunEvent
from schemas.struct_wire import fill_struct, set_timestamp
from workflows.samples.handlers import embed_ids, tokenize_text

SAMPLE_TEXT = "The quick brown fox jumps over the lazy dog, twice, before the review."


def _answers(dimensions: int) -> dict[str, Mapping[str, Any]]:
    tokens, ids = tokenize_text(SAMPLE_TEXT)
    rng = random.Random(1)
    return {
        "tokenize (peers)": {"tokens": tokens, "ids": ids},
        "embed, 8 floats (peers)": {"vector": embed_ids(ids), "dimensions": 8},
        "review (peers)": {"approved": True, "note": "auto"},
        f"embed, {dimensions} floats": {
            "vector": [round(rng.uniform(-1, 1), 6) for _ in range(dimensions)],
            "dimensions": dimensions,
        },
    }


Filler = Callable[[WorkflowRunEvent, Mapping[str, Any], datetime], None]


def _with_helpers(event: WorkflowRunEvent, answer: Mapping[str, Any], moment: datetime) -> None:
    Struct.update(event.response, answer)
    Timestamp.FromDatetime(event.occurred_at, moment)


def _with_wire(event: WorkflowRunEvent, answer: Mapping[str, Any], moment: datetime) -> None:
    fill_struct(event.response, answer)
    set_timestamp(event.occurred_at, moment)


def _event() -> WorkflowRunEvent:
    return WorkflowRunEvent(
        job_id=str(uuid.uuid4()),
        type=EventType.TYPE_STEP_CHECKPOINT,
        workflow_name="bench",
        attempt=1,
        step_name="step",
    )


def _median_us(fill: Filler, answer: Mapping[str, Any], rounds: int, events: int) -> float:
    samples = []
    for _ in range(rounds):
        batch = [_event() for _ in range(events)]
        moment = datetime.now(UTC)
        started = time.process_time()
        for event in batch:
            fill(event, answer, moment)
        samples.append((time.process_time() - started) * 1e6 / events)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30, help="rounds per measurement")
    parser.add_argument("--events", type=int, default=200, help="events per round")
    parser.add_argument("--dimensions", type=int, default=1536, help="the large answer's floats")
    args = parser.parse_args(argv)

    print(f"CPU us per event, median of {args.rounds} rounds of {args.events} events")
    print(f"{'answer':<26} {'helpers':>10} {'wire':>10} {'ratio':>8}")
    for name, answer in _answers(args.dimensions).items():
        # Both ways must build the same event before their speed means anything.
        moment = datetime.now(UTC)
        reference, ours = _event(), _event()
        ours.job_id = reference.job_id
        _with_helpers(reference, answer, moment)
        _with_wire(ours, answer, moment)
        assert ours.SerializeToString(deterministic=True) == reference.SerializeToString(
            deterministic=True
        )
        helpers = _median_us(_with_helpers, answer, args.rounds, args.events)
        wire = _median_us(_with_wire, answer, args.rounds, args.events)
        print(f"{name:<26} {helpers:>10.1f} {wire:>10.1f} {helpers / wire:>7.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
