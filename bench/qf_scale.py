"""The log at scale: the same operations against a database holding a large history and an empty one, side by side.

Run by `bench/run.py --parts scale` (sizes from --scale-events); also alone:
    python bench/qf_scale.py --database-url postgresql://postgres@127.0.0.1:5432/postgres --events 50000000

Each repetition measures, on both databases in alternating order (so a noisy
moment does not always land on one side): enqueue (batches of 1,000),
claim, claim+complete, GET /jobs/{id}/events, tag search (GET /executions?tag=),
GET /queues, and SSE catch-up from a cursor 1M events back (the empty
database: from its start). Then, on the large one: the drain rate while
`qforge archive` runs against the rate without it, archive throughput, and
bytes per event in the database and in the archive.

With --pack, copies of the history with their log packed (qforge.log.pack)
are measured beside the two, in the same turns: `closed` packs every closed
partition and leaves the one being written live, as a deployment's log looks
(--partition-size sets how much that is); `all` closes it first and packs
everything. Bytes per event of the log before and after, and the packing's pace,
are in the result. --only-drain --maintenance pack drains beside `pack` instead
of `qforge archive`.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import psycopg
from psycopg.rows import dict_row

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

import qf_history  # noqa: E402
from common import admin_parser, emit, in_turns, recreate, start_api, summarize, with_database  # noqa: E402

SCALE_HISTORY = "qf_bench_scale"  # kept with --keep (and reused with --reuse)
REQUESTS = 300  # per read figure and repetition
CATCH_UP_EVENTS = 20_000  # read through the stream per catch-up figure
CURSOR_BACK = 1_000_000
WITHOUT_ROUNDS = 3  # drain rounds per repetition without the archive (--only-drain)
BESIDE_ROUNDS = 2  # and just before and just after each archive, on its copy
PACK_MODES = {"closed": False, "all": True}  # --pack MODE: pack(close_current=...)


class Api:
    """A `qforge api` process on one database."""

    def __init__(self, url: str, log_dir: Path, name: str):
        self.log = open(log_dir / f"scale-api-{name}.log", "w")
        self.process, self.base = start_api(url, self.log)
        self.client = httpx.Client(base_url=self.base, timeout=60)

    def close(self) -> None:
        self.client.close()
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=20)
        self.log.close()


def _rate(calls: Callable[[], None], n: int) -> float:
    """Calls per second of `calls` run n times in a row."""
    started = time.perf_counter()
    for _ in range(n):
        calls()
    return n / (time.perf_counter() - started)


def enqueue_rate(url: str, jobs: int, tag_prefix: str) -> float:
    from qforge.commands.enqueue import JobSpec, enqueue

    with psycopg.connect(url, autocommit=True) as conn:
        started = time.perf_counter()
        for lo in range(0, jobs, 1000):
            enqueue(conn, [JobSpec(task="bench_noop", queue="scale-enqueue",
                                   tags={"order": f"{tag_prefix}-{lo + i}"}) for i in range(min(1000, jobs - lo))],
                    actor="bench")
        elapsed = time.perf_counter() - started
        conn.execute("SELECT log_maintain()")
    return jobs / elapsed


def sample(url: str, query: str, n: int) -> list[Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        return [row[0] for row in conn.execute(query, (n,)).fetchall()]


def read_figures(api: Api, url: str, rng: random.Random) -> dict[str, float]:
    """GET /jobs/{id}/events, tag search and GET /queues, requests per second (one client)."""
    ids = sample(url, "SELECT id FROM jobs TABLESAMPLE SYSTEM (1) WHERE status = 'succeeded' LIMIT %s", REQUESTS)
    if len(ids) < REQUESTS:
        ids = sample(url, "SELECT id FROM jobs WHERE status = 'succeeded' LIMIT %s", REQUESTS)
    tags = sample(url, "SELECT value FROM execution_tags TABLESAMPLE SYSTEM (1) WHERE key = 'order' LIMIT %s",
                  REQUESTS)
    if len(tags) < REQUESTS:  # a small table's 1% of pages may hold fewer (the empty database's)
        tags = sample(url, "SELECT value FROM execution_tags WHERE key = 'order' LIMIT %s", REQUESTS)
    rng.shuffle(ids)
    rng.shuffle(tags)
    it_ids, it_tags = itertools.cycle(ids), itertools.cycle(tags)

    def events() -> None:
        response = api.client.get(f"/jobs/{next(it_ids)}/events")
        assert response.status_code == 200, response.text

    def search() -> None:
        response = api.client.get("/executions", params={"tag": f"order:{next(it_tags)}"})
        assert response.status_code == 200 and response.json()["items"], response.text

    def queues() -> None:
        assert api.client.get("/queues").status_code == 200

    return {"job_events_rps": _rate(events, REQUESTS), "tag_search_rps": _rate(search, REQUESTS),
            "queues_rps": _rate(queues, REQUESTS)}


def catch_up_rate(api: Api, url: str) -> float:
    """Events per second read through GET /events/stream from a cursor CURSOR_BACK events back."""
    with psycopg.connect(url, autocommit=True) as conn:
        # (log_tail_cursor: counted in the gapless read's order, through packed blocks too; a
        # cursor taken by position would land in the positions that closing a partition skips.)
        row = conn.execute("SELECT xid::text, position FROM log_tail_cursor(%s)", (CURSOR_BACK,)).fetchone()
        wanted = CATCH_UP_EVENTS if row is not None else min(CATCH_UP_EVENTS, conn.execute(
            "SELECT count(*) FROM (SELECT FROM events LIMIT %s) e", (CATCH_UP_EVENTS,)).fetchone()[0])
    cursor = "0" if row is None else f"{row[0]}-{row[1]}"
    got = 0
    started = time.perf_counter()
    with api.client.stream("GET", "/events/stream", headers={"Last-Event-ID": cursor},
                           timeout=httpx.Timeout(60, read=30)) as response:
        for line in response.iter_lines():
            if line.startswith("data:"):
                got += 1
                if got >= wanted:
                    break
    return got / (time.perf_counter() - started)


def measure(url: str, api: Api, rng: random.Random, rep: int, where: str, claim_jobs: int) -> dict[str, float]:
    # The enqueued jobs wait on a queue of their own: the claims below take 'default'.
    out = {"enqueue_jobs_per_s": enqueue_rate(url, claim_jobs, f"S{rep}{where}")}
    out["claim_jobs_per_s"] = qf_history.claim_throughput(url, claim_jobs)["jobs_per_s"]
    out["claim_complete_jobs_per_s"] = qf_history.claim_throughput(url, claim_jobs, complete=True)["jobs_per_s"]
    out.update(read_figures(api, url, rng))
    out["sse_catch_up_events_per_s"] = catch_up_rate(api, url)
    return out


def drain_rate(url: str, jobs: int) -> float:
    return qf_history.claim_throughput(url, jobs, complete=True)["jobs_per_s"]


def archive_run(url: str, directory: Path, log_path: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "QFORGE_LOG_LEVEL": "WARNING"}
    return subprocess.Popen([sys.executable, "-m", "qforge", "archive", "--close-current", "--to", str(directory),
                             "--database-url", url], stdout=open(log_path, "w"), stderr=subprocess.STDOUT,
                            env=env, start_new_session=True)


# What a maintenance run beside the drain says, in its last line, of the events it moved.
MAINTENANCE_EVENTS = {"archive": r"archived \d+ segment\(s\), ([\d,]+) events",
                      "pack": r"packed \d+ partition\(s\), ([\d,]+) events"}


def maintenance_argv(maintenance: str, url: str, directory: Path, arguments: list[str]) -> list[str]:
    """`qforge archive --close-current` or `qforge pack --close-current` (every partition up
    to now, as beside a drain), with extra `arguments`."""
    python = sys.executable  # '@PYTHON' first among the arguments: another checkout's interpreter
    if arguments and arguments[0].startswith("@"):
        python, arguments = arguments[0][1:], arguments[1:]
    if maintenance == "pack":
        return [python, "-m", "qforge", "pack", "--close-current", "--database-url", url, *arguments]
    return [python, "-m", "qforge", "archive", "--close-current", "--to", str(directory), "--database-url", url,
            *arguments]


class TimedArchive:
    """A maintenance command (maintenance_argv) in its own process, each line of its output
    stamped with time.monotonic() as it comes (where the drain loses time: see drain_phases)."""

    def __init__(self, argv: list[str]):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "QFORGE_LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1"}
        self.started = time.monotonic()
        self.lines: list[tuple[float, str]] = []
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                        start_new_session=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append((time.monotonic(), line.rstrip()))

    def running(self) -> bool:
        return self.process.poll() is None

    def wait(self) -> float:
        self.process.wait(timeout=7200)
        self.reader.join(timeout=10)
        if self.process.returncode != 0:
            raise RuntimeError("maintenance failed: " + " | ".join(line for _, line in self.lines[-5:]))
        return self.lines[-1][0] - self.started if self.lines else time.monotonic() - self.started

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)


def drain_rounds(url: str, jobs: int, keep_going: Callable[[], bool], timeline: list[tuple[float, int]],
                 rounds: int | None = None) -> dict[str, float]:
    """Drain rounds of `jobs` jobs (claim+complete, as drain_rate) while keep_going() (and
    at most `rounds`): jobs/s over the drained time and server CPU per job. With an
    archive running, only rounds it ran through all along count."""
    done, seconds, cpu_us, n = 0, 0.0, 0.0, 0
    while (rounds is None or n < rounds) and keep_going():
        # What the monitor's leader does on every tick: without it, a long archive's
        # drain ran past the partitions made ahead ("no partition ... found for row").
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT log_maintain()")
        mark = len(timeline)
        figures = qf_history.claim_throughput(url, jobs, complete=True, timeline=timeline)
        if not keep_going():
            del timeline[mark:]
            break
        done, seconds, n = done + figures["jobs"], seconds + figures["seconds"], n + 1
        cpu_us += (figures["server_cpu_us_per_job"] or 0) * figures["jobs"]
    return {"rounds": n, "jobs": done, "jobs_per_s": done / seconds if seconds else None,
            "server_cpu_us_per_job": cpu_us / done if done else None}


def drain_phases(archive: TimedArchive, timeline: list[tuple[float, int]]) -> list[dict[str, Any]]:
    """The drain's rate between consecutive lines of the archive's output (what it did then)."""
    edges = [(archive.started, "start")] + archive.lines
    phases = []
    for (begin, _), (end, what) in zip(edges, edges[1:]):
        jobs = sum(n for at, n in timeline if begin <= at < end)
        phases.append({"until": what[:80], "seconds": round(end - begin, 2), "drain_jobs_per_s": round(jobs / (end - begin))
                       if end > begin else None})
    return phases


def run_drain(admin_url: str, *, events: int, repeat: int, claim_jobs: int, log_dir: Path, name: str,
              variants: dict[str, list[str]], log=print, reuse: bool = False, maintenance: str = "archive",
              partition_size: int | None = None) -> dict[str, Any]:
    """The drain rate while `qforge archive` (or `pack`: maintenance) runs against without
    it, alone: each repetition drains a fresh copy of one history (CREATE DATABASE ...
    TEMPLATE) without an archive, and for each variant (extra arguments of `qforge
    archive`) a fresh copy while that archive runs, the order rotating from one repetition
    to the next. The archive's drain counts every round drained while the archive ran, so
    every step of the archive (writing, read-back, release, detach, drop) weighs in; it is
    compared with as many rounds drained on a fresh copy without an archive
    (drain_ratio_matched: like for like, the database growing alike), with a few rounds on
    a fresh copy (drain_ratio), and with rounds just before and after it on its own copy
    (drain_ratio_beside). A pack is measured alike, its figures under `pack` in the keys."""
    jobs = events // 3
    template_url, generated = _history(admin_url, name, jobs, reuse=reuse, log=log, label="drain",
                                       partition_size=partition_size)
    copy = f"{name}_copy"
    copy_url = with_database(admin_url, copy)
    sides = ["without", *variants]
    figures: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    archives: dict[str, list[dict[str, Any]]] = {side: [] for side in variants}
    for rep in range(repeat):
        for side in sides[rep % len(sides):] + sides[:rep % len(sides)]:
            recreate(admin_url, copy, name, file_copy=True)
            if side == "without":
                figures[side].append(drain_rounds(copy_url, claim_jobs, lambda: True, [], rounds=WITHOUT_ROUNDS))
                continue
            directory = Path(tempfile.mkdtemp(prefix="qf-drain-archive-", dir=str(log_dir)))
            timeline: list[tuple[float, int]] = []
            # Its own baseline too, drained just before and just after it on the same copy:
            # the machine is shared, and its pace changes over minutes.
            before = drain_rounds(copy_url, claim_jobs, lambda: True, [], rounds=BESIDE_ROUNDS)
            archive = TimedArchive(maintenance_argv(maintenance, copy_url, directory, variants[side]))
            try:
                figures[side].append(drain_rounds(copy_url, claim_jobs, archive.running, timeline))
                seconds = archive.wait()
            finally:
                archive.kill()
                shutil.rmtree(directory, ignore_errors=True)
            after = drain_rounds(copy_url, claim_jobs, lambda: True, [], rounds=BESIDE_ROUNDS)
            during = figures[side][-1]
            during["beside_jobs_per_s"] = (before["jobs_per_s"] + after["jobs_per_s"]) / 2
            during["beside_ratio"] = during["jobs_per_s"] / during["beside_jobs_per_s"]
            # Like for like: as many rounds again on a fresh copy without an archive. Every
            # round adds its jobs to the database, so a drain beside a slow archive runs on
            # a bigger jobs table, on average, than a few rounds on a fresh copy do.
            recreate(admin_url, copy, name, file_copy=True)
            matched = drain_rounds(copy_url, claim_jobs, lambda: True, [], rounds=during["rounds"])
            during["matched_jobs_per_s"] = matched["jobs_per_s"]
            during["matched_ratio"] = during["jobs_per_s"] / matched["jobs_per_s"]
            total = sum(int(m.group(1).replace(",", "")) for _, line in archive.lines
                        if (m := re.search(MAINTENANCE_EVENTS[maintenance], line)))
            archives[side].append({"seconds": seconds, "events": total, "events_per_s": total / seconds,
                                   "phases": drain_phases(archive, timeline)})
            log(f"  {side}: {during['jobs_per_s'] or 0:.0f} jobs/s during the {maintenance}"
                f" ({during['matched_ratio']:.2f}x of as many rounds without it, {during['matched_jobs_per_s']:.0f};"
                f" {during['beside_ratio']:.2f}x of just before+after);"
                f" {archive.lines[-1][1] if archive.lines else ''}")
        line = [f"drain rep {rep + 1}: without {figures['without'][-1]['jobs_per_s']:.0f} jobs/s"
                f" ({figures['without'][-1]['server_cpu_us_per_job']:.0f} us/job)"]
        for side in variants:
            got, run = figures[side][-1], archives[side][-1]
            line.append(f"{side} {got['jobs_per_s'] or 0:.0f} jobs/s"
                        f" ({got['matched_ratio']:.2f}x of as many rounds without it;"
                        f" {(got['jobs_per_s'] or 0) / figures['without'][-1]['jobs_per_s']:.2f}x;"
                        f" {got['beside_ratio']:.2f}x of {got['beside_jobs_per_s']:.0f} jobs/s just before+after,"
                        f" {got['server_cpu_us_per_job'] or 0:.0f} us/job, {got['rounds']} rounds;"
                        f" {maintenance} {run['events_per_s']:,.0f} events/s in {run['seconds']:.1f}s)")
        log("; ".join(line))
        for side in variants:
            for phase in archives[side][-1]["phases"]:
                log(f"    {side}: {phase['seconds']:6.1f}s drain {phase['drain_jobs_per_s']} jobs/s"
                    f" until: {phase['until']}")
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{copy}" WITH (FORCE)')
    rates = {side: [f["jobs_per_s"] for f in figures[side]] for side in sides}
    return {
        "events": events, "history": generated, "claim_jobs": claim_jobs, "variants": variants,
        "maintenance": maintenance,
        f"drain_without_{maintenance}": summarize(rates["without"]),
        f"drain_during_{maintenance}": {side: summarize(rates[side]) for side in variants},
        "drain_ratio": {side: summarize([d / w if d and w else None for d, w in zip(rates[side], rates["without"])])
                        for side in variants},
        # the drain during each archive against as many rounds on a fresh copy without it
        "drain_ratio_matched": {side: summarize([f["matched_ratio"] for f in figures[side]]) for side in variants},
        # the drain during each archive against the mean of its own before and after
        "drain_ratio_beside": {side: summarize([f["beside_ratio"] for f in figures[side]]) for side in variants},
        "server_cpu_us_per_job": {side: summarize([f["server_cpu_us_per_job"] for f in figures[side]])
                                  for side in sides},
        f"{maintenance}_events_per_s": {side: summarize([a["events_per_s"] for a in archives[side]])
                                        for side in variants},
        f"{maintenance}_runs": archives,
    }


def run_scale(admin_url: str, *, events: int, repeat: int, claim_jobs: int, log_dir: Path, log=print,
              reuse: bool = False, keep: bool = False, name: str = SCALE_HISTORY, pack: tuple[str, ...] = (),
              partition_size: int | None = None, archive: bool = True) -> dict[str, Any]:
    jobs = events // 3
    history_url, generated = _history(admin_url, name, jobs, reuse=reuse, log=log, label="scale",
                                      partition_size=partition_size)
    with psycopg.connect(history_url, autocommit=True) as conn:
        log(f"scale: next position {conn.execute('SELECT log_next_position()').fetchone()[0]}; partitions "
            + ", ".join(f"[{lo}, {hi})" for lo, hi in conn.execute("SELECT lower, upper FROM log_partitions()")))
    # The packed copies first: a copy wants its template without connections.
    urls, packing = {}, {}
    dropped = {"empty": f"{name}_empty_{os.getpid()}"}  # what is dropped at the end (the history unless keep)
    for mode in pack:
        side = "packed" if mode == "closed" else f"packed_{mode}"
        dropped[side] = f"{name}_{side}"
        urls[side], packing[side] = packed_copy(admin_url, name, dropped[side], close_current=PACK_MODES[mode],
                                                log=log)
    urls = {"empty": qf_history.recreate_database(admin_url, dropped["empty"]), "history": history_url, **urls}
    apis = {where: Api(url, log_dir, where) for where, url in urls.items()}
    rng = random.Random(7)
    raw: dict[str, dict[str, list[float]]] = {where: {} for where in urls}
    try:
        for rep in range(repeat):
            for where in in_turns(list(urls), rep):
                figures = measure(urls[where], apis[where], rng, rep, where, claim_jobs)
                for key, value in figures.items():
                    raw[where].setdefault(key, []).append(value)
            for where in list(urls)[1:]:
                log(f"scale rep {rep + 1}, {where}: " + ", ".join(
                    f"{k} {raw[where][k][-1] / raw['empty'][k][-1]:.2f}x" for k in raw[where]))
    finally:
        for api in apis.values():
            api.close()

    def ratios_of(top: str, bottom: str) -> dict[str, dict[str, Any]]:
        return {key: summarize([t / b for t, b in zip(raw[top][key], raw[bottom][key])]) for key in raw[top]}

    result = {"events": events, "history": generated, "raw": raw, "ratios": ratios_of("history", "empty")}
    if packing:
        result.update({
            "pack": packing,
            # each packed copy against the empty database, and against the history unpacked
            "packed_ratios": {side: ratios_of(side, "empty") for side in packing},
            "packed_over_unpacked": {side: ratios_of(side, "history") for side in packing},
        })
    with psycopg.connect(admin_url, autocommit=True) as admin:
        for database in dropped.values():
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    if archive:
        result.update(archive_beside_drain(history_url, repeat=repeat, claim_jobs=claim_jobs, log_dir=log_dir,
                                           log=log))
    if not keep:  # (a kept one that has been archived: --reuse regenerates it)
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return result


def packed_copy(admin_url: str, template: str, name: str, *, close_current: bool, log=print
                ) -> tuple[str, dict[str, Any]]:
    """A copy of the history with its log packed by qforge.log.pack (every closed partition,
    and with close_current the one being written too); its URL and what packing did: events,
    seconds, events/s, and bytes per event of the log before and after."""
    from qforge.log.pack import pack

    url = recreate(admin_url, name, template, file_copy=True)
    with psycopg.connect(url, autocommit=True) as conn:
        before = log_sizes(conn)
        done = pack(conn, close_current=close_current)
        # As after generating the history: autovacuum would otherwise come in the middle
        # of the measurement (and the planner would know nothing of the blocks).
        conn.execute("VACUUM (ANALYZE) events_packed")
        after = log_sizes(conn)
    figures = {"close_current": close_current, "partitions": len(done.partitions), "events": done.events,
               "seconds": done.seconds, "events_per_s": done.events / done.seconds if done.seconds else None,
               "finish_tries": done.finish_tries, "sizes_before": before, "sizes_after": after,
               "bytes_per_event": {"before": before["bytes_per_event"], "after": after["bytes_per_event"],
                                   "packed": after["packed_bytes"] / after["packed_events"]
                                   if after["packed_events"] else None}}
    log(f"scale: {name}: packed {done.events:,} events of {len(done.partitions)} partition(s) in"
        f" {done.seconds:.1f} s ({figures['events_per_s'] or 0:,.0f} events/s); bytes per event of the log"
        f" {before['bytes_per_event']:.0f} -> {after['bytes_per_event']:.0f}"
        f" (packed blocks alone: {figures['bytes_per_event']['packed'] or 0:.0f})")
    return url, figures


def log_sizes(conn: psycopg.Connection) -> dict[str, Any]:
    """Bytes and events of the log, live and packed (qf_history.sql log_sizes), and bytes per event."""
    with conn.cursor(row_factory=dict_row) as cur:
        sizes = cur.execute(qf_history.QUERIES["log_sizes"]).fetchone()
    events = sizes["live_events"] + sizes["packed_events"]
    return {**sizes, "bytes_per_event": (sizes["live_bytes"] + sizes["packed_bytes"]) / events if events else None}


def archive_beside_drain(history_url: str, *, repeat: int, claim_jobs: int, log_dir: Path, log=print
                         ) -> dict[str, Any]:
    """Drain with and without an archive running on the large log; the archive's pace and bytes."""
    directory = Path(tempfile.mkdtemp(prefix="qf-scale-archive-", dir=str(log_dir)))
    with psycopg.connect(history_url, autocommit=True) as conn:
        size_before = conn.execute(qf_history.QUERIES["history_sizes"]).fetchone()[0]
        events_before = conn.execute("SELECT count(*) FROM events").fetchone()[0]
        log(f"scale: {events_before:,} events in the log before the archive; partitions "
            + ", ".join(f"[{lo}, {hi})" for lo, hi in conn.execute("SELECT lower, upper FROM log_partitions()"))
            + f"; next position {conn.execute('SELECT log_next_position()').fetchone()[0]}")
    without, during = [], []
    archiver = None
    try:
        for rep in range(repeat):
            without.append(drain_rate(history_url, claim_jobs))
            if archiver is None:
                archiver = archive_run(history_url, directory, log_dir / "scale-archive.log")
                time.sleep(3)  # past closing and settling: into writing segments
            if archiver.poll() is None:
                during.append(drain_rate(history_url, claim_jobs))
        started = time.perf_counter()
        archiver.wait(timeout=7200)
        archive_tail = time.perf_counter() - started
    finally:
        if archiver is not None and archiver.poll() is None:
            os.killpg(archiver.pid, signal.SIGKILL)
    output = (log_dir / "scale-archive.log").read_text()
    manifests = [json.loads(p.read_text()) for p in directory.glob("*.manifest.json")]
    archived_events = sum(m["events"] for m in manifests)
    archived_raw = sum(m["raw_bytes"] for m in manifests)
    archived_bytes = sum(m["bytes"] for m in manifests)
    seconds = _archive_seconds(output)
    shutil.rmtree(directory, ignore_errors=True)
    return {
        "drain_without_archive": summarize(without), "drain_during_archive": summarize(during) if during else None,
        "drain_ratio": statistics.median(during) / statistics.median(without) if during else None,
        "archive": {"events": archived_events, "seconds": seconds,
                    "events_per_s": archived_events / seconds if seconds else None,
                    "tail_wait_s": archive_tail, "exit": archiver.returncode if archiver else None},
        "bytes_per_event": {"database": size_before / events_before if events_before else None,
                            "archive_raw": archived_raw / archived_events if archived_events else None,
                            "archive_compressed": archived_bytes / archived_events if archived_events else None},
    }


