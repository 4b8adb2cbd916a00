"""The Markdown table and the goal checks of a bench/run.py result."""

from __future__ import annotations

from typing import Any, Callable

NAMES = {"qforge": "QForge", "pgqueuer": "PgQueuer", "procrastinate": "Procrastinate", "oban": "Oban",
         "dbos": "DBOS"}

# The goals of #33 (the single job's path), every one a ratio to a figure of the same run.
LATENCY_P50_OVER_BEST_PEER = 1.0
LATENCY_P99_OVER_BEST_PEER = 1.2
ENQUEUE_OVER_PGQUEUER = 1.0
DRAIN_OVER_PGQUEUER_BEST = 1.3  # QForge's median over PgQueuer's best repetition
POSTGRES_CPU_OVER_PGQUEUER = 1.0
ATTRIBUTED_CPU_OVER_PGQUEUER = 0.8  # workers + PostgreSQL
CLAIM_HISTORY_RATIO = 0.95  # claim with the large history / empty, in every repetition
SSE_MANY_OVER_ONE = 2.0  # p99 with 100 subscribers over p99 with one, in every repetition
REPLAY_OVER_0_1_0 = 3.0  # the fold issue's goal, kept


def _median(summary: dict | None) -> float | None:
    return None if not summary else summary.get("median")


def _get(results: dict, *path: str) -> Any:
    node: Any = results
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def _best_peer(results: dict, part: str, figure: str) -> tuple[str | None, float | None]:
    """The peer with the lowest median of `figure` in `part` (latency: the fastest), and that median."""
    medians = {name: _median(_get(results, part, name, figure)) for name in results.get(part, {})
               if name != "qforge"}
    medians = {name: value for name, value in medians.items() if value is not None}
    if not medians:
        return None, None
    name = min(medians, key=medians.__getitem__)
    return name, medians[name]


