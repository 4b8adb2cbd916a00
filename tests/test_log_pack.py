"""qforge pack: closed partitions of the log go into compressed blocks and every reader sees the very same log;
a killed pack loses nothing, appends go on meanwhile, packed partitions stay append-only and archive alike."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from uuid import UUID

import httpx
import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from factories import count
from qforge.api.app import create_app
from qforge.api.server import BackgroundServer
from qforge.cli import main as cli
from qforge.log import pack as pack_module
from qforge.workflows import engine as wf
from qforge.log.archive import archive
from qforge.commands.claim import claim
from qforge.commands.enqueue import JobSpec, enqueue
from qforge.log.pack import STEPS, pack
from qforge.commands.report import Report, complete
from qforge.db import connect, with_database
from qforge.events import store
from qforge.log import segments
from qforge.audit import checkpoints as audit
from qforge.audit import proofs as audit_proof
from qforge.audit import verify as audit_verify
from qforge.log.archive_check import verify_archive
from qforge.events.states import JOB_READY_EVENTS
from qforge.projections import asof
from qforge.projections.replay import rebuild, replay, swap, verify
from qforge.settings import Settings
from test_archive import maintain, run_all, small_partitions, workload

EVERYTHING = "SELECT * FROM log_range(0, 9223372036854775807) ORDER BY position"


def stored(conn) -> list[dict]:
    """Every event of the log with every stored column, in position order."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(EVERYTHING).fetchall()


def gapless(conn, page: int, cursor: tuple[int, int] = (0, 0)) -> list[tuple[int, int]]:
    """(xid, position) of every event after `cursor` as events_after_page gives them, `page` at a time."""
    seen = []
    while rows := conn.execute("SELECT xid::text::bigint AS xid, position FROM events_after_page(%s::text::xid8,"
                               " %s, %s)", (str(cursor[0]), cursor[1], page)).fetchall():
        assert len(rows) <= page
        seen += [(r["xid"], r["position"]) for r in rows]
        cursor = seen[-1]
    return seen


def read_after_all(conn, page: int) -> list:
    """The whole log as readers get it (events_after in app/sql/events.sql), `page` at a time."""
    seen, cursor = [], store.START
    while batch := store.read_after(conn, cursor, page):
        seen += batch
        cursor = store.cursor_of(batch[-1])
    return seen


def readers(conn) -> dict:
    """What every reader of the log in the database answers."""
    rows = stored(conn)
    streams = sorted({r["stream_id"] for r in rows})
    workflows = sorted({r["workflow_id"] for r in rows if r["workflow_id"] is not None})
    jobs = conn.execute("SELECT id, version FROM jobs ORDER BY id").fetchall()
    return {
        "streams": {s: [e.model_dump(mode="json") for e in store.read_stream(conn, s)] for s in streams},
        "workflows": {w: [e.model_dump(mode="json") for e in store.read_workflow(conn, w)] for w in workflows},
        "gapless": {page: gapless(conn, page) for page in (1, 7, 500)},
        "read_after": {page: [(e.xid, e.model_dump(mode="json")) for e in read_after_all(conn, page)]
                       for page in (1, 7, 500)},
        "tail": {back: store.tail_cursor(conn, back) for back in (0, 1, 5, 63, 64, 65, 150, 10_000)},
        "ready_at": {j["id"]: count(conn, "SELECT job_ready_at(%s, %s, %s)", j["id"], j["version"] + 1,
                                    sorted(JOB_READY_EVENTS)) for j in jobs},
    }


def packed_state(conn) -> list[tuple[int, str]]:
    return [(r["lower_position"], r["state"]) for r in conn.execute(
        "SELECT lower_position, state FROM log_packs ORDER BY lower_position")]


def loose_tables(conn) -> list[str]:
    """Tables named like a partition of the log that are not part of it."""
    return [r["relname"] for r in conn.execute(
        "SELECT c.relname FROM pg_class c WHERE c.relname ~ '^events_(packed_)?[0-9]{19}$' AND c.relkind = 'r'"
        " AND NOT EXISTS (SELECT FROM pg_inherits i WHERE i.inhrelid = c.oid)")]


