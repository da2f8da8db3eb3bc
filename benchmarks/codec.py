"""proto3 JSON conversion: the engine's compiled codecs beside ``json_format``.

``python -m benchmarks.codec [--floats 1536] [--rounds 200]``

Every checkpoint a segment writes or replays goes through proto3 JSON, and an
embedding step's response is mostly 32-bit floats. This measures one such
response both ways, encode (message to JSON object) and decode (JSON object to
message), in the same process, and prints the ratio. CPU time only; nothing is
asserted.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, json_format
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from workflows.codec import Codecs


def _embedding_class() -> tuple[type[Message], Descriptor]:
    file = descriptor_pb2.FileDescriptorProto(
        name="bench/embedding.proto", package="bench", syntax="proto3"
    )
    message = file.message_type.add(name="Embedding")
    message.field.add(
        name="vector",
        number=1,
        type=descriptor_pb2.FieldDescriptorProto.TYPE_FLOAT,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
        json_name="vector",
    )
    message.field.add(
        name="dimensions",
        number=2,
        type=descriptor_pb2.FieldDescriptorProto.TYPE_UINT32,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
        json_name="dimensions",
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    descriptor = pool.FindMessageTypeByName("bench.Embedding")
    return GetMessageClass(descriptor), descriptor


def _median_ms(action: Callable[[], object], rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        started = time.process_time()
        action()
        samples.append((time.process_time() - started) * 1000)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--floats", type=int, default=1536, help="embedding dimensions")
    parser.add_argument("--rounds", type=int, default=200, help="repetitions per measurement")
    args = parser.parse_args(argv)

    embedding_class, descriptor = _embedding_class()
    rng = random.Random(1)
    # A class made from a descriptor at run time: its fields are unknown to the type checker.
    make_embedding: Any = embedding_class
    message = make_embedding(
        vector=[rng.uniform(-1, 1) for _ in range(args.floats)], dimensions=args.floats
    )
    codec = Codecs().of(descriptor)
    as_json = codec.encode(message)
    # Both sides must agree on the message before their speed means anything.
    assert codec.decode(as_json, "bench") == message
    assert json_format.ParseDict(as_json, embedding_class()) == message

    rows = [
        (
            "encode",
            _median_ms(
                lambda: json_format.MessageToDict(message, preserving_proto_field_name=True),
                args.rounds,
            ),
            _median_ms(lambda: codec.encode(message), args.rounds),
        ),
        (
            "decode",
            _median_ms(lambda: json_format.ParseDict(as_json, embedding_class()), args.rounds),
            _median_ms(lambda: codec.decode(as_json, "bench"), args.rounds),
        ),
    ]
    print(f"one Embedding of {args.floats} float32 values, median of {args.rounds} rounds, CPU ms")
    print(f"{'direction':<10} {'json_format':>12} {'codec':>10} {'ratio':>8}")
    for direction, reference, compiled in rows:
        ratio = reference / compiled if compiled else float("inf")
        print(f"{direction:<10} {reference:>12.3f} {compiled:>10.3f} {ratio:>7.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
