"""QForge, PgQueuer, Procrastinate, Oban for Python and DBOS side by side on one PostgreSQL: one
command, one table.

    python bench/run.py --database-url postgresql://postgres@127.0.0.1:5432/postgres --repeat 3
    python bench/run.py --database-url ... --quick          # small sizes, a few minutes

The URL names an existing database used only to create and drop the
benchmark's own databases (qf_bench_<run id>_*, dropped at the end). The
peers are installed on first use into bench/.peers-venv (PgQueuer,
Procrastinate, DBOS) and bench/.oban-venv (Oban for Python, which needs
Python 3.12+: see harness.python312); they are not project dependencies. Prints a Markdown table and writes
bench/results/<timestamp>.json with every repetition. Not part of the test
suite.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402
import psycopg  # noqa: E402

from common import CpuWindow, descendants_of, in_turns, parse_result, start_api, summarize  # noqa: E402
from harness import Bench, System, ensure_venv, python312, python_of  # noqa: E402
from perf_profile import Recording  # noqa: E402
from qf_history import KEPT_HISTORY  # noqa: E402
from report import goals, markdown_table  # noqa: E402

# Each peer's venv: (folder under bench/, Python, packages, modules that must import).
PEER_VENVS = {
    "peers": (".peers-venv", lambda: sys.executable,
              ["pgqueuer", "asyncpg", "procrastinate", "psycopg[binary]", "dbos"],
              ["pgqueuer", "procrastinate", "asyncpg", "psycopg", "dbos"]),
    "oban": (".oban-venv", python312, ["oban"], ["oban"]),  # Oban for Python needs 3.12+
}
VENV_OF = {"pgqueuer": "peers", "procrastinate": "peers", "dbos": "peers", "oban": "oban"}
SYSTEMS = ("qforge", "pgqueuer", "procrastinate", "oban", "dbos")
PARTS = ("drain", "latency", "claim", "sse", "replay")
OPTIONAL_PARTS = ("scale", "flow")  # long (scale: a 50M-event history) or QForge-only: only when named


def peer(name: str, python: str, bench: Bench, worker_args: list[str], *, progress_sql: str, busy_sql: str,
         done_count_sql: str) -> System:
    """A peer driven by bench/peer_<name>.py from its own venv's `python`."""
    driver = str(BENCH_DIR / f"peer_{name}.py")
    return System(name=name, database=bench.name(name), python=python, driver=driver,
                  worker_argv=[python, driver, "worker", "--url", "{url}", *worker_args],
                  progress_sql=progress_sql, busy_sql=busy_sql, done_count_sql=done_count_sql)


