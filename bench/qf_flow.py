"""QForge flow control: what concurrency keys, rate limits and fairness keys cost the claim, and
whether fairness and rate limits hold under real workers.

Parts (run.py --parts flow runs them all; also usable alone):
  claim     claim+complete throughput and PostgreSQL CPU per job: plain jobs, jobs with
            concurrency keys (limits far above the drain), a queue rate-limited far above
            the drain, jobs with fairness keys; each variant in its own fresh database, the
            four claimed in turns, batch round by batch round
  fairness  key A: 100,000 jobs queued first; key B: 1 job/s; B's enqueue-to-start p99,
            against B alone on an empty queue (real `qforge worker` processes; --slots 1,500
            runs it with workers of 1 and of 500 slots)
  rate      a queue limited to 50/s drained by 3 worker processes: claims per second over 60 s

    python bench/qf_flow.py --database-url postgresql://postgres@127.0.0.1:5432/postgres --parts claim

--baseline-tree DIR (a checkout of another version, e.g. `git archive <main> | tar -x -C DIR`) adds
the claim variant plain@base: plain jobs in a database migrated with DIR's schema, claimed in the
same turns as the others (the claim's statement is this tree's; the bench checks that DIR's
job_claim_plain is the same text, so the variant measures that version's plain claim).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
from common import admin_parser, percentile, summarize  # noqa: E402
from qf_history import backend_cpu_ns, claim_side_by_side, recreate_database  # noqa: E402

VARIANTS = ("plain", "keys", "rate", "fair")
BASELINE = "plain@base"
BASELINE_TREE: Path | None = None  # --baseline-tree
KEYS = 20  # distinct concurrency / fairness keys in the claim variants
# Scratch databases are PREFIX_<variant> (--db-prefix: engineers sharing one server must not drop
# each other's databases).
DB_PREFIX = "qf_bench_flow16"


def _specs(variant: str, count: int) -> list:
    from qforge.commands.enqueue import JobSpec

    if variant == "keys":
        return [JobSpec(task="bench_noop", concurrency_key=f"k{n % KEYS}", concurrency_limit=100_000)
                for n in range(count)]
    if variant == "fair":
        return [JobSpec(task="bench_noop", fairness_key=f"tenant-{n % KEYS}") for n in range(count)]
    return [JobSpec(task="bench_noop") for _ in range(count)]


def _fill(admin_url: str, variant: str, jobs: int) -> str:
    """A fresh database holding `jobs` pending jobs of one variant (and, for "rate", the queue's limit)."""
    url = _database(admin_url, f"{DB_PREFIX}_{variant.replace('@', '_')}", variant)
    with psycopg.connect(url, autocommit=True) as conn:
        _load(conn, variant, jobs)
    return url


def _load(conn: psycopg.Connection, variant: str, jobs: int) -> None:
    """`jobs` pending jobs of one variant (and, for "rate", the queue's limit), analyzed, checkpointed."""
    from qforge.commands.enqueue import enqueue

    for lo in range(0, jobs, 1000):
        enqueue(conn, _specs(variant, min(1000, jobs - lo)), actor="bench")
    if variant == "rate":
        from qforge.commands.queues import QueueSettingsSpec, configure_queue
        configure_queue(conn, "default", QueueSettingsSpec(rate_per_second=1_000_000, burst=1_000_000))
    conn.execute("ANALYZE jobs")
    conn.execute("CHECKPOINT")


def _database(admin_url: str, name: str, variant: str) -> str:
    """A fresh migrated database: with this tree's schema, or for plain@base with the baseline's."""
    if variant != BASELINE:
        return recreate_database(admin_url, name)
    from common import recreate
    from qforge.migrate import load_source, migrate

    if BASELINE_TREE is None:
        raise SystemExit(f"{BASELINE} needs --baseline-tree")
    url = recreate(admin_url, name)
    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn, load_source(BASELINE_TREE / "migrations", state_machine=True))
    return url


def same_plain_claim(tree: Path) -> bool:
    """Whether `tree`'s plain claim (job_claim_plain and what it includes) is this tree's, text for text."""
    import re

    from qforge.sql import QUERIES

    text = (tree / "app" / "sql" / "jobs.sql").read_text()
    theirs = dict(re.findall(r"^-- name: (\w+)\n(.*?)(?=^-- name: |\Z)", text, re.S | re.M))
    return all(theirs.get(name, "").strip() == _raw(name).strip()
               for name in ("job_claim_plain", "job_claim_record", "job_claim_plan")) and bool(QUERIES)


