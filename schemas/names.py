"""Workflow names: the one form a definition, a stored workflow and a job carry."""

from __future__ import annotations

import re

WORKFLOW_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
WORKFLOW_NAME_FORM = (
    "1 to 200 characters from letters, digits, '.', '_' and '-', starting with a letter or digit"
)

__all__ = ["WORKFLOW_NAME_FORM", "WORKFLOW_NAME_PATTERN"]