def pack_all(conn, **options):
    done = pack(conn, close_current=True, duty=1, **options)
    assert count(conn, "SELECT count(*) FROM events") == 0, "a closed partition was left live"
    return done


# -- every reader, before and after ------------------------------------------------------------------------


def api_answers(db_url: str, work) -> dict:
    """What the HTTP API answers about the workload, the whole log paged through /events included."""
    app = create_app(db_url, settings=Settings(database_url=db_url, api_token=None))
    answers = {}
    with BackgroundServer(app) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        paths = [f"/jobs/{work.finished[0]}", f"/jobs/{work.finished[0]}/events", f"/jobs/{work.pending[0]}",
                 f"/workflows/{work.done_workflow}", f"/workflows/{work.done_workflow}/events",
                 f"/workflows/{work.waiting_workflow}/events", "/executions?tag=order:A-2",
                 "/executions?tag=order:A-3&actor=w1", "/executions?tag=order:A-3&actor=nobody",
                 f"/jobs/{work.finished[-1]}?as_of={first_position_of(db_url, work.finished[-1])}"]
        for path in paths:
            response = client.get(path)
            assert response.status_code == 200, (path, response.text)
            answers[path] = response.json()
        pages, after = [], "0"
        while (page := client.get("/events", params={"after": after, "limit": 7}).json())["events"]:
            pages.append(page)
            after = page["next"]
        answers["/events"] = pages
    return answers


def first_position_of(db_url: str, job_id: UUID) -> int:
    """The position of the job's first event (an as-of point in its past)."""
    with connect(db_url) as own:
        return own.execute("SELECT min(position) FROM log_stream(%s)", (job_id,)).fetchone()[0]


