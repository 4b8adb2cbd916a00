"""The Markdown table and the goal checks of a bench/run.py result."""

from __future__ import annotations

from typing import Any, Callable

NAMES = {"qforge": "QForge", "pgqueuer": "PgQueuer", "procrastinate": "Procrastinate", "oban": "Oban",
         "dbos": "DBOS"}

# The fold issue's targets. Peer-relative goals compare figures of the same run.
DRAIN_OVER_PEER_BEST = 1.3
ATTRIBUTED_CPU_OVER_PEER = 0.8
LATENCY_P99_MS = 50.0
CLAIM_HISTORY_RATIO = 0.95  # in every repetition
REPLAY_OVER_0_1_0 = 3.0
SSE_MANY_OVER_ONE = 2.0  # p99 with 100 subscribers over p99 with one, in every repetition


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
    """Each goal: what, QForge's figure (a ratio where the goal is one), the bar, met (None: not measured)."""

    def check(goal: str, value: float | None, bar: float | None, higher_is_better: bool) -> dict[str, Any]:
        met = None
        if value is not None and bar is not None:
            met = value >= bar if higher_is_better else value <= bar
        return {"goal": goal, "qforge": value, "bar": bar, "met": met}

    def ratio(top: float | None, bottom: float | None) -> float | None:
        return None if top is None or not bottom else top / bottom

    peer = lambda *path: _median(_get(results, "drain", "pgqueuer", *path))  # noqa: E731
    qf = lambda *path: _median(_get(results, "drain", "qforge", *path))  # noqa: E731
    peer_best = (_get(results, "drain", "pgqueuer", "drain_jobs_per_s") or {}).get("max")
    claim_worst = (_get(results, "claim", "ratio") or {}).get("min")
    return [
        check("enqueue jobs/s, QForge / PgQueuer", ratio(qf("enqueue_jobs_per_s"), peer("enqueue_jobs_per_s")),
              1.0, True),
        check("drain jobs/s, QForge median / PgQueuer's best repetition",
              ratio(qf("drain_jobs_per_s"), peer_best), DRAIN_OVER_PEER_BEST, True),
        check("PostgreSQL CPU µs per drained job, QForge / PgQueuer",
              ratio(qf("drain_postgres_cpu_us_per_job"), peer("drain_postgres_cpu_us_per_job")), 1.0, False),
        check("workers + PostgreSQL CPU µs per drained job, QForge / PgQueuer",
              ratio(qf("drain_attributed_cpu_us_per_job"), peer("drain_attributed_cpu_us_per_job")),
              ATTRIBUTED_CPU_OVER_PEER, False),
        check("latency p50, QForge / PgQueuer",
              ratio(_median(_get(results, "latency", "qforge", "p50_ms")),
                    _median(_get(results, "latency", "pgqueuer", "p50_ms"))), 1.0, False),
        check(f"latency p99 <= {LATENCY_P99_MS:g} ms", _median(_get(results, "latency", "qforge", "p99_ms")),
              LATENCY_P99_MS, False),
        check("claim with the large history / empty, worst repetition", claim_worst, CLAIM_HISTORY_RATIO, True),
        check("replay events/s, today / 0.1.0 (same run)", _get(results, "replay", "raw", "ratio"),
              REPLAY_OVER_0_1_0, True),
        check("SSE p99 lag, 100 subscribers / 1, worst repetition", _get(results, "sse", "worst_ratio_p99"),
              SSE_MANY_OVER_ONE, False),
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
        if sse.get("single_p99_ms"):
            rows.append(("SSE delivery lag p99, ms (1 subscriber, same rate)", only(_cell(sse["single_p99_ms"], _ms))))
    replay = results.get("replay")
    if replay:
        text = _cell(replay.get("events_per_s"), _int) if "events_per_s" in replay else f"skipped: {replay['skipped']}"
        rows.append(("replay, events/s", only(text)))
    scale = results.get("scale")
    if scale:
        n = f"{scale['events']:,}"
        labels = {"enqueue_jobs_per_s": "enqueue", "claim_jobs_per_s": "claim",
                  "claim_complete_jobs_per_s": "claim+complete", "job_events_rps": "GET /jobs/{id}/events",
                  "tag_search_rps": "tag search", "queues_rps": "GET /queues",
                  "sse_catch_up_events_per_s": "SSE catch-up 1M events back"}
        for key, label in labels.items():
            if key in scale["ratios"]:
                rows.append((f"scale: {label}, {n} events / empty", only(_cell(scale["ratios"][key], _ratio))))
            for side, ratios in scale.get("packed_ratios", {}).items():
                if key in ratios:
                    rows.append((f"scale: {label}, {n} events {side} / empty (/ unpacked)",
                                 only(f"{_cell(ratios[key], _ratio)}"
                                      f" ({_cell(scale['packed_over_unpacked'][side][key], _ratio)})")))
        for side, pack in scale.get("pack", {}).items():
            per = pack["bytes_per_event"]
            rows += [
                (f"scale: {side}: pack, events/s ({pack['events']:,} events, {pack['partitions']} partitions)",
                 only(f"{_int(pack['events_per_s'] or 0)} in {pack['seconds']:.0f} s")),
                (f"scale: {side}: bytes per event of the log, before / after packing (packed blocks alone)",
                 only(f"{_number(per['before'])} / {_number(per['after'])} ({_number(per['packed'])})")),
            ]
        if scale.get("drain_ratio") is not None:
            rows.append(("scale: drain while qforge archive runs / without", only(_ratio(scale["drain_ratio"]))))
        archive = scale.get("archive", {})
        if archive.get("events_per_s"):
            rows.append(("scale: archive, events/s", only(_int(archive["events_per_s"]))))
        per = scale.get("bytes_per_event")
        if per:  # (the drain beside `qforge archive`: left out with --no-archive)
            rows.append(("scale: bytes per event, database / archive raw / archive compressed",
                         only(" / ".join(_number(per.get(k))
                                         for k in ("database", "archive_raw", "archive_compressed")))))
    header = "| figure: median (min–max) | " + " | ".join(NAMES[n] for n in systems) + " |"
    lines = [header, "|" + " --- |" * (len(systems) + 1)]
    lines += [f"| {label} | " + " | ".join(cells) + " |" for label, cells in rows]
    lines += ["", "| goal (QForge) | QForge | bar | met |", "| --- | --- | --- | --- |"]
    for goal in results.get("goals", []):
        value, bar = _number(goal["qforge"]), _number(goal["bar"])
        met = {True: "yes", False: "**no**", None: "not measured"}[goal["met"]]
        lines.append(f"| {goal['goal']} | {value} | {bar} | {met} |")
    return "\n".join(lines)