def _variants(given: list[str], maintenance: str = "archive") -> dict[str, list[str]]:
    variants = {}
    for text in given or [f"{maintenance}="]:
        name, sep, arguments = text.partition("=")
        if not sep or not name or name == "without" or name in variants:
            raise SystemExit(f"--archive-variant NAME=ARGS, NAME unique and not 'without': {text!r}")
        variants[name] = arguments.split()
    return variants


def _history(admin_url: str, name: str, jobs: int, *, reuse: bool, log, label: str,
             partition_size: int | None = None) -> tuple[str, dict[str, Any]]:
    """(URL, generation record) of a history of `jobs` finished jobs in database `name`, in
    partitions of `partition_size` positions (default: the schema's): with reuse, the kept one,
    upgraded to this checkout's schema (the functions it is measured with); else a new one."""
    url = with_database(admin_url, name)
    generated = _kept_history(url, jobs, any_schema=True, partition_size=partition_size) if reuse else None
    if generated is None:
        log(f"{label}: generating {jobs:,} finished jobs ({3 * jobs:,} events) in {name}")
        url = qf_history.recreate_database(admin_url, name)
        generated = qf_history.generate_history(url, jobs, partition_size=partition_size, log=lambda m: None)
        log(f"{label}: history generated in {generated['total_s']:.0f}s, events {generated['events_bytes'] / 1e9:.2f} GB")
    else:
        from qforge.migrate import migrate

        with psycopg.connect(url, autocommit=True) as conn:
            migrate(conn)
        log(f"{label}: reusing the kept history of {jobs:,} jobs in {name}")
    return url, generated


