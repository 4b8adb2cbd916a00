"""The client SDK: qforge.Client and qforge.AsyncClient over the HTTP API, typed with the API's models."""

from qforge.client.aio import AsyncClient
from qforge.client.errors import (ApiError, BadRequest, Conflict, Forbidden, Invalid, JobFailed, NotFound,
                                  PayloadTooLarge, Unauthorized, Unavailable, Unreachable, WaitTimeout)
from qforge.client.sync import Client

__all__ = ["ApiError", "AsyncClient", "BadRequest", "Client", "Conflict", "Forbidden", "Invalid", "JobFailed",
           "NotFound", "PayloadTooLarge", "Unauthorized", "Unavailable", "Unreachable", "WaitTimeout"]
