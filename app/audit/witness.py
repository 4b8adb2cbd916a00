"""Witnessed heads: every signed head written as a file of its own to a directory the database cannot reach.

A head (`qforge audit head`) is the newest checkpoint's hash, which binds every
event before it. An attacker who controls the whole database can rewrite
events, chains and checkpoints together so that `qforge audit verify` finds
them consistent; only a head kept elsewhere tells. The monitor's leader writes
each checkpoint's head into QFORGE_AUDIT_WITNESS_DIR as
`head-<seq>-<hash prefix>.json`, created exclusively and never overwritten: a
second, different head for the same checkpoint (a rewrite) lands beside the
first, it cannot replace it. `verify --witness DIR` checks the log against every
head in the directory.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Mapping

from qforge.audit import checkpoints as audit

FILE = re.compile(r"^head-(\d{12})-([0-9a-f]{16})\.json$")


def file_name(line: Mapping[str, Any]) -> str:
    return f"head-{int(line['seq']):012d}-{str(line['hash'])[:16]}.json"


def write(directory: Path, line: Mapping[str, Any]) -> Path | None:
    """Write one head as its own file (durably: the file and the directory entry are synced).
    None when the very same head is already there; never overwrites a file."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / file_name(line)
    text = audit.head_line(line) + "\n"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
    except FileExistsError:
        return None
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    folder = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
    return path


def newest_seq(directory: Path) -> int:
    """The highest checkpoint a head file in the directory names (0 when there is none)."""
    if not directory.is_dir():
        return 0
    return max((int(m.group(1)) for m in map(FILE.match, os.listdir(directory)) if m), default=0)


def head_files(directory: Path) -> list[Path]:
    """The directory's head files, by checkpoint (other files are not heads and are left alone)."""
    return sorted(directory / name for name in os.listdir(directory) if FILE.match(name))


def witness(conn, directory: Path, *, signing_key: str | None, limit: int = 100) -> list[Path]:
    """Write the heads of the checkpoints after the directory's newest, up to `limit` (the newest
    alone into an empty directory: a witness vouches from the moment it is set up)."""
    newest = audit.head(conn, seq=None)
    if newest is None:
        return []
    after = newest_seq(directory)
    first = newest["seq"] if after == 0 else after + 1
    written: list[Path] = []
    for seq in range(first, min(newest["seq"], first + limit - 1) + 1):
        line = audit.head(conn, signing_key=signing_key, seq=seq)
        if line is not None:
            path = write(directory, line)
            if path is not None:
                written.append(path)
    return written
