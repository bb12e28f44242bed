"""What an API failure means, as exception classes: callers catch ``NotFound`` or ``Conflict``
instead of comparing status codes.

``KubeError(status, message)`` returns the subclass for ``status`` (as ``OSError(errno, ...)``
returns ``FileNotFoundError``), so every place that raises one, the real client and the tests'
fakes alike, produces the class a caller catches. The boolean properties stay for the few places
that test several meanings at once.
"""

from __future__ import annotations

from typing import Any


class KubeError(Exception):
    """An API error with its HTTP status (0 when the server could not be reached)."""

    #: The status a subclass stands for (None: the base class, any status).
    code: int | None = None

    def __new__(cls, status: int = 0, message: str = "") -> KubeError:
        if cls is KubeError:
            cls = _BY_STATUS.get(status, Unavailable if status == 0 or status >= 500 else KubeError)
        instance: KubeError = super().__new__(cls)
        return instance

    def __init__(self, status: int = 0, message: str = "") -> None:
        if self.code is not None and status == 0 and not isinstance(self, Unavailable):
            status = self.code
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.status, self.message))

    @property
    def conflict(self) -> bool:
        return isinstance(self, Conflict)

    @property
    def not_found(self) -> bool:
        return isinstance(self, NotFound)

    @property
    def gone(self) -> bool:
        return isinstance(self, Gone)


class NotFound(KubeError):
    """404: the object (or its namespace, or the resource type) does not exist."""

    code = 404


class Conflict(KubeError):
    """409: the object changed since it was read (or already exists): re-read, then retry."""

    code = 409


class Gone(KubeError):
    """410: a watch's resourceVersion is too old: relist."""

    code = 410


class Forbidden(KubeError):
    """403: RBAC or an admission policy refused the request; retrying will not help."""

    code = 403


class Invalid(KubeError):
    """422: the object failed validation; retrying the same object will not help."""

    code = 422


class Unavailable(KubeError):
    """The server could not be reached (status 0), was overloaded (429) or failed (5xx): retry later."""


_BY_STATUS: dict[int, type[KubeError]] = {
    404: NotFound,
    409: Conflict,
    410: Gone,
    403: Forbidden,
    422: Invalid,
    429: Unavailable,
}