def build_systems(args: argparse.Namespace, pythons: dict[str, str], bench: Bench) -> dict[str, System]:
    qforge_env = {"PYTHONPATH": os.pathsep.join([str(BENCH_DIR), str(ROOT)]),
                  "QFORGE_LOG_LEVEL": "WARNING"}
    if (ROOT / "app" / "workers" / "worker.py").exists() and not args.qforge_loop:
        console_script = Path(sys.executable).parent / "qforge"
        qforge = [str(console_script)] if console_script.exists() else [sys.executable, "-m", "qforge.cli"]
        qforge_worker = [*qforge, "worker", "--database-url", "{url}",
                         "--concurrency", str(args.qforge_concurrency), "--tasks", "qf_tasks",
                         "--name", "bench-{index}"]
    else:  # the fallback: a minimal claim + complete loop over the same commands
        qforge_worker = [sys.executable, str(BENCH_DIR / "qf_driver.py"), "worker", "--url", "{url}",
                         "--batch", str(args.qforge_concurrency)]
    python = lambda name: pythons.get(VENV_OF[name], sys.executable)  # noqa: E731
    return {
        "qforge": System(
            name="qforge", database=bench.name("qforge"), python=sys.executable,
            driver=str(BENCH_DIR / "qf_driver.py"), worker_argv=qforge_worker, worker_env=qforge_env,
            progress_sql="SELECT coalesce(max(position), 0) FROM events",
            busy_sql="SELECT EXISTS (SELECT 1 FROM jobs WHERE status = 'pending')"
                     " OR EXISTS (SELECT 1 FROM jobs WHERE status = 'running')",
            done_count_sql="SELECT count(*) FROM jobs WHERE status = 'succeeded'",
            # Every transition is in the log: Enqueued, Claimed, Succeeded per job.
            extra_checks=[("events_per_job", "SELECT count(*)::float / nullif((SELECT count(*) FROM jobs), 0)"
                                             " FROM events")]),
        "pgqueuer": peer(
            "pgqueuer", python("pgqueuer"), bench, ["--batch", "100"],
            progress_sql="SELECT coalesce(max(id), 0) FROM pgqueuer_log",
            busy_sql="SELECT EXISTS (SELECT 1 FROM pgqueuer)",
            done_count_sql="SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'"),
        "procrastinate": peer(
            "procrastinate", python("procrastinate"), bench, ["--concurrency", "16"],
            progress_sql="SELECT coalesce(max(id), 0) FROM procrastinate_events",
            busy_sql="SELECT EXISTS (SELECT 1 FROM procrastinate_jobs WHERE status IN ('todo', 'doing'))",
            done_count_sql="SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"),
        "oban": peer(  # settings: bench/peer_oban.py's docstring
            "oban", python("oban"), bench, ["--limit", "100"],
            progress_sql="SELECT count(*) FROM oban_jobs WHERE state IN ('executing', 'completed')",
            busy_sql="SELECT EXISTS (SELECT 1 FROM oban_jobs WHERE state IN ('available', 'executing'))",
            done_count_sql="SELECT count(*) FROM oban_jobs WHERE state = 'completed'"),
        "dbos": peer(  # settings, and why: bench/peer_dbos.py's docstring
            "dbos", python("dbos"), bench, ["--concurrency", "100", "--polling-interval", "0.05"],
            progress_sql="SELECT count(*) FROM dbos.workflow_status WHERE started_at_epoch_ms IS NOT NULL",
            busy_sql="SELECT EXISTS (SELECT 1 FROM dbos.workflow_status"
                     " WHERE queue_name = 'bench' AND status IN ('ENQUEUED', 'PENDING'))",
            done_count_sql="SELECT count(*) FROM dbos.workflow_status WHERE status = 'SUCCESS'"),
    }


def drain_jobs(args: argparse.Namespace, name: str) -> int:
    """The drain size of one system: the slow peers drain fewer (--procrastinate-jobs, --dbos-jobs)."""
    return {"procrastinate": args.procrastinate_jobs, "dbos": args.dbos_jobs}.get(name, args.jobs)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- the parts ----------------------------------------------------------------------------


