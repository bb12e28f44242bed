"""The one error type of the release: its message is the whole, actionable line a user reads."""


class ReleaseError(RuntimeError):
    """Bad input or a failed step; ``str()`` says what is wrong and what to do."""
