"""What one run of a code workflow's function costs in Python: replaying a journal of N succeeded steps.

The figure behind the choice to re-run the function from the top on every activation
(docs/workflows-as-code.md): python bench/code_replay_cost.py
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

from qforge.workflows.context import Context
from qforge.workflows.replay import Replay, StepRecord


def sequential(ctx: Context, steps: int) -> str:
    for index in range(steps):
        ctx.run("step", {"i": index})
    return "done"


def main() -> None:
    for steps in (10, 100, 1000):
        journal = [{"op": "run", "step": "step" if i == 0 else f"step#{i + 1}", "task": "step",
                    "payload": {"i": i}, "options": {}} for i in range(steps)]
        records = {op["step"]: StepRecord("succeeded", {"ok": 1}) for op in journal}
        repetitions = max(3, 2000 // steps)
        started = time.perf_counter()
        for _ in range(repetitions):
            replay = Replay(journal, records, datetime.now(timezone.utc))
            assert sequential(Context(replay, "bench", None), steps) == "done"
        per_run = (time.perf_counter() - started) / repetitions
        print(f"{steps:5d} steps: one replay of the journal {per_run * 1e3:8.3f} ms"
              f" ({per_run / steps * 1e6:5.1f} us per step)")


if __name__ == "__main__":
    main()