def run_drain(bench: Bench, systems: dict[str, System], args: argparse.Namespace) -> dict[str, Any]:
    """Enqueue `jobs` in batches of 1,000 (figure 2), then drain them (figure 1), per repetition.

    Repetitions are interleaved across systems so that a noisy minute on the
    shared machine does not land on one system only.
    """
    raw: dict[str, dict[str, list]] = {name: {"enqueue": [], "drain": []} for name in systems}
    for rep in range(args.repeat):
        for name, system in systems.items():
            jobs = drain_jobs(args, name)
            bench.fresh_database(system.database)
            bench.driver(system, "setup")
            recording = Recording(f"{name}-enqueue")  # only with BENCH_PERF_DIR (perf_profile.py)
            enqueued = bench.driver(system, "enqueue", "--jobs", str(jobs), "--batch", "1000")
            recording.stop(jobs=jobs, by_command={"postgres": "postgres", "python": "client"})
            drained = bench.drain(system, jobs)
            raw[name]["enqueue"].append(enqueued)
            raw[name]["drain"].append(drained)
            log(f"{name} rep {rep + 1}: enqueue {enqueued['jobs_per_s']:,.0f} jobs/s, drain "
                f"{drained['jobs_per_s']:,.0f} jobs/s, {drained['machine_cpu_us_per_job']:.0f} µs CPU/job "
                f"(machine), {drained['attributed_cpu_us_per_job']:.0f} attributed = "
                f"{drained['workers_cpu_us_per_job']:.0f} workers + {drained['postgres_cpu_us_per_job']:.0f} "
                f"PostgreSQL")
    return {name: {
        "jobs": drain_jobs(args, name),
        "enqueue_jobs_per_s": summarize([r["jobs_per_s"] for r in parts["enqueue"]]),
        "drain_jobs_per_s": summarize([r["jobs_per_s"] for r in parts["drain"]]),
        "drain_machine_cpu_us_per_job": summarize([r["machine_cpu_us_per_job"] for r in parts["drain"]]),
        "drain_attributed_cpu_us_per_job": summarize([r["attributed_cpu_us_per_job"] for r in parts["drain"]]),
        "drain_workers_cpu_us_per_job": summarize([r["workers_cpu_us_per_job"] for r in parts["drain"]]),
        "drain_postgres_cpu_us_per_job": summarize([r["postgres_cpu_us_per_job"] for r in parts["drain"]]),
        "raw": parts} for name, parts in raw.items()}


def run_latency(bench: Bench, systems: dict[str, System], args: argparse.Namespace,
                warmup_jobs: int = 20) -> dict[str, Any]:
    """Figure 3. Every system's workers are started once and stay idle between rounds; the rounds
    alternate across systems, round by round, who goes first turning each round (in_turns), so
    that a noisy minute of the shared machine does not fall on one system only. Round 0 is the
    warm-up (workers connected, caches and plans warm) and is not counted."""
    sessions = {}
    try:
        for name, system in systems.items():
            bench.fresh_database(system.database)
            bench.driver(system, "setup")
            sessions[name] = bench.start_latency(system)
        reps: dict[str, list[dict[str, float]]] = {name: [] for name in systems}
        for round_index in range(args.repeat + 1):
            for name in in_turns(list(sessions), round_index):
                # what the other systems' idle workers cost meanwhile (their polling, if any)
                idle = CpuWindow({"idle": descendants_of(p.pid for other, session in sessions.items()
                                                         if other != name for p in session.workers)})
                measured = bench.latency_round(sessions[name], interval=args.latency_interval,
                                               jobs=args.latency_jobs if round_index else warmup_jobs)
                used = idle.stop()
                measured["others_idle_workers_cores"] = used["idle_cpu_s"] / used["wall_s"]
                if round_index:
                    reps[name].append(measured)
                    log(f"{name} latency round {round_index}: p50 {measured['p50_ms']:.1f} ms,"
                        f" p99 {measured['p99_ms']:.1f} ms (the others' idle workers:"
                        f" {measured['others_idle_workers_cores']:.2f} cores)")
    finally:
        for session in sessions.values():
            bench.stop_workers(session.workers)
    out = {name: {"p50_ms": summarize([r["p50_ms"] for r in rounds]),
                  "p99_ms": summarize([r["p99_ms"] for r in rounds]), "raw": rounds}
           for name, rounds in reps.items()}
    for name, figures in out.items():
        log(f"{name} latency: p50 {figures['p50_ms']['median']:.1f} ms, p99 {figures['p99_ms']['median']:.1f} ms")
    return out


