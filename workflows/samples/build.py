"""Keep the sample workflow's descriptor set in step with its ``.proto``.

``python -m workflows.samples.build`` compiles ``embed_review.proto`` with protoc
(grpcio-tools, from the ``dev`` extra) and writes the result, base64, into
``embed-and-review.json`` as ``schema.descriptorSetBase64``.
``python -m workflows.samples.build --check`` exits non-zero when the checked-in
set does not describe the same files as the ``.proto`` compiles to.

The comparison is between parsed ``FileDescriptorSet`` messages, not bytes, so a
protoc that orders its output differently does not count as drift.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2

HERE = Path(__file__).resolve().parent
PROTO = HERE / "embed_review.proto"
WORKFLOW_FILE = HERE / "embed-and-review.json"


def compile_descriptor_set() -> bytes:
    """The descriptor set protoc makes of the sample ``.proto`` (no source info)."""
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.binpb"
        status = protoc.main(
            ["protoc", f"-I{HERE}", f"--descriptor_set_out={out}", "--include_imports", PROTO.name]
        )
        if status != 0:
            raise SystemExit(f"protoc failed on {PROTO}")
        return out.read_bytes()


def parse_set(data: bytes) -> descriptor_pb2.FileDescriptorSet:
    files = descriptor_pb2.FileDescriptorSet()
    files.ParseFromString(data)
    return files


def load_workflow() -> dict[str, Any]:
    workflow: dict[str, Any] = json.loads(WORKFLOW_FILE.read_text())
    return workflow


def checked_in_set(workflow: dict[str, Any]) -> bytes:
    return base64.b64decode(workflow["schema"]["descriptorSetBase64"], validate=True)


def write_workflow(workflow: dict[str, Any]) -> None:
    WORKFLOW_FILE.write_text(json.dumps(workflow, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workflows.samples.build", description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the checked-in set drifted")
    args = parser.parse_args(argv)
    fresh = compile_descriptor_set()
    workflow = load_workflow()
    if args.check:
        if parse_set(checked_in_set(workflow)) == parse_set(fresh):
            return 0
        print(
            f"{WORKFLOW_FILE.name}: schema.descriptorSetBase64 does not match {PROTO.name}; "
            "run `python -m workflows.samples.build`",
            file=sys.stderr,
        )
        return 1
    workflow.setdefault("schema", {})["descriptorSetBase64"] = base64.b64encode(fresh).decode()
    write_workflow(workflow)
    print(f"wrote {WORKFLOW_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