def test_every_reader_sees_the_same_log_after_packing(conn, db_url, capsys):
    work = workload(conn)
    audit.checkpoint(conn)
    events = stored(conn)
    assert events == conn.execute("SELECT * FROM events ORDER BY position").fetchall()
    before = readers(conn)
    http_before = api_answers(db_url, work)
    proof_before = audit_proof.proof(conn, "workflow", work.done_workflow)
    as_of_before = [asof.job_as_of(conn, work.finished[0], p) for p in range(1, events[-1]["position"] + 1, 17)]
    capsys.readouterr()
    assert cli(["history", str(work.done_workflow), "--database-url", db_url]) == 0
    history_before = capsys.readouterr().out

    done = pack_all(conn)
    assert done.events == len(events) and len(done.partitions) >= 2
    assert [state for _, state in packed_state(conn)] == ["packed"] * len(done.partitions)
    block = count(conn, "SELECT log_pack_block()")
    blocks = {(lower, (e["position"] - lower) // block) for e in events
              for lower in [max(lo for lo in done.partitions if lo <= e["position"])]}
    assert count(conn, "SELECT count(*) FROM events_packed") == len(blocks) > len(done.partitions)
    assert loose_tables(conn) == []

    assert stored(conn) == events  # every column of every event, as stored
    assert readers(conn) == before
    assert api_answers(db_url, work) == http_before
    assert [asof.job_as_of(conn, work.finished[0], p)
            for p in range(1, events[-1]["position"] + 1, 17)] == as_of_before
    assert cli(["history", str(work.done_workflow), "--database-url", db_url]) == 0
    assert capsys.readouterr().out == history_before

    # The audit: the checkpoint made before packing still holds, a new one covers only new events.
    assert audit_proof.proof(conn, "workflow", work.done_workflow) == proof_before
    assert audit_proof.check(proof_before)["verified"] and len(proof_before["events"]) > 3
    assert audit.checkpoint(conn) == []
    enqueue(conn, [JobSpec(task="echo")], actor="test")
    (after,) = audit.checkpoint(conn)
    assert after.events == 1
    report = audit_verify.verify(conn)
    assert report.problems == [] and report.events == len(events) + 1
    assert cli(["audit", "verify", "--database-url", db_url]) == 0

    assert verify(conn) == []
    _built, swapped = replay(conn)
    assert swapped.changed == 0


def test_a_long_lived_workflow_whose_first_events_are_packed_goes_on(conn):
    work = workload(conn)
    pack_all(conn)
    assert count(conn, "SELECT count(*) FROM log_workflow(%s)", work.waiting_workflow) > 0
    wf.trigger(conn, work.waiting_workflow, "approve", {"ok": True}, actor="test")
    run_all(conn)
    assert count(conn, "SELECT status FROM workflows WHERE id = %s", work.waiting_workflow) == "succeeded"
    history = [e.type for e in store.read_workflow(conn, work.waiting_workflow)]
    assert history[0] == "WorkflowSubmitted" and history[-1] == "WorkflowSucceeded"
    assert sorted(run_all(conn, "later")) == sorted(work.pending)  # enqueued before the pack
    assert verify(conn) == []


def test_a_swap_folds_again_the_streams_that_changed_after_the_rebuild_though_they_were_packed(conn):
    work = workload(conn)
    rebuild(conn)
    run_all(conn, "later")  # the pending jobs run after the rebuild's snapshot ...
    pack_all(conn)  # ... and their new events are packed before the swap
    assert count(conn, "SELECT count(*) FROM jobs WHERE id = ANY(%s) AND status = 'succeeded'", work.pending) == 4
    swap(conn)
    assert count(conn, "SELECT count(*) FROM jobs WHERE id = ANY(%s) AND status = 'succeeded'", work.pending) == 4
    assert verify(conn) == []


# -- the gapless order across live and packed events ------------------------------------------------------


def log_order(conn, *, visible: bool = True) -> list[tuple[int, int]]:
    """(xid, position) of every event (that a gapless reader may see now), in the order it must see them."""
    return [(r["xid"], r["position"]) for r in conn.execute(
        "SELECT xid::text::bigint AS xid, position FROM log_range(0, 9223372036854775807)"
        " WHERE NOT %s OR xid < pg_snapshot_xmin(pg_current_snapshot()) ORDER BY xid, position", (visible,))]


def assert_gapless_reads(conn, expected: list[tuple[int, int]]) -> None:
    """Whole reads at several page sizes, a page from many cursors, and the tail cursor, against `expected`."""
    for page in (1, 7, 500):
        assert gapless(conn, page) == expected, f"pages of {page}"
    assert [store.cursor_of(e) for e in read_after_all(conn, 7)] == expected
    for i in [*range(0, len(expected), 41), len(expected) - 1]:
        page = conn.execute("SELECT xid::text::bigint AS xid, position FROM events_after_page(%s::text::xid8, %s, 7)",
                            (str(expected[i][0]), expected[i][1])).fetchall()
        assert [(r["xid"], r["position"]) for r in page] == expected[i + 1:i + 8], f"after {expected[i]}"
    for back in [b for b in (0, 1, 7, 63, 64, 65, 500) if b < len(expected)] + [len(expected) - 1]:
        assert store.tail_cursor(conn, back) == expected[-1 - back], f"{back} back"
    assert store.tail_cursor(conn, len(expected)) == store.START


def test_the_gapless_order_holds_across_live_and_packed_events_whose_xids_interleave(conn, db_url):
    small_partitions(conn)
    conn.execute("UPDATE log_settings SET partitions_ahead = 25")  # room for the big transaction
    maintain(conn)
    enqueue(conn, [JobSpec(task="echo") for _ in range(10)], actor="test")
    with connect(db_url) as early:  # takes its xid now, appends after everything below is packed
        early_xid = int(early.execute("SELECT pg_current_xact_id()::text").fetchone()[0])
        for _ in range(4):
            enqueue(conn, [JobSpec(task="echo") for _ in range(30)], actor="test")
            run_all(conn, limit=30)
        big = enqueue(conn, [JobSpec(task="echo", queue="big") for _ in range(2_000)], actor="test")
        maintain(conn)
        run_all(conn, "big", limit=50)
        everything = log_order(conn, visible=False)
        pack(conn, close_current=True, duty=1, limit=3)  # a prefix packed, live partitions after it
        # The open transaction holds the horizon back: nothing from its xid on is seen, packed or live.
        seen = log_order(conn)
        assert seen == [e for e in everything if e[0] < early_xid] and len(seen) == 10
        assert_gapless_reads(conn, seen)
        enqueue(early, [JobSpec(task="echo", queue="early")], actor="test")
        early.commit()

    # A live event with a lower xid than packed ones after it, and later xids live.
    expected = log_order(conn)
    (early_event,) = [e for e in expected if e[0] == early_xid]
    packed = [e for e in expected if e[1] < count(conn, "SELECT min(position) FROM events")]
    assert packed and max(packed)[0] > early_xid and len(expected) == len(everything) + 1
    assert_gapless_reads(conn, expected)
    # The reader that stopped at the horizon goes on from its cursor: the late commit, then the rest.
    assert gapless(conn, 7, seen[-1]) == expected[len(seen):] and expected[len(seen)] == early_event

    # All packed now, the late commit too (a low xid at a high position), and a live tail after them.
    pack_all(conn)
    enqueue(conn, [JobSpec(task="echo", queue="tail") for _ in range(5)], actor="test")
    expected = log_order(conn)
    assert len(expected) == len(everything) + 6 and expected[len(seen)] == early_event
    assert_gapless_reads(conn, expected)

    # Small pages from a cursor in the middle of the big transaction (one xid, many blocks).
    big_xid = count(conn, "SELECT xid::text::bigint FROM log_stream(%s)", big[0].id)
    in_big = [e for e in expected if e[0] == big_xid]
    assert len(in_big) == 2_000 and count(conn, "SELECT count(*) FROM events_packed WHERE min_xid = max_xid"
                                                " AND min_xid = %s::text::xid8", str(big_xid)) >= 2_000 // 64
    middle = in_big[len(in_big) // 2]
    assert gapless(conn, 7, middle) == expected[expected.index(middle) + 1:]



def test_a_read_that_began_while_a_pack_took_its_partition_s_place_skips_nothing(conn, db_url):
    """A page takes its snapshot, then waits for the log's lock while the pack's finish holds it; it
    then plans with the packed partition in place of the live one, which its snapshot saw as filling."""
    small_partitions(conn)
    enqueue(conn, [JobSpec(task="echo") for _ in range(50)], actor="test")
    lower = count(conn, "SELECT min(position) FROM events")
    conn.execute("SELECT log_close_current()")
    enqueue(conn, [JobSpec(task="echo") for _ in range(5)], actor="test")  # live, after the packed ones
    expected = log_order(conn)
    conn.execute("SELECT log_pack_begin(%s)", (lower,))
    conn.execute("SELECT log_pack_fill(%s, %s)", (lower, lower + 100))
    for row in conn.execute("SELECT log_pack_indexes(%s) AS statement", (lower,)).fetchall():
        conn.execute(row["statement"])
    answers = {}

    def read(name: str, reader) -> None:
        with connect(db_url, autocommit=True) as own:
            answers[name] = reader(own)

    threads = [threading.Thread(target=read, args=("page", lambda c: [store.cursor_of(e) for e in
                                                                       store.read_after(c, store.START)])),
               threading.Thread(target=read, args=("tail", store.tail_cursor))]
    with connect(db_url) as finisher:
        finisher.execute("SELECT log_pack_finish(%s, 50)", (lower,))  # the log's lock, held until commit
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while count(conn, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                          " AND wait_event_type = 'Lock'") < len(threads):
            assert time.monotonic() < deadline, "the readers never waited for the pack's lock"
            time.sleep(0.01)
        finisher.commit()
    for thread in threads:
        thread.join()
    assert answers == {"page": expected, "tail": expected[-1]}


# -- crashes and concurrency -------------------------------------------------------------------------------


def killed_pack(db_url: str, step: str) -> None:
    """qforge pack in a process of its own, killed with SIGKILL at `step`."""
    killed = subprocess.run([sys.executable, "-c", PACK_SCRIPT, db_url], capture_output=True, text=True,
                            env={**os.environ, pack_module.FAULT_ENV: step}, timeout=120)
    assert killed.returncode == -9, killed.stdout + killed.stderr


PACK_SCRIPT = ("import sys\nfrom qforge.log.pack import pack\nfrom qforge.db import connect\n"
               "with connect(sys.argv[1], autocommit=True) as conn:\n"
               "    pack(conn, close_current=True, duty=1)\n")


def invalid_indexes(conn) -> int:
    return count(conn, "SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid"
                       " WHERE c.relname ~ '^events_packed' AND NOT i.indisvalid")


@pytest.mark.parametrize("step", STEPS)
def test_a_pack_killed_at_any_step_loses_nothing_and_packs_again(conn, db_url, step):
    workload(conn)
    events = stored(conn)
    before = readers(conn)
    killed_pack(db_url, step)
    first, state = packed_state(conn)[0]
    if step == "finished":
        assert state == "packed" and loose_tables(conn) == []
    else:  # its blocks' table is beside the log, not in it: nothing is read twice
        assert state == "filling" and loose_tables(conn) == [f"events_packed_{first:019d}"]
    assert stored(conn) == events and readers(conn) == before

    done = pack_all(conn)
    assert done.partitions and packed_state(conn) == [(lower, "packed") for lower, _ in packed_state(conn)]
    assert count(conn, "SELECT sum(events) FROM log_packs") == len(events)
    assert loose_tables(conn) == [] and invalid_indexes(conn) == 0
    assert stored(conn) == events and readers(conn) == before
    assert verify(conn) == []


def test_a_pack_stopped_between_two_windows_goes_on_without_packing_an_event_twice(conn):
    workload(conn)
    conn.execute("SELECT log_close_current()")
    events = stored(conn)
    lower = events[0]["position"]
    conn.execute("SELECT log_pack_begin(%s)", (lower,))
    block = count(conn, "SELECT log_pack_block()")
    assert count(conn, "SELECT log_pack_fill(%s, %s)", lower, lower + block) == block
    with pytest.raises(psycopg.errors.RaiseException, match="block boundary"):
        conn.execute("SELECT log_pack_fill(%s, %s)", (lower, lower + block + 1))
    with pytest.raises(psycopg.errors.RaiseException, match="not wholly packed"):
        conn.execute("SELECT log_pack_finish(%s, %s)", (lower, 100))
    pack_all(conn)
    assert stored(conn) == events
    assert count(conn, "SELECT sum(cardinality(events)) FROM events_packed") == len(events)


def test_keep_leaves_the_partitions_near_the_head_live_and_the_command_packs_the_rest(conn, db_url, capsys):
    workload(conn)
    conn.execute("SELECT log_close_current()")
    events = stored(conn)
    head = count(conn, "SELECT log_next_position()")
    uppers = [r["upper"] for r in conn.execute("SELECT upper FROM log_partitions() WHERE upper <= %s", (head,))]
    done = pack(conn, keep=200, duty=1)  # every partition ending 200 positions or more before the head
    assert sorted(done.partitions) == sorted(lower for lower, _ in packed_state(conn))
    assert [upper for upper in uppers if upper <= head - 200] == [
        count(conn, "SELECT upper_position FROM log_packs WHERE lower_position = %s", lower)
        for lower in sorted(done.partitions)]
    assert count(conn, "SELECT count(*) FROM events") == sum(1 for e in events if e["position"] >= head - 200) > 0
    assert cli(["pack", "--keep", "-1", "--database-url", db_url]) == 2
    assert cli(["pack", "--busy-duty", "1.5", "--database-url", db_url]) == 2
    capsys.readouterr()
    assert cli(["pack", "--nice", "0", "--database-url", db_url]) == 0  # the rest, at --keep 0
    assert "packed 2 partition(s)" in capsys.readouterr().out
    assert count(conn, "SELECT count(*) FROM events") == 0
    assert stored(conn) == events


def test_appends_claims_and_a_gapless_reader_going_on_while_packing_lose_nothing(conn, db_url, monkeypatch):
    monkeypatch.setattr(pack_module, "FILL_BLOCKS", 1)  # many short windows
    small_partitions(conn)
    conn.execute("UPDATE log_settings SET partitions_ahead = 20")
    maintain(conn)
    stop, drained, errors, enqueued, seen = threading.Event(), threading.Event(), [], [], []

    def write(maintains: bool) -> None:
        try:
            with connect(db_url, autocommit=True) as own:
                while not stop.is_set():
                    enqueued.extend(o.id for o in enqueue(own, [JobSpec(task="echo") for _ in range(4)]))
                    for job in claim(own, ["default"], 3, "w2"):
                        complete(own, [Report(job.id, job.attempt, result={"ok": True})], actor="w2")
                    if maintains:  # (one maintainer, as the monitor's leader is)
                        own.execute("SELECT log_maintain()")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def read() -> None:
        cursor = store.START
        try:
            with connect(db_url, autocommit=True) as own:
                while True:
                    # (Whether the writers had ended is taken before the read: an empty read
                    # after they ended is the end; one before may have raced their last commit.)
                    ended = drained.is_set()
                    batch = store.read_after(own, cursor, 50)
                    if not batch and ended:
                        break
                    for event in batch:
                        seen.append(event.position)
                        cursor = store.cursor_of(event)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    writers = [threading.Thread(target=write, args=(n == 0,)) for n in range(2)]
    reader = threading.Thread(target=read)
    for thread in [*writers, reader]:
        thread.start()
    packed = []
    try:
        while len(packed) < 6 and not errors:
            packed += pack(conn, close_current=True, duty=1).partitions
    finally:
        stop.set()
        for thread in writers:
            thread.join()
        drained.set()  # every write has ended: the reader reads to the end and stops
        reader.join()
    assert not errors, errors
    assert len(packed) >= 6
    everything = [r["position"] for r in conn.execute(
        "SELECT position FROM log_range(0, 9223372036854775807) ORDER BY position")]
    assert len(seen) == len(set(seen)), "an event was read twice"
    assert sorted(seen) == everything, "the reader missed events"
    assert count(conn, "SELECT count(*) FROM jobs WHERE id = ANY(%s)", enqueued) == len(set(enqueued))
    assert count(conn, "SELECT count(*) FROM jobs j WHERE j.version <> (SELECT count(*) FROM log_stream(j.id))") == 0
    assert verify(conn) == []


# -- append-only, and let go only by the archive ------------------------------------------------------------


def test_packed_partitions_refuse_update_delete_and_truncate(conn):
    workload(conn)
    pack_all(conn)
    events = stored(conn)
    partition = f"events_packed_{packed_state(conn)[0][0]:019d}"
    for table in ("events_packed", partition):
        for statement in (f"UPDATE {table} SET events = events[1:1]", f"DELETE FROM {table}", f"TRUNCATE {table}"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
                conn.execute(statement)
    assert stored(conn) == events


def test_a_packed_partition_is_detached_or_dropped_only_by_archive(conn):
    workload(conn)
    pack_all(conn)
    events = stored(conn)
    partition = f"events_packed_{packed_state(conn)[0][0]:019d}"
    for statement in (f"ALTER TABLE events_packed DETACH PARTITION {partition}",
                      f"DROP TABLE {partition}", "DROP TABLE events_packed CASCADE"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="qforge archive"):
            conn.execute(statement)
    assert loose_tables(conn) == [] and stored(conn) == events


# -- the archive of packed partitions -------------------------------------------------------------------------


def archived(directory) -> list[tuple[dict, list[dict]]]:
    """Each segment's manifest (less the moment it was written) and its lines."""
    return [({k: v for k, v in manifest.items() if k != "written_at"},
             list(segments.read_segment(directory / manifest["file"]))) for manifest in segments.manifests(directory)]


def read_model(conn) -> dict:
    return {table: sorted(r["id"] for r in conn.execute(f"SELECT id FROM {table}"))
            for table in ("jobs", "workflows", "execution_tags")}


def test_a_packed_log_archives_as_the_same_log_unpacked_would(db_url, server_url, scratch_dir):
    with connect(db_url, autocommit=True, row_factory=dict_row) as conn:
        workload(conn)
        conn.execute("SELECT log_close_current()")
        audit.checkpoint(conn)
        name = conn.info.dbname
    twin = f"{name}_twin"  # the same log, byte for byte: xids, ids, moments
    with connect(server_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(twin), sql.Identifier(name)))
    try:
        results = {}
        for url, packs in ((db_url, True), (with_database(db_url, twin), False)):
            with connect(url, autocommit=True, row_factory=dict_row) as conn:
                assert conn.info.dbname == (name if packs else twin)
                if packs:  # the first partition packed, the next one live: both sources in one archive
                    assert pack(conn, duty=1, limit=1).partitions
                    assert count(conn, "SELECT count(*) FROM events") > 0
                directory = scratch_dir / ("packed" if packs else "live")
                done = archive(conn, directory, close_current=True, duty=1, busy_duty=1)
                results[packs] = (archived(directory), read_model(conn), done.jobs_released, done.workflows_released)
                assert verify_archive(directory, conn).problems == []
                assert cli(["archive", "verify", str(directory)]) == 0
                assert verify(conn, archive=directory) == []
                assert audit_verify.verify(conn, archive=directory).problems == []
                assert packed_state(conn) == [] and loose_tables(conn) == []
                assert count(conn, "SELECT count(*) FROM log_range(0, 9223372036854775807)") == 0
        assert len(results[True][0]) >= 2
        assert results[True] == results[False]
    finally:
        with connect(server_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(twin)))


def test_archive_takes_a_partition_a_killed_pack_was_filling_and_its_blocks_with_it(conn, db_url, scratch_dir):
    workload(conn)
    events = {r["position"]: bytes(r["hash"]) for r in stored(conn)}
    killed_pack(db_url, "indexed")
    ((first, state),) = packed_state(conn)
    assert state == "filling" and loose_tables(conn) == [f"events_packed_{first:019d}"]
    archive(conn, scratch_dir, close_current=True, duty=1, busy_duty=1)
    assert packed_state(conn) == [] and loose_tables(conn) == []
    assert count(conn, "SELECT count(*) FROM pg_class WHERE relname ~ '^events_packed_[0-9]'") == 0
    lines = [line for manifest in segments.manifests(scratch_dir)
             for line in segments.read_segment(scratch_dir / manifest["file"])]
    assert {line["position"]: bytes.fromhex(line["hash"]) for line in lines} == events
    assert verify_archive(scratch_dir, conn).problems == []
    assert verify(conn, archive=scratch_dir) == []


def test_pack_and_archive_report_their_progress_in_positions_up_to_the_total(conn, scratch_dir, monkeypatch, capsys):
    """What `qforge pack` and `qforge archive` show (app/cli/progress.py): every window moves the
    count on, never past the total, and the last report is the whole of it."""
    monkeypatch.setattr(pack_module, "FILL_BLOCKS", 1)  # several windows per partition
    workload(conn)
    heard: list[tuple[int, int | None]] = []
    pack_all(conn, progress=lambda done, total: heard.append((done, total)))
    assert len(heard) > 3 and all(b[0] > a[0] for a, b in zip(heard, heard[1:])), heard
    assert heard[-1][0] == heard[-1][1] and all(done <= total for done, total in heard)

    archived: list[tuple[int, int | None]] = []
    archive(conn, scratch_dir, duty=1, busy_duty=1, progress=lambda done, total: archived.append((done, total)))
    assert archived and archived[-1][0] == archived[-1][1] == heard[-1][1]
    capsys.readouterr()
    monkeypatch.setenv("QFORGE_PROGRESS", "plain")
    assert cli(["pack", "--database-url", conn.info.dsn]) == 0  # nothing left: quick, and so silent
    assert capsys.readouterr().err == ""