def goals(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each goal of #33: QForge's figure, what it is compared to (a peer's figure of the same run),
    their ratio, the bar the ratio must meet, met (None: not measured)."""

    def goal(what: str, figure: float | None, against: str | None, reference: float | None, bar: float,
             higher_is_better: bool) -> dict[str, Any]:
        ratio = None if figure is None or not reference else figure / reference
        met = None if ratio is None else (ratio >= bar if higher_is_better else ratio <= bar)
        return {"goal": what, "qforge": figure, "against": against, "reference": reference,
                "ratio": ratio, "bar": bar, "higher_is_better": higher_is_better, "met": met}

    qf = lambda part, figure: _median(_get(results, part, "qforge", figure))  # noqa: E731
    pgq = lambda figure: _median(_get(results, "drain", "pgqueuer", figure))  # noqa: E731
    p50_peer, p50_best = _best_peer(results, "latency", "p50_ms")
    p99_peer, p99_best = _best_peer(results, "latency", "p99_ms")
    pgq_best_drain = (_get(results, "drain", "pgqueuer", "drain_jobs_per_s") or {}).get("max")
    sse = _get(results, "sse") or {}
    # a repetition still held back by another database's xid after its retries measured that
    # neighbour, not QForge (run.py's ForeignXminWatch): none left means "not measured"
    clean_sse = [rep for rep in sse.get("raw") or [] if not rep.get("foreign_xid_limit_exceeded")]
    worst_sse = max(clean_sse or [{}], key=lambda rep: rep.get("ratio_p99", 0))
    name = lambda peer: NAMES.get(peer, peer) if peer else None  # noqa: E731
    return [
        goal("enqueue-to-start latency p50, ms", qf("latency", "p50_ms"), name(p50_peer), p50_best,
             LATENCY_P50_OVER_BEST_PEER, False),
        goal("enqueue-to-start latency p99, ms", qf("latency", "p99_ms"), name(p99_peer), p99_best,
             LATENCY_P99_OVER_BEST_PEER, False),
        goal("enqueue, jobs/s", qf("drain", "enqueue_jobs_per_s"), "PgQueuer", pgq("enqueue_jobs_per_s"),
             ENQUEUE_OVER_PGQUEUER, True),
        goal("drain, jobs/s (QForge's median / PgQueuer's best repetition)", qf("drain", "drain_jobs_per_s"),
             "PgQueuer", pgq_best_drain, DRAIN_OVER_PGQUEUER_BEST, True),
        goal("PostgreSQL CPU µs per drained job", qf("drain", "drain_postgres_cpu_us_per_job"), "PgQueuer",
             pgq("drain_postgres_cpu_us_per_job"), POSTGRES_CPU_OVER_PGQUEUER, False),
        goal("workers + PostgreSQL CPU µs per drained job", qf("drain", "drain_attributed_cpu_us_per_job"),
             "PgQueuer", pgq("drain_attributed_cpu_us_per_job"), ATTRIBUTED_CPU_OVER_PGQUEUER, False),
        goal("claim jobs/s with the large history (the repetition of the lowest ratio to the empty one)",
             _worst_claim(results), "QForge, empty history", _worst_claim(results, "empty_claim"),
             CLAIM_HISTORY_RATIO, True),
        goal(f"SSE delivery lag p99, ms, {sse.get('subscribers', 100)} subscribers (worst repetition"
             f"{_sse_left_out(sse, clean_sse)})",
             worst_sse.get("p99_ms"), "QForge, 1 subscriber", worst_sse.get("single_p99_ms"),
             SSE_MANY_OVER_ONE, False),
        goal("replay, events/s", _median(_get(results, "replay", "events_per_s")), "QForge 0.1.0 (same run)",
             _replay_0_1_0(results), REPLAY_OVER_0_1_0, True),
    ]


def _sse_left_out(sse: dict, clean: list[dict]) -> str:
    """How many SSE repetitions another database's xid held back even after their retries."""
    held = len(sse.get("raw") or []) - len(clean)
    return f"; {held} left out: another database held an xid" if held else ""


def _worst_claim(results: dict, key: str = "history_claim") -> float | None:
    """Claim jobs/s of the repetition whose history / empty ratio is the lowest (`key`: which side)."""
    claim = results.get("claim") or {}
    history, empty = (claim.get(side, {}).get("values") or [] for side in ("history_claim", "empty_claim"))
    pairs = [(h / e, index) for index, (h, e) in enumerate(zip(history, empty)) if e]
    if not pairs:
        return None
    return claim[key]["values"][min(pairs)[1]]


def _replay_0_1_0(results: dict) -> float | None:
    """0.1.0's events/s from bench/replay_bench.py's output: today's median over its ratio."""
    today, ratio = _median(_get(results, "replay", "events_per_s")), _get(results, "replay", "raw", "ratio")
    return None if not today or not ratio else today / ratio


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
            ("enqueue, jobs/s (batches of 1,000 in one call; DBOS, which has no batch enqueue: one"
             " enqueue_in_transaction call per job, 1,000 per transaction)",
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
    versions = results.get("peer_versions", {})
    header = "| figure: median (min–max) | " + " | ".join(
        f"{NAMES[n]} {versions[n]}" if n in versions else NAMES[n] for n in systems) + " |"
    lines = [header, "|" + " --- |" * (len(systems) + 1)]
    lines += [f"| {label} | " + " | ".join(cells) + " |" for label, cells in rows]
    lines += ["", "| goal (#33) | QForge | compared to | its figure | ratio | bar for the ratio | met |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for goal in results.get("goals", []):
        met = {True: "yes", False: "**no**", None: "not measured"}[goal["met"]]
        bar = ("≥ " if goal["higher_is_better"] else "≤ ") + f"{goal['bar']:g}"
        ratio = "–" if goal["ratio"] is None else f"{goal['ratio']:.2f}"
        lines.append(f"| {goal['goal']} | {_number(goal['qforge'])} | {goal['against'] or '–'} | "
                     f"{_number(goal['reference'])} | {ratio} | {bar} | {met} |")
    return "\n".join(lines)
