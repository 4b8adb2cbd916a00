"""DBOS Transact's side of bench/code_vs_dbos.py: the same two workflow shapes, run in its own venv.

    .venv-dbos/bin/python bench/peer_dbos_workflows.py URL SHAPE N   -> one JSON line
"""

import json
import resource
import sys
import time

from dbos import DBOS, DBOSConfig

url, shape, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
config: DBOSConfig = {"name": "bench_dbos", "system_database_url": url, "log_level": "WARNING"}
DBOS(config=config)


@DBOS.step()
def bench_step(i):
    started = time.time()
    return {"t0": started, "t1": time.time()}


@DBOS.workflow()
def sequential():
    return [bench_step(i) for i in range(10)]


@DBOS.workflow()
def fan_out():
    first = bench_step(0)
    handles = [steps.enqueue(bench_step, i) for i in range(1, 11)]
    return [first, [h.get_result() for h in handles]]


DBOS.launch()
runs = DBOS.register_queue("runs", worker_concurrency=32, polling_interval_sec=0.1)
steps = DBOS.register_queue("steps", worker_concurrency=32, polling_interval_sec=0.1)
usage = resource.getrusage(resource.RUSAGE_SELF)
started = time.perf_counter()
handles = [runs.enqueue(sequential if shape == "sequential" else fan_out) for _ in range(count)]
results = [h.get_result() for h in handles]
wall = time.perf_counter() - started
after = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"wall": wall, "cpu": after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime,
                  "results": results}))
DBOS.destroy()
