"""Secrets by reference: `{"secret": "NAME"}` in a step's payload, read from QFORGE_SECRETS_DIR when it runs, masked in what it returns.

The log keeps only the reference (the payload as enqueued); the value exists in
the worker's memory while the step runs, and whatever the step returns or
raises passes through a Masker that turns each value into `***` before it can
reach a result, an error message, an event or the worker's log.
"""

from __future__ import annotations

import os
import re
from typing import Any

from qforge.workers.tasks import TaskError

MASK = "***"
MAX_SECRET_BYTES = 64 * 1024
# A file name of the directory itself: no separators, no leading dot (`..`, `.`, hidden files).
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")


def is_reference(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {"secret"}


def read_secret(secrets_dir: str | None, field: str, reference: dict) -> str:
    """The value of the secret `reference` names (`field` says where, for the error)."""
    name = reference.get("secret")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise TaskError(f"{field}: secret name {name!r} is not a file name (letters, digits, '_', '.', '-',"
                        " not starting with '.')", reason="secret")
    if not secrets_dir:
        raise TaskError(f"{field}: secret {name!r} is referenced, but this worker has no QFORGE_SECRETS_DIR",
                        reason="secret")
    root = os.path.realpath(secrets_dir)
    path = os.path.realpath(os.path.join(root, name))
    # Symlinks inside the directory are fine (Kubernetes mounts secrets so); out of it are not.
    if os.path.dirname(path) != root and not path.startswith(root + os.sep):
        raise TaskError(f"{field}: secret {name!r} points outside the secrets directory", reason="secret")
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_SECRET_BYTES + 1)
    except FileNotFoundError:
        raise TaskError(f"{field}: no secret {name!r} in the worker's secrets directory", reason="secret") from None
    except OSError as exc:
        raise TaskError(f"{field}: secret {name!r} cannot be read ({exc.strerror})", reason="secret") from None
    if len(data) > MAX_SECRET_BYTES:
        raise TaskError(f"{field}: secret {name!r} is larger than {MAX_SECRET_BYTES} bytes", reason="secret")
    try:
        value = data.decode("utf-8")
    except UnicodeDecodeError:
        raise TaskError(f"{field}: secret {name!r} is not UTF-8 text", reason="secret") from None
    value = value[:-1] if value.endswith("\n") else value  # files written by `echo` end in one newline
    value = value[:-1] if value.endswith("\r") else value
    if not value:
        raise TaskError(f"{field}: secret {name!r} is empty", reason="secret")
    if "\0" in value:
        raise TaskError(f"{field}: secret {name!r} holds a NUL character", reason="secret")
    return value


class Masker:
    """Replaces every known secret value by `***` in text and in JSON values."""

    def __init__(self) -> None:
        self.values: list[str] = []

    def add(self, value: str) -> str:
        if value not in self.values:
            self.values.append(value)
            self.values.sort(key=len, reverse=True)  # a secret that contains another goes first
        return value

    def __bool__(self) -> bool:
        return bool(self.values)

    def text(self, text: str, *, cut_head: bool = False) -> str:
        """`text` with every value masked; with `cut_head` (the text is the tail of a longer
        stream) a start that may be the end of a value cut off is masked too."""
        for value in self.values:
            text = text.replace(value, MASK)
        if cut_head:
            for value in self.values:
                for length in range(len(value) - 1, 0, -1):
                    if text.startswith(value[-length:]):
                        text = MASK + text[length:]
                        break
        return text

    def json(self, value: Any) -> Any:
        if not self.values:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.json(item) for item in value]
        if isinstance(value, dict):
            return {self.text(str(key)): self.json(item) for key, item in value.items()}
        return value

    def error(self, exc: TaskError) -> TaskError:
        masked = TaskError(self.text(exc.message), reason=exc.reason, result=self.json(exc.result))
        masked.__cause__ = None
        return masked


def resolve_references(payload: dict, field: str, secrets_dir: str | None, masker: Masker) -> dict:
    """A copy of `payload` whose `field` object (a shell step's env, an http step's headers) has
    each `{"secret": NAME}` value replaced by the secret, each value noted in `masker`."""
    values = payload.get(field)
    if not isinstance(values, dict) or not any(is_reference(v) for v in values.values()):
        return payload
    resolved = {}
    for name, value in values.items():
        if is_reference(value):
            value = masker.add(read_secret(secrets_dir, f"{field}.{name}", value))
        resolved[name] = value
    return {**payload, field: resolved}
