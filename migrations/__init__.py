"""The schema, shipped inside the package: versioned migrations and repeatable definitions (qforge.migrate)."""
