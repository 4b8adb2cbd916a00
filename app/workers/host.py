"""What this machine gives shell steps: the user they run as, their folders, what they must not see, control groups.

`qforge.workers.isolation` builds each step from these findings; IsolationError
says that the settings ask for more than the machine or the worker's user can give.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import pwd
import stat
import tempfile
from dataclasses import dataclass
from typing import Iterator

from qforge.settings import Settings

# Hiding one of these (or a folder holding one) would leave the step without its programs.
ESSENTIAL = ("/bin", "/sbin", "/usr", "/lib", "/lib64", "/etc", "/dev", "/proc", "/sys")
CGROUP_CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_MICROSECONDS = 100_000
PR_SET_DUMPABLE = 4


class IsolationError(Exception):
    """The settings ask for an isolation this machine or this user cannot give (the worker does not start)."""


@dataclass(frozen=True)
class Cgroups:
    """Where a step's control group is made, and what goes into it."""

    version: int  # 1 or 2
    parents: tuple[str, ...]  # v1: one folder per hierarchy (memory, pids, cpu); v2: one folder
    controllers: tuple[str, ...]  # those whose limits apply (v2 without delegation: none, kill only)
    limits: tuple[tuple[str, str], ...]  # (file, value), written where the file exists, in order

    def describe(self) -> str:
        what = ", ".join(self.controllers) if self.controllers else "no controllers: kill only"
        return f"cgroup v{self.version} ({what}) under {', '.join(self.parents)}"


# --- who and where ---------------------------------------------------------------


def shell_user(setting: str | None, root: bool) -> tuple[int, int, str]:
    """(uid, gid, label) of the user shell steps run as."""
    me = os.geteuid()
    if setting is None:
        setting = "nobody" if root else str(me)
    try:
        entry = pwd.getpwuid(int(setting)) if setting.isdigit() else pwd.getpwnam(setting)
        uid, gid, label = entry.pw_uid, entry.pw_gid, f"{entry.pw_name} (uid {entry.pw_uid})"
    except KeyError:
        if not setting.isdigit():
            raise IsolationError(f"QFORGE_SHELL_USER={setting}: no such user") from None
        uid = gid = int(setting)
        label = f"uid {uid}"
    if not root and uid != me:
        raise IsolationError(f"QFORGE_SHELL_USER={setting}: only a worker running as root can run steps as"
                             f" another user (this one runs as uid {me})")
    return uid, gid if root else os.getegid(), label


def work_base(setting: str | None) -> str:
    """The folder of the steps' working directories: ours, traversable but not listable by others
    (0711), so a step cannot find another step's folder."""
    base = os.path.realpath(setting or os.path.join(tempfile.gettempdir(), f"qforge-steps-{os.geteuid()}"))
    try:
        os.mkdir(base, 0o711)
    except FileExistsError:
        pass
    info = os.lstat(base)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise IsolationError(f"{base} (QFORGE_SHELL_WORK_DIR) must be a folder of the worker's user that"
                             " nobody else can write to")
    os.chmod(base, 0o711)
    return base


def hidden_paths(settings: Settings, base_dir: str) -> tuple[str, ...]:
    """The worker's own places, to cover in the step's mount namespace."""
    cwd = os.getcwd()
    candidates = [os.path.expanduser("~"), cwd, settings.data_dir, settings.secrets_dir,
                  os.path.join(cwd, ".env")]
    chosen: list[str] = []
    for candidate in candidates:
        if not candidate:
            continue
        path = os.path.realpath(os.path.join(cwd, candidate))
        if path == "/" or not os.path.exists(path) or not os.path.isabs(path):
            continue
        if any(_within(needed, path) for needed in (*ESSENTIAL, base_dir)):
            continue  # hiding it would hide what the step needs; its .env is still covered below
        if any(_within(path, other) for other in chosen):
            continue
        chosen = [other for other in chosen if not _within(other, path)] + [path]
    return tuple(sorted(chosen, key=len))


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def make_undumpable() -> bool:
    """prctl(PR_SET_DUMPABLE, 0): /proc/<worker>/environ, mem and fd become root's, so a step running
    as the worker's own user cannot read them (nor ptrace the worker)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


# --- control groups --------------------------------------------------------------


def _mountinfo() -> Iterator[tuple[str, str, str, str]]:
    """(fstype, mount point, root of the mount, super options) of each mount."""
    try:
        with open("/proc/self/mountinfo") as file:
            lines = file.readlines()
    except OSError:
        return
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if len(fields) < 5 or len(rest) < 3:
            continue
        unescape = fields[4].replace("\\040", " ")
        yield rest[0], unescape, fields[3], rest[2]


def _own_cgroups() -> dict[str, str]:
    """Controller (or "" for v2) -> this process's cgroup path."""
    paths = {}
    try:
        with open("/proc/self/cgroup") as file:
            for line in file:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                for controller in controllers.split(",") if controllers else [""]:
                    paths[controller] = path
    except (OSError, ValueError):
        pass
    return paths


