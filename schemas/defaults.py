"""Where things are when nobody says otherwise: the one home of shared defaults.

The worker's settings (``streams.settings``), the ``wfjobs`` command, the
embedded stack and the serializers all start from these values, so a topic
name, a port or an address is written down once. ``schemas`` is the package
every side may import without pulling in the service.
"""

from __future__ import annotations

REQUESTS_TOPIC = "workflow-run-requests"
EVENTS_TOPIC = "workflow-run-events"
# StepCompletion messages in, their StepCompletionResult answers out.
COMPLETIONS_TOPIC = "workflow-step-completions"
COMPLETION_RESULTS_TOPIC = "workflow-step-completion-results"
# Appended to the requests topic when no dead-letter topic is named.
DLQ_SUFFIX = ".dlq"

KAFKA_PORT = 9092
KAFKA_BOOTSTRAP_SERVERS = f"127.0.0.1:{KAFKA_PORT}"

WEB_HOST = "127.0.0.1"
WEB_PORT = 6066
API_URL = f"http://{WEB_HOST}:{WEB_PORT}"

# Where `wfjobs dev` keeps its data, relative to the directory it runs in, and
# the development token it writes there for the command line to pick up.
DEV_FOLDER = ".wfjobs-dev"
DEV_TOKEN_FILE = f"{DEV_FOLDER}/token"


def dlq_topic_for(requests_topic: str) -> str:
    """The dead-letter topic of ``requests_topic`` when none is configured."""
    return f"{requests_topic}{DLQ_SUFFIX}"


__all__ = [
    "API_URL",
    "COMPLETIONS_TOPIC",
    "COMPLETION_RESULTS_TOPIC",
    "DEV_FOLDER",
    "DEV_TOKEN_FILE",
    "DLQ_SUFFIX",
    "EVENTS_TOPIC",
    "KAFKA_BOOTSTRAP_SERVERS",
    "KAFKA_PORT",
    "REQUESTS_TOPIC",
    "WEB_HOST",
    "WEB_PORT",
    "dlq_topic_for",
]
