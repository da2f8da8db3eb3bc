"""The topics the agents consume and produce to, declared the way the settings say.

Values and keys travel as raw bytes: the agents decode them themselves (framed
through the registry or plain Protobuf), so a value that does not decode is
theirs to dead-letter rather than Faust's to drop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import faust
    from faust.types import TopicT

    from streams.settings import Settings


def declared_topic_options(settings: Settings) -> dict[str, Any]:
    """With ``WFJOBS_CREATE_TOPICS`` the topic is internal, so Faust creates it before
    it subscribes; otherwise it is provisioned outside and nothing is declared."""
    if not settings.create_topics:
        return {}
    return {
        "internal": True,
        "partitions": settings.topic_partitions,
        "replicas": settings.topic_replicas,
    }


def raw_topic(app: faust.App, settings: Settings, name: str) -> TopicT:
    """A topic of raw keys and values, declared as the settings say."""
    return app.topic(
        name,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
        allow_empty=True,
        **declared_topic_options(settings),
    )


async def declare(app: faust.App, settings: Settings, *names: str) -> None:
    """Create the topics an agent only produces to, when the settings ask for it."""
    if settings.create_topics:
        for name in names:
            await raw_topic(app, settings, name).maybe_declare()
