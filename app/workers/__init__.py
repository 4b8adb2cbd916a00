"""Workers: the pool that claims and runs jobs, the task executors, heartbeats and the monitor."""
