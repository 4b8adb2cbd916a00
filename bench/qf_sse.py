"""QForge only: SSE fan-out, N subscribers on GET /events/stream of a real `qforge api`.

    subscribe --port P --subscribers 100     connect, print READY, then read from stdin how many
                                              events were appended and wait until every subscriber
                                              has them (or --timeout); RESULT lag percentiles
    append    --url U --rate 1000 --seconds 10
                                              enqueue jobs at `rate` events/s (batches of 10 every 10 ms)

Delivery lag = time the message reached the subscriber's socket - the event's
occurred_at (the appending transaction's start). "Reached the socket" is the
kernel's receive time stamp of the read's last packet (SO_TIMESTAMPNS), not the
time the client got round to reading it: the one client process reads all N
connections one after the other, so a clock read in Python would add its own
work on the sockets before (on 2 busy cores, 20 ms of every 100-subscriber
delivery) to the server's. The subscribers use raw sockets and a small
chunked-transfer decoder so that the client's own cost stays small anyway.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import socket
import struct
import sys
import time
from datetime import datetime

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit, percentile  # noqa: E402

OCCURRED_AT = re.compile(rb'"occurred_at":\s*"([^"]+)"')
# A message's first line (complete text starts at a message: see data_received). A
# literal first: re finds it by a fast scan, where a MULTILINE ^ tries every position.
EVENT_ID = re.compile(rb"\nid: ?([0-9]+-[0-9]+)\r?\n")
# Linux's receive time stamps (socket(7)); Python's socket module does not name them.
SO_TIMESTAMPNS = SCM_TIMESTAMPNS = 35
READ_BYTES = 1 << 18


def message_end(text: bytes) -> int:
    """Where the last complete message of `text` ends (0: none is complete yet)."""
    crlf, lf = text.rfind(b"\r\n\r\n"), text.rfind(b"\n\n")
    return max(crlf + 4 if crlf >= 0 else 0, lf + 2 if lf >= 0 else 0)


class Subscriber:
    """One SSE connection's reader: undoes chunked encoding, splits messages, keeps per read its
    times and its messages' occurred_at texts (lags are worked out after the run: lags_of), and
    every id received."""

    def __init__(self, ready: asyncio.Event, counter: list[int]) -> None:
        self.ready = ready
        self.counter = counter
        self.headers_done = False
        self.raw = b""  # bytes not yet de-chunked
        self.chunk_left = 0  # bytes of the current chunk still to come
        self.text = b""  # de-chunked bytes not yet split into messages
        self.ids: list[bytes] = []  # every event id received, in order (checked at the end)
        # (reached the socket, read by the client, the occurred_at texts of its messages) per read
        self.reads: list[tuple[float, float, list[bytes]]] = []
        self.messages = 0
        self.status = b""

    def data_received(self, data: bytes, arrived: float | None = None) -> None:
        """`arrived`: when `data` reached the socket (the kernel's stamp); else the clock, now."""
        now = time.time()
        self.raw = self.raw + data if self.raw else data
        if not self.headers_done:
            end = self.raw.find(b"\r\n\r\n")
            if end < 0:
                return
            self.status = self.raw.split(b"\r\n", 1)[0]
            self.headers_done = True
            self.raw = self.raw[end + 4:]
            self.counter[0] += 1
            if self.counter[0] == self.counter[1]:
                self.ready.set()
        self._dechunk()
        # One parse per read, not per message: the complete messages of this read are
        # scanned once for their ids and their occurred_at; each message still gets its
        # own lag (this read's time minus its occurred_at). Pings have neither.
        end = message_end(self.text)
        if not end:
            return
        complete, self.text = self.text[:end], self.text[end:]
        ids = EVENT_ID.findall(b"\n" + complete)
        occurred_texts = OCCURRED_AT.findall(complete)
        if len(ids) != len(occurred_texts):
            raise RuntimeError(f"{len(ids)} ids but {len(occurred_texts)} occurred_at in one read")
        self.reads.append((now if arrived is None else arrived, now, occurred_texts))
        self.ids += ids
        self.messages += len(ids)

    def _dechunk(self) -> None:
        """Move the complete chunk data of `raw` to `text` (one join per read, no slicing
        per chunk: a read holds many chunks when the client falls behind)."""
        raw, at, pieces = self.raw, 0, []
        while at < len(raw):
            if self.chunk_left > 0:
                take = raw[at:at + self.chunk_left]
                pieces.append(take)
                at += len(take)
                self.chunk_left -= len(take)
                if self.chunk_left == 0:
                    self.chunk_left = -2  # the CRLF after the chunk
                continue
            if self.chunk_left < 0:
                if len(raw) - at < 2:
                    break
                at += 2
                self.chunk_left = 0
                continue
            line_end = raw.find(b"\r\n", at)
            if line_end < 0:
                break
            size = int(raw[at:line_end].split(b";")[0], 16)
            at = line_end + 2
            self.chunk_left = size
            if size == 0:  # the last chunk: the server ended the stream
                break
        self.raw = raw[at:] if at else raw
        if pieces:
            self.text = b"".join([self.text, *pieces]) if self.text else b"".join(pieces)


def received_at(ancillary: list[tuple[int, int, bytes]]) -> float | None:
    """The kernel's receive time of a read (for TCP: of its last packet), if it gave one."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SCM_TIMESTAMPNS and len(data) >= 16:
            seconds, nanoseconds = struct.unpack("qq", data[:16])
            return seconds + nanoseconds / 1e9
    return None


async def connect(port: int, protocol: Subscriber) -> None:
    """One subscriber's connection, read with recvmsg for the kernel's receive time stamps."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    protocol.sock = sock  # held open while it subscribes
    room = socket.CMSG_SPACE(16)

    def readable() -> None:
        try:
            data, ancillary, _, _ = sock.recvmsg(READ_BYTES, room)
        except (BlockingIOError, InterruptedError):
            return
        if not data:
            loop.remove_reader(sock.fileno())
            return
        protocol.data_received(data, received_at(ancillary))

    loop.add_reader(sock.fileno(), readable)
    await loop.sock_sendall(sock, (f"GET /events/stream HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                                   "Accept: text/event-stream\r\n\r\n").encode())


def lags_of(subscribers: list[Subscriber]) -> tuple[list[float], list[float]]:
    """Every message's lag in ms, sorted: from when it reached the socket, and from when the client
    read it. (Worked out once the run is over: the client's work while it runs competes with
    the server for the machine's cores.)"""
    occurred: dict[bytes, float] = {}  # occurred_at text -> epoch seconds (a batch of 10 shares one)
    lags, read_lags = [], []
    for subscriber in subscribers:
        for arrived, read, texts in subscriber.reads:
            for text in texts:
                at = occurred.get(text)
                if at is None:
                    at = occurred[text] = datetime.fromisoformat(text.decode()).timestamp()
                lags.append((arrived - at) * 1000.0)
                read_lags.append((read - at) * 1000.0)
    lags.sort()
    read_lags.sort()
    return lags, read_lags


async def subscribe(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    ready = asyncio.Event()
    counter = [0, args.subscribers]
    protocols = []
    for _ in range(args.subscribers):
        protocol = Subscriber(ready, counter)
        await connect(args.port, protocol)
        protocols.append(protocol)
    await asyncio.wait_for(ready.wait(), 60)
    bad = [p.status for p in protocols if b" 200 " not in p.status + b" "]
    if bad:
        raise RuntimeError(f"subscribers got {bad[:3]}")
    print("READY", flush=True)
    cpu_started = time.process_time()
    expected = int(await loop.run_in_executor(None, sys.stdin.readline))
    deadline = time.monotonic() + args.timeout
    while min(p.messages for p in protocols) < expected and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    client_cpu = time.process_time() - cpu_started
    counts = sorted(p.messages for p in protocols)
    lags, read_lags = lags_of(protocols)
    emit({"subscribers": args.subscribers, "messages": len(lags), "expected_each": expected,
          "complete": counts[0] >= expected, **delivery_check(protocols, expected),
          "per_subscriber_min": counts[0], "per_subscriber_max": counts[-1],
          "p50_ms": percentile(lags, 0.5), "p99_ms": percentile(lags, 0.99),
          "max_ms": lags[-1] if lags else None,
          # the same lags from the clock when the client got round to each read: the client's own
          # delay on top (it reads the N sockets one after the other)
          "read_p50_ms": percentile(read_lags, 0.5), "read_p99_ms": percentile(read_lags, 0.99),
          # the measuring client's own CPU per message received (it shares the machine's cores)
          "client_cpu_us_per_message": client_cpu * 1e6 / max(len(lags), 1)})


def delivery_check(protocols: list[Subscriber], expected: int) -> dict[str, bool]:
    """Did every subscriber get every appended event exactly once, in log order? (Only the
    bench's appends reach the log during a run, so: `expected` ids, strictly increasing
    by (xid, position), and the same sequence for every subscriber.)"""
    first = protocols[0].ids
    in_order = all(
        all(a < b for a, b in zip(cursors, cursors[1:]))
        for cursors in ([tuple(map(int, i.split(b"-"))) for i in p.ids] for p in protocols))
    return {"exactly_once_in_order": in_order and len(first) == expected
            and all(p.ids == first for p in protocols)}


def append(args: argparse.Namespace) -> None:
    import psycopg

    from qforge.commands.enqueue import JobSpec, enqueue

    batch = max(1, args.rate // 100)
    period = batch / args.rate
    sent = 0
    with psycopg.connect(args.url, autocommit=True) as conn:
        started = time.perf_counter()
        next_at = started
        while time.perf_counter() - started < args.seconds:
            enqueue(conn, [JobSpec(task="bench_noop") for _ in range(batch)], actor="bench-sse")
            sent += batch
            next_at += period
            delay = next_at - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        elapsed = time.perf_counter() - started
    emit({"events": sent, "seconds": elapsed, "events_per_s": sent / elapsed})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["subscribe", "append"])
    parser.add_argument("--port", type=int)
    parser.add_argument("--url")
    parser.add_argument("--subscribers", type=int, default=100)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--timeout", type=float, default=60.0, help="subscribe: longest wait for the tail")
    args = parser.parse_args()
    if args.command == "subscribe":
        asyncio.run(subscribe(args))
    else:
        append(args)


if __name__ == "__main__":
    main()
