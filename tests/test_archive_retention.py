"""Archive by retention: a real `qforge monitor` with QFORGE_ARCHIVE_AFTER closes a quiet partition by
age (QFORGE_LOG_PARTITION_MAX_AGE), archives what is older to QFORGE_ARCHIVE_DIR with nobody running
`qforge archive`, and the API then answers 410 for the finished jobs it let go of."""

from __future__ import annotations

import subprocess

import httpx

from cluster_procs import start_api
from qforge.commands.claim import claim
from qforge.commands.report import Report, complete
from test_worker_support import QFORGE, Processes, procs, scalar, tasks_dir, wait_for  # noqa: F401  (fixtures)
from tests.factories import make_job


def test_the_leader_archives_what_is_older_than_archive_after_and_closes_a_quiet_partition_by_age(
        conn, db_url, procs: Processes, scratch_dir):
    finished = [make_job(conn, tags={"batch": "old"}) for _ in range(5)]
    for job in claim(conn, ["default"], 10, "w1"):
        complete(conn, [Report(job.id, job.attempt, result={"n": 1})], actor="w1")
    waiting = make_job(conn, run_at="2999-01-01T00:00:00Z")  # still pending: stays in the read model
    archive_dir = scratch_dir / "archive"
    procs.monitor({"QFORGE_ARCHIVE_AFTER": "1s", "QFORGE_LOG_PARTITION_MAX_AGE": "1s",
                   "QFORGE_ARCHIVE_DIR": str(archive_dir), "QFORGE_LOG_PACK_SECONDS": "0.3"})
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM archive_segments WHERE state = 'dropped'") >= 1,
             timeout=60, message="the monitor to archive the closed partition")
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE id = ANY(%s)", finished) == 0
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE id = %s", waiting) == 1

    _, base = start_api(procs)
    response = httpx.get(f"{base}/jobs/{finished[0]}", timeout=10)
    assert response.status_code == 410 and response.json()["error"] == "archived", response.text
    assert httpx.get(f"{base}/jobs/{waiting}", timeout=10).json()["status"] == "pending"
    verified = subprocess.run([str(QFORGE), "archive", "verify", str(archive_dir), "--database-url", db_url],
                              capture_output=True, text=True, timeout=120)
    assert verified.returncode == 0 and "archive sound" in verified.stdout, verified.stdout + verified.stderr
    replayed = subprocess.run([str(QFORGE), "replay", "--verify", "--archive", str(archive_dir),
                               "--database-url", db_url], capture_output=True, text=True, timeout=120)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr

    # A quiet log: nothing new is written, so no empty partition is closed again and again.
    segments = scalar(conn, "SELECT count(*) FROM archive_segments")
    make_job(conn)  # one more event, in the new partition: closed and archived once it is old
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM archive_segments") > segments, timeout=60,
             message="the next partition to be closed by age and archived")
    logs = procs.logs()
    assert "closed the partition being written" in logs and "archived 1 partition(s)" in logs, logs
