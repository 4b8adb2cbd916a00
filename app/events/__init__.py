"""Events: the types, the state machine and the event store (knows nothing of its callers)."""
