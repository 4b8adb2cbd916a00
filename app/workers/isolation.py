"""Shell steps apart from their worker: another OS user, a fresh directory, PID, mount and network namespaces, a control group.

A step's command must not become its worker: read the worker's environment
(the database URL), its files (`.env`, HOME, the secrets directory), signal it
or other jobs' processes, or leave a process behind (`setsid`) once it is
cancelled or times out. The worker builds, per step, one argv of small
programs that each do one thing and exec the next (no preexec_fn: the worker
has threads):

    sh JOIN     writes its own pid into the step's control group(s)
    unshare     new PID and mount namespaces (and network, for QFORGE_SHELL_NETWORK=none;
                a user namespace too when the worker is not root), --kill-child
    sh HIDE     as root of those namespaces: tmpfs over the worker's HOME, working
                directory, data and secrets directories, /dev/null over its .env
    setpriv     to QFORGE_SHELL_USER (or, not root, `unshare --user` back to the worker's
                uid): no capabilities, no new privileges
    sh INIT     PID 1 of the namespace: runs the command and exits with its status; when
                it ends the kernel kills every process left in the namespace

What the machine does not offer is left out and said in the worker's log at
start; QFORGE_SHELL_NETWORK=none without a network namespace refuses to start.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import logging
import os
import pwd
import secrets
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Iterator

from qforge.settings import Settings

log = logging.getLogger("qforge.worker")

# Run by /bin/sh; "$@" is: files to write our pid into, --, the next program.
JOIN = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
# "$@" is: the mount program, paths to hide, --, the next program.
HIDE = ('m=$1; shift; while [ "$1" != -- ]; do'
        ' if [ -d "$1" ]; then "$m" -t tmpfs -o size=4k,mode=0555,nosuid,nodev,noexec qforge-hidden "$1" || exit 125;'
        ' elif [ -e "$1" ]; then "$m" --bind /dev/null "$1" || exit 125; fi; shift; done; shift; exec "$@"')
# Not the last command of its script, so the shell forks it instead of exec'ing: the command
# is not PID 1 (which ignores signals it has no handler for) and its exit ends the namespace.
INIT = '"$@"; exit $?'
# Hiding one of these (or a folder holding one) would leave the step without its programs.
ESSENTIAL = ("/bin", "/sbin", "/usr", "/lib", "/lib64", "/etc", "/dev", "/proc", "/sys")
CGROUP_CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_MICROSECONDS = 100_000
KILL_WAIT_SECONDS = 2.0
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


@dataclass(frozen=True)
class Isolation:
    """How this worker runs shell steps (from the settings and what the machine offers)."""

    uid: int
    gid: int
    user: str
    switch_user: bool  # root running steps as another user (setpriv)
    namespaces: bool  # PID + mount (+ network) namespaces through unshare
    user_namespace: bool  # not root: the namespaces are owned by a user namespace of the step
    network_none: bool
    base_dir: str
    hidden: tuple[str, ...]
    cgroups: Cgroups | None
    programs: dict[str, str] = dataclasses.field(default_factory=dict)  # unshare, setpriv, mount

    @classmethod
    def from_settings(cls, settings: Settings) -> "Isolation":
        root = os.geteuid() == 0
        uid, gid, user = shell_user(settings.shell_user, root)
        programs = {name: path for name in ("unshare", "setpriv", "mount") if (path := shutil.which(name))}
        switch_user = root and uid != 0
        if switch_user and "setpriv" not in programs:
            raise IsolationError(f"running shell steps as {user} needs setpriv (util-linux), not found on PATH")
        base_dir = work_base(settings.shell_work_dir)
        isolation = cls(uid=uid, gid=gid, user=user, switch_user=switch_user,
                        namespaces="unshare" in programs and "mount" in programs, user_namespace=not root,
                        network_none=settings.shell_network == "none", base_dir=base_dir,
                        hidden=hidden_paths(settings, base_dir), cgroups=find_cgroups(settings),
                        programs=programs)
        if isolation.namespaces and (problem := dataclasses.replace(isolation, cgroups=None).check()):
            log.warning("shell steps get no PID namespace: %s", problem)
            isolation = dataclasses.replace(isolation, namespaces=False)
        if isolation.cgroups is not None and (problem := isolation.check()) is not None:
            log.warning("shell steps get no control group: %s", problem)
            isolation = dataclasses.replace(isolation, cgroups=None)
        if isolation.network_none and not isolation.namespaces:
            raise IsolationError("QFORGE_SHELL_NETWORK=none needs a network namespace (unshare --net), which"
                                 " this machine does not give this worker")
        return isolation

    def describe(self) -> str:
        if self.switch_user:
            who = f"as {self.user}"
        elif os.geteuid() == 0:
            who = f"as {self.user}, like the worker itself: QFORGE_SHELL_USER names root"
        else:
            who = f"as {self.user}, the worker's own user (it is not root, see docs/security.md)"
        parts = [who, f"in fresh folders under {self.base_dir}"]
        if self.namespaces:
            parts.append("in PID and mount namespaces" + (" of a user namespace" if self.user_namespace else ""))
            parts.append("network: " + ("none (a network namespace of their own)" if self.network_none
                                        else "the host's"))
            parts.append("hidden from them: " + (", ".join(self.hidden) or "nothing"))
        else:
            parts.append("without PID namespace (a setsid child outlives a cancel unless a cgroup holds it)")
        parts.append(self.cgroups.describe() if self.cgroups else "no cgroup")
        return "shell steps run " + "; ".join(parts)

    def check(self) -> str | None:
        """Run `true` the way a step runs; None if it worked, else why not."""
        step = self.prepare()
        try:
            done = subprocess.run(step.argv(["/bin/true"]), cwd=step.directory, env={"PATH": "/usr/bin:/bin"},
                                  stdin=subprocess.DEVNULL, capture_output=True, timeout=15,
                                  start_new_session=True)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return str(exc)
        finally:
            step.finish()
        if done.returncode != 0:
            return f"exit code {done.returncode}: {done.stderr.decode(errors='replace').strip()[-500:]}"
        return None

    def prepare(self) -> "Step":
        """A fresh directory (owned by the shell user) and control group for one step."""
        directory = tempfile.mkdtemp(prefix="step-", dir=self.base_dir)
        step = Step(self, directory)
        try:
            if self.switch_user:
                os.chown(directory, self.uid, self.gid)
            if self.cgroups is not None:
                step.make_cgroups()
        except BaseException:
            step.finish()
            raise
        return step


class Step:
    """One shell step's directory and control group; finish() removes both and whatever still runs."""

    def __init__(self, isolation: Isolation, directory: str) -> None:
        self.isolation = isolation
        self.directory = directory
        self.cgroup_dirs: list[str] = []

    def environment(self) -> dict[str, str]:
        return {"HOME": self.directory, "TMPDIR": self.directory}

    def argv(self, command: list[str]) -> list[str]:
        iso, programs = self.isolation, self.isolation.programs
        before: list[str] = []  # the programs between the namespace's root and the command
        if iso.switch_user:
            before = [programs["setpriv"], f"--reuid={iso.uid}", f"--regid={iso.gid}", "--clear-groups",
                      "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", "--"]
        elif "setpriv" in programs:
            before = [programs["setpriv"], "--no-new-privs", "--"]
        if not iso.namespaces:
            argv = [*before, *command]
        else:
            if iso.user_namespace:  # from root of the namespace back to the worker's uid, without capabilities
                before = [programs["unshare"], "--user", f"--map-user={iso.uid}", f"--map-group={iso.gid}", "--",
                          *before]
            argv = [programs["unshare"], *(["--user", "--map-root-user"] if iso.user_namespace else []),
                    "--pid", "--fork", "--kill-child", "--mount-proc", *(["--net"] if iso.network_none else []),
                    "--", "/bin/sh", "-c", HIDE, "qforge-hide", programs["mount"], *iso.hidden, "--",
                    *before, "/bin/sh", "-c", INIT, "qforge-init", *command]
        if self.cgroup_dirs:
            argv = ["/bin/sh", "-c", JOIN, "qforge-join",
                    *(os.path.join(d, "cgroup.procs") for d in self.cgroup_dirs), "--", *argv]
        return argv

    def make_cgroups(self) -> None:
        cgroups = self.isolation.cgroups
        assert cgroups is not None
        name = f"qforge-{os.getpid()}-{secrets.token_hex(4)}"
        for parent in cgroups.parents:
            path = os.path.join(parent, name)
            os.mkdir(path)
            self.cgroup_dirs.append(path)
            for file, value in cgroups.limits:
                if os.path.exists(os.path.join(path, file)):
                    _write(os.path.join(path, file), value)

    def kill_all(self) -> None:
        """SIGKILL every process still in the step's control group (setsid or not), until none is left."""
        if not self.cgroup_dirs:
            return
        kill_file = os.path.join(self.cgroup_dirs[0], "cgroup.kill")
        deadline = time.monotonic() + KILL_WAIT_SECONDS
        while True:
            pids = [pid for d in self.cgroup_dirs for pid in _pids(d)]
            if not pids or time.monotonic() >= deadline:
                break
            if os.path.exists(kill_file):
                _write(kill_file, "1")
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.01)

    def finish(self) -> None:
        """Kill what is left, remove the control group(s) and the directory (the step's HOME)."""
        try:
            self.kill_all()
        finally:
            for path in reversed(self.cgroup_dirs):
                deadline = time.monotonic() + KILL_WAIT_SECONDS
                while True:
                    try:
                        os.rmdir(path)
                        break
                    except FileNotFoundError:
                        break
                    except OSError as exc:  # EBUSY while the last exits are accounted
                        if time.monotonic() >= deadline:
                            log.warning("cannot remove the step's cgroup %s: %s", path, exc)
                            break
                        time.sleep(0.01)
            self.cgroup_dirs = []
            remove_tree(self.directory)


def _write(path: str, value: str) -> None:
    with open(path, "w") as file:
        file.write(value)


def _pids(cgroup_dir: str) -> list[int]:
    try:
        with open(os.path.join(cgroup_dir, "cgroup.procs")) as file:
            return [int(line) for line in file if line.strip()]
    except FileNotFoundError:
        return []


def remove_tree(path: str) -> None:
    """rmtree, also through folders the step made unreadable (chmod 000) for the worker."""
    def fix(function, failed_path, _exc_info) -> None:  # type: ignore[no-untyped-def]
        try:
            os.chmod(os.path.dirname(failed_path), 0o700)
            os.chmod(failed_path, 0o700)
        except OSError:
            pass
        try:
            function(failed_path)
        except OSError:
            pass
    shutil.rmtree(path, onerror=fix)
    if os.path.exists(path):
        shutil.rmtree(path, ignore_errors=True)


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
