"""What authentication costs a request: GET /jobs/{id} without tokens (anonymous) and with a named token
(looked up on every request, no cache), on one API served in this process.

    python bench/auth_bench.py [--server-url postgresql://postgres@127.0.0.1:5432/postgres] [--seconds 5] [--rounds 5]

Makes a database qforge_bench_auth_19 on that server, migrates it, and drops it afterwards.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import statistics
import sys
import time

import httpx
import psycopg
from psycopg import sql

sys.path.insert(0, os.path.dirname(__file__))
from common import with_database  # noqa: E402

from qforge.api.app import create_app  # noqa: E402
from qforge.api.server import BackgroundServer  # noqa: E402
from qforge.commands import tokens  # noqa: E402
from qforge.migrate import migrate  # noqa: E402
from qforge.settings import Settings  # noqa: E402

DATABASE = "qforge_bench_auth_19"


def rate(url: str, path: str, headers: dict, seconds: float, clients: int) -> float:
    """Requests per second of `clients` keep-alive clients asking `path` for `seconds`."""
    deadline = time.monotonic() + seconds

    def client_loop() -> int:
        done = 0
        with httpx.Client(base_url=url, headers=headers) as client:
            while time.monotonic() < deadline:
                client.get(path).raise_for_status()
                done += 1
        return done

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        total = sum(pool.map(lambda _: client_loop(), range(clients)))
    return total / (time.monotonic() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args()
    with psycopg.connect(args.server_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(DATABASE)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
    url = with_database(args.server_url, DATABASE)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            migrate(conn)
            app = create_app(url, settings=Settings(database_url=url, api_token=None))
            with BackgroundServer(app) as server:
                with httpx.Client(base_url=server.url) as client:
                    job_id = client.post("/jobs", json={"task": "echo"}).json()["id"]
                path = f"/jobs/{job_id}"
                rate(server.url, path, {}, 1, args.clients)  # warm up
                # Alternate the two modes (tokens on, then off again) so that the
                # load of a shared machine spreads over both; report medians.
                anonymous_rates, named_rates = [], []
                for _ in range(args.rounds):
                    anonymous_rates.append(rate(server.url, path, {}, args.seconds, args.clients))
                    secret = tokens.create_token(conn, "bench", "read", actor="bench")
                    named_rates.append(rate(server.url, path, {"Authorization": f"Bearer {secret}"},
                                            args.seconds, args.clients))
                    conn.execute("DELETE FROM tokens")  # a bench database: back to no tokens at all
                anonymous, named = statistics.median(anonymous_rates), statistics.median(named_rates)
        print(f"GET /jobs/{{id}}, {args.clients} clients, {args.rounds} rounds of {args.seconds:g} s each"
              " (medians):")
        print(f"  no token (anonymous):  {anonymous:8.0f} req/s")
        print(f"  named token (lookup):  {named:8.0f} req/s  ({(named / anonymous - 1) * 100:+.1f} %)")
    finally:
        with psycopg.connect(args.server_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DATABASE)))


if __name__ == "__main__":
    main()
