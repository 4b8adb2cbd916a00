"""QForge: an event-sourced job queue and DAG workflow orchestrator on PostgreSQL."""
