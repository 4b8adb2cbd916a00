"""QForge only: build a large finished history fast, and measure claim throughput against it.

The history is written with set-based SQL, not through the commands: each job
gets its three events (Enqueued, Claimed, Succeeded) and the jobs row those
events fold to, generated side by side from generate_series. The projection
trigger is bypassed for speed (session_replication_role = replica, superuser
only) and the rows are checked against the real fold (job_fold) on a sample,
so the history is what the live path would have written. Ids are UUIDv7 in
the past, as qforge.events.ids makes them, so later inserts land where live ones
would (the right edge of every index).

Run by run.py; also usable alone:
    python bench/qf_history.py --database-url postgresql://postgres@127.0.0.1:5432/postgres --jobs 1000000
"""

from __future__ import annotations

import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import admin_parser, emit, in_turns, load_queries, recreate, summarize, with_database  # noqa: E402
from perf_profile import Recording  # noqa: E402

KEPT_HISTORY = "qf_bench_history"  # the one history run.py keeps (--keep-history) and reuses
HISTORY_CHUNK_JOBS = 500_000  # one transaction each: bounded WAL per commit, visible progress
QUERIES = load_queries(os.path.join(os.path.dirname(os.path.abspath(__file__)), "qf_history.sql"))


def recreate_database(admin_url: str, name: str) -> str:
    """A new, empty, migrated database `name`; its URL."""
    url = recreate(admin_url, name)
    from qforge.migrate import migrate

    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn)
    return url


def schema_fingerprint() -> str:
    """A hash of migrations/*.sql: a kept history is reused only with the very same schema."""
    import hashlib

    from qforge.migrate import load_source

    digest = hashlib.sha256()
    for schema_file in load_source().all():
        digest.update(schema_file.name.encode() + schema_file.checksum.encode())
    return digest.hexdigest()[:16]


def reusable_history(admin_url: str, jobs: int) -> dict[str, Any] | None:
    """The generation record of a kept qf_bench_history of this size and schema, else None."""
    try:
        with psycopg.connect(with_database(admin_url, KEPT_HISTORY), autocommit=True) as conn:
            row = conn.execute("SELECT record FROM bench_history_meta WHERE jobs = %s AND schema = %s",
                               (jobs, schema_fingerprint())).fetchone()
    except psycopg.Error:
        return None
    return None if row is None else {**row[0], "reused": True}


