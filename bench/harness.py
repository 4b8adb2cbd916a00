"""The measuring side of run.py: fresh databases, worker processes, the drain clock, the latency clock.

Every system is measured the same way from the outside: its own driver
enqueues through its own Python API, its own workers drain, and this module
watches the database to start the clock at the first job taken and stop it
when no job is left, reading the machine's CPU counters at both instants.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from common import CpuWindow, parse_result, percentile, read_latency_files, with_database
from perf_profile import Recording
from qforge.cli.progress import Progress

BENCH_DIR = Path(__file__).resolve().parent
POLL_START_SECONDS = 0.005  # the "started" probes are single index lookups
POLL_END_SECONDS = 0.05


@dataclass
class System:
    """How to drive one queue: its driver command, its workers, and three probes into its tables."""

    name: str
    database: str
    python: str  # interpreter of its venv
    driver: str  # script with setup / enqueue / latency verbs
    worker_argv: list[str]  # one worker process (the driver is told --url)
    progress_sql: str  # a number that grows as soon as a worker takes a job
    busy_sql: str  # true while any job is still waiting or running
    done_count_sql: str  # how many jobs finished successfully
    worker_env: dict[str, str] = field(default_factory=dict)
    worker_processes: int = 2
    extra_checks: list[tuple[str, str]] = field(default_factory=list)  # (label, sql) -> counts


class Bench:
    """Database and process plumbing shared by all measurements."""

    def __init__(self, admin_url: str, log_dir: Path, log=print) -> None:
        self.admin_url = admin_url
        self.log_dir = log_dir
        self.log = log
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._counter = 0
        # Names of this run only: two runs on one server must not drop each other's databases.
        self.prefix = f"qf_bench_{secrets.token_hex(3)}_"
        self.created: set[str] = set()

    def name(self, role: str) -> str:
        return self.prefix + role

    def url(self, database: str) -> str:
        return with_database(self.admin_url, database)

    def fresh_database(self, database: str) -> str:
        self.created.add(database)
        with psycopg.connect(self.admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)))
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
        return self.url(database)

    def drop_all(self, keep: set[str] = frozenset()) -> None:
        """Drop every database this run created (also after a failure)."""
        for database in sorted(self.created - set(keep)):
            self.drop_database(database)

    def drop_database(self, database: str) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)))

    def driver(self, system: System, verb: str, *args: str, timeout: float = 1800) -> dict[str, Any]:
        """Run a driver verb to completion; its RESULT line (or {} for verbs that print none)."""
        argv = [system.python, system.driver, verb, "--url", self.url(system.database), *args]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **system.worker_env})
        if done.returncode != 0:
            raise RuntimeError(f"{system.name} {verb} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        return parse_result(done.stdout) if "RESULT " in done.stdout else {}

    def start_workers(self, system: System, extra_env: dict[str, str] | None = None) -> list[subprocess.Popen]:
        processes = []
        for index in range(system.worker_processes):
            self._counter += 1
            log_path = self.log_dir / f"{system.name}-worker-{self._counter}.log"
            argv = [arg.replace("{url}", self.url(system.database)).replace("{index}", str(index))
                    for arg in system.worker_argv]
            env = {**os.environ, **system.worker_env, **(extra_env or {})}
            with open(log_path, "w") as log_file:
                processes.append(subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT,
                                                  env=env, start_new_session=True))
        return processes

    def stop_workers(self, processes: list[subprocess.Popen], grace: float = 20.0) -> None:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for process in processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    # --- drain -----------------------------------------------------------------

    def drain(self, system: System, jobs: int, *, timeout: float = 1800) -> dict[str, Any]:
        """Workers start on `jobs` pre-enqueued no-op jobs; clock from the first taken to the last done."""
        url = self.url(system.database)
        with psycopg.connect(url, autocommit=True) as probe:
            # Statistics that know about the backlog, as autovacuum would soon give every
            # system; otherwise it may run in the middle of one system's drain and not another's.
            probe.execute("ANALYZE")
            baseline = probe.execute(system.progress_sql).fetchone()[0]
            workers = self.start_workers(system)
            try:
                deadline = time.monotonic() + timeout
                while probe.execute(system.progress_sql).fetchone()[0] == baseline:
                    self._check_alive(system, workers)
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{system.name}: no job was taken in {timeout}s")
                    time.sleep(POLL_START_SECONDS)
                started = time.perf_counter()
                cpu = CpuWindow({"workers": self._worker_pids(workers),
                                 "postgres": self._server_pids(probe, system.database)})
                recording = Recording(f"{system.name}-drain")  # only with BENCH_PERF_DIR (perf_profile.py)
                # Progress on stderr from the log's high-water mark (one index probe a second,
                # so the reporting costs the measured systems nothing noticeable).
                with Progress(f"{system.name} drain", unit="log entries") as shown:
                    reported = time.monotonic()
                    while probe.execute(system.busy_sql).fetchone()[0]:
                        self._check_alive(system, workers)
                        if time.monotonic() > deadline:
                            raise TimeoutError(f"{system.name}: drain not finished in {timeout}s")
                        if time.monotonic() - reported >= 1.0:
                            shown.update(probe.execute(system.progress_sql).fetchone()[0] - baseline)
                            reported = time.monotonic()
                        time.sleep(POLL_END_SECONDS)
                elapsed = time.perf_counter() - started
                late = {"workers": self._worker_pids(workers), "postgres": self._server_pids(probe, system.database)}
                used = cpu.stop(late=late)
                recording.stop(jobs=jobs, groups={name: cpu.groups[name] | pids for name, pids in late.items()})
            finally:
                self.stop_workers(workers)
            done = probe.execute(system.done_count_sql).fetchone()[0]
            checks = {label: probe.execute(sql).fetchone()[0] for label, sql in system.extra_checks}
        if done != jobs:
            raise RuntimeError(f"{system.name}: {done} jobs succeeded, expected {jobs}")
        return {"jobs": jobs, "seconds": elapsed, "jobs_per_s": jobs / elapsed,
                "machine_cpu_us_per_job": used["machine_cpu_s"] * 1e6 / jobs,
                "attributed_cpu_us_per_job": used["attributed_cpu_s"] * 1e6 / jobs,
                "workers_cpu_us_per_job": used["workers_cpu_s"] * 1e6 / jobs,
                "postgres_cpu_us_per_job": used["postgres_cpu_s"] * 1e6 / jobs,
                "machine_busy_cores": used["machine_cpu_s"] / used["wall_s"], **checks}

    def _check_alive(self, system: System, workers: list[subprocess.Popen]) -> None:
        for process in workers:
            if process.poll() is not None:
                raise RuntimeError(f"{system.name}: a worker exited with {process.returncode}; "
                                   f"see the logs in {self.log_dir}")

    def _worker_pids(self, workers: list[subprocess.Popen]) -> set[int]:
        from common import descendants_of

        return descendants_of(p.pid for p in workers)

    def _server_pids(self, probe: psycopg.Connection, database: str) -> set[int]:
        """This database's backends plus the server's own helpers (WAL writer, checkpointer, ...).

        Other databases on the same server are other people's work and stay out,
        and so does the probe's own backend.
        """
        rows = probe.execute(
            "SELECT pid FROM pg_stat_activity"
            " WHERE (datname = %s OR datname IS NULL) AND pid <> pg_backend_pid()",
            (database,)).fetchall()
        return {row[0] for row in rows}

    # --- latency ------------------------------------------------------------------

    def start_latency(self, system: System) -> "LatencyWorkers":
        """Idle workers of `system` for latency rounds (`latency_round`), started once; stop them
        with `stop_workers(session.workers)`."""
        latency_dir = self.log_dir / f"latency-{system.name}"
        latency_dir.mkdir(exist_ok=True)
        return LatencyWorkers(system, latency_dir,
                              self.start_workers(system, {"BENCH_LATENCY_DIR": str(latency_dir)}))

    def latency_round(self, session: "LatencyWorkers", *, jobs: int, interval: float,
                      timeout: float = 120) -> dict[str, float]:
        """One round: `jobs` enqueued one at a time, `interval` apart, to idle workers; each task
        records its start time; p50, p99 and max of start - enqueue."""
        system, latency_dir = session.system, session.latency_dir
        for stale in latency_dir.glob("latency-*.txt"):
            stale.unlink()
        self.driver(system, "latency", "--jobs", str(jobs), "--interval", str(interval),
                    "--latency-dir", str(latency_dir))
        deadline = time.monotonic() + timeout
        while True:
            values = read_latency_files(latency_dir.glob("latency-*.txt"))
            if len(values) >= jobs:
                break
            self._check_alive(system, session.workers)
            if time.monotonic() > deadline:
                raise TimeoutError(f"{system.name}: {len(values)} of {jobs} latency jobs ran")
            time.sleep(0.05)
        values.sort()
        return {"p50_ms": percentile(values, 0.50), "p99_ms": percentile(values, 0.99),
                "max_ms": values[-1], "jobs": len(values)}


@dataclass
class LatencyWorkers:
    """A system's idle workers for the latency rounds, and where their tasks write start times."""

    system: System
    latency_dir: Path
    workers: list[subprocess.Popen]


