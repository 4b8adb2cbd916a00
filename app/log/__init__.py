"""The log room: partitions' lifecycle (archive, pack), segment files, archived reads and their checks."""
