"""The worked example of docs/workflows-as-code.md, as the page gives it, against `qforge dev --tasks`."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import qforge
from test_dev import free_port, healthy
from test_worker_support import wait_for

DOC = Path(__file__).parent.parent / "docs" / "workflows-as-code.md"


def example(name: str) -> str:
    """The python block after `<!-- example: name -->` in the page."""
    found = re.search(rf"<!-- example: {name} -->\s*```python\n(.*?)```", DOC.read_text(), re.S)
    assert found, f"docs/workflows-as-code.md has no example {name}"
    return found.group(1)


def test_the_checkout_example_runs_from_the_docs_against_qforge_dev(db_url, tmp_path):
    (tmp_path / "checkout_example.py").write_text(example("checkout_example"))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("QFORGE_API_TOKEN", "QFORGE_DATABASE_URL")}
    with open(tmp_path / "dev.log", "wb") as log:
        dev = subprocess.Popen([sys.executable, "-m", "qforge.cli", "--database-url", db_url, "dev", "--port",
                                str(port), "--tasks", "checkout_example"],
                               cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: healthy(url), timeout=60, message="qforge dev to serve")
        with qforge.Client(url) as client:
            order = {"id": 7, "amount": 1500, "email": "a@example.com", "cool_off_seconds": 0.5}
            created = client.start("checkout", order)
            waiting = wait_for(lambda: client.get_workflow(created.id).waiting_on, timeout=60,
                               message="the approval wait")
            assert [(w.step, w.kind) for w in waiting] == [("approve", "trigger")]
            client.trigger(created.id, "approve", {"by": "alice"})
            view = wait_for(lambda: (lambda v: v if v.status != "running" else None)(client.get_workflow(created.id)),
                            timeout=60, message="the checkout to finish")
        assert view.status == "succeeded", view
        assert view.result == {"receipt": {"order": 7, "amount": 1500}, "tracking": "TRACK-7"}
        steps = {s.step: s for s in view.steps}
        assert list(steps) == ["charge", "approve", "ship", "email", "sleep"]
        assert steps["ship"].depends_on == steps["email"].depends_on == ["approve"]
        assert steps["approve"].output == {"by": "alice"}
    finally:
        dev.send_signal(signal.SIGTERM)
        assert dev.wait(timeout=60) == 0, (tmp_path / "dev.log").read_text(errors="replace")