def run_claim(bench: Bench, args: argparse.Namespace) -> dict[str, Any]:
    """Claim throughput on an empty history and on a large one (generation timed)."""
    import qf_history

    history_db = qf_history.KEPT_HISTORY if args.keep_history or args.reuse_history else bench.name("history")
    history_url = bench.url(history_db)
    generated = qf_history.reusable_history(bench.admin_url, args.history_jobs) if args.reuse_history else None
    if generated:
        log(f"reusing the kept history of {args.history_jobs:,} jobs (generated in {generated['total_s']:.0f}s)")
    else:
        log(f"generating a history of {args.history_jobs:,} finished jobs ({3 * args.history_jobs:,} events)")
        bench.created.add(history_db)
        history_url = qf_history.recreate_database(bench.admin_url, history_db)
        generated = qf_history.generate_history(history_url, args.history_jobs, log=log)
        log(f"history generated in {generated['total_s']:.0f}s "
            f"(events {generated['events_bytes'] / 1e9:.1f} GB, jobs {generated['jobs_bytes'] / 1e9:.1f} GB)")
    raw: dict[str, list[float]] = {f"{where}_{kind}{figure}": []
                                   for where in ("empty", "history") for kind in ("claim", "claim_complete")
                                   for figure in ("", "_server_cpu_us")}
    for rep in range(args.repeat):
        for complete in (False, True):
            kind = "claim_complete" if complete else "claim"
            bench.created.add(bench.name("claim_empty"))
            urls = {"empty": qf_history.recreate_database(bench.admin_url, bench.name("claim_empty")),
                    "history": history_url}
            for url in urls.values():
                qf_history.enqueue_pending(url, args.claim_jobs)
            # Both claimed in turns, batch round by batch round (see claim_side_by_side).
            measured = qf_history.claim_side_by_side(urls, args.claim_jobs, complete=complete)
            for where, figures in measured.items():
                raw[f"{where}_{kind}"].append(figures["jobs_per_s"])
                raw[f"{where}_{kind}_server_cpu_us"].append(figures["server_cpu_us_per_job"])
        log(f"claim rep {rep + 1}: empty {raw['empty_claim'][-1]:,.0f} / history {raw['history_claim'][-1]:,.0f}"
            f" jobs/s; claim+complete empty {raw['empty_claim_complete'][-1]:,.0f} / history "
            f"{raw['history_claim_complete'][-1]:,.0f}")
    bench.drop_database(bench.name("claim_empty"))
    if history_db != qf_history.KEPT_HISTORY:
        bench.drop_database(history_db)
    ratios = [h / e for h, e in zip(raw["history_claim"], raw["empty_claim"])]
    ratios_complete = [h / e for h, e in zip(raw["history_claim_complete"], raw["empty_claim_complete"])]
    return {"history": generated, "pending_jobs": args.claim_jobs,
            **{key: summarize(values) for key, values in raw.items()},
            "ratio": summarize(ratios), "ratio_complete": summarize(ratios_complete)}


class LoadSampler:
    """The 1-minute load average every 10 s while the run lasts (os.getloadavg)."""

    def __init__(self, every: float = 10.0) -> None:
        self.samples: list[float] = [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, args=(every,), daemon=True)
        self._thread.start()

    def _sample(self, every: float) -> None:
        while not self._stop.wait(every):
            self.samples.append(os.getloadavg()[0])

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class ForeignXminWatch:
    """The longest transaction of ANOTHER database holding an xid while it runs. The gapless
    read shows an event only once every older transaction of the whole cluster has ended
    (pg_current_snapshot's xmin is cluster-wide), so on a shared server another database's
    long transaction (a bulk load, CREATE DATABASE) holds every SSE message back: such a
    repetition measures the neighbour, and says so here."""

    def __init__(self, admin_url: str, database: str) -> None:
        self.admin_url, self.database = admin_url, database
        self.longest_s = 0.0
        self.what = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> "ForeignXminWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            while not self._stop.wait(0.05):
                row = conn.execute(
                    "SELECT extract(epoch FROM clock_timestamp() - xact_start)::float8, datname,"
                    "       left(query, 60)"
                    "  FROM pg_stat_activity"
                    " WHERE backend_xid IS NOT NULL AND datname IS DISTINCT FROM %s"
                    " ORDER BY xact_start LIMIT 1", (self.database,)).fetchone()
                if row and row[0] > self.longest_s:
                    self.longest_s, self.what = row[0], f"{row[1]}: {row[2]}"


