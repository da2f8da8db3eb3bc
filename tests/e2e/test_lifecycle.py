"""A job's whole life through a real worker process: topic in, events out, HTTP in between.

Schema Registry: the worker runs with ``WFJOBS_SCHEMA_REGISTRY_URL=mock://...``
and this test opens a mock registry of the same URL. confluent-kafka's mock
registry lives inside one process, so the two are separate registries; they
agree on schema ids because ``schemas.serde.open_registry`` registers the
contract's schemas in one fixed order in every process. Requests are produced
framed through the test's registry and decoded through the worker's; events
are framed by the worker's relay and decoded here with the registry
deserializer (``EventDecoder``). A real registry shared by both sides is the
compose file's job; these tests prove the framing on both directions.
"""

from __future__ import annotations

import httpx
import pytest

from schemas.contract import WorkflowRunEvent
from schemas.serde import ProtobufFramer, framed_schema_id
from streams.convert import struct_to_dict
from tests.e2e.conftest import PARTITIONS
from tests.e2e.harness import Stack, dedupe, type_name
from tests.workflows_fixtures import EMBED, TOKENIZE, envelope

pytestmark = pytest.mark.e2e


async def test_request_to_waiting_then_complete_step_to_completed(stack: Stack) -> None:
    worker = await stack.start_worker("w1")
    reader = stack.event_reader(PARTITIONS)
    workflow = envelope(name="e2e-review")
    await stack.put_workflow(worker, workflow)
    async with httpx.AsyncClient(base_url=worker.url, timeout=10, headers=stack.headers) as http:
        job_id = stack.produce_request(workflow["name"], {"text": "durable jobs tell kafka"})
        stack.flush()

        def parked(_: object) -> bool:
            return [type_name(e) for e in dedupe(reader.for_job(job_id))][-1:] == ["WAITING"]

        await reader.wait(parked)
        events = dedupe(reader.for_job(job_id))
        assert [(type_name(e), e.step_name) for e in events] == [
            ("ACCEPTED", ""),
            ("STEP_CHECKPOINT", "tokenize"),
            ("STEP_CHECKPOINT", "embed"),
            ("WAITING", "review"),
        ]
        assert all(e.workflow_name == "e2e-review" for e in events)
        assert [e.attempt for e in events] == [0, 1, 1, 1]
        ids = [e.event_id for e in events]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)

        waiting = (await http.get(f"/v1/workflow-runs/{job_id}")).json()["job"]
        assert waiting["status"] == "WAITING"
        assert waiting["outstanding_step"] == "review"
        assert [c["name"] for c in waiting["checkpoints"]] == ["tokenize", "embed"]

        answer = await http.post(
            f"/v1/workflow-runs/{job_id}/steps/review:complete",
            json={"response": {"approved": True, "reviewer": "ada", "note": "fine"}},
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["outcome"] == "COMPLETED"

        def completed(_: object) -> bool:
            return any(type_name(e) == "COMPLETED" for e in reader.for_job(job_id))

        await reader.wait(completed)
        events = dedupe(reader.for_job(job_id))
        assert [(type_name(e), e.step_name) for e in events[4:]] == [
            ("STEP_CHECKPOINT", "review"),
            ("COMPLETED", ""),
        ]
        done_event = events[-1]
        assert done_event.verdict == "completed 3 steps: tokenize, embed, review"
        # Every value was framed through the registry (magic byte, then the id
        # the registry gives WorkflowRunEvent's Protobuf schema), not sent plain.
        framer = ProtobufFramer(WorkflowRunEvent, stack.registry, stack.events_topic)
        framer.prepare()
        assert {framed_schema_id(value) for value in reader.values_for(job_id)} == {
            framer.schema_id
        }

        final = (await http.get(f"/v1/workflow-runs/{job_id}")).json()["job"]
        assert final["status"] == "COMPLETED"
        assert final["verdict"] == done_event.verdict
        assert final["result"] == struct_to_dict(done_event.result, "result")
        # get-job shows exactly what the checkpoint events carried, in order.
        checkpoint_events = [e for e in events if type_name(e) == "STEP_CHECKPOINT"]
        assert [(c["name"], c["response"]) for c in final["checkpoints"]] == [
            (e.step_name, struct_to_dict(e.response, "response")) for e in checkpoint_events
        ]

        again = await http.post(
            f"/v1/workflow-runs/{job_id}/steps/review:complete",
            json={"response": {"approved": True}},
        )
        assert again.status_code == 200
        assert again.json()["outcome"] == "ALREADY_DONE"

    assert [c.method for c in stack.calls_for(job_id)] == [TOKENIZE, EMBED]
    reader.close()
    assert worker.stop() == 0, worker.log_tail()
