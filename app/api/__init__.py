"""The HTTP API: FastAPI routers, one file per resource; routes call commands and projections."""
