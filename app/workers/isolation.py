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
What it offers (the user, the folders, what to hide, control groups) is found
by `qforge.workers.host`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass

from qforge.settings import Settings
from qforge.workers.host import Cgroups, IsolationError, find_cgroups, hidden_paths, shell_user, work_base

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
KILL_WAIT_SECONDS = 2.0


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

