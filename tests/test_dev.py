"""`qforge dev` from nothing in an empty folder: serves, runs a job end to end, stops cleanly
on SIGTERM leaving no process behind, and a second run finds the data of the first."""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def processes_using(folder: Path) -> list[psutil.Process]:
    """Live processes whose command line names the folder (PostgreSQL's -D, our children)."""
    found = []
    for process in psutil.process_iter(["cmdline", "cwd"]):
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                continue
            cmdline = " ".join(process.info["cmdline"] or [])
            if str(folder) in cmdline or process.info["cwd"] == str(folder):
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


class DevRun:
    def __init__(self, folder: Path, port: int, *extra: str):
        env = {k: v for k, v in os.environ.items()
               if k not in ("QFORGE_DATABASE_URL", "QFORGE_API_TOKEN", "QFORGE_DATA_DIR")}
        self.log = open(folder / f"dev-{port}.log", "wb")
        self.process = subprocess.Popen([sys.executable, "-m", "qforge.cli", "dev", "--port", str(port), *extra],
                                        cwd=folder, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{port}"
        self.folder = folder

    def output(self) -> str:
        return (self.folder / Path(self.log.name).name).read_text(errors="replace")

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=60)
        finally:
            self.log.close()

    def kill(self) -> None:
        if self.process.poll() is None:
            for child in psutil.Process(self.process.pid).children(recursive=True):
                child.kill()
            self.process.kill()
            self.process.wait()
        self.log.close()


def test_qforge_dev_runs_the_whole_system_and_stops_cleanly(scratch_dir: Path):
    port = free_port()
    run = DevRun(scratch_dir, port)
    try:
        wait_until(lambda: healthy(run.url) or run.process.poll() is not None, 90, "qforge dev")
        assert run.process.poll() is None, run.output()
        tree = psutil.Process(run.process.pid).children(recursive=True)
        assert len(tree) >= 4, [p.cmdline() for p in tree]  # api, monitor, two pools

        job = httpx.post(f"{run.url}/jobs", json={"task": "add", "payload": {"a": 2, "b": 3}}).json()
        assert job["status"] in ("pending", "running", "succeeded")  # the pools are quick
        if importlib.util.find_spec("qforge.workers.worker") is not None:
            done = wait_until(lambda: (j := httpx.get(f"{run.url}/jobs/{job['id']}").json())["status"]
                              == "succeeded" and j, 30, "the job to run")
            assert done["result"] == 5 and done["worker"] in ("pool-1", "pool-2")
            shell = httpx.post(f"{run.url}/workflow", json={"workflowId": "wf-dev", "steps": [
                {"id": "A", "command": "echo hello"},
                {"id": "B", "command": "echo B", "dependsOn": ["A"]}]})
            assert shell.status_code == 201
            final = wait_until(lambda: (w := httpx.get(f"{run.url}/workflow/wf-dev").json())["status"]
                               == "COMPLETED" and w, 30, "the shell workflow")
            assert final["steps"][0]["stdout"] == "hello\n"
            workers = httpx.get(f"{run.url}/workers").json()["items"]
            assert {w["name"] for w in workers} == {"pool-1", "pool-2"}
        # every child on its own role, none with the owner's URL (issue 30)
        for child in tree:
            environ = child.environ()
            assert "QFORGE_DATABASE_URL" not in environ, child.cmdline()
            assert any(name in environ for name in ("QFORGE_API_DATABASE_URL", "QFORGE_WORKER_DATABASE_URL"))

        pids = [p.pid for p in tree] + [p.pid for p in processes_using(scratch_dir)]
        assert run.stop() == 0, run.output()
        for pid in pids:
            assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, (
                f"process {pid} outlived qforge dev")
        assert processes_using(scratch_dir) == []
        assert "stopped" in run.output()

        # A second run finds the first one's data.
        again = DevRun(scratch_dir, port)
        try:
            wait_until(lambda: healthy(again.url) or again.process.poll() is not None, 90, "the second run")
            assert httpx.get(f"{again.url}/jobs/{job['id']}").status_code == 200, again.output()
            assert again.stop() == 0
        finally:
            again.kill()
        assert processes_using(scratch_dir) == []
    finally:
        run.kill()


def test_qforge_dev_refuses_a_port_in_use(scratch_dir: Path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "qforge.cli", "dev", "--port", str(port)],
                                cwd=scratch_dir, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "in use" in result.stderr
    assert processes_using(scratch_dir) == []


def test_a_second_qforge_dev_in_the_folder_refuses_naming_the_first_or_attaches_when_asked(scratch_dir: Path):
    first = DevRun(scratch_dir, free_port())
    try:
        wait_until(lambda: healthy(first.url) or first.process.poll() is not None, 90, "qforge dev")
        assert first.process.poll() is None, first.output()
        other_port = free_port()
        refused = subprocess.run([sys.executable, "-m", "qforge.cli", "dev", "--port", str(other_port)],
                                 cwd=scratch_dir, capture_output=True, text=True, timeout=60)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert f"pid {first.process.pid}" in refused.stderr and first.url in refused.stderr, refused.stderr
        assert "--attach" in refused.stderr and "PostgreSQL" not in refused.stdout

        attached = DevRun(scratch_dir, other_port, "--attach")
        try:
            wait_until(lambda: healthy(attached.url) or attached.process.poll() is not None, 90, "the attached run")
            assert attached.process.poll() is None, attached.output()
            suffix = f"-{attached.process.pid}"
            names = wait_until(lambda: (n := {w["name"] for w in httpx.get(f"{first.url}/workers").json()["items"]})
                               >= {"pool-1", "pool-2", f"pool-1{suffix}", f"pool-2{suffix}"} and n, 60,
                               "four distinct pools in one registry")
            assert len(names) == 4, names
            assert f"attaching to the qforge dev of pid {first.process.pid}" in attached.output()
            assert attached.stop() == 0, attached.output()
        finally:
            attached.kill()
        said = attached.output()
        assert "starting PostgreSQL" not in said and "stopping PostgreSQL" not in said, said
        assert healthy(first.url), "the first qforge dev lost its server when the attached one stopped"
        assert first.stop() == 0, first.output()
    finally:
        first.kill()
    assert not (scratch_dir / ".qforge" / "dev.json").exists()
