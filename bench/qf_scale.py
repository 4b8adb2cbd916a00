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
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import psycopg

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

import qf_history  # noqa: E402
from common import emit, summarize, with_database  # noqa: E402

SCALE_HISTORY = "qf_bench_scale"  # kept with --keep (and reused with --reuse)
REQUESTS = 300  # per read figure and repetition
CATCH_UP_EVENTS = 20_000  # read through the stream per catch-up figure
CURSOR_BACK = 1_000_000


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Api:
    """A `qforge api` process on one database."""

    def __init__(self, url: str, log_dir: Path, name: str):
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = open(log_dir / f"scale-api-{name}.log", "w")
        env = {**os.environ, "PYTHONPATH": str(ROOT), "QFORGE_LOG_LEVEL": "WARNING"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "qforge", "api", "--database-url", url, "--port", str(self.port)],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{self.base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"qforge api did not start (see {self.log.name})")
            time.sleep(0.2)
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
                  REQUESTS) or sample(url, "SELECT value FROM execution_tags WHERE key = 'order' LIMIT %s", REQUESTS)
    rng.shuffle(ids)
    rng.shuffle(tags)
    it_ids, it_tags = iter(ids * 2), iter(tags * 2)

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
        row = conn.execute("SELECT xid::text, position FROM events WHERE position <= greatest("
                           "(SELECT max(position) FROM events) - %s, 0) ORDER BY position DESC LIMIT 1",
                           (CURSOR_BACK,)).fetchone()
        after = 0 if row is None else row[1]
        wanted = min(CATCH_UP_EVENTS, conn.execute("SELECT count(*) FROM (SELECT FROM events WHERE position > %s"
                                                   " LIMIT %s) e", (after, CATCH_UP_EVENTS)).fetchone()[0])
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


def run_scale(admin_url: str, *, events: int, repeat: int, claim_jobs: int, log_dir: Path, log=print,
              reuse: bool = False, keep: bool = False) -> dict[str, Any]:
    jobs = events // 3
    history_url = with_database(admin_url, SCALE_HISTORY)
    generated = _kept_history(history_url, jobs) if reuse else None
    if generated is None:
        log(f"scale: generating {jobs:,} finished jobs ({events:,} events)")
        history_url = qf_history.recreate_database(admin_url, SCALE_HISTORY)
        generated = qf_history.generate_history(history_url, jobs, log=lambda m: None)
        log(f"scale: history generated in {generated['total_s']:.0f}s, events {generated['events_bytes'] / 1e9:.2f} GB")
    with psycopg.connect(history_url, autocommit=True) as conn:
        log(f"scale: next position {conn.execute('SELECT log_next_position()').fetchone()[0]}")
    empty_name = f"qf_bench_scale_empty_{os.getpid()}"
    empty_url = qf_history.recreate_database(admin_url, empty_name)
    apis = {"history": Api(history_url, log_dir, "history"), "empty": Api(empty_url, log_dir, "empty")}
    urls = {"history": history_url, "empty": empty_url}
    rng = random.Random(7)
    raw: dict[str, dict[str, list[float]]] = {"history": {}, "empty": {}}
    try:
        for rep in range(repeat):
            for where in (("empty", "history") if rep % 2 == 0 else ("history", "empty")):
                figures = measure(urls[where], apis[where], rng, rep, where, claim_jobs)
                for key, value in figures.items():
                    raw[where].setdefault(key, []).append(value)
            log("scale rep {}: ".format(rep + 1) + ", ".join(
                f"{k} {raw['history'][k][-1] / raw['empty'][k][-1]:.2f}x" for k in raw["history"]))
    finally:
        for api in apis.values():
            api.close()
    ratios = {key: summarize([h / e for h, e in zip(raw["history"][key], raw["empty"][key])])
              for key in raw["history"]}
    # Drain with and without an archive running on the large log.
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
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{empty_name}" WITH (FORCE)')
        if not keep:  # (a kept one has been archived: --reuse regenerates it)
            admin.execute(f'DROP DATABASE IF EXISTS "{SCALE_HISTORY}" WITH (FORCE)')
    return {
        "events": events, "history": generated, "raw": raw, "ratios": ratios,
        "drain_without_archive": summarize(without), "drain_during_archive": summarize(during) if during else None,
        "drain_ratio": statistics.median(during) / statistics.median(without) if during else None,
        "archive": {"events": archived_events, "seconds": seconds,
                    "events_per_s": archived_events / seconds if seconds else None,
                    "tail_wait_s": archive_tail, "exit": archiver.returncode if archiver else None},
        "bytes_per_event": {"database": size_before / events_before if events_before else None,
                            "archive_raw": archived_raw / archived_events if archived_events else None,
                            "archive_compressed": archived_bytes / archived_events if archived_events else None},
    }


def _kept_history(url: str, jobs: int) -> dict[str, Any] | None:
    """The generation record of a kept, not yet archived, history of this size."""
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute("SELECT record FROM bench_history_meta WHERE jobs = %s AND schema = %s"
                               " AND NOT EXISTS (SELECT FROM archive_segments)",
                               (jobs, qf_history.schema_fingerprint())).fetchone()
    except psycopg.Error:
        return None
    return None if row is None else {**row[0], "reused": True}


def _archive_seconds(output: str) -> float | None:
    import re

    match = re.search(r"events to .* in ([\d.]+) s", output)
    return float(match.group(1)) if match else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", required=True, help="admin URL; databases are created beside it")
    parser.add_argument("--events", type=int, default=50_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--claim-jobs", type=int, default=20_000)
    parser.add_argument("--keep", action="store_true", help="keep the large history (qf_bench_scale)")
    parser.add_argument("--reuse", action="store_true", help="reuse a kept qf_bench_scale of this size")
    parser.add_argument("--out", default=str(BENCH_DIR / "results"))
    args = parser.parse_args()
    log_dir = Path(args.out) / f"scale-{time.strftime('%Y%m%dT%H%M%S')}"
    log_dir.mkdir(parents=True, exist_ok=True)
    result = run_scale(args.database_url, events=args.events, repeat=args.repeat, claim_jobs=args.claim_jobs,
                       log_dir=log_dir, log=lambda m: print(m, file=sys.stderr, flush=True),
                       reuse=args.reuse, keep=args.keep)
    (log_dir / "result.json").write_text(json.dumps(result, indent=1, default=str))
    emit(result)


if __name__ == "__main__":
    main()
