"""Errors that commands raise for the caller (the API maps them to 404/409/422)."""

from __future__ import annotations


class CommandError(Exception):
    code = "bad_request"

    def __init__(self, message: str, details: list | None = None):
        super().__init__(message)
        self.message = message
        self.details = details or []


class NotFound(CommandError):
    code = "not_found"


class Conflict(CommandError):
    """The current state does not allow the command (HTTP 409)."""

    code = "conflict"


class Invalid(CommandError):
    """The input is well-formed but makes no sense (HTTP 422)."""

    code = "invalid"


class NotAllowed(CommandError):
    """The database refused the caller's credentials for this command (HTTP 403)."""

    code = "forbidden"
