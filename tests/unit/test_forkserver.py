"""The fork server the tests start workers with: each child is configured by its own request."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from tests.forkserver import REPO_ROOT, ForkedProcess, ForkServer

FAUST = Path(sys.executable).with_name("faust")


def _exited(process: ForkedProcess, timeout_s: float = 60.0) -> int:
    deadline = time.monotonic() + timeout_s
    while (code := process.exit_code()) is None:
        assert time.monotonic() < deadline, process.log_path.read_text()
        time.sleep(0.05)
    return code


def _env(**settings: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("WFJOBS_")}
    # Nothing listens here: the worker must refuse before it tries to connect.
    return {**env, "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1", **settings}


def test_a_forked_worker_reads_its_own_environment_logs_to_its_file_and_reports_its_exit(
    fork_server: ForkServer, tmp_path: Path
) -> None:
    argv = [str(FAUST), "-A", "streams.app", "worker"]
    refused = fork_server(
        "refused",
        argv,
        log_path=tmp_path / "refused.log",
        env=_env(WFJOBS_CLAIM_LOOPS="lots", WFJOBS_DATA_DIR=str(tmp_path / "a")),
        cwd=REPO_ROOT,
    )
    assert _exited(refused) != 0
    assert "WFJOBS_CLAIM_LOOPS must be an integer" in refused.log_path.read_text()

    # A second child of the same server is not configured by the first one's request.
    nameless = fork_server(
        "nameless",
        argv,
        log_path=tmp_path / "nameless.log",
        env=_env(WFJOBS_DATA_DIR=str(tmp_path / "b")),
        cwd=REPO_ROOT,
    )
    assert _exited(nameless) == 2
    log = nameless.log_path.read_text()
    assert "WFJOBS_WORKER_ID is required" in log and "CLAIM_LOOPS" not in log
    nameless.stop()  # a child that has exited stops at once
    assert nameless.exit_code() == 2
