"""Regenerate what is derived from the `.proto` sources in ``schemas/proto``.

* ``schemas/gen``: the Python modules the product runs on;
* ``schemas/proto-consumer``: the files consumers compile. Each is its producer
  file with the protovalidate import and options removed, so ``protoc`` compiles
  it with nothing but the well-known types, and it is the schema the serializers
  register (see :mod:`schemas.consumer`).

Run with ``python -m schemas.generate`` (needs the ``dev`` extra for grpcio-tools).
``python -m schemas.generate --check`` exits non-zero when anything checked in
differs from what the sources produce, or when a consumer file, compiled on its
own, is not the same wire contract as its producer file.

``buf/validate/validate.proto`` is not vendored as source: its descriptor is taken
from the installed protovalidate package, so the options we compile against are
exactly the ones the validator reads.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
import tempfile
from pathlib import Path

from google.protobuf import descriptor_pb2

HERE = Path(__file__).resolve().parent
PROTO_ROOT = HERE / "proto"
GEN_ROOT = HERE / "gen"
CONSUMER_ROOT = HERE / "proto-consumer"
OWN_PACKAGES = ("workflowjobs", "buf")
PACKAGE_INITS = (
    "",
    "buf",
    "buf/validate",
    "workflowjobs",
    "workflowjobs/v1",
)


def _validate_descriptor_set() -> bytes:
    from protovalidate._gen.buf.validate import validate_pb

    file_set = descriptor_pb2.FileDescriptorSet()
    file_set.file.add().ParseFromString(validate_pb.desc().proto.to_binary())
    return file_set.SerializeToString()


def _rewrite_imports(source: str) -> str:
    # protoc emits absolute imports rooted at the proto path; ours live under schemas.gen.
    pattern = re.compile(rf"^from ({'|'.join(OWN_PACKAGES)})((?:\.\w+)*) import", re.MULTILINE)
    return pattern.sub(r"from schemas.gen.\1\2 import", source)


def _well_known_root() -> Path:
    import grpc_tools

    return Path(grpc_tools.__file__).parent / "_proto"


def generate(out_dir: Path) -> None:
    from grpc_tools import protoc

    well_known = _well_known_root()
    sources = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    with tempfile.TemporaryDirectory() as tmp:
        validate_set = Path(tmp) / "validate.binpb"
        validate_set.write_bytes(_validate_descriptor_set())
        args = [
            "protoc",
            f"--descriptor_set_in={validate_set}",
            f"-I{PROTO_ROOT}",
            f"-I{well_known}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            *sources,
            "buf/validate/validate.proto",
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
    for generated in list(out_dir.rglob("*_pb2.py")) + list(out_dir.rglob("*_pb2.pyi")):
        generated.write_text(_rewrite_imports(generated.read_text()))
    for package in PACKAGE_INITS:
        init = out_dir / package / "__init__.py"
        init.parent.mkdir(parents=True, exist_ok=True)
        init.write_text("")


# --------------------------------------------------------------------------- consumer files

_CONSUMER_HEADER = """\
// Generated from schemas/proto/{name}
// by `python -m schemas.generate`: the same wire contract without the producer's
// validation rules (protovalidate), so it compiles with the well-known types alone.
// Do not edit: edit the producer file and regenerate.
"""
_PRODUCER_ONLY_IMPORT = re.compile(
    r'^import\s+"buf/validate/validate\.proto";[ \t]*\n', re.MULTILINE
)
_PRODUCER_ONLY_OPTION = re.compile(r"^[ \t]*option\s*\(buf\.validate\.", re.MULTILINE)
_FIELD_OPTIONS = re.compile(r"=\s*\d+(\s*)\[")
_CLOSERS = {"(": ")", "[": "]", "{": "}"}


def _scan(text: str, start: int, stop: str) -> int:
    """The index just past the first ``stop`` at nesting depth 0, from ``start``.

    Skips string literals and comments, and counts (), [] and {} nesting, so a
    rule's CEL expression or message can hold any of them.
    """
    expected: list[str] = []
    i = start
    while i < len(text):
        char = text[i]
        if char in "\"'":
            i += 1
            while text[i] != char:
                i += 2 if text[i] == "\\" else 1
        elif text.startswith("//", i):
            i = text.index("\n", i)
            continue
        elif text.startswith("/*", i):
            i = text.index("*/", i) + 1
        elif not expected and char == stop:
            return i + 1
        elif char in _CLOSERS:
            expected.append(_CLOSERS[char])
        elif expected and char == expected[-1]:
            expected.pop()
        i += 1
    raise ValueError(f"unbalanced source: no {stop!r} after offset {start}")


def _split_top_level(options: str) -> list[str]:
    """``a, b = {c: 1, d: [2, 3]}`` -> ``["a", "b = {c: 1, d: [2, 3]}"]``."""
    parts, begin = [], 0
    while "," in options[begin:]:
        try:
            end = _scan(options, begin, ",")
        except ValueError:  # every remaining comma is nested
            break
        parts.append(options[begin : end - 1])
        begin = end
    parts.append(options[begin:])
    return [part.strip() for part in parts if part.strip()]


def consumer_source(source: str, name: str) -> str:
    """A producer ``.proto`` text without the protovalidate import and options."""
    text = _PRODUCER_ONLY_IMPORT.sub("", source)
    while match := _PRODUCER_ONLY_OPTION.search(text):
        end = _scan(text, match.end(), ";")
        if text.startswith("\n", end):
            end += 1
        text = text[: match.start()] + text[end:]
    position = 0
    while match := _FIELD_OPTIONS.search(text, position):
        line_start = text.rfind("\n", 0, match.start()) + 1
        if "//" in text[line_start : match.start()]:  # in a comment: not a field
            position = match.end()
            continue
        open_at = match.end() - 1
        close_at = _scan(text, open_at + 1, "]")
        kept = [
            option
            for option in _split_top_level(text[open_at + 1 : close_at - 1])
            if not option.startswith("(buf.validate.")
        ]
        replacement = f"{match.group(1)}[{', '.join(kept)}]" if kept else ""
        cut_from = open_at - len(match.group(1))
        text = text[:cut_from] + replacement + text[close_at:]
        position = cut_from + len(replacement)
    # A message whose first lines were rules now opens on a blank line.
    text = re.sub(r"\{\n(?:[ \t]*\n)+", "{\n", text)
    if "buf.validate" in text or "buf/validate" in text:
        raise ValueError(f"{name}: a validation option survived; extend consumer_source")
    return _CONSUMER_HEADER.format(name=name) + text


def _producer_sources() -> list[Path]:
    return sorted(PROTO_ROOT.rglob("*.proto"))


def generate_consumer_files(out_dir: Path) -> None:
    for source in _producer_sources():
        name = str(source.relative_to(PROTO_ROOT))
        target = out_dir / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(consumer_source(source.read_text(), name))


def _compile_consumer_files(root: Path) -> list[bytes]:
    """Each consumer file under ``root`` compiled by ``protoc`` with only the well-known types."""
    from grpc_tools import protoc

    sources = sorted(str(p.relative_to(root)) for p in root.rglob("*.proto"))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "consumer.binpb"
        args = ["protoc", f"-I{root}", f"-I{_well_known_root()}", f"--descriptor_set_out={out}"]
        if protoc.main([*args, *sources]) != 0:
            raise ValueError(f"protoc cannot compile {root} with only the well-known types")
        file_set = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    return [file.SerializeToString() for file in file_set.file]


def _wire_problems(compiled: list[bytes]) -> list[str]:
    """Where a compiled consumer file differs from what the serializers register.

    ``json_name`` is left out of the comparison: protoc fills it in, the runtime's
    descriptors leave it to be derived from the field name, and it is not on the wire.
    """
    from google.protobuf import descriptor_pool

    import schemas.contract  # noqa: F401 - loads every producer file into the default pool
    from schemas.consumer import consumer_file

    problems = []
    for serialized in compiled:
        shipped = _without_json_names(descriptor_pb2.FileDescriptorProto.FromString(serialized))
        try:
            producer = descriptor_pool.Default().FindFileByName(shipped.name)
        except KeyError:
            problems.append(f"schemas/proto-consumer/{shipped.name} has no producer file")
            continue
        registered = _without_json_names(consumer_file(producer))
        if shipped != registered:
            diff = difflib.unified_diff(
                str(registered).splitlines(),
                str(shipped).splitlines(),
                f"registered/{shipped.name}",
                f"schemas/proto-consumer/{shipped.name}",
                lineterm="",
            )
            problems.append("\n".join(diff))
            problems.append(
                f"schemas/proto-consumer/{shipped.name} is not the contract registered for it"
            )
    return problems


def _without_json_names(
    proto: descriptor_pb2.FileDescriptorProto,
) -> descriptor_pb2.FileDescriptorProto:
    for message in proto.message_type:
        _clear_json_names(message)
    return proto


def _clear_json_names(message: descriptor_pb2.DescriptorProto) -> None:
    for field in (*message.field, *message.extension):
        field.ClearField("json_name")
    for nested in message.nested_type:
        _clear_json_names(nested)


# --------------------------------------------------------------------------- check


def _snapshot(root: Path, suffixes: set[str]) -> dict[str, str]:
    return {
        str(p.relative_to(root)): p.read_text()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.suffix in suffixes
    }


def _drift(fresh: dict[str, str], current: dict[str, str]) -> list[str]:
    diffs = []
    for name in sorted(set(fresh) | set(current)):
        if fresh.get(name) != current.get(name):
            diff = difflib.unified_diff(
                current.get(name, "").splitlines(),
                fresh.get(name, "").splitlines(),
                f"checked-in/{name}",
                f"generated/{name}",
                lineterm="",
            )
            diffs.append("\n".join(diff))
    return diffs


def _check() -> list[str]:
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        fresh_root = Path(tmp)
        generate(fresh_root)
        drift = _drift(_snapshot(fresh_root, {".py", ".pyi"}), _snapshot(GEN_ROOT, {".py", ".pyi"}))
    if drift:
        problems += [*drift, "schemas/gen is stale: run `python -m schemas.generate`"]
    with tempfile.TemporaryDirectory() as tmp:
        fresh_root = Path(tmp)
        generate_consumer_files(fresh_root)
        drift = _drift(_snapshot(fresh_root, {".proto"}), _snapshot(CONSUMER_ROOT, {".proto"}))
    if drift:
        problems += [*drift, "schemas/proto-consumer is stale: run `python -m schemas.generate`"]
    try:
        problems += _wire_problems(_compile_consumer_files(CONSUMER_ROOT))
    except ValueError as exc:
        problems.append(str(exc))
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if anything checked in drifts")
    args = parser.parse_args(argv)
    if not args.check:
        generate(GEN_ROOT)
        for stale in CONSUMER_ROOT.rglob("*.proto"):
            stale.unlink()
        generate_consumer_files(CONSUMER_ROOT)
        return 0
    problems = _check()
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
