"""The HTTP routers: one module per resource (app.py mounts them)."""
