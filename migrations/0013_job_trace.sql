-- The trace context of whoever enqueued a job (W3C traceparent/tracestate, as
-- OpenTelemetry's propagator writes them), folded from its Enqueued event, so
-- the claim can hand it to the worker and the run span joins the producer's
-- trace. NULL for jobs enqueued without tracing (all jobs before this version).
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS trace jsonb;