def _raw(name: str) -> str:
    import re

    text = (Path(__file__).resolve().parents[1] / "app" / "sql" / "jobs.sql").read_text()
    return dict(re.findall(r"^-- name: (\w+)\n(.*?)(?=^-- name: |\Z)", text, re.S | re.M))[name]


def claim_variants(admin_url: str, variants: tuple[str, ...], jobs: int) -> dict[str, dict[str, float]]:
    """Claim and complete `jobs` jobs of each variant from 2 connections each, in batches of 100, the
    variants' databases taking turns batch round by batch round (qf_history.claim_side_by_side)."""
    urls = {variant: _fill(admin_url, variant, jobs) for variant in variants}
    done = threading.Event()

    def monitor(url: str) -> None:
        """What `qforge monitor` does every tick for concurrency keys (every variant runs it)."""
        with psycopg.connect(url, autocommit=True) as conn:
            while not done.wait(1.0):
                conn.execute("SELECT concurrency_compact()")

    compactors = [threading.Thread(target=monitor, args=(url,)) for url in urls.values()]
    for compactor in compactors:
        compactor.start()
    try:
        measured = claim_side_by_side(urls, jobs, complete=True)
    finally:
        done.set()
        for compactor in compactors:
            compactor.join()
        with psycopg.connect(admin_url, autocommit=True) as admin:
            for variant in variants:
                admin.execute(f'DROP DATABASE IF EXISTS "{DB_PREFIX}_{variant.replace("@", "_")}" WITH (FORCE)')
    return {variant: {"jobs_per_s": figures["jobs_per_s"],
                      "postgres_cpu_us_per_job": figures["server_cpu_us_per_job"]}
            for variant, figures in measured.items()}


def claim_cpu(admin_url: str, variant: str, jobs: int, *, batch: int = 100) -> dict[str, float]:
    """PostgreSQL CPU per claim statement: one connection claims `jobs` jobs, `batch` a claim
    (no completions: only the claim's own cost). Runs against any QForge version for "plain"."""
    from qforge.commands.claim import claim

    url = recreate_database(admin_url, f"{DB_PREFIX}_cpu_{variant}")
    with psycopg.connect(url, autocommit=True) as conn:
        _load(conn, variant, jobs)
        backend = conn.info.backend_pid
        claims, claimed = 0, 0
        before, started = backend_cpu_ns(backend), time.perf_counter()
        while claimed < jobs:
            got = len(claim(conn, ["default"], batch, "bench"))
            if not got:
                raise RuntimeError(f"{variant}: claimed {claimed} of {jobs} jobs")
            claimed += got
            claims += 1
        cpu_ns, elapsed = backend_cpu_ns(backend) - before, time.perf_counter() - started
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{DB_PREFIX}_cpu_{variant}" WITH (FORCE)')
    return {"postgres_cpu_us_per_claim": cpu_ns / 1000 / claims, "ms_per_claim": elapsed * 1000 / claims,
            "claims": claims}


def run_claim(admin_url: str, jobs: int, repeat: int, variants: tuple[str, ...] = VARIANTS) -> dict[str, Any]:
    raw: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    for rep in range(repeat):
        for variant, figures in claim_variants(admin_url, variants, jobs).items():
            raw[variant].append(figures)
            print(f"claim rep {rep + 1} {variant}: {figures['jobs_per_s']:,.0f} jobs/s, "
                  f"{figures['postgres_cpu_us_per_job']:.1f} us PG CPU/job", file=sys.stderr)
    out: dict[str, Any] = {"jobs": jobs}
    for variant in variants:
        out[variant] = {"jobs_per_s": summarize([r["jobs_per_s"] for r in raw[variant]]),
                        "postgres_cpu_us_per_job": summarize([r["postgres_cpu_us_per_job"] for r in raw[variant]])}
        if variant != "plain" and "plain" in raw:
            out[variant]["ratio_to_plain"] = statistics.median(
                r["jobs_per_s"] / p["jobs_per_s"] for r, p in zip(raw[variant], raw["plain"]))
    if BASELINE in raw and "plain" in raw:
        # this tree's plain claim against the baseline's, PostgreSQL CPU per job (> 1: costs more)
        out["plain"]["cpu_ratio_to_base"] = statistics.median(
            p["postgres_cpu_us_per_job"] / b["postgres_cpu_us_per_job"] for p, b in zip(raw["plain"], raw[BASELINE]))
        out["plain"]["same_claim_statement_as_base"] = same_plain_claim(BASELINE_TREE)
    return out


