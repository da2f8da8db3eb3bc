"""Regenerate the checked-in Python modules from the `.proto` sources.

Run with ``python -m schemas.generate`` (needs the ``dev`` extra for grpcio-tools).
``python -m schemas.generate --check`` exits non-zero when the checked-in modules
differ from what the sources produce.

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

HERE = Path(__file__).resolve().parent
PROTO_ROOT = HERE / "proto"
GEN_ROOT = HERE / "gen"
OWN_PACKAGES = ("workflowjobs", "buf")
PACKAGE_INITS = (
    "",
    "buf",
    "buf/validate",
    "workflowjobs",
    "workflowjobs/v1",
)


def _validate_descriptor_set() -> bytes:
    from google.protobuf import descriptor_pb2
    from protovalidate._gen.buf.validate import validate_pb

    file_set = descriptor_pb2.FileDescriptorSet()
    file_set.file.add().ParseFromString(validate_pb.desc().proto.to_binary())
    return file_set.SerializeToString()


def _rewrite_imports(source: str) -> str:
    # protoc emits absolute imports rooted at the proto path; ours live under schemas.gen.
    pattern = re.compile(rf"^from ({'|'.join(OWN_PACKAGES)})((?:\.\w+)*) import", re.MULTILINE)
    return pattern.sub(r"from schemas.gen.\1\2 import", source)


def generate(out_dir: Path) -> None:
    import grpc_tools
    from grpc_tools import protoc

    well_known = Path(grpc_tools.__file__).parent / "_proto"
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


def _snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): p.read_text()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.suffix in {".py", ".pyi"}
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if checked-in modules drift")
    args = parser.parse_args(argv)
    if not args.check:
        generate(GEN_ROOT)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh_root = Path(tmp)
        generate(fresh_root)
        fresh, current = _snapshot(fresh_root), _snapshot(GEN_ROOT)
    if fresh == current:
        return 0
    for name in sorted(set(fresh) | set(current)):
        if fresh.get(name) != current.get(name):
            diff = difflib.unified_diff(
                current.get(name, "").splitlines(),
                fresh.get(name, "").splitlines(),
                f"checked-in/{name}",
                f"generated/{name}",
                lineterm="",
            )
            print("\n".join(diff), file=sys.stderr)
    print("schemas/gen is stale: run `python -m schemas.generate`", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
