"""Descriptor sets: from the definition's base64 text to a private descriptor pool.

Each definition gets its own pool, so two definitions may use different
versions of the same message names without seeing each other. A set built
without ``--include_imports`` still loads when the only files it lacks are the
ones every protobuf runtime ships (``google/protobuf/*.proto``) or
``buf/validate/validate.proto``.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import Any

from google.protobuf import (
    any_pb2,
    descriptor_pb2,
    descriptor_pool,
    duration_pb2,
    empty_pb2,
    field_mask_pb2,
    struct_pb2,
    timestamp_pb2,
    wrappers_pb2,
)
from google.protobuf.descriptor import Descriptor, MethodDescriptor

from schemas.gen.buf.validate import validate_pb2

# Importing these registers the files the fallback below copies from the default pool.
_BUNDLED_MODULES = (
    any_pb2,
    descriptor_pb2,
    duration_pb2,
    empty_pb2,
    field_mask_pb2,
    struct_pb2,
    timestamp_pb2,
    wrappers_pb2,
    validate_pb2,
)
PROTOVALIDATE_FILE = "buf/validate/validate.proto"
MAX_DESCRIPTOR_SET_CHARS = 8 * 1024 * 1024
_METHOD = re.compile(
    r"([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)/([A-Za-z_][A-Za-z0-9_]*)"
)
_LISTED = 12


class DescriptorSetError(Exception):
    """The descriptor set, or a name looked up in it, is wrong; the text says how."""


@dataclass(frozen=True, slots=True, eq=False)
class Schema:
    """A loaded descriptor set: its pool and the files the set itself brought."""

    pool: descriptor_pool.DescriptorPool
    files: tuple[str, ...]
    uses_protovalidate: bool

    def message(self, name: Any) -> Descriptor:
        if not isinstance(name, str) or not name.strip():
            raise DescriptorSetError(f"must name a message type, got {name!r}")
        full_name = name[1:] if name.startswith(".") else name
        try:
            descriptor: Descriptor = self.pool.FindMessageTypeByName(full_name)
        except KeyError:
            known = ", ".join(self._own_messages()[:_LISTED]) or "none"
            raise DescriptorSetError(
                f"{full_name!r} is not a message in the descriptor set; its messages: {known}"
            ) from None
        return descriptor

    def method(self, text: Any) -> MethodDescriptor:
        if not isinstance(text, str):
            raise DescriptorSetError(f"must be a string `package.Service/Method`, got {text!r}")
        match = _METHOD.fullmatch(text)
        if match is None:
            raise DescriptorSetError(f"must have the form `package.Service/Method`, got {text!r}")
        service_name, method_name = match.groups()
        try:
            service = self.pool.FindServiceByName(service_name)
        except KeyError:
            known = ", ".join(self._own_services()[:_LISTED]) or "none"
            raise DescriptorSetError(
                f"service {service_name!r} is not in the descriptor set; its services: {known}"
            ) from None
        method: MethodDescriptor | None = service.methods_by_name.get(method_name)
        if method is None:
            names = ", ".join(m.name for m in service.methods) or "none"
            raise DescriptorSetError(
                f"service {service_name!r} has no method {method_name!r}; its methods: {names}"
            )
        if method.client_streaming or method.server_streaming:
            raise DescriptorSetError(f"{text} is a streaming method; steps call unary methods only")
        return method

    def _own_messages(self) -> list[str]:
        names: list[str] = []
        for file_name in self.files:
            if _is_bundled_name(file_name):
                continue
            file = self.pool.FindFileByName(file_name)
            names.extend(message.full_name for message in file.message_types_by_name.values())
        return names

    def _own_services(self) -> list[str]:
        names: list[str] = []
        for file_name in self.files:
            file = self.pool.FindFileByName(file_name)
            names.extend(service.full_name for service in file.services_by_name.values())
        return names


def _is_bundled_name(name: str) -> bool:
    return name.startswith("google/protobuf/") or name == PROTOVALIDATE_FILE


def decode(encoded: Any) -> bytes:
    if not isinstance(encoded, str):
        raise DescriptorSetError(
            f"must be a string (base64 of a FileDescriptorSet), got {type(encoded).__name__}"
        )
    text = "".join(encoded.split())
    if not text:
        raise DescriptorSetError("is empty")
    if len(text) > MAX_DESCRIPTOR_SET_CHARS:
        raise DescriptorSetError(f"is longer than {MAX_DESCRIPTOR_SET_CHARS} characters")
    if len(text) % 4:
        text += "=" * (-len(text) % 4)
    try:
        if "-" in text or "_" in text:
            raw = base64.b64decode(text, altchars=b"-_", validate=True)
        else:
            raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise DescriptorSetError(f"is not valid base64: {exc}") from None
    if not raw:
        raise DescriptorSetError("decodes to no bytes")
    return raw


def load(encoded: Any) -> Schema:
    """Decode and load a base64 ``FileDescriptorSet`` into a new pool."""
    raw = decode(encoded)
    file_set = descriptor_pb2.FileDescriptorSet()
    try:
        file_set.ParseFromString(raw)
    except Exception as exc:
        raise DescriptorSetError(f"is not a serialized FileDescriptorSet: {exc}") from None
    if not file_set.file:
        raise DescriptorSetError("holds no files")

    by_name: dict[str, descriptor_pb2.FileDescriptorProto] = {}
    for file in file_set.file:
        # proto2 string fields come back as bytes when they are not valid UTF-8.
        if not isinstance(file.name, str) or not all(
            isinstance(dependency, str) for dependency in file.dependency
        ):
            raise DescriptorSetError("holds a file or import name that is not valid UTF-8")
        if not file.name:
            raise DescriptorSetError("holds a file without a name")
        previous = by_name.get(file.name)
        if previous is not None and previous != file:
            raise DescriptorSetError(f"holds two different files named {file.name!r}")
        by_name[file.name] = file

    pool = descriptor_pool.DescriptorPool()
    given = set(by_name)
    loaded: list[str] = []
    done: set[str] = set()
    for root in list(by_name):
        _load_file(root, by_name, pool, done, loaded)
    own = tuple(name for name in loaded if name in given)
    return Schema(pool=pool, files=own, uses_protovalidate=PROTOVALIDATE_FILE in done)


def _load_file(
    root: str,
    by_name: dict[str, descriptor_pb2.FileDescriptorProto],
    pool: descriptor_pool.DescriptorPool,
    done: set[str],
    loaded: list[str],
) -> None:
    # Depth-first over imports with an explicit stack: sets are untrusted input.
    stack: list[tuple[str, str | None, bool]] = [(root, None, False)]
    visiting: set[str] = set()
    while stack:
        name, importer, expanded = stack.pop()
        if name in done:
            continue
        if expanded:
            visiting.discard(name)
            _add(pool, name, _file_for(name, importer, by_name))
            done.add(name)
            loaded.append(name)
            continue
        if name in visiting:
            raise DescriptorSetError(f"has an import cycle through {name!r}")
        proto = _file_for(name, importer, by_name)
        visiting.add(name)
        stack.append((name, importer, True))
        for dependency in reversed(proto.dependency):
            if dependency not in done:
                if dependency in visiting:
                    raise DescriptorSetError(f"has an import cycle through {dependency!r}")
                stack.append((dependency, name, False))


def _file_for(
    name: str, importer: str | None, by_name: dict[str, descriptor_pb2.FileDescriptorProto]
) -> descriptor_pb2.FileDescriptorProto:
    proto = by_name.get(name)
    if proto is not None:
        return proto
    bundled = _bundled(name)
    if bundled is not None:
        by_name[name] = bundled
        return bundled
    raise DescriptorSetError(
        f"lacks {name!r}, imported by {importer!r}; build the set with protoc --include_imports"
    )


def _bundled(name: str) -> descriptor_pb2.FileDescriptorProto | None:
    if not _is_bundled_name(name):
        return None
    try:
        file = descriptor_pool.Default().FindFileByName(name)
    except KeyError:
        return None
    proto = descriptor_pb2.FileDescriptorProto()
    file.CopyToProto(proto)
    return proto


def _add(
    pool: descriptor_pool.DescriptorPool, name: str, proto: descriptor_pb2.FileDescriptorProto
) -> None:
    try:
        pool.Add(proto)
    except Exception as exc:
        text = str(exc).replace("Couldn't build proto file into descriptor pool: ", "")
        raise DescriptorSetError(f"file {name!r} does not load: {text}") from None


__all__ = ["PROTOVALIDATE_FILE", "DescriptorSetError", "Schema", "decode", "load"]
