"""A plain ``pip install workflow-jobs``, without extras, gives a worker and the CLI.

The package is built from a copy of the sources (what the Docker image copies)
into a fresh virtual environment; the installer reaches the package index for
the runtime dependencies. The installer is uv's pip-compatible one: it builds
the package through the same PEP 517 backend and resolves the same
requirements as ``pip install``, faster. Every command runs
outside the repository, so nothing is imported from the working tree by
accident. ``wfjobs dev`` needs the ``dev`` extra, which
this install leaves out: it must say which extra to install instead of failing
somewhere inside the embedded stack.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SOURCES = (
    "pyproject.toml",
    "README.md",
    "schemas",
    "store",
    "migrations",
    "workflows",
    "streams",
    "cli",
    "devstack",
)
INSTALL_TIMEOUT_S = 900
COMMAND_TIMEOUT_S = 120


def _copy_sources(into: Path) -> Path:
    project = into / "project"
    project.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in SOURCES:
        source = REPO_ROOT / name
        if source.is_dir():
            shutil.copytree(source, project / name, ignore=ignore)
        else:
            shutil.copy2(source, project / name)
    return project


def _clean_environment(venv: Path) -> dict[str, str]:
    """What a user's shell would have: no settings of ours, this venv first on PATH."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("WFJOBS_", "F_", "FAUST_", "PYTHON", "VIRTUAL_ENV"))
        and key not in ("DATABASE_URL", "KAFKA_BOOTSTRAP_SERVERS")
    }
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A venv holding ``uv pip install <sources>`` with no extras, and its environment."""
    root = tmp_path_factory.mktemp("install")
    project = _copy_sources(root)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    env = _clean_environment(venv)
    # uv leaves a lock file per build in TMPDIR: this one is thrown away with the test's.
    scratch = root / "tmp"
    scratch.mkdir()
    pip = subprocess.run(
        [
            sys.executable,
            "-m",
            "uv",
            "pip",
            "install",
            "--quiet",
            "--python",
            str(venv / "bin" / "python"),
            str(project),
        ],
        cwd=root,
        env={**env, "TMPDIR": str(scratch)},
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
    )
    assert pip.returncode == 0, pip.stderr[-4000:]
    return venv, env


def _run(
    installed: tuple[Path, dict[str, str]], *argv: str, **extra: str
) -> subprocess.CompletedProcess[str]:
    venv, env = installed
    elsewhere = venv.parent / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    return subprocess.run(
        [str(venv / "bin" / argv[0]), *argv[1:]],
        cwd=elsewhere,
        env={**env, **extra},
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )


@pytest.mark.timeout(INSTALL_TIMEOUT_S + 4 * COMMAND_TIMEOUT_S)
def test_a_plain_install_runs_the_cli_and_the_worker(
    installed: tuple[Path, dict[str, str]],
) -> None:
    venv, _ = installed
    tools = _run(installed, "python", "-c", "import cli, devstack, streams; print(cli.__file__)")
    assert tools.returncode == 0, tools.stderr
    assert Path(tools.stdout.strip()).is_relative_to(venv), "imported from outside the venv"

    usage = _run(installed, "wfjobs", "--help")
    assert usage.returncode == 0, usage.stderr
    assert "submit" in usage.stdout and "dev" in usage.stdout

    version = _run(installed, "wfjobs", "--version")
    assert version.returncode == 0, version.stderr
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert version.stdout.strip() == f"wfjobs {project['version']}"

    worker = _run(
        installed, "faust", "-A", "streams.app", "worker", "--help", WFJOBS_WORKER_ID="install-1"
    )
    assert worker.returncode == 0, worker.stderr
    assert "--web-port" in worker.stdout


@pytest.mark.timeout(INSTALL_TIMEOUT_S + COMMAND_TIMEOUT_S)
def test_wfjobs_dev_without_the_dev_extra_names_the_extra(
    installed: tuple[Path, dict[str, str]],
) -> None:
    dev = _run(installed, "wfjobs", "dev")
    assert dev.returncode != 0
    message = dev.stderr.strip()
    assert len(message.splitlines()) == 1, message
    assert "pip install 'workflow-jobs[dev]'" in message