def _folder(mount_point: str, mount_root: str, path: str) -> str:
    relative = path[len(mount_root):] if mount_root != "/" and _within(path, mount_root) else path
    return os.path.join(mount_point, relative.lstrip("/"))


def find_cgroups(settings: Settings) -> Cgroups | None:
    """The control groups this worker may create steps' groups in: v2 when it delegates the
    controllers (or is all there is), else the v1 hierarchies of memory, pids and cpu."""
    if settings.shell_cgroup == "none":
        return None
    own = _own_cgroups()
    mounts = list(_mountinfo())
    v1: dict[str, str] = {}
    for controller in CGROUP_CONTROLLERS:
        for fstype, point, root, options in mounts:
            if fstype == "cgroup" and controller in options.split(",") and controller in own:
                folder = _folder(point, root, own[controller])
                if os.path.isdir(folder) and os.access(folder, os.W_OK):
                    v1.setdefault(controller, folder)
    v2_folder = None
    v2_controllers: tuple[str, ...] = ()
    for fstype, point, root, _ in mounts:
        if fstype == "cgroup2" and "" in own:
            folder = _folder(point, root, own[""])
            if os.path.isdir(folder) and os.access(folder, os.W_OK):
                v2_folder = folder
                try:
                    with open(os.path.join(folder, "cgroup.subtree_control")) as file:
                        delegated = file.read().split()
                except OSError:
                    delegated = []
                v2_controllers = tuple(c for c in CGROUP_CONTROLLERS if c in delegated)
                break
    use_v2 = settings.shell_cgroup == "v2" or (settings.shell_cgroup == "auto" and v2_folder is not None
                                                and (v2_controllers or not v1))
    memory = None if settings.shell_max_memory_mb is None else str(settings.shell_max_memory_mb * 1024 * 1024)
    quota = None if settings.shell_max_cpus is None else str(int(settings.shell_max_cpus * CPU_PERIOD_MICROSECONDS))
    processes = None if settings.shell_max_processes is None else str(settings.shell_max_processes)
    if use_v2:
        if v2_folder is None:
            raise IsolationError("QFORGE_SHELL_CGROUP=v2, but this worker has no writable cgroup v2 folder")
        limits = [("memory.max", memory), ("pids.max", processes),
                  ("cpu.max", None if quota is None else f"{quota} {CPU_PERIOD_MICROSECONDS}")]
        return Cgroups(2, (v2_folder,), v2_controllers, tuple((f, v) for f, v in limits if v is not None))
    if settings.shell_cgroup == "v1" and not v1:
        raise IsolationError("QFORGE_SHELL_CGROUP=v1, but this worker has no writable cgroup v1 hierarchy"
                             " of memory, pids or cpu")
    if not v1:
        return None
    limits = [("memory.limit_in_bytes", memory), ("pids.max", processes),
              ("cpu.cfs_period_us", None if quota is None else str(CPU_PERIOD_MICROSECONDS)),
              ("cpu.cfs_quota_us", quota)]
    parents = tuple(dict.fromkeys(v1.values()))  # controllers mounted together share one folder
    return Cgroups(1, parents, tuple(v1), tuple((f, v) for f, v in limits if v is not None))
