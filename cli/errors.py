"""The error the command line prints as ``code: message`` before exiting 1."""

from __future__ import annotations

from schemas.errors import WorkflowJobsError


class CliError(WorkflowJobsError):
    """An error to print as ``code: message``; ``code`` comes from the server or us."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
