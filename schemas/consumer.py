"""The consumer-facing contract: our message types without producer-only imports and options.

The ``.proto`` files in ``schemas/proto`` carry protovalidate rules, so they import
``buf/validate/validate.proto`` (which imports ``google/protobuf/descriptor.proto``).
Consumers need none of that to read our bytes, and several Confluent-compatible
registries refuse such a reference. What we register, and ship in
``schemas/proto-consumer``, is the same wire contract (package, message and enum
names, field numbers, types and labels) with those imports and options removed.

:func:`consumer_file` derives it from a producer file's descriptor; ``python -m
schemas.generate --check`` proves it equals what ``protoc`` compiles from the
shipped consumer files. :func:`consumer_message_class` gives a message class built
from it, in a pool of its own, whose encoding of a message is byte for byte the
producer class's encoding.
"""

from __future__ import annotations

from typing import cast

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FileDescriptor
from google.protobuf.message import Message

PRODUCER_ONLY_IMPORTS = frozenset({"buf/validate/validate.proto"})
PRODUCER_ONLY_OPTION_PREFIX = "buf.validate."


def consumer_file(file: FileDescriptor) -> descriptor_pb2.FileDescriptorProto:
    """The consumer-facing ``FileDescriptorProto`` of a producer file."""
    proto = descriptor_pb2.FileDescriptorProto()
    file.CopyToProto(proto)
    return strip_producer_only(proto)


def strip_producer_only(
    proto: descriptor_pb2.FileDescriptorProto,
) -> descriptor_pb2.FileDescriptorProto:
    """Remove producer-only imports and every producer-only option, in place."""
    old = list(proto.dependency)
    kept = [name for name in old if name not in PRODUCER_ONLY_IMPORTS]
    new_index = {old.index(name): i for i, name in enumerate(kept)}
    public = [new_index[i] for i in proto.public_dependency if i in new_index]
    weak = [new_index[i] for i in proto.weak_dependency if i in new_index]
    del proto.dependency[:]
    proto.dependency.extend(kept)
    del proto.public_dependency[:]
    proto.public_dependency.extend(public)
    del proto.weak_dependency[:]
    proto.weak_dependency.extend(weak)

    _strip_options(proto)
    for message in proto.message_type:
        _strip_message(message)
    for enum in proto.enum_type:
        _strip_enum(enum)
    for extension in proto.extension:
        _strip_options(extension)
    for service in proto.service:
        _strip_options(service)
        for method in service.method:
            _strip_options(method)
    return proto


def _strip_message(message: descriptor_pb2.DescriptorProto) -> None:
    _strip_options(message)
    for field in (*message.field, *message.extension):
        _strip_options(field)
    for oneof in message.oneof_decl:
        _strip_options(oneof)
    for nested in message.nested_type:
        _strip_message(nested)
    for enum in message.enum_type:
        _strip_enum(enum)


def _strip_enum(enum: descriptor_pb2.EnumDescriptorProto) -> None:
    _strip_options(enum)
    for value in enum.value:
        _strip_options(value)


def _strip_options(owner: Message) -> None:
    if not owner.HasField("options"):
        return
    options = getattr(owner, "options")  # noqa: B009 - every descriptor proto names it so
    for field, _ in options.ListFields():
        if field.is_extension and field.full_name.startswith(PRODUCER_ONLY_OPTION_PREFIX):
            options.ClearExtension(field)
    if options.ByteSize() == 0:
        owner.ClearField("options")


_pool = descriptor_pool.DescriptorPool()
_classes: dict[str, type[Message]] = {}


def _add_file(file: FileDescriptor) -> None:
    try:
        _pool.FindFileByName(file.name)
        return
    except KeyError:
        pass
    for dependency in file.dependencies:
        if dependency.name not in PRODUCER_ONLY_IMPORTS:
            _add_file(dependency)
    _pool.Add(consumer_file(file))


def consumer_message_class(message_type: type[Message]) -> type[Message]:
    """The class of ``message_type`` as a consumer compiles it from the shipped files."""
    name = message_type.DESCRIPTOR.full_name
    found = _classes.get(name)
    if found is None:
        # The stubs type a message's file as either runtime's descriptor class.
        _add_file(cast(FileDescriptor, message_type.DESCRIPTOR.file))
        found = message_factory.GetMessageClass(_pool.FindMessageTypeByName(name))
        _classes[name] = found
    return found


__all__ = [
    "PRODUCER_ONLY_IMPORTS",
    "PRODUCER_ONLY_OPTION_PREFIX",
    "consumer_file",
    "consumer_message_class",
    "strip_producer_only",
]
