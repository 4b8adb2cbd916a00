"""OpenTelemetry: one trace from an HTTP request through enqueue to the worker's runs (a retry
included), checked with the SDK's in-memory exporter; configured by OTEL_* variables; and nothing
of OpenTelemetry imported by a process that did not ask for it."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import httpx
import pytest
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from opentelemetry.util._once import Once

from qforge.api.app import create_app
from qforge.api.server import BackgroundServer
from qforge.settings import Settings
from qforge.workers.worker import Worker


@pytest.fixture
def spans() -> InMemorySpanExporter:
    """A tracer provider with an in-memory exporter, for this test only: afterwards the process is
    untraced again (as OpenTelemetry's own tests reset it), so later tests see untraced jobs."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        provider.shutdown()
        trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]
        trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]


def test_one_trace_from_the_request_through_enqueue_to_every_run(db_url: str, spans: InMemorySpanExporter):
    settings = Settings(database_url=db_url, api_token=None, backoff_base_seconds=0.05,
                        backoff_cap_seconds=0.1, poll_interval_seconds=0.1)
    tracer = trace.get_tracer("the-web-app")
    with BackgroundServer(create_app(db_url, settings=settings)) as api:
        with tracer.start_as_current_span("checkout") as checkout:
            headers: dict[str, str] = {}
            propagate.inject(headers)  # what an instrumented web app sends along
            job = httpx.post(f"{api.url}/jobs", headers=headers, json={
                "task": "flaky", "payload": {"fail_times": 1}, "max_retries": 2}).json()

        async def work() -> str:
            worker = Worker(db_url, name="traced", queues=["default"], concurrency=2, settings=settings)
            running = asyncio.create_task(worker.run())
            status = "pending"
            for _ in range(300):
                status = (await asyncio.to_thread(httpx.get, f"{api.url}/jobs/{job['id']}")).json()["status"]
                if status == "succeeded":
                    break
                await asyncio.sleep(0.1)
            worker._on_signal(signal.SIGTERM)
            await running
            return status
        assert asyncio.run(work()) == "succeeded"

    finished = spans.get_finished_spans()
    trace_id = checkout.get_span_context().trace_id
    enqueue = [s for s in finished if s.name == "qforge.enqueue"]
    runs = sorted((s for s in finished if s.name == "qforge.run"), key=lambda s: s.attributes["qforge.attempt"])
    server = [s for s in finished if s.kind == trace.SpanKind.SERVER and s.name.startswith("POST /jobs")]
    assert len(enqueue) == 1 and len(runs) == 2 and server
    assert {s.context.trace_id for s in [*enqueue, *runs, *server]} == {trace_id}
    assert server[0].parent.span_id == checkout.get_span_context().span_id
    assert enqueue[0].attributes["qforge.job_id"] == job["id"] and enqueue[0].attributes["qforge.task"] == "flaky"
    for attempt, run in enumerate(runs, start=1):
        assert run.parent.span_id == enqueue[0].context.span_id
        assert run.attributes["qforge.job_id"] == job["id"] and run.attributes["qforge.attempt"] == attempt
        assert run.attributes["qforge.queue"] == "default" and run.attributes["qforge.task"] == "flaky"
    assert runs[0].status.status_code == StatusCode.ERROR and runs[0].events[0].name == "exception"
    assert runs[1].status.status_code != StatusCode.ERROR


PROBE = """
import sys
from qforge import tracing
import qforge, qforge.client, qforge.producer, qforge.workers.worker, qforge.cli.worker
loaded = sorted({m.split('.')[1] for m in sys.modules if m.startswith('opentelemetry.')})
print(tracing.configure("probe"))
with tracing.enqueue_span(task="t") as traced:
    print(traced.carrier is not None)
print(loaded)
import qforge.api.app  # FastAPI imports opentelemetry's API itself: what matters is the provider
app = qforge.api.app.create_app("postgresql://nowhere/none")
print("instrumented", getattr(app, "_is_instrumented_by_opentelemetry", False))
"""


def _probe(**env: str) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    result = subprocess.run([sys.executable, "-c", PROBE], env={**clean, **env}, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_nothing_of_opentelemetry_is_imported_unless_asked():
    assert _probe() == ["False", "False", "[]", "instrumented False"]


def test_otel_variables_configure_the_sdk_and_its_exporter():
    lines = _probe(OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="shop-worker")
    assert lines[:2] == ["True", "True"] and "instrumented True" in lines
    printed = "\n".join(lines)
    assert '"name": "qforge.enqueue"' in printed and "shop-worker" in printed