def generate_history(url: str, jobs: int, *, parallel: int = 2, partition_size: int | None = None,
                     log=print) -> dict[str, Any]:
    """Append `jobs` finished jobs (3 events each) and their rows, in partitions of `partition_size`
    positions (default: the schema's); VACUUM ANALYZE; time every phase."""
    started = time.perf_counter()
    base_ms = int(time.time() * 1000) - jobs - 86_400_000  # all in the past, a day before now
    with psycopg.connect(url, autocommit=True) as conn:
        if partition_size:
            conn.execute(QUERIES["history_partition_size"], {"size": partition_size})
        conn.execute(QUERIES["history_id_function"])
        conn.execute(QUERIES["history_partitions"], {"positions": 3 * jobs})
    chunks = [(lo, min(lo + HISTORY_CHUNK_JOBS, jobs)) for lo in range(0, jobs, HISTORY_CHUNK_JOBS)]
    done = [0]
    lock = threading.Lock()

    def write_chunks(my_chunks: list[tuple[int, int]]) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SET session_replication_role = replica")  # no triggers: rows written directly
            for lo, hi in my_chunks:
                params = {"base_ms": base_ms, "lo": lo, "hi": hi}
                with conn.transaction():
                    conn.execute(QUERIES["history_events"], params)
                with lock:
                    done[0] += hi - lo
                    log(f"  history: {done[0]:,}/{jobs:,} jobs after {time.perf_counter() - started:.0f}s")

    # Both cores: PostgreSQL spends the time in row building, index upkeep and WAL.
    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(write_chunks, [chunks[i::parallel] for i in range(parallel)]))
    inserted = time.perf_counter() - started
    from qforge.projections.asof import job_row_as_of
    from qforge.projections.jobs import get_job_row

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(QUERIES["history_counts"])
        sample = [0, jobs // 2, jobs - 1]
        ids = [conn.execute(QUERIES["history_id"], {"ms": base_ms + i, "n": i}).fetchone()[0] for i in sample]
        for job_id in ids:  # the rows written directly are what the fold makes of their events
            if job_row_as_of(conn, job_id, 2**62) != get_job_row(conn, job_id):
                raise RuntimeError(f"generated history does not fold to its rows (job {job_id})")
        # Without this, autovacuum would start on the fresh rows in the middle of the measurement.
        conn.execute("SET maintenance_work_mem = '512MB'")
        conn.execute("VACUUM (ANALYZE) jobs")
        conn.execute("VACUUM (ANALYZE) events")
        sizes = conn.execute(QUERIES["history_sizes"]).fetchone()
    total = time.perf_counter() - started
    with psycopg.connect(url, autocommit=True) as conn:
        size = conn.execute("SELECT partition_size FROM log_settings").fetchone()[0]
        record = {"jobs": jobs, "events": 3 * jobs, "insert_s": inserted, "total_s": total,
                  "events_bytes": sizes[0], "jobs_bytes": sizes[1], "partition_size": size}
        conn.execute("CREATE TABLE bench_history_meta (jobs bigint, schema text, record jsonb)")
        conn.execute("INSERT INTO bench_history_meta VALUES (%s, %s, %s)",
                     (jobs, schema_fingerprint(), Jsonb(record)))
    return record


# --- claim throughput ------------------------------------------------------------------


def enqueue_pending(url: str, count: int) -> None:
    from qforge.commands.enqueue import JobSpec, enqueue

    with psycopg.connect(url, autocommit=True) as conn:
        # The last measurement's claimed jobs are dead entries at the head of the claim index
        # until a vacuum: autovacuum's work in a live system, done here before the timed part. The
        # history side, measured again and again, would otherwise walk more of them each time
        # than the empty side, new each time (measured: 0.95x, 0.88x, 0.87x of empty in three
        # repetitions in a row without this). A plain VACUUM, as autovacuum's: that it cleans
        # the indexes of a table this large is the schema's doing (0027_jobs_index_cleanup.sql;
        # before it, the history side's vacuum skipped them and its claims walked the dead
        # entries of every earlier repetition).
        conn.execute("VACUUM jobs")
        for lo in range(0, count, 1000):
            enqueue(conn, [JobSpec(task="bench_noop") for _ in range(min(1000, count - lo))],
                    actor="bench")
        conn.execute("ANALYZE jobs")
        # The enqueue's dirty pages (and, on the history side, whatever the generation
        # left) are written now, not by a checkpoint in the middle of the timed claims:
        # the figure is about the history's effect on the claim, not about I/O owed.
        conn.execute("CHECKPOINT")


def claim_throughput(url: str, pending: int, *, threads: int = 2, batch: int = 100,
                     complete: bool = False, timeline: list[tuple[float, int]] | None = None) -> dict[str, float]:
    """Claim (and optionally complete) `pending` jobs from `threads` connections in batches; jobs/s.
    `timeline`, when given, gets (time.monotonic(), jobs) for every batch done."""
    enqueue_pending(url, pending)
    barrier = threading.Barrier(threads + 1)
    counts = [0] * threads
    errors: list[BaseException] = []

    server_ns = [0] * threads

    def run(index: int) -> None:
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                name = f"bench-claim-{index}"
                backend = conn.info.backend_pid
                barrier.wait()
                cpu_before = backend_cpu_ns(backend)
                while True:
                    got = claim_batch(conn, batch, name, complete=complete)
                    if not got:
                        break
                    counts[index] += got
                    if timeline is not None:
                        timeline.append((time.monotonic(), got))
                server_ns[index] = backend_cpu_ns(backend) - cpu_before
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            barrier.abort()

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    barrier.wait()
    started = time.perf_counter()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    if sum(counts) != pending:
        raise RuntimeError(f"claimed {sum(counts)} of {pending} jobs")
    return {"jobs": pending, "seconds": elapsed, "jobs_per_s": pending / elapsed,
            "server_cpu_us_per_job": sum(server_ns) / 1e3 / pending if all(server_ns) else None}


def claim_batch(conn: psycopg.Connection, batch: int, name: str, *, complete: bool) -> int:
    """One claim of up to `batch` jobs as a worker claims (and, with `complete`, their completion);
    how many were claimed."""
    from qforge.commands.claim import claim
    from qforge.commands.report import Report, complete as complete_jobs

    jobs = claim(conn, ["default"], batch, name)
    if jobs and complete:
        complete_jobs(conn, [Report(j.id, j.attempt, result=None) for j in jobs], actor=name,
                      workflow_ids_known=True)
    return len(jobs)


def claim_side_by_side(urls: dict[str, str], pending: int, *, threads: int = 2, batch: int = 100,
                       complete: bool = False) -> dict[str, dict[str, float]]:
    """claim_throughput on several databases at once, each holding `pending` pending jobs (see
    enqueue_pending), taking turns round by round: in a round one database's `threads`
    connections each claim (and complete) a batch at once; the databases go one after the other,
    the first alternating. A noisy moment of this machine (its speed swings by a third within a
    minute) then falls on all of them alike, not on whichever ran then. Wall time and server CPU
    are summed per database over its own rounds."""
    conns = {where: [psycopg.connect(url, autocommit=True) for _ in range(threads)] for where, url in urls.items()}
    seconds, counts, server_ns = dict.fromkeys(urls, 0.0), dict.fromkeys(urls, 0), dict.fromkeys(urls, 0)

    def step(conn: psycopg.Connection, name: str) -> int:
        return claim_batch(conn, batch, name, complete=complete)

    names = [f"bench-claim-{i}" for i in range(threads)]
    # With BENCH_PERF_DIR (perf_profile.py): each database's backends are a group of their own.
    recording = Recording("claim-complete" if complete else "claim")
    try:
        with ThreadPoolExecutor(threads) as pool:
            active, turn = list(urls), 0
            while active:
                for where in in_turns(active, turn):
                    pids = [c.info.backend_pid for c in conns[where]]
                    cpu_before, started = sum(map(backend_cpu_ns, pids)), time.perf_counter()
                    got = list(pool.map(step, conns[where], names))
                    seconds[where] += time.perf_counter() - started
                    server_ns[where] += sum(map(backend_cpu_ns, pids)) - cpu_before
                    counts[where] += sum(got)
                    # Done when nothing is pending: a claim passes over rows (and keys) locked by
                    # another claim rather than wait, so an empty one alone does not tell.
                    # (The bench's jobs are plain: the probe walks jobs_claim_plain, not the history.)
                    if not any(got) and not conns[where][0].execute(
                            "SELECT 1 FROM jobs WHERE status = 'pending' AND concurrency_key IS NULL"
                            " AND fairness_key IS NULL LIMIT 1").fetchone():
                        active.remove(where)
                turn += 1
    finally:
        recording.stop(jobs=pending, groups={where: {c.info.backend_pid for c in opened}
                                             for where, opened in conns.items()})
        for opened in conns.values():
            for conn in opened:
                conn.close()
    for where, count in counts.items():
        if count != pending:
            raise RuntimeError(f"{where}: claimed {count} of {pending} jobs")
    return {where: {"jobs": pending, "seconds": seconds[where], "jobs_per_s": pending / seconds[where],
                    "server_cpu_us_per_job": server_ns[where] / 1e3 / pending if server_ns[where] else None}
            for where in urls}


def backend_cpu_ns(pid: int) -> int:
    """CPU time of a server process in ns (/proc/<pid>/schedstat: PostgreSQL on this machine), else 0."""
    try:
        with open(f"/proc/{pid}/schedstat") as stat:
            return int(stat.read().split()[0])
    except OSError:
        return 0


def main() -> None:
    parser = admin_parser(__doc__)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--pending", type=int, default=20_000)
    parser.add_argument("--keep", action="store_true", help="keep the history database")
    args = parser.parse_args()
    url = recreate_database(args.database_url, KEPT_HISTORY)
    history = generate_history(url, args.jobs, log=lambda m: print(m, file=sys.stderr))
    print(history, file=sys.stderr)
    results = {"history": history, "claim": [], "claim_complete": []}
    for _ in range(args.repeat):
        results["claim"].append(claim_throughput(url, args.pending)["jobs_per_s"])
        results["claim_complete"].append(claim_throughput(url, args.pending, complete=True)["jobs_per_s"])
    results["claim"] = summarize(results["claim"])
    results["claim_complete"] = summarize(results["claim_complete"])
    emit(results)
    if not args.keep:
        with psycopg.connect(args.database_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(KEPT_HISTORY)))


if __name__ == "__main__":
    main()
