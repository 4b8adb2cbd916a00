"""Workflows: written as code (durable execution on the event log); the graph engine moves here later."""