def run_sse(bench: Bench, args: argparse.Namespace) -> dict[str, Any]:
    url = bench.fresh_database(bench.name("sse"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "QFORGE_LOG_LEVEL": "WARNING"}
    api_log = open(bench.log_dir / "sse-api.log", "w")
    api = None
    reps = []
    try:
        # The API allows QFORGE_API_STREAMS_PER_TOKEN (20) open streams per token: all subscribers
        # here are anonymous, so one token.
        api, base = start_api(url, api_log, env={"QFORGE_API_STREAMS_PER_TOKEN": str(args.sse_subscribers + 1)})
        port = base.rsplit(":", 1)[1]

        def one_run(subscribers: int) -> dict[str, Any]:
            subscriber = subprocess.Popen(
                [sys.executable, str(BENCH_DIR / "qf_sse.py"), "subscribe", "--port", str(port),
                 "--subscribers", str(subscribers)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
            try:
                if subscriber.stdout.readline().strip() != "READY":
                    raise RuntimeError("SSE subscribers did not connect")
                api_cpu = psutil.Process(api.pid).cpu_times()
                with ForeignXminWatch(bench.admin_url, bench.name("sse")) as foreign:
                    appended = parse_result(subprocess.run(
                        [sys.executable, str(BENCH_DIR / "qf_sse.py"), "append", "--url", url,
                         "--rate", str(args.sse_rate), "--seconds", str(args.sse_seconds)],
                        capture_output=True, text=True, env=env, check=True).stdout)
                    out, _ = subscriber.communicate(f"{appended['events']}\n", timeout=120)
                api_cpu_after = psutil.Process(api.pid).cpu_times()
            finally:
                if subscriber.poll() is None:
                    subscriber.kill()
                    subscriber.wait()
            result = parse_result(out)
            if not result["exactly_once_in_order"]:  # a fast figure for a wrong stream is no figure
                raise RuntimeError(f"SSE: {subscribers} subscriber(s) did not each get the"
                                   f" {appended['events']} events exactly once in order: {result}")
            api_cpu_s = api_cpu_after.user + api_cpu_after.system - api_cpu.user - api_cpu.system
            # the server's CPU per message it delivered: less sensitive to the other loads than lag
            return {**result, "appended_events_per_s": appended["events_per_s"],
                    "foreign_xid_held_s": foreign.longest_s, "foreign_xid_holder": foreign.what,
                    "api_cpu_us_per_message": api_cpu_s * 1e6 / max(result["messages"], 1)}

        for rep in range(args.repeat):
            # One subscriber, then many, at the same rate: the goal is their ratio in each repetition.
            # A repetition during which another database held an xid longer than
            # --sse-foreign-xid-limit measures that neighbour (ForeignXminWatch): it is done again,
            # up to --sse-retries times, and what was set aside stays in the JSON ("set_aside").
            set_aside = []
            while True:
                single = one_run(1)
                result = one_run(args.sse_subscribers)
                held = max(single["foreign_xid_held_s"], result["foreign_xid_held_s"])
                result.update(single_p99_ms=single["p99_ms"], single=single,
                              ratio_p99=result["p99_ms"] / max(single["p99_ms"], 0.001),
                              foreign_xid_limit_exceeded=held > args.sse_foreign_xid_limit)
                log_sse_repetition(rep, result)
                if not result["foreign_xid_limit_exceeded"] or len(set_aside) >= args.sse_retries:
                    break
                set_aside.append(result)
                log(f"sse rep {rep + 1}: another database held an xid for {held:.2f} s"
                    f" (> {args.sse_foreign_xid_limit} s): measured again")
            reps.append({**result, "set_aside": set_aside})
    finally:
        if api is not None:
            bench.stop_workers([api])
        api_log.close()
        bench.drop_database(bench.name("sse"))
    return {"p50_ms": summarize([r["p50_ms"] for r in reps]), "p99_ms": summarize([r["p99_ms"] for r in reps]),
            "single_p99_ms": summarize([r["single_p99_ms"] for r in reps]),
            "ratio_p99": summarize([r["ratio_p99"] for r in reps]),
            "worst_ratio_p99": max(r["ratio_p99"] for r in reps),
            "api_cpu_us_per_message": summarize([r["api_cpu_us_per_message"] for r in reps]),
            "single_api_cpu_us_per_message": summarize([r["single"]["api_cpu_us_per_message"] for r in reps]),
            "subscribers": args.sse_subscribers, "rate": args.sse_rate, "seconds": args.sse_seconds, "raw": reps}


def log_sse_repetition(rep: int, result: dict[str, Any]) -> None:
    single = result["single"]
    log(f"sse rep {rep + 1}: {result['subscribers']} subscribers, {result['appended_events_per_s']:.0f}"
        f" events/s, p99 lag {result['p99_ms']:.0f} ms (1 subscriber: {single['p99_ms']:.0f} ms,"
        f" ratio {result['ratio_p99']:.2f}), complete={result['complete']}; p99 by the client's clock"
        f" {result['read_p99_ms']:.0f} ms (1 subscriber: {single['read_p99_ms']:.0f}); CPU µs per message"
        f" delivered: API {result['api_cpu_us_per_message']:.1f} (1 subscriber:"
        f" {single['api_cpu_us_per_message']:.1f}), client {result['client_cpu_us_per_message']:.1f};"
        f" another database held an xid for up to {result['foreign_xid_held_s']:.1f} s"
        f" (1 subscriber: {single['foreign_xid_held_s']:.1f} s)")


def run_replay(bench: Bench, args: argparse.Namespace) -> dict[str, Any]:
    """bench/replay_bench.py belongs to the replay engineer; this only calls it and reads its output."""
    script = BENCH_DIR / "replay_bench.py"
    if not script.exists():
        return {"skipped": "bench/replay_bench.py does not exist yet"}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    usage = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True,
                           env=env).stdout
    url_flag = "--server-url" if "--server-url" in usage else "--database-url"
    argv = [sys.executable, str(script), url_flag, bench.admin_url]
    if "--runs" in usage:
        argv += ["--runs", str(args.repeat)]
    if args.quick and "--jobs" in usage:
        argv += ["--jobs", "100000"]
    log(f"replay: {' '.join(argv[1:])}")
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=1800)
    (bench.log_dir / "replay_bench.log").write_text(done.stdout + done.stderr)
    found = read_replay_output(done.stdout)
    if done.returncode != 0:
        found["note"] = f"bench/replay_bench.py exited {done.returncode}; see {bench.log_dir}/replay_bench.log"
    return found


# "  rebuild run 2: 3.41 s (293,512 events/s), server CPU ..." (bench/replay_bench.py's own lines)
REPLAY_RUN_LINE = re.compile(r"^  rebuild run \d+: [\d.]+ s \(([\d,]+) events/s\)", re.MULTILINE)


def read_replay_output(stdout: str) -> dict[str, Any]:
    """Its RESULT JSON (events_per_s, and the ratio to 0.1.0 in the same run); else its rebuild lines."""
    for line in reversed(stdout.splitlines()):
        text = line[len("RESULT "):] if line.startswith("RESULT ") else line
        if not text.strip().startswith("{"):
            continue
        try:
            found = json.loads(text)
        except ValueError:
            continue
        runs = found.get("runs")
        value = found.get("events_per_s")
        if runs:
            return {"events_per_s": summarize(runs), "raw": found}
        if isinstance(value, dict) and "median" in value:
            return {"events_per_s": value, "raw": found}
        if isinstance(value, (int, float)):
            return {"events_per_s": summarize([value]), "raw": found}
    runs = [float(m.group(1).replace(",", "")) for m in REPLAY_RUN_LINE.finditer(stdout)]
    if runs:
        return {"events_per_s": summarize(runs), "output": stdout[-3000:]}
    return {"skipped": "no rebuild figure in bench/replay_bench.py output", "output": stdout[-3000:]}


# --- main --------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=os.environ.get("QFORGE_BENCH_DATABASE_URL"),
                        help="PostgreSQL (15+) URL of an existing database, used to create qf_bench_* databases")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions per figure (at least 3)")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes (10k jobs, 300 latency jobs, 500k history, 3 s of SSE)")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="subset of " + ",".join(SYSTEMS))
    parser.add_argument("--parts", default=",".join(PARTS),
                        help="subset of " + ",".join(PARTS + OPTIONAL_PARTS) + " (scale and flow only when named)")
    parser.add_argument("--jobs", type=int, default=100_000, help="drain size")
    parser.add_argument("--procrastinate-jobs", type=int, default=10_000,
                        help="drain size for Procrastinate: it drains 150-1,000 jobs/s here, so 100,000 would "
                             "take 2-10 minutes per repetition; its claim only slows as the queue grows")
    parser.add_argument("--dbos-jobs", type=int, default=20_000,
                        help="drain size for DBOS: it enqueues one job per call at ~1,000 jobs/s and drains"
                             " 1,000-2,000 jobs/s here")
    parser.add_argument("--qforge-concurrency", type=int, default=500,
                        help="slots per `qforge worker` process in the drain")
    parser.add_argument("--qforge-loop", action="store_true",
                        help="drain QForge with bench/qf_driver.py's claim+complete loop instead of qforge worker")
    parser.add_argument("--latency-jobs", type=int, default=1000)
    parser.add_argument("--latency-interval", type=float, default=0.01, help="seconds between single enqueues")
    parser.add_argument("--history-jobs", type=int, default=10_000_000,
                        help="finished jobs in the large history (3 events each)")
    parser.add_argument("--claim-jobs", type=int, default=60_000,
                        help="pending jobs claimed per measurement (long enough that a repetition's ratio is"
                             " not the noise of a few seconds on a shared machine)")
    parser.add_argument("--keep-history", action="store_true",
                        help="write the history to qf_bench_history and keep it afterwards")
    parser.add_argument("--reuse-history", action="store_true",
                        help="reuse a kept qf_bench_history of the same size and schema (and keep it); "
                             "its generation time is then the one recorded when it was made")
    parser.add_argument("--sse-subscribers", type=int, default=100)
    parser.add_argument("--sse-rate", type=int, default=1000, help="events appended per second")
    parser.add_argument("--sse-seconds", type=float, default=10.0)
    parser.add_argument("--sse-foreign-xid-limit", type=float, default=0.1,
                        help="an SSE repetition during which another database held an xid longer than this"
                             " (s) is measured again: a gapless reader waits for every older transaction of"
                             " the cluster, so it measured that neighbour")
    parser.add_argument("--sse-retries", type=int, default=2, help="how many times one SSE repetition is redone")
    parser.add_argument("--scale-events", type=int, default=50_000_000,
                        help="events in the scale part's large history (bench/qf_scale.py)")
    parser.add_argument("--scale-pack", action="append", default=[], choices=("closed", "all"),
                        help="the scale part also measures a copy of the history with its log packed (qf_scale.py"
                             " --pack); repeatable")
    parser.add_argument("--scale-partition-size", type=int, default=None,
                        help="positions per partition of the scale part's history (qf_scale.py --partition-size)")
    parser.add_argument("--out", default=str(BENCH_DIR / "results"), help="folder for the JSON and the logs")
    args = parser.parse_args(argv)
    if not args.database_url:
        parser.error("--database-url (or QFORGE_BENCH_DATABASE_URL) is required")
    if args.quick:
        args.jobs, args.latency_jobs, args.history_jobs = 10_000, 300, 500_000
        args.claim_jobs, args.sse_seconds = 10_000, 3.0
    args.procrastinate_jobs = min(args.procrastinate_jobs, args.jobs)
    args.dbos_jobs = min(args.dbos_jobs, args.jobs)
    if args.repeat < 3:
        log("note: fewer than 3 repetitions; the figures are not medians of 3")
    return args


