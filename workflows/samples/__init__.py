"""The sample workflow: tokenize -> embed -> external review.

``embed-and-review.json`` is the definition envelope exactly as stored (its
descriptor set is compiled from ``embed_review.proto``; ``build.py`` keeps the
two in step), ``handlers.py`` runs the first two steps in-process, and a person
answers the third with ``wfjobs complete JOB_ID review --response '{...}'``.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WORKFLOW_FILE = HERE / "embed-and-review.json"
HANDLER_MODULE = "workflows.samples.handlers"

SAMPLE_WORKFLOW_NAME = "embed-and-review"
SAMPLE_INPUT: dict[str, Any] = {"text": "Durable jobs survive crashes and tell Kafka about it"}
SAMPLE_REVIEW: dict[str, Any] = {"approved": True, "note": "looks good"}


@cache
def _stored() -> dict[str, Any]:
    workflow: dict[str, Any] = json.loads(WORKFLOW_FILE.read_text())
    return workflow


def sample_workflow() -> dict[str, Any]:
    """The dev workflow: its review step waits for a person (``completion: external``)."""
    return copy.deepcopy(_stored())


def automatic_workflow(name: str = "embed-and-auto-review") -> dict[str, Any]:
    """The same three steps, all in-process: the review is the automatic reviewer.

    This is the benchmark's 3-step workflow; nothing in it waits for a person.
    """
    workflow = sample_workflow()
    workflow["name"] = name
    for step in workflow["steps"]:
        step.pop("completion", None)
    return workflow


__all__ = [
    "HANDLER_MODULE",
    "SAMPLE_INPUT",
    "SAMPLE_REVIEW",
    "SAMPLE_WORKFLOW_NAME",
    "WORKFLOW_FILE",
    "automatic_workflow",
    "sample_workflow",
]
