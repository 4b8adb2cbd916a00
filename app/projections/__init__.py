"""Read models: views of the projection tables for the API, replay and verify."""
