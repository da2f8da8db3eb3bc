"""The verdict on a response supplied for a parked external step.

The engine reaches it (``CompiledWorkflow.accept_external``) and the store acts
on it under the row lock (``RunStore.complete_step``): one type for both, kept
here because neither package may import the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class StepVerdict:
    """Accepted: ``response`` is the normalized response to checkpoint.

    Rejected: ``violations`` say why, and the job fails with them as its verdict.
    """

    step_name: str
    accepted: bool
    response: dict[str, Any]
    violations: tuple[str, ...] = ()

    @property
    def message(self) -> str:
        if self.accepted:
            return f"step {self.step_name!r} accepted"
        return f"step {self.step_name!r} rejected: {'; '.join(self.violations)}"
