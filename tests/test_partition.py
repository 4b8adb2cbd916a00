"""A network partition: a worker in its own network namespace loses its link mid-job.

The worker reaches PostgreSQL over a veth pair; the cut is `ip link set <host side> down`,
so its packets just stop (no FIN, no RST). The monitor fails the silent attempt, a worker
on the host finishes the job, and when the link is back the cut-off worker's late result
is refused by fencing and it carries on. Run with `-s` for the timeline.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import time
from datetime import datetime
from typing import Iterator

import psycopg
import pytest

from cluster_procs import DBNAME, log_dir, require_binaries
from pgcluster import Cluster
from qforge.migrate import migrate
from test_worker_support import (  # noqa: F401  (tasks_dir is a fixture)
    FAST_ENV, QFORGE, Proc, Processes, add_jobs, history, job, tasks_dir, types, wait_for)

SLEEP_SECONDS = 1.5  # the first attempt's run time: it finishes while the link is down
# How the cut-off worker learns it was fenced: its late result refused (the usual case: the task
# ended during the cut), or, on a loaded machine where the task ends after the link is back, its
# heartbeat refused first, which stops the task. Either way its work leaves no trace.
FENCED = {"results not recorded": "late result rejected",
          "was cancelled or taken over": "late heartbeat rejected, task stopped"}


class Link:
    """A network namespace joined to the host by a veth pair (/30 subnet)."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 10000:04d}{random.randrange(100):02d}"
        self.namespace, self.host_side, self.ns_side = f"qf-part-{tag}", f"qfh{tag}", f"qfn{tag}"
        subnet = random.randrange(1, 250)
        self.host_address, self.ns_address = f"10.217.{subnet}.1", f"10.217.{subnet}.2"
        self._created: list[list[str]] = []
        self._ip("netns", "add", self.namespace)
        self._created.append(["netns", "del", self.namespace])
        self._ip("link", "add", self.host_side, "type", "veth", "peer", "name", self.ns_side)
        self._created.append(["link", "del", self.host_side])
        self._ip("link", "set", self.ns_side, "netns", self.namespace)
        self._ip("addr", "add", f"{self.host_address}/30", "dev", self.host_side)
        self._ip("link", "set", self.host_side, "up")
        self._ip("-n", self.namespace, "addr", "add", f"{self.ns_address}/30", "dev", self.ns_side)
        self._ip("-n", self.namespace, "link", "set", self.ns_side, "up")
        self._ip("-n", self.namespace, "link", "set", "lo", "up")

    @staticmethod
    def _ip(*args: str) -> None:
        done = subprocess.run(["ip", *args], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")

    def cut(self) -> None:
        self._ip("link", "set", self.host_side, "down")  # packets vanish: no FIN, no RST

    def restore(self) -> None:
        self._ip("link", "set", self.host_side, "up")

    def close(self) -> None:
        for command in reversed(self._created):
            subprocess.run(["ip", *command], capture_output=True)


@pytest.fixture
def link() -> Iterator[Link]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2 (`ip`)")
    try:
        made = Link()
    except RuntimeError as exc:
        pytest.skip(f"cannot create a network namespace with a veth pair here: {exc}")
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def server(link: Link) -> Iterator[Cluster]:
    require_binaries()
    built = Cluster(settings={"listen_addresses": "'*'"})  # the host and the veth's address
    try:
        built.primary.sql(f"CREATE DATABASE {DBNAME}")
        with psycopg.connect(built.primary.url(DBNAME), autocommit=True) as conn:
            migrate(conn)
        yield built
    finally:
        built.close()


def test_a_partitioned_worker_is_fenced_and_its_job_finished_elsewhere(link, server, tmp_path, tasks_dir):
    url = server.primary.url(DBNAME)
    ns_url = f"postgresql://postgres@{link.host_address}:{server.primary.port}/{DBNAME}"
    processes = Processes(url, log_dir(tmp_path), tasks_dir)
    env = {**os.environ, **FAST_ENV, "PYTHONPATH": os.pathsep.join(
        p for p in (str(tasks_dir), os.environ.get("PYTHONPATH", "")) if p)}
    log_path = log_dir(tmp_path) / "ns-worker.log"
    with open(log_path, "wb") as log_file:
        popen = subprocess.Popen(["ip", "netns", "exec", link.namespace, str(QFORGE), "worker",
                                  "--database-url", ns_url, "--queues", "shared,cutoff", "--name", "ns-worker",
                                  "--tasks", "qf_test_tasks"], stdout=log_file, stderr=subprocess.STDOUT, env=env)
    cut_off = Proc(popen, log_path, "ns-worker")
    processes.started.append(cut_off)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            processes.monitor()
            (job_id,) = add_jobs(conn, {"task": "test_sleep_first_attempt", "queue": "shared",
                                        "payload": {"seconds": SLEEP_SECONDS}})
            wait_for(lambda: job(conn, job_id)["worker"] == "ns-worker", timeout=30,
                     message="the worker in the namespace to claim the job")
            cut_at = time.time()
            link.cut()
            processes.worker("--queues", "shared", "--name", "host-worker", "--tasks", "qf_test_tasks")
            wait_for(lambda: job(conn, job_id)["worker"] == "host-worker", timeout=30,
                     message="the monitor to fail the silent attempt and the host worker to claim it")
            link.restore()
            restored_at = time.time()
            fenced = wait_for(lambda: [what for line, what in FENCED.items() if line in cut_off.log()],
                              timeout=60, message="the cut-off worker to be fenced")
            rejected_at = time.time()
            wait_for(lambda: job(conn, job_id)["status"] == "succeeded", timeout=30,
                     message="the host worker to finish the job")
            # The cut-off worker carries on: a queue only it serves.
            (after_id,) = add_jobs(conn, {"task": "echo", "queue": "cutoff"})
            wait_for(lambda: job(conn, after_id)["status"] == "succeeded", timeout=60,
                     message="the cut-off worker to run a new job after the partition")
            assert cut_off.alive()
            assert job(conn, after_id)["worker"] == "ns-worker"

            events = history(conn, job_id)
            assert types(events) == ["Enqueued", "Claimed", "Failed", "Retried", "Claimed", "Succeeded"]
            assert events[2].data["reason"] == "heartbeat_timeout"
            assert job(conn, job_id)["result"] == {"attempt": 2}  # the late attempt 1 left no trace
            assert job(conn, job_id)["worker"] == "host-worker"
            [(succeeded,)] = conn.execute("SELECT count(*) FROM events WHERE stream_id = %s AND type = 'Succeeded'",
                                          (job_id,)).fetchall()
            assert succeeded == 1

            def at(moment: datetime | float) -> str:
                seconds = moment.timestamp() if isinstance(moment, datetime) else moment
                return f"{seconds - cut_at:+.2f}"

            claimed_1, failed, claimed_2, done = events[1], events[2], events[4], events[5]
            after_done = history(conn, after_id)[-1]
            print(f"\npartition timeline (s from the cut; stale limit {FAST_ENV['QFORGE_STALE_SECONDS']} s): "
                  f"{at(claimed_1.occurred_at)} worker in the namespace claims; +0.00 link cut; "
                  f"{at(failed.occurred_at)} monitor fails the silent attempt ({failed.data['reason']}); "
                  f"{at(claimed_2.occurred_at)} host worker claims; {at(restored_at)} link restored; "
                  f"{at(rejected_at)} {fenced[0]} (seen in its log); "
                  f"{at(done.occurred_at)} host worker succeeds; "
                  f"{at(after_done.occurred_at)} cut-off worker runs a new job")
    finally:
        processes.close()
        print(processes.logs()[-5000:])
