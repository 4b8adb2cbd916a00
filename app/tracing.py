"""OpenTelemetry traces, when the process has OpenTelemetry: spans qforge.enqueue and qforge.run,
and the enqueuer's trace context carried in the job so the run joins the producer's trace.

Nothing here imports OpenTelemetry unless the process already has, and nothing traces unless a
tracer provider is installed: by the application (its own tracing setup) or by configure(), when
the standard OTEL_* variables ask for it (`pip install qforge[otel]`). Otherwise every helper is a
no-op that costs a lookup or two. (FastAPI >= 0.13x imports opentelemetry's API by itself, so in the
API process the module is loaded anyway; what decides is the provider.)
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import Any, Iterator

log = logging.getLogger("qforge.tracing")

TRACER = "qforge"
# Any of these set means the operator wants traces from the qforge processes.
_ASKING = ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
           "OTEL_SERVICE_NAME")


def active() -> bool:
    """True when this process traces: OpenTelemetry's API is loaded and a real tracer provider is
    installed (not the API's placeholder, which would make every span a no-op)."""
    api = sys.modules.get("opentelemetry.trace")
    if api is None:
        return False
    return not isinstance(api.get_tracer_provider(), (api.ProxyTracerProvider, api.NoOpTracerProvider))


def configure(service: str) -> bool:
    """Install the SDK's tracer provider and exporter as the OTEL_* variables say: exporter
    OTEL_TRACES_EXPORTER (otlp, the default; console; none), endpoint OTEL_EXPORTER_OTLP_*,
    service name OTEL_SERVICE_NAME (default `service`), OTEL_RESOURCE_ATTRIBUTES. Does nothing
    when none is set or OTEL_SDK_DISABLED=true. Returns whether traces are exported."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if not any(os.environ.get(name) for name in _ASKING):
        return False
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError:
        log.warning("OTEL_* variables are set but OpenTelemetry is not installed: pip install 'qforge[otel]'")
        return False
    kinds = [k.strip() for k in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",") if k.strip()]
    provider = TracerProvider(resource=Resource.create(
        {"service.name": os.environ.get("OTEL_SERVICE_NAME") or service}))
    for kind in kinds:
        if kind == "none":
            continue
        if kind == "console":
            exporter: Any = ConsoleSpanExporter()
        elif kind == "otlp":
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            except ImportError:
                log.warning("OTEL_TRACES_EXPORTER=otlp needs opentelemetry-exporter-otlp-proto-http "
                            "(pip install 'qforge[otel]')")
                continue
            exporter = OTLPSpanExporter()
        else:
            log.warning("OTEL_TRACES_EXPORTER=%s is not supported here (otlp, console, none)", kind)
            continue
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return True


def instrument(app: Any) -> None:
    """Server spans for every request of the FastAPI app, when tracing is on and the
    instrumentation is installed (incoming traceparent headers become the parents)."""
    if not active():
        return
    try:
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
    except ImportError:
        log.info("opentelemetry-instrumentation-fastapi is not installed: no server spans")
        return
    FastAPIInstrumentor.instrument_app(app, excluded_urls="healthz,events/stream")


def _attributes(values: dict[str, Any]) -> dict[str, Any]:
    return {f"qforge.{key}": str(value) if not isinstance(value, (int, float, str, bool)) else value
            for key, value in values.items() if value is not None}


class Traced:
    """What an enqueue span gives its caller: the context to store in the jobs, and the span."""

    def __init__(self, span: Any = None, carrier: dict[str, str] | None = None):
        self.span, self.carrier = span, carrier

    def set(self, **values: Any) -> None:
        if self.span is not None:
            self.span.set_attributes(_attributes(values))


@contextlib.contextmanager
def enqueue_span(**values: Any) -> Iterator[Traced]:
    """The qforge.enqueue span (a producer span, child of the caller's current span); yields the
    W3C context (traceparent, tracestate) to store in the Enqueued event, or None when untraced."""
    if not active():
        yield Traced()
        return
    from opentelemetry import propagate, trace

    tracer = trace.get_tracer(TRACER)
    with tracer.start_as_current_span("qforge.enqueue", kind=trace.SpanKind.PRODUCER,
                                      attributes=_attributes(values)) as span:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        yield Traced(span, carrier or None)


def run_span(job: Any) -> contextlib.AbstractContextManager[None]:
    """The qforge.run span of one attempt (a consumer span whose parent is the enqueuer's span,
    from the job's stored context); an exception is recorded and marks it as an error.
    Without tracing, one shared do-nothing context (this is on every job's path)."""
    return _run_span(job) if active() else _NO_SPAN


_NO_SPAN = contextlib.nullcontext()


@contextlib.contextmanager
def _run_span(job: Any) -> Iterator[None]:
    from opentelemetry import propagate, trace

    parent = propagate.extract(job.trace or {})
    tracer = trace.get_tracer(TRACER)
    with tracer.start_as_current_span("qforge.run", context=parent, kind=trace.SpanKind.CONSUMER,
                                      attributes=_attributes({
                                          "job_id": job.id, "task": job.task, "attempt": job.attempt,
                                          "queue": job.queue, "workflow_id": job.workflow_id,
                                          "step": job.step})):
        yield


# --------------------------------------------------------------------------- workflows and schedules
#
# A workflow run is one trace: qforge.submit (a producer span, child of the caller's span) is
# stored as the trace context of every step, so each step's qforge.run is its child; a fan-out
# step's elements are children of a qforge.fan_out span, itself a child of the submit; a
# sub-workflow's qforge.submit is a child of its parent's; qforge.workflow.end, a child of the
# submit, says how the run ended. A schedule's fire starts a trace of its own (qforge.schedule.fire,
# linked to the span that created the schedule), in which its job or definition run is enqueued.


@contextlib.contextmanager
def span(name: str, *, parent: dict[str, str] | None = None, link: dict[str, str] | None = None,
         root: bool = False, producer: bool = True, **values: Any) -> Iterator[Traced]:
    """A span named `name`, current inside the block: a child of the stored context `parent`
    when given, else of the current span (`root`: of none); with a link to the stored context
    `link`. Yields its context to store (Traced.carrier), or an untraced Traced."""
    if not active():
        yield Traced()
        return
    from opentelemetry import context as otel_context, propagate, trace

    if parent:
        start_context = propagate.extract(parent)
    elif root:
        start_context = otel_context.Context()
    else:
        start_context = None
    links = []
    if link:
        linked = trace.get_current_span(propagate.extract(link)).get_span_context()
        if linked.is_valid:
            links.append(trace.Link(linked))
    tracer = trace.get_tracer(TRACER)
    with tracer.start_as_current_span(name, context=start_context, links=links,
                                      kind=trace.SpanKind.PRODUCER if producer else trace.SpanKind.INTERNAL,
                                      attributes=_attributes(values)) as current:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        yield Traced(current, carrier or None)


def ended(parent: dict[str, str] | None, name: str, **values: Any) -> None:
    """A span that marks a moment (a workflow's end) in the trace of the stored context `parent`."""
    if not active() or not parent:
        return
    with span(name, parent=parent, producer=False, **values):
        pass