# --------------------------------------------------------------------------- with real workers

def _worker(url: str, name: str, queues: str = "default", concurrency: int = 8) -> subprocess.Popen:
    qforge = Path(sys.executable).parent / "qforge"
    env = {**os.environ, "PYTHONPATH": str(BENCH_DIR), "QFORGE_LOG_LEVEL": "WARNING"}
    return subprocess.Popen([str(qforge), "worker", "--database-url", url, "--queues", queues,
                             "--concurrency", str(concurrency), "--tasks", "qf_tasks", "--name", name],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def _b_latencies(url: str, backlog: int, samples: int, slots: int = 8, workers: int = 2) -> dict[str, Any]:
    """Enqueue `backlog` jobs of key A, then one job of key B a second; B's enqueue-to-claim seconds."""
    from qforge.commands.enqueue import JobSpec, enqueue

    with psycopg.connect(url, autocommit=True) as conn:
        for lo in range(0, backlog, 1000):
            enqueue(conn, [JobSpec(task="bench_noop", fairness_key="A") for _ in range(min(1000, backlog - lo))],
                    actor="bench")
        conn.execute("ANALYZE jobs")
        workers = [_worker(url, f"fair-{n}", concurrency=slots) for n in range(workers)]
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and conn.execute(
                    "SELECT count(*) FROM workers WHERE status = 'running'").fetchone()[0] < len(workers):
                time.sleep(0.1)  # both workers serve (and, with a backlog, drain A) before B starts
            time.sleep(1)
            ids = []
            for _ in range(samples):
                ids.append(enqueue(conn, [JobSpec(task="bench_noop", fairness_key="B")], actor="bench")[0].id)
                time.sleep(1)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and conn.execute(
                    "SELECT count(*) FROM jobs WHERE id = ANY(%s) AND status <> 'succeeded'", [ids]).fetchone()[0]:
                time.sleep(0.2)
            rows = conn.execute(
                "SELECT extract(epoch FROM c.occurred_at - e.occurred_at) FROM events e"
                "  JOIN events c ON c.stream_id = e.stream_id AND c.type = 'Claimed' AND c.version = 2"
                " WHERE e.stream_id = ANY(%s) AND e.version = 1", [ids]).fetchall()
            a_left = conn.execute("SELECT count(*) FROM jobs WHERE fairness_key = 'A' AND status = 'pending'"
                                  ).fetchone()[0]
        finally:
            _stop(workers)
    return {"latencies_ms": [float(r[0]) * 1000 for r in rows], "a_still_pending_at_end": a_left}


def _latency_figures(latencies_ms: list[float]) -> dict[str, float]:
    return {"samples": len(latencies_ms), "p50_ms": statistics.median(latencies_ms),
            "p99_ms": percentile(sorted(latencies_ms), 0.99), "max_ms": max(latencies_ms)}


def run_fairness(admin_url: str, backlog: int, samples: int, repeat: int, slots: int = 8,
                 workers: int = 2) -> dict[str, Any]:
    """`repeat` rounds of B's `samples` jobs on an empty queue and behind A's backlog. A p99 of 100
    samples is their second largest, so the figures pool the rounds' samples (p99 of repeat x samples
    per case); each round's own ratio is kept beside them."""
    cases: dict[str, list[float]] = {"empty": [], "loaded": []}
    rounds = []
    for _ in range(repeat):
        got = {case: _b_latencies(recreate_database(admin_url, f"{DB_PREFIX}_fair_{case}"),
                                  backlog if case == "loaded" else 0, samples, slots, workers)
               for case in ("empty", "loaded")}
        for case, answer in got.items():
            cases[case] += answer["latencies_ms"]
        fig = {case: _latency_figures(answer["latencies_ms"]) for case, answer in got.items()}
        rounds.append({"empty_p99_ms": fig["empty"]["p99_ms"], "loaded_p99_ms": fig["loaded"]["p99_ms"],
                       "p99_ratio": fig["loaded"]["p99_ms"] / max(fig["empty"]["p99_ms"], 1e-9),
                       "a_still_pending_at_end": got["loaded"]["a_still_pending_at_end"]})
    with psycopg.connect(admin_url, autocommit=True) as admin:
        for name in (f"{DB_PREFIX}_fair_empty", f"{DB_PREFIX}_fair_loaded"):
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    empty, loaded = _latency_figures(cases["empty"]), _latency_figures(cases["loaded"])
    return {"backlog_of_a": backlog, "workers": workers, "slots": slots, "empty": empty, "loaded": loaded,
            "rounds": rounds,
            "p99_ratio": loaded["p99_ms"] / max(empty["p99_ms"], 1e-9)}


def run_rate(admin_url: str, rate: float, seconds: float) -> dict[str, Any]:
    from qforge.commands.enqueue import JobSpec, enqueue
    from qforge.commands.queues import QueueSettingsSpec, configure_queue

    url = recreate_database(admin_url, f"{DB_PREFIX}_rate")
    total = int(rate * (seconds + 20))
    with psycopg.connect(url, autocommit=True) as conn:
        for lo in range(0, total, 1000):
            enqueue(conn, [JobSpec(task="bench_noop", queue="limited") for _ in range(min(1000, total - lo))],
                    actor="bench")
        configure_queue(conn, "limited", QueueSettingsSpec(rate_per_second=rate))
        workers = [_worker(url, f"rate-{n}", queues="limited") for n in range(3)]
        try:
            time.sleep(seconds + 5)
        finally:
            _stop(workers)
        first = conn.execute("SELECT min(occurred_at) FROM events WHERE type = 'Claimed'").fetchone()[0]
        claims = conn.execute("SELECT count(*) FROM events WHERE type = 'Claimed' AND occurred_at < %s"
                              " + make_interval(secs => %s)", [first, seconds]).fetchone()[0]
        per_window = [r[0] for r in conn.execute(
            "SELECT count(*) FROM events WHERE type = 'Claimed' AND occurred_at < %s + make_interval(secs => %s)"
            " GROUP BY floor(extract(epoch FROM occurred_at - %s)) ORDER BY 1", [first, seconds, first])]
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{DB_PREFIX}_rate" WITH (FORCE)')
    measured = claims / seconds
    return {"rate_per_second": rate, "seconds": seconds, "claims": claims, "measured_per_second": measured,
            "error_pct": (measured - rate) / rate * 100, "per_second_min": min(per_window),
            "per_second_max": max(per_window)}


def run(admin_url: str, *, parts: tuple[str, ...] = ("claim", "fairness", "rate"), jobs: int = 20_000,
        repeat: int = 3, backlog: int = 100_000, samples: int = 100, rate_seconds: float = 60) -> dict[str, Any]:
    results: dict[str, Any] = {}
    if "claim" in parts:
        results["claim"] = run_claim(admin_url, jobs, repeat)
    if "fairness" in parts:
        results["fairness"] = run_fairness(admin_url, backlog, samples, repeat)
    if "rate" in parts:
        results["rate"] = run_rate(admin_url, 50, rate_seconds)
    return results


def markdown(results: dict[str, Any]) -> str:
    """The flow-control table of run.py --parts flow."""
    rows = ["| flow control | figure | goal |", "| --- | --- | --- |"]
    claim = results.get("claim")
    if claim:
        plain = claim["plain"]
        rows.append(f"| claim+complete, plain jobs ({claim['jobs']:,}, 2 connections, batches of 100) | "
                    f"{plain['jobs_per_s']['median']:,.0f} jobs/s, "
                    f"{plain['postgres_cpu_us_per_job']['median']:.0f} µs PostgreSQL CPU/job | |")
        for variant, label in (("keys", f"concurrency keys ({KEYS} keys, limits far above the drain)"),
                               ("rate", "rate limit far above the drain"),
                               ("fair", f"fairness keys ({KEYS} keys)")):
            if variant in claim:
                v = claim[variant]
                rows.append(f"| claim+complete, {label} | {v['jobs_per_s']['median']:,.0f} jobs/s "
                            f"({v['ratio_to_plain']:.2f}x plain), {v['postgres_cpu_us_per_job']['median']:.0f} µs "
                            f"PostgreSQL CPU/job | >= 0.8x plain: {'met' if v['ratio_to_plain'] >= 0.8 else 'NOT met'} |")
        if "cpu_ratio_to_base" in plain:
            ratio = plain["cpu_ratio_to_base"]
            rows.append(f"| plain claim+complete, PostgreSQL CPU/job against {BASELINE} (same claim statement:"
                        f" {plain['same_claim_statement_as_base']}) | {ratio:.3f}x | <= 1.05x:"
                        f" {'met' if ratio <= 1.05 else 'NOT met'} |")
    fairs = results.get("fairness")
    for fair in (fairs.values() if fairs and "rounds" not in fairs else [fairs] if fairs else []):
        rounds = ", ".join(f"{r['p99_ratio']:.2f}x" for r in fair["rounds"])
        rows.append(f"| fairness: B (1 job/s) enqueue-to-start p99, A's {fair['backlog_of_a']:,} jobs queued first,"
                    f" {fair.get('workers', 2)} worker(s) of {fair.get('slots', 8)} slots"
                    f" ({fair['loaded']['samples']} samples in {len(fair['rounds'])} rounds)"
                    f" | {fair['loaded']['p99_ms']:.0f} ms (empty queue: {fair['empty']['p99_ms']:.0f} ms; "
                    f"{fair['p99_ratio']:.2f}x; rounds: {rounds})"
                    f" | <= 2x: {'met' if fair['p99_ratio'] <= 2 else 'NOT met'} |")
    rate = results.get("rate")
    if rate:
        rows.append(f"| rate limit {rate['rate_per_second']:.0f}/s, 3 worker processes, {rate['seconds']:.0f} s"
                    f" | {rate['measured_per_second']:.2f}/s ({rate['error_pct']:+.1f} %) | within 5 %: "
                    f"{'met' if abs(rate['error_pct']) <= 5 else 'NOT met'} |")
    return "\n".join(rows)


def main() -> None:
    global DB_PREFIX, BASELINE_TREE
    parser = admin_parser(__doc__)
    parser.add_argument("--parts", default="claim,fairness,rate")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="claim part only")
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=100, help="B's jobs, one a second, per case")
    parser.add_argument("--rate-seconds", type=float, default=60)
    parser.add_argument("--db-prefix", default=DB_PREFIX, help="scratch databases: PREFIX_<variant>")
    parser.add_argument("--slots", default="", help="fairness part: worker slots per case, e.g. 1,500"
                                                    " (default: 2 workers of 8)")
    parser.add_argument("--fair-workers", type=int, default=None, help="workers per fairness case with --slots (1)")
    parser.add_argument("--baseline-tree", type=Path, default=None,
                        help="claim part: add plain@base, plain jobs on this checkout's schema")
    args = parser.parse_args()
    BASELINE_TREE = args.baseline_tree
    DB_PREFIX = args.db_prefix
    parts = tuple(p.strip() for p in args.parts.split(",") if p.strip())
    if parts == ("cpu",):
        variants = tuple(v for v in args.variants.split(",") if v)
        results = {"cpu": {v: [claim_cpu(args.database_url, v, args.jobs) for _ in range(args.repeat)]
                           for v in variants}}
    elif parts == ("claim",):
        variants = tuple(v for v in args.variants.split(",") if v)
        if BASELINE_TREE is not None and BASELINE not in variants:
            variants += (BASELINE,)
        results = {"claim": run_claim(args.database_url, args.jobs, args.repeat, variants)}
    elif parts == ("fairness",) and args.slots:
        results = {"fairness": {f"{slots}_slots": run_fairness(args.database_url, args.backlog, args.samples,
                                                               args.repeat, int(slots), args.fair_workers or 1)
                                for slots in args.slots.split(",")}}
    else:
        results = run(args.database_url, parts=parts, jobs=args.jobs, repeat=args.repeat, backlog=args.backlog,
                      samples=args.samples, rate_seconds=args.rate_seconds)
    print(json.dumps(results, indent=2, default=str))
    if "cpu" not in results:
        print(markdown(results))


if __name__ == "__main__":
    main()