def server_facts(admin_url: str) -> dict[str, Any]:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        facts = {"version": conn.execute("SHOW server_version").fetchone()[0]}
        for name in ("shared_buffers", "synchronous_commit", "fsync", "max_connections",
                     "shared_preload_libraries"):
            facts[name] = conn.execute("SELECT current_setting(%s)", (name,)).fetchone()[0]
    return facts


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out_dir = Path(args.out)
    bench = Bench(args.database_url, out_dir / "logs" / stamp, log=log)
    wanted = [s.strip() for s in args.systems.split(",") if s.strip()]
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    started = time.perf_counter()
    versions: dict[str, str] = {}
    pythons: dict[str, str] = {}
    if "drain" in parts or "latency" in parts:
        for venv_name in dict.fromkeys(VENV_OF[name] for name in wanted if name in VENV_OF):
            folder, python, packages, modules = PEER_VENVS[venv_name]
            venv = BENCH_DIR / folder
            versions.update(ensure_venv(venv, packages, modules, python=python(), log=log))
            pythons[venv_name] = python_of(venv)
    all_systems = build_systems(args, pythons, bench)
    systems = {name: all_systems[name] for name in SYSTEMS if name in wanted}
    results: dict[str, Any] = {
        "started_at": stamp, "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if argv is None else argv,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "load_before": os.getloadavg()},
        "postgres": server_facts(args.database_url), "peer_versions": versions,
        "qforge_worker": " ".join(all_systems["qforge"].worker_argv),
        "config": {k: v for k, v in vars(args).items() if k != "database_url"},
    }
    load = LoadSampler()  # the machine is shared: its load beside the figures
    try:
        if "drain" in parts:
            results["drain"] = run_drain(bench, systems, args)
        if "latency" in parts:
            results["latency"] = run_latency(bench, systems, args)
        if "qforge" in wanted and "claim" in parts:
            results["claim"] = run_claim(bench, args)
        if "qforge" in wanted and "sse" in parts:
            results["sse"] = run_sse(bench, args)
        if "qforge" in wanted and "replay" in parts:
            results["replay"] = run_replay(bench, args)
        if "qforge" in wanted and "scale" in parts:
            import qf_scale

            results["scale"] = qf_scale.run_scale(args.database_url, events=args.scale_events, repeat=args.repeat,
                                                  claim_jobs=args.claim_jobs, log_dir=bench.log_dir, log=log,
                                                  pack=tuple(dict.fromkeys(args.scale_pack)),
                                                  partition_size=args.scale_partition_size)
        if "qforge" in wanted and "flow" in parts:
            import qf_flow

            results["flow"] = qf_flow.run(args.database_url, jobs=args.claim_jobs, repeat=args.repeat)
    finally:
        bench.drop_all(keep={KEPT_HISTORY})
        load.stop()
    results["machine"]["load_after"] = os.getloadavg()
    results["machine"]["load_1min_during"] = summarize(load.samples)
    results["total_s"] = time.perf_counter() - started
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"{stamp}.json"
    json_path.write_text(json.dumps(results, indent=2, default=str))  # the measurements, whatever follows
    results["goals"] = goals(results)
    json_path.write_text(json.dumps(results, indent=2, default=str))
    print(markdown_table(results))
    if "flow" in results:
        import qf_flow
        print("\n" + qf_flow.markdown(results["flow"]))
    print(f"\n{json_path} ({results['total_s'] / 60:.1f} min); worker logs in {bench.log_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
