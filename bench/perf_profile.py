"""Where the CPU goes: `perf` samples of a benchmark step, grouped by process and by what the code does.

Profile evidence for the goals of bench/run.py that a figure alone cannot
explain. Off unless asked for: with BENCH_PERF_DIR set, bench/harness.py
records the whole machine (`perf record -e cpu-clock -a`, no call graphs, so
the cost to the measured systems is the sampling interrupt) during each drain
and each enqueue, and notes which processes were the system's workers and its
PostgreSQL backends. Then:

    BENCH_PERF_DIR=/tmp/perf python bench/run.py --parts drain --repeat 1 ...
    python bench/perf_profile.py /tmp/perf

prints, per recorded step, the CPU µs per job of each group (PostgreSQL,
workers or the enqueuing client), split into categories of functions
(index upkeep, heap, WAL, hashing, jsonb, PL/pgSQL, executor, kernel, ...).
Needs `perf` (Debian: linux-perf) and root (or perf_event_paranoid <= 0).
PostgreSQL's own functions are named through its dynamic symbol table, so a
Debian build without debug symbols still resolves nearly all of them; what
stays unnamed lands in "other".
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

FREQUENCY = 999  # samples per second per CPU

# First match wins: (category, regex on the symbol, regex on the object file).
CATEGORIES: list[tuple[str, str, str]] = [
    ("kernel: network, scheduling, I/O", r"", r"kernel|vmlinux|\[vdso\]"),
    ("hashing (SHA-256)", r"sha256|SHA256|sha2", r"libcrypto"),
    ("PL/pgSQL interpreter", r"", r"plpgsql"),
    ("index upkeep and lookups (B-tree, BRIN)",
     r"^_bt|^bt[a-z]|^brin|^index_|^Index|ExecInsertIndexTuples|ExecIndex|_bt_|FormIndexDatum|"
     r"check_exclusion|ExecCheckIndexConstraints|^IndexScan", r""),
    ("heap: insert, update, visibility, pruning",
     r"^heap|^Heap|RelationGetBufferForTuple|PageAdd|PageGetHeapFreeSpace|HeapTuple|toast|"
     r"^page_|PageRepairFragmentation|^log_heap|simple_heap|ExecUpdate|ExecInsert|ExecDelete|"
     r"table_tuple|heapam", r""),
    ("WAL and commit", r"XLog|xlog|^Xact|RecordTransactionCommit|CommitTransaction|StartTransaction|"
                       r"AtEOXact|AtCommit|TransactionId|GetNewTransactionId|pg_fsync|issue_xlog_fsync|"
                       r"SyncRepWait|ProcArray|GetSnapshotData|XidInMVCC|SubTrans|CLog|clog", r""),
    ("buffers and locks", r"Buffer|LWLock|^Lock|LockAcquire|LockRelease|LockRelation|hash_search|"
                          r"hash_bytes|^pg_atomic|s_lock|SpinLock|ReadBuffer|MarkBuffer|"
                          r"PinBuffer|StrategyGetBuffer|ResourceOwner", r""),
    ("jsonb", r"jsonb|Jsonb|json_|JsonContainer|JsonValue|getKeyJsonValue|findJsonbValue|"
              r"pushJsonbValue|convertJsonb|lengthCompareJsonb|fillJsonbValue|uniqueifyJsonbObject", r""),
    ("executor and expressions", r"^Exec|ExecInterp|^ExecEval|slot_|^tts_|^execTuples|"
                                 r"FunctionCall|DirectFunctionCall|OidFunctionCall|^fmgr|"
                                 r"datum|Datum|^int[248]|^text|varlena|^uuid|timestamp|^numeric|"
                                 r"^bpchar|^name|texteq|^byteacat|^range_", r""),
    ("parse, plan and plan cache", r"^parse|^raw_parser|^base_yy|^core_yy|^transform|^plan|^pull_|"
                                   r"^subquery_planner|^query_planner|^create_|^make_|^cost_|"
                                   r"GetCachedPlan|RevalidateCachedQuery|CachedPlan|^expression_tree|"
                                   r"^eval_const|^fix_|^set_|^preprocess|^grouping_planner|"
                                   r"^SearchCatCache|^SearchSysCache|catcache|relcache|^Relation", r""),
    ("memory allocation", r"^palloc|^pfree|AllocSet|MemoryContext|^repalloc|GenerationAlloc|"
                          r"SlabAlloc|^malloc|^free$|^_int_malloc|^_int_free|cfree|^memcpy|^memset|"
                          r"__memmove|__memset|__memcpy|memcmp", r""),
    ("protocol and sockets", r"^pq_|^secure_|^socket_|^internal_flush|^Send|^ReadCommand|"
                             r"^PostgresMain|^exec_bind|^exec_execute|^exec_parse|^exec_simple|"
                             r"^printtup|^SocketBackend|^WaitEventSet|^WaitLatch|^be_tls", r""),
    ("triggers and transition tables", r"Trigger|trigger|tuplestore|AfterTrigger", r""),
    ("Python interpreter", r"", r"python|libpython"),
    ("psycopg and libpq", r"", r"psycopg|libpq"),
    ("C library", r"", r"libc\.so|libc-|ld-linux|libm\.so"),
]
_COMPILED = [(name, re.compile(sym) if sym else None, re.compile(dso) if dso else None)
             for name, sym, dso in CATEGORIES]


def category(symbol: str, dso: str) -> str:
    for name, sym, obj in _COMPILED:
        if sym is not None and obj is not None:
            if sym.search(symbol) or obj.search(dso):
                return name
        elif sym is not None and sym.search(symbol):
            return name
        elif obj is not None and obj.search(dso):
            return name
    return "other"


class Recording:
    """`perf record` of the whole machine for one step, when BENCH_PERF_DIR asks for it."""

    def __init__(self, name: str) -> None:
        folder = os.environ.get("BENCH_PERF_DIR")
        self.process: subprocess.Popen | None = None
        if not folder or shutil.which("perf") is None:
            return
        self.path = Path(folder)
        self.path.mkdir(parents=True, exist_ok=True)
        existing = len(list(self.path.glob(f"{name}-[0-9]*.data")))  # not "claim-complete-1" for "claim"
        self.stem = self.path / f"{name}-{existing + 1}"
        self.process = subprocess.Popen(
            ["perf", "record", "-q", "-e", "cpu-clock", "-F", str(FREQUENCY), "-a",
             *os.environ.get("BENCH_PERF_ARGS", "").split(), "-o", f"{self.stem}.data"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self, *, jobs: int, groups: dict[str, set[int]] | None = None,
             by_command: dict[str, str] | None = None) -> None:
        """`groups`: name -> pids; `by_command`: process name -> group, for processes not known by pid."""
        if self.process is None:
            return
        self.process.send_signal(signal.SIGINT)
        self.process.wait(timeout=60)
        meta = {"jobs": jobs, "groups": {name: sorted(pids) for name, pids in (groups or {}).items()},
                "by_command": by_command or {}}
        Path(f"{self.stem}.json").write_text(json.dumps(meta))


def profile(data: Path) -> tuple[dict, dict[str, Counter]]:
    meta = json.loads(data.with_suffix(".json").read_text())
    group_of = {pid: name for name, pids in meta["groups"].items() for pid in pids}
    out = subprocess.run(["perf", "script", "-i", str(data), "-F", "pid,comm,ip,sym,dso"],
                         capture_output=True, text=True, check=True).stdout
    counts: dict[str, Counter] = defaultdict(Counter)
    line_re = re.compile(r"^\s*(?P<comm>.+?)\s+(?P<pid>\d+)\s+(?:[0-9a-f]+\s+)?(?P<sym>.*?)\s+\((?P<dso>[^)]*)\)\s*$")
    for line in out.splitlines():
        match = line_re.match(line)
        if not match:
            continue
        pid, comm = int(match["pid"]), match["comm"].strip()
        group = group_of.get(pid)
        if group is None:
            group = next((g for prefix, g in meta["by_command"].items() if comm.startswith(prefix)), None)
        if group is None:
            group = "rest of the machine"
        sym = re.sub(r"\+0x[0-9a-f]+$", "", match["sym"])
        counts[group][category(sym, match["dso"])] += 1
    return meta, counts


def report(folder: Path) -> None:
    for data in sorted(folder.glob("*.data")):
        if not data.with_suffix(".json").exists():
            continue
        meta, counts = profile(data)
        jobs = meta["jobs"]
        print(f"\n{data.stem}: CPU µs per job by group and category ({jobs:,} jobs, {FREQUENCY} Hz samples)")
        for group, cats in sorted(counts.items(), key=lambda item: -sum(item[1].values())):
            total = sum(cats.values())
            print(f"  {group}: {total / FREQUENCY * 1e6 / jobs:.1f}")
            for name, n in cats.most_common():
                share = n / total
                if share < 0.01:
                    continue
                print(f"      {n / FREQUENCY * 1e6 / jobs:7.1f}  {share:5.1%}  {name}")


# With call graphs (BENCH_PERF_ARGS="--call-graph dwarf,32768"): the share of PostgreSQL's time spent
# under each of these functions (a sample counts for every one on its stack, so shares overlap).
UNDER: list[tuple[str, str]] = [
    ("executing statements (ExecutorRun/Finish)", r"^(standard_)?Executor(Run|Finish)$"),
    ("after-statement triggers (folds, counters, wake-ups)", r"^AfterTriggerEndQuery$"),
    ("PL/pgSQL (trigger functions and their statements)", r"^plpgsql_exec_(trigger|function)$"),
    ("row inserts (heap)", r"^heap_(multi_)?insert$"),
    ("row updates (heap)", r"^heap_update$"),
    ("row locks (FOR UPDATE SKIP LOCKED)", r"^heap_lock_tuple$"),
    ("index entries written", r"^ExecInsertIndexTuples$"),
    ("index scans", r"^(index_getnext_tid|index_getnext_slot|_bt_first|_bt_next|btgettuple)$"),
    ("transition tables (tuplestore)", r"^tuplestore_"),
    ("SHA-256", r"sha256|SHA256|pg_cryptohash"),
    ("jsonb", r"^(jsonb_|Jsonb|pushJsonbValue|findJsonbValueFromContainer|getKeyJsonValueFromContainer)"),
    ("WAL records", r"^XLogInsert$"),
    ("commit (with its WAL flush)", r"^(CommitTransaction|CommitTransactionCommand)$"),
    ("WAL flush (fsync)", r"^XLogFlush$"),
    ("plan cache and planning", r"^(GetCachedPlan|pg_plan_query|planner|standard_planner)$"),
    ("parse and bind messages", r"^(exec_parse_message|exec_bind_message)$"),
    ("network reads and writes", r"^(secure_read|secure_write|pq_recvbuf|internal_flush|pq_flush)$"),
]


def under(data: Path, group: str = "postgres") -> tuple[int, int, Counter]:
    """(jobs, samples of `group`, samples per UNDER label) from a recording made with call graphs."""
    meta = json.loads(data.with_suffix(".json").read_text())
    pids = set(meta["groups"].get(group, []))
    out = subprocess.run(["perf", "script", "-i", str(data), "-F", "comm,pid,ip,sym"],
                         capture_output=True, text=True, check=True).stdout
    patterns = [(label, re.compile(pattern)) for label, pattern in UNDER]
    counts: Counter = Counter()
    samples = 0
    for block in out.split("\n\n"):
        lines = block.strip().splitlines()
        if not lines:
            continue
        head = lines[0].split()
        if len(head) < 2 or not head[1].isdigit():
            continue
        pid = int(head[1])
        if pids and pid not in pids or not pids and head[0] != group:
            continue
        samples += 1
        frames = [line.split(None, 1)[1] if len(line.split(None, 1)) > 1 else "" for line in lines[1:]]
        for label, pattern in patterns:
            if any(pattern.search(frame) for frame in frames):
                counts[label] += 1
    return meta["jobs"], samples, counts


def report_under(folder: Path) -> None:
    """PostgreSQL's share under each UNDER function: the "postgres" group of a recording, or each
    of its groups when it names no such group (qf_history's claim: one per database)."""
    for data in sorted(folder.glob("*.data")):
        groups = list(json.loads(data.with_suffix(".json").read_text())["groups"])
        for group in ["postgres"] if "postgres" in groups or not groups else groups:
            jobs, samples, counts = under(data, group)
            if not samples:
                continue
            print(f"\n{data.stem}, {group}: PostgreSQL CPU µs per job under each function ({jobs:,} jobs;"
                  f" {samples / FREQUENCY * 1e6 / jobs:.1f} in all)")
            for label, _ in UNDER:
                n = counts[label]
                print(f"  {n / FREQUENCY * 1e6 / jobs:7.1f}  {n / samples:5.1%}  {label}")


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--under":
        report_under(Path(sys.argv[2]))
        return 0
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    report(Path(sys.argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
