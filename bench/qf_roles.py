"""What the processes' roles (issue 30) cost the hot path: claim, and claim+complete (the drain),
jobs/s and PostgreSQL CPU per job, side by side in one run, round by round in turns:

  fe80a14   the schema before the roles (migrations as of commit fe80a14), claimed as the schema
            owner, as every process did then
  owner     today's schema, claimed as the schema owner (row-level security does not apply)
  role      today's schema, claimed as the worker's role (<prefix>_worker: the events policy
            checked on every appended row, privileges checked on every statement)

    python bench/qf_roles.py --database-url postgresql://postgres@127.0.0.1:5432/postgres

The roles are made with --role-prefix (default qfbench) so that a bench run does not touch the
roles of a QForge that shares the server.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

import psycopg

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
from common import admin_parser, recreate, summarize  # noqa: E402
from qf_history import claim_side_by_side, enqueue_pending  # noqa: E402

BASELINE = "fe80a14"
DB_PREFIX = "qf_bench_roles30"


def old_migrations(commit: str, into: Path) -> Path:
    """The migrations folder as of `commit` (git archive), unpacked under `into`."""
    blob = subprocess.run(["git", "archive", commit, "migrations"], cwd=BENCH_DIR.parent, check=True,
                          capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(blob)) as archive:
        archive.extractall(into, filter="data")
    return into / "migrations"


def main() -> None:
    parser = admin_parser(__doc__, repeat=2)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--role-prefix", default="qfbench")
    parser.add_argument("--db-prefix", default=DB_PREFIX)
    args = parser.parse_args()

    from qforge.db import role_name, with_credentials
    from qforge.migrate import load_source, migrate

    with tempfile.TemporaryDirectory() as scratch:
        sources = {"fe80a14": load_source(old_migrations(BASELINE, Path(scratch)), state_machine=True),
                   "owner": load_source(),
                   "role": load_source()}
        urls: dict[str, str] = {}
        for where, source in sources.items():
            url = recreate(args.database_url, f"{args.db_prefix}_{where}")
            with psycopg.connect(url, autocommit=True) as conn:
                migrate(conn, source, role_prefix=args.role_prefix)
            urls[where] = url
    # the worker's role logs in without a password on this server (trust); give one with the URL otherwise
    claim_urls = {**urls, "role": with_credentials(urls["role"], role_name(args.role_prefix, "worker"), None)}
    with psycopg.connect(claim_urls["role"], autocommit=True) as conn:
        assert conn.execute("SELECT current_user").fetchone()[0] == role_name(args.role_prefix, "worker")

    results: dict[str, dict[str, list[float]]] = {}
    for part, complete in (("claim", False), ("drain", True)):
        for _ in range(args.repeat):
            for url in urls.values():
                enqueue_pending(url, args.jobs)
            figures = claim_side_by_side(claim_urls, args.jobs, complete=complete)
            for where, got in figures.items():
                entry = results.setdefault(f"{part}/{where}", {"jobs_per_s": [], "server_cpu_us_per_job": []})
                entry["jobs_per_s"].append(got["jobs_per_s"])
                entry["server_cpu_us_per_job"].append(got["server_cpu_us_per_job"] or 0.0)
            print(part, json.dumps({w: {k: round(v, 1) for k, v in f.items() if v} for w, f in figures.items()}),
                  flush=True)
    report = {name: {key: summarize(values) for key, values in figures.items()} for name, figures in results.items()}
    for part in ("claim", "drain"):
        base = report[f"{part}/fe80a14"]
        for where in ("owner", "role"):
            mine = report[f"{part}/{where}"]
            print(f"{part:5} {where:5} vs fe80a14: jobs/s x{mine['jobs_per_s']['median'] / base['jobs_per_s']['median']:.3f},"
                  f" PostgreSQL CPU/job x{mine['server_cpu_us_per_job']['median'] / base['server_cpu_us_per_job']['median']:.3f}"
                  f" ({mine['server_cpu_us_per_job']['median']:.1f} vs {base['server_cpu_us_per_job']['median']:.1f} µs)")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
