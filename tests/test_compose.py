"""docker-compose.yml checked by a real Compose implementation, and the Dockerfile built from the
wheel: its build stage copies everything pyproject.toml builds from."""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml  # PyYAML: in the test extras through schemathesis (docker-compose's own parser too)

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = shutil.which("docker-compose")


@pytest.mark.skipif(COMPOSE is None, reason="docker-compose is missing (apt-get install docker-compose); CI installs it")
def test_compose_file_is_valid_and_runs_every_role_from_one_image():
    # Debian's docker-compose parses and resolves the file without any engine.
    result = subprocess.run([COMPOSE, "-f", str(ROOT / "docker-compose.yml"), "config"],
                            capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load(result.stdout)["services"]
    assert {"postgres", "migrate", "api", "monitor"} <= set(services)
    roles = {name: spec for name, spec in services.items() if name != "postgres"}
    assert any(name.startswith("worker") for name in roles)
    assert {spec.get("image") for spec in roles.values()} == {"qforge:latest"}
    assert {str(Path(spec["build"]["context"]).resolve()) for spec in roles.values()} == {str(ROOT)}
    for name, spec in roles.items():
        command = spec["command"]
        assert command[0] == "qforge" and command[1] in ("migrate", "api", "monitor", "worker"), name
        # Each process on its own role (issue 30): only migrate has the schema owner's URL.
        environment = spec["environment"]
        own = {"migrate": "QFORGE_DATABASE_URL", "api": "QFORGE_API_DATABASE_URL",
               "monitor": "QFORGE_MONITOR_DATABASE_URL", "worker": "QFORGE_WORKER_DATABASE_URL"}[command[1]]
        assert environment[own].startswith("postgresql://"), name
        if command[1] != "migrate":
            assert "QFORGE_DATABASE_URL" not in environment, name
    assert services["api"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"


def test_dockerfile_builds_the_wheel_from_everything_pyproject_needs_and_installs_it():
    dockerfile = (ROOT / "Dockerfile").read_text()
    stages = re.split(r"(?m)^FROM ", dockerfile)[1:]
    assert len(stages) == 2, "a build stage and a runtime stage"
    build, runtime = stages
    copied = {source for line in re.findall(r"(?m)^COPY (?!--from)(.+)$", build)
              for source in line.split()[:-1]}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = {"pyproject.toml", project["project"]["readme"], *project["project"].get("license-files", [])}
    needed |= {folder.split("/")[0] for folder in project["tool"]["setuptools"]["package-dir"].values()}
    assert needed <= copied, f"the build stage misses {sorted(needed - copied)}"
    ignored = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    assert not [n for n in needed for pattern in ignored if fnmatch.fnmatch(n, pattern)], ".dockerignore drops a source"
    assert "python -m build --wheel" in build
    assert re.search(r"pip install /tmp/qforge-\*\.whl", runtime) and "-e ." not in dockerfile
    assert re.search(r"(?m)^USER 10001$", runtime)
