"""The Markdown table and the goal checks of a bench/run.py result."""

from __future__ import annotations

from typing import Any, Callable

NAMES = {"qforge": "QForge", "pgqueuer": "PgQueuer", "procrastinate": "Procrastinate"}

# The targets (issue 8). Peer-relative goals compare medians of the same run.
LATENCY_P50_MS = 5.0
LATENCY_P99_MS = 50.0
CLAIM_HISTORY_RATIO = 0.9
SSE_P99_MS = 250.0
REPLAY_EVENTS_PER_S = 100_000


def _median(summary: dict | None) -> float | None:
    return None if not summary else summary.get("median")


def _get(results: dict, *path: str) -> Any:
    node: Any = results
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def goals(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each goal: what, QForge's median, the bar, met (None when not measured)."""

    def check(goal: str, value: float | None, bar: float | None, higher_is_better: bool) -> dict[str, Any]:
        met = None
        if value is not None and bar is not None:
            met = value >= bar if higher_is_better else value <= bar
        return {"goal": goal, "qforge": value, "bar": bar, "met": met}

    peer = lambda *path: _median(_get(results, "drain", "pgqueuer", *path))  # noqa: E731
    qf = lambda *path: _median(_get(results, "drain", "qforge", *path))  # noqa: E731
    return [
        check("drain jobs/s >= PgQueuer's", qf("drain_jobs_per_s"), peer("drain_jobs_per_s"), True),
        check("drain CPU µs/job (machine) <= PgQueuer's", qf("drain_machine_cpu_us_per_job"),
              peer("drain_machine_cpu_us_per_job"), False),
        check("drain CPU µs/job (workers + PostgreSQL) <= PgQueuer's", qf("drain_attributed_cpu_us_per_job"),
              peer("drain_attributed_cpu_us_per_job"), False),
        check("enqueue jobs/s >= PgQueuer's", qf("enqueue_jobs_per_s"), peer("enqueue_jobs_per_s"), True),
        check(f"latency p50 <= {LATENCY_P50_MS:g} ms", _median(_get(results, "latency", "qforge", "p50_ms")),
              LATENCY_P50_MS, False),
        check(f"latency p99 <= {LATENCY_P99_MS:g} ms", _median(_get(results, "latency", "qforge", "p99_ms")),
              LATENCY_P99_MS, False),
        check(f"claim with history >= {CLAIM_HISTORY_RATIO}x empty", _median(_get(results, "claim", "ratio")),
              CLAIM_HISTORY_RATIO, True),
        check(f"SSE p99 lag <= {SSE_P99_MS:g} ms", _median(_get(results, "sse", "p99_ms")), SSE_P99_MS, False),
        check(f"replay >= {REPLAY_EVENTS_PER_S:,} events/s", _median(_get(results, "replay", "events_per_s")),
              REPLAY_EVENTS_PER_S, True),
    ]


def _cell(summary: dict | None, fmt: Callable[[float], str]) -> str:
    if not summary or summary.get("median") is None:
        return "–"
    return f"{fmt(summary['median'])} ({fmt(summary['min'])}–{fmt(summary['max'])})"


def _number(value: float | None) -> str:
    if value is None:
        return "–"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _int(value: float) -> str:
    return f"{value:,.0f}"


def _ms(value: float) -> str:
    return f"{value:.1f}" if value < 100 else f"{value:,.0f}"


def _ratio(value: float) -> str:
    return f"{value:.2f}"


def markdown_table(results: dict[str, Any]) -> str:
    systems = [name for name in NAMES if name in results.get("drain", {}) or name in results.get("latency", {})]
    if not systems:
        systems = ["qforge"]  # only QForge-only parts were run
    rows: list[tuple[str, list[str]]] = []
    drain = results.get("drain", {})
    if drain:
        size = ", ".join(f"{NAMES[n]} {drain[n]['jobs']:,}" for n in systems if n in drain)
        rows += [
            (f"drain, jobs/s (pre-enqueued no-op jobs: {size}; 2 worker processes each)",
             [_cell(_get(drain, n, "drain_jobs_per_s"), _int) for n in systems]),
            ("drain, CPU µs per job, whole machine",
             [_cell(_get(drain, n, "drain_machine_cpu_us_per_job"), _int) for n in systems]),
            ("drain, CPU µs per job, workers + PostgreSQL only",
             [_cell(_get(drain, n, "drain_attributed_cpu_us_per_job"), _int) for n in systems]),
            ("… of which the workers",
             [_cell(_get(drain, n, "drain_workers_cpu_us_per_job"), _int) for n in systems]),
            ("… of which PostgreSQL",
             [_cell(_get(drain, n, "drain_postgres_cpu_us_per_job"), _int) for n in systems]),
            ("enqueue, jobs/s (batches of 1,000)",
             [_cell(_get(drain, n, "enqueue_jobs_per_s"), _int) for n in systems]),
        ]
    latency = results.get("latency", {})
    if latency:
        jobs = results["config"]["latency_jobs"]
        rows += [
            (f"enqueue-to-start latency p50, ms ({jobs:,} single enqueues, idle workers)",
             [_cell(_get(latency, n, "p50_ms"), _ms) for n in systems]),
            ("enqueue-to-start latency p99, ms", [_cell(_get(latency, n, "p99_ms"), _ms) for n in systems]),
        ]
    blank = ["n/a"] * (len(systems) - 1)
    only = lambda text: [text] + blank if "qforge" in systems else [text]  # noqa: E731
    claim = results.get("claim")
    if claim:
        history = f"{claim['history']['jobs']:,}"
        rows += [
            (f"claim jobs/s, empty history ({claim['pending_jobs']:,} pending, 2 claimers x 100)",
             only(_cell(claim["empty_claim"], _int))),
            (f"claim jobs/s, {history} finished jobs in history", only(_cell(claim["history_claim"], _int))),
            ("claim, history / empty", only(_cell(claim["ratio"], _ratio))),
            ("claim, PostgreSQL CPU µs per job, empty / history",
             only(f"{_cell(claim.get('empty_claim_server_cpu_us'), _ms)} / "
                  f"{_cell(claim.get('history_claim_server_cpu_us'), _ms)}")),
            ("claim+complete jobs/s, empty history", only(_cell(claim["empty_claim_complete"], _int))),
            (f"claim+complete jobs/s, {history} in history", only(_cell(claim["history_claim_complete"], _int))),
            (f"history generation, s ({claim['history']['events']:,} events)",
             only(f"{claim['history']['total_s']:.0f}")),
        ]
    sse = results.get("sse")
    if sse:
        rows.append((f"SSE delivery lag p99, ms ({sse['subscribers']} subscribers, {sse['rate']:,} events/s)",
                     only(_cell(sse["p99_ms"], _ms))))
    replay = results.get("replay")
    if replay:
        text = _cell(replay.get("events_per_s"), _int) if "events_per_s" in replay else f"skipped: {replay['skipped']}"
        rows.append(("replay, events/s", only(text)))
    header = "| figure: median (min–max) | " + " | ".join(NAMES[n] for n in systems) + " |"
    lines = [header, "|" + " --- |" * (len(systems) + 1)]
    lines += [f"| {label} | " + " | ".join(cells) + " |" for label, cells in rows]
    lines += ["", "| goal (QForge) | QForge | bar | met |", "| --- | --- | --- | --- |"]
    for goal in results.get("goals", []):
        value, bar = _number(goal["qforge"]), _number(goal["bar"])
        met = {True: "yes", False: "**no**", None: "not measured"}[goal["met"]]
        lines.append(f"| {goal['goal']} | {value} | {bar} | {met} |")
    return "\n".join(lines)
