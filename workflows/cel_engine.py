"""The ``cel`` package, imported without its interactive shell.

``cel`` imports its shell (prompt_toolkit, typer, rich, pygments) when it is
imported. No process of ours runs that shell, and loading it costs every worker
and CLI start about a tenth of a second, so an empty module stands in for it.
"""

from __future__ import annotations

import sys
from types import ModuleType

sys.modules.setdefault("cel.cli", ModuleType("cel.cli"))

import cel  # noqa: E402  (the stand-in must be in place first)

__all__ = ["cel"]
