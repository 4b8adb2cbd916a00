"""Commands: each takes a connection, appends its events and (through the projection
trigger) updates the read model in one transaction."""
