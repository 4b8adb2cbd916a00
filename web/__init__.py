"""The dashboard: static files served by the API."""
