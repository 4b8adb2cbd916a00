"""What the client raises: the API's error body as an exception, one class per status."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """A refused request: the HTTP status and the API's {"error", "message", "details"}."""

    def __init__(self, status: int, error: str, message: str, details: list[Any] | None = None):
        super().__init__(f"{status} {error}: {message}")
        self.status, self.error, self.message = status, error, message
        self.details = details or []


class BadRequest(ApiError):
    """400"""


class Unauthorized(ApiError):
    """401: no token or a wrong one."""


class Forbidden(ApiError):
    """403: the token may not do this."""


class NotFound(ApiError):
    """404: no such job, workflow or step."""


class Conflict(ApiError):
    """409: the current state does not allow the command."""


class PayloadTooLarge(ApiError):
    """413"""


class Invalid(ApiError):
    """422: bad input; `details` names every field or problem."""


class Unavailable(ApiError):
    """503: the API cannot reach its database right now."""


BY_STATUS: dict[int, type[ApiError]] = {400: BadRequest, 401: Unauthorized, 403: Forbidden,
                                        404: NotFound, 409: Conflict, 413: PayloadTooLarge,
                                        422: Invalid, 503: Unavailable}


def error_of(status: int, body: Any, text: str) -> ApiError:
    """The exception for a non-2xx answer; a body that is not the API's (a proxy's page) still gives one."""
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return BY_STATUS.get(status, ApiError)(status, body["error"], str(body.get("message", "")),
                                               body.get("details") or [])
    return BY_STATUS.get(status, ApiError)(status, "http_error", text[:500] or f"HTTP {status}")


class Unreachable(ConnectionError):
    """The API did not answer at all (nothing listens there, a wrong port, a timeout): the
    message names the URL that was tried; `cause` is the transport's own error."""

    def __init__(self, url: str, cause: Exception):
        super().__init__(f"cannot reach the QForge API at {url}: {cause or type(cause).__name__}")
        self.url, self.cause = url, cause


class JobFailed(Exception):
    """wait(): the job ended without succeeding (dead, cancelled or skipped); `job` is its last view."""

    def __init__(self, job: Any):
        super().__init__(f"job {job.id} {job.status}: {job.last_error or 'no error recorded'}")
        self.job = job
        self.error = job.last_error


class WaitTimeout(TimeoutError):
    """wait(): the job had not finished when the timeout ran out; `job` is its last view."""

    def __init__(self, job: Any, timeout: float):
        super().__init__(f"job {job.id} still {job.status} after {timeout:g}s")
        self.job = job