def python_of(venv: Path) -> str:
    return str(venv / "bin" / "python")


def ensure_venv(venv: Path, packages: list[str], modules: list[str], *, python: str = sys.executable,
                log=print) -> dict[str, str]:
    """Create a peer's own venv once (`python` -m venv + pip, until `modules` import) and return
    the installed versions of `packages`."""
    if not (venv / "bin" / "python").exists():
        log(f"creating {venv} ({python}) and installing {' '.join(packages)}")
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
    check = subprocess.run([python_of(venv), "-c", "import " + ", ".join(modules)], capture_output=True)
    if check.returncode != 0:
        subprocess.run([python_of(venv), "-m", "pip", "install", "--quiet", *packages], check=True)
    listing = subprocess.run([python_of(venv), "-m", "pip", "list", "--format=freeze"],
                             capture_output=True, text=True, check=True).stdout
    wanted = {package.partition("[")[0].lower() for package in packages}
    return {name: version for name, _, version in (line.partition("==") for line in listing.splitlines())
            if name.lower() in wanted}


def python312() -> str:
    """A Python 3.12 or newer for the venvs of peers that need it (Oban for Python):
    $BENCH_PYTHON312, python3.12 / python3.13 on PATH, else pyenv's."""
    import glob
    import shutil

    candidates = [os.environ.get("BENCH_PYTHON312"), shutil.which("python3.12"), shutil.which("python3.13"),
                  *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[2-9]*/bin/python3")))]
    for candidate in candidates:
        # a pyenv shim is on the PATH even where that version is not the selected one: run it to know
        if candidate and os.path.exists(candidate) and subprocess.run(
                [candidate, "-c", "import sys; assert sys.version_info >= (3, 12)"],
                capture_output=True).returncode == 0:
            return candidate
    raise RuntimeError("Oban for Python needs Python 3.12+: set BENCH_PYTHON312 to one")
