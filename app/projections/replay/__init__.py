"""Replay: rebuild the projections from the event log, verify them against the live tables, swap them in.

The projections (jobs, workflows, execution_tags) are folds of the log. The
live path folds each insert in the events_project() statement trigger on the
log; replay inserts the log, chunk by chunk, into a feed table that carries the
same trigger, with scratch tables first on the search path (queries in
app/sql/replay.sql), so replay equals live by construction and `verify` proves
it on a real database.

- rebuild: fold the log (or its prefix up to a position) into a scratch
  schema, chunk by chunk of streams in one REPEATABLE READ snapshot.
- verify: fold and compare chunk by chunk with the live tables, in one
  read-only snapshot, so it runs while the system works; nothing is written.
- swap: make the live tables equal to a rebuild, atomically. It marks the
  rows that differ without locks; then, in one transaction under locks that
  stop writers (not readers), it folds again the streams that got events
  since the rebuild's snapshot and deletes, updates and inserts only those
  rows and the marked ones. The live tables stay the same tables, so their
  indexes, the events_project() trigger and the functions typed on their rows
  stay valid, and writers wait for the delta, not for the whole replay.
"""

from qforge.projections.replay.common import PROJECTIONS, SCRATCH_SCHEMA, Projection, ReplayError
from qforge.projections.replay.rebuild import RebuildStats, position_at, rebuild, status_counts
from qforge.projections.replay.swap import SwapStats, replay, swap
from qforge.projections.replay.verify import Difference, VerifyReport, verify, verify_report

__all__ = ["PROJECTIONS", "SCRATCH_SCHEMA", "Difference", "Projection", "RebuildStats", "ReplayError",
           "SwapStats", "VerifyReport", "position_at", "rebuild", "replay", "status_counts", "swap",
           "verify", "verify_report"]
