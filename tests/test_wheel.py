"""The built wheel is the product: from a copy of the source, build it, install it into a fresh
venv, and run the whole system from an empty folder with nothing of the checkout in sight."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.test_dev import free_port, healthy, wait_until

ROOT = Path(__file__).resolve().parent.parent
# What pyproject.toml builds from (the Dockerfile's build stage copies the same list).
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "app", "migrations", "web", "tools")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A venv with the wheel installed; returns its bin folder."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    source.mkdir()
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, source / name)
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(work / "dist"), str(source)],
                   check=True, capture_output=True, timeout=300)
    wheels = list((work / "dist").glob("qforge-*.whl"))
    assert len(wheels) == 1, wheels
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheels[0])],
                   check=True, capture_output=True, timeout=600)
    return venv / "bin"


def test_wheel_installs_qforge_and_nothing_named_app(installed: Path):
    python = str(installed / "python")
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    names = {p.name for p in Path(purelib).iterdir()}
    assert "qforge" in names and "app" not in names
    license_files = list(Path(purelib).glob("qforge-*.dist-info/licenses/LICENSE"))
    assert license_files and "MIT License" in license_files[0].read_text()
    version = subprocess.run([str(installed / "qforge"), "--version"], capture_output=True, text=True,
                             timeout=60)
    assert version.returncode == 0 and "0." in version.stdout + version.stderr


def test_wheel_runs_qforge_dev_from_an_empty_folder(installed: Path, scratch_dir: Path):
    port = free_port()
    env = {k: v for k, v in os.environ.items()
           if k not in ("QFORGE_DATABASE_URL", "QFORGE_API_TOKEN", "QFORGE_DATA_DIR", "PYTHONPATH")}
    log = open(scratch_dir / "dev.log", "wb")
    process = subprocess.Popen([str(installed / "qforge"), "dev", "--port", str(port)], cwd=scratch_dir,
                               env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: healthy(url) or process.poll() is not None, 120, "qforge dev from the wheel")
        output = lambda: (scratch_dir / "dev.log").read_text(errors="replace")  # noqa: E731
        assert process.poll() is None, output()
        for path in ("/", "/js/states.js", "/app.js", "/js/api.js", "/styles.css"):
            assert httpx.get(url + path).status_code == 200, path
        created = httpx.post(f"{url}/jobs", json={"task": "add", "payload": {"a": 1, "b": 2}})
        assert created.status_code == 201, (created.text, output())
        job = created.json()
        done = wait_until(lambda: (j := httpx.get(f"{url}/jobs/{job['id']}").json())["status"]
                          == "succeeded" and j, 60, "the job to run")
        assert done["result"] == 3
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0, output()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()
