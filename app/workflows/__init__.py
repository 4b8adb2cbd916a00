"""The workflow room: the DAG rules, submit, the engine (the one door every step's end goes through), resume, definitions, and workflows written as code."""
