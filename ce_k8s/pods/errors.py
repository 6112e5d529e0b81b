"""The one exception the pod builder raises for unusable input.

Why one type with a string code: the update hook turns a failed build into a hold, and factory
operators key their `recoverable_exitcodes` on stable numbers. The code string is the stable key
into `ce_k8s.holds.HOLDS`; the message is for humans and may change.
"""

from __future__ import annotations


class PodBuildError(ValueError):
    """A routed job ad cannot become a pod; `code` is stable, `message` says what and where."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    def __reduce__(self):  # keep the two-argument form picklable (the agent may use processes)
        return (type(self), (self.code, self.message))