def _kept_history(url: str, jobs: int, *, any_schema: bool = False,
                  partition_size: int | None = None) -> dict[str, Any] | None:
    """The generation record of a kept, not yet archived, history of this size (made
    with this schema, unless any_schema: the caller migrates it; and partitions of this
    size, if given)."""
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute("SELECT record FROM bench_history_meta WHERE jobs = %s AND (%s OR schema = %s)"
                               " AND NOT EXISTS (SELECT FROM archive_segments)"
                               " AND (%s::bigint IS NULL OR %s = (SELECT partition_size FROM log_settings))",
                               (jobs, any_schema, qf_history.schema_fingerprint(), partition_size,
                                partition_size)).fetchone()
    except psycopg.Error:
        return None
    return None if row is None else {**row[0], "reused": True}


def _archive_seconds(output: str) -> float | None:
    match = re.search(r"events to .* in ([\d.]+) s", output)
    return float(match.group(1)) if match else None


def main() -> None:
    parser = admin_parser(__doc__)
    parser.add_argument("--events", type=int, default=50_000_000)
    parser.add_argument("--claim-jobs", type=int, default=20_000)
    parser.add_argument("--keep", action="store_true", help="keep the large history (--history-name)")
    parser.add_argument("--reuse", action="store_true", help="reuse a kept history of this size (--history-name)")
    parser.add_argument("--partition-size", type=int, default=None,
                        help="positions per partition of the log in a newly generated history (default: the"
                             " schema's, 10M); with --reuse, a kept one is reused only if its size is this")
    parser.add_argument("--pack", action="append", default=[], choices=sorted(PACK_MODES),
                        help="also measure a copy of the history with its log packed: 'closed' (every closed"
                             " partition; the one being written stays live) or 'all' (that one closed and"
                             " packed too); repeatable")
    parser.add_argument("--no-archive", action="store_true",
                        help="leave out the drain beside `qforge archive` on the large history")
    parser.add_argument("--out", default=str(BENCH_DIR / "results"))
    parser.add_argument("--only-drain", action="store_true",
                        help="only the drain with and without `qforge archive` (each repetition archives a fresh"
                             " copy of the history, kept in --history-name, reused with --reuse)")
    parser.add_argument("--history-name", default=None,
                        help=f"the database holding the history (default {SCALE_HISTORY}; with --only-drain"
                             f" {SCALE_HISTORY}_drain)")
    parser.add_argument("--maintenance", choices=("archive", "pack"), default="archive",
                        help="with --only-drain: drain beside `qforge archive --close-current` or beside"
                             " `qforge pack --close-current` (--archive-variant gives either its arguments)")
    parser.add_argument("--archive-variant", action="append", default=[], metavar="NAME=ARGS",
                        help="with --only-drain: an archive to drain beside, as extra `qforge archive` arguments"
                             " (e.g. 'full=--duty 1 --nice 0'; '@PYTHON' first: run by that interpreter, e.g."
                             " another checkout's venv); repeatable; default: one, with no extra arguments")
    args = parser.parse_args()
    log_dir = Path(args.out) / f"scale-{time.strftime('%Y%m%dT%H%M%S')}"
    log_dir.mkdir(parents=True, exist_ok=True)
    if args.only_drain:
        result = run_drain(args.database_url, events=args.events, repeat=args.repeat, claim_jobs=args.claim_jobs,
                           log_dir=log_dir, name=args.history_name or SCALE_HISTORY + "_drain", reuse=args.reuse,
                           variants=_variants(args.archive_variant, args.maintenance),
                           maintenance=args.maintenance, partition_size=args.partition_size,
                           log=lambda m: print(m, file=sys.stderr, flush=True))
        (log_dir / "result.json").write_text(json.dumps(result, indent=1, default=str))
        emit(result)
        return
    result = run_scale(args.database_url, events=args.events, repeat=args.repeat, claim_jobs=args.claim_jobs,
                       log_dir=log_dir, log=lambda m: print(m, file=sys.stderr, flush=True),
                       reuse=args.reuse, keep=args.keep, name=args.history_name or SCALE_HISTORY,
                       pack=tuple(dict.fromkeys(args.pack)), partition_size=args.partition_size,
                       archive=not args.no_archive)
    (log_dir / "result.json").write_text(json.dumps(result, indent=1, default=str))
    emit(result)


if __name__ == "__main__":
    main()
