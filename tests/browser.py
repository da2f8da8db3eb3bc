"""Debian's Chromium for the browser tests: found on the machine, or installed.

The tests drive the system browser through Playwright's CDP client
(``executable_path``); Playwright's own browser downloads are never used. A
machine without Chromium gets it from Debian's packages (``apt-get update``
first, once); if that is impossible the test errors with the reason, it is
never skipped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

CHROMIUM_CANDIDATES = ("chromium", "chromium-browser")
# Screenshots and other files a browser test leaves for people to look at.
ARTIFACTS_ENV = "WFJOBS_TEST_ARTIFACTS"
DEFAULT_ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"


def _found() -> str | None:
    for name in CHROMIUM_CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def chromium_executable() -> str:
    """The path of Debian's Chromium, installing the package when it is absent."""
    found = _found()
    if found:
        return found
    apt = shutil.which("apt-get")
    if apt is None:
        raise RuntimeError("Chromium is not installed and there is no apt-get to install it")
    prefix: list[str] = []
    if os.geteuid() != 0:
        sudo = shutil.which("sudo")
        if sudo is None:
            raise RuntimeError("Chromium is not installed; installing it needs root or sudo")
        prefix = [sudo, "-n"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in ([apt, "update", "-qq"], [apt, "install", "-y", "-qq", "chromium"]):
        done = subprocess.run(
            prefix + command, env=env, capture_output=True, text=True, timeout=900, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed: {done.stderr[-2000:]}")
    found = _found()
    if found is None:
        raise RuntimeError("apt-get installed chromium, yet no chromium executable is on PATH")
    return found


def artifacts_dir() -> Path:
    path = Path(os.environ.get(ARTIFACTS_ENV) or DEFAULT_ARTIFACTS)
    path.mkdir(parents=True, exist_ok=True)
    return path
