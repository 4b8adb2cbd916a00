"""QForge only: SSE fan-out, N subscribers on GET /events/stream of a real `qforge api`.

    subscribe --port P --subscribers 100     connect, print READY, then read from stdin how many
                                              events were appended and wait until every subscriber
                                              has them (or --timeout); RESULT lag percentiles
    append    --url U --rate 1000 --seconds 10
                                              enqueue jobs at `rate` events/s (batches of 10 every 10 ms)

Delivery lag = time the subscriber read the message - the event's occurred_at
(the appending transaction's start). The subscribers use raw sockets and a
small chunked-transfer decoder so that the client's own cost stays small
next to the server's on a 2-core machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import time
from datetime import datetime

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit, percentile  # noqa: E402

OCCURRED_AT = re.compile(rb'"occurred_at":\s*"([^"]+)"')
MESSAGE_END = re.compile(rb"\r\n\r\n|\n\n")


class Subscriber(asyncio.Protocol):
    """One SSE connection: undoes chunked encoding, splits messages, records lags."""

    def __init__(self, lags: list[float], ready: asyncio.Event, counter: list[int]) -> None:
        self.lags = lags
        self.ready = ready
        self.counter = counter
        self.headers_done = False
        self.raw = b""  # bytes not yet de-chunked
        self.chunk_left = 0  # bytes of the current chunk still to come
        self.text = b""  # de-chunked bytes not yet split into messages
        self.messages = 0
        self.status = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        now = time.time()
        self.raw += data
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
        # One split per read: a server that batches many messages into one
        # write must not make this client quadratic (slicing per message).
        *messages, self.text = MESSAGE_END.split(self.text)
        for message in messages:
            found = OCCURRED_AT.search(message)
            if found:
                occurred = datetime.fromisoformat(found.group(1).decode()).timestamp()
                self.lags.append((now - occurred) * 1000.0)
                self.messages += 1

    def _dechunk(self) -> None:
        while self.raw:
            if self.chunk_left > 0:
                take = self.raw[:self.chunk_left]
                self.text += take
                self.raw = self.raw[len(take):]
                self.chunk_left -= len(take)
                if self.chunk_left == 0:
                    self.chunk_left = -2  # the CRLF after the chunk
                continue
            if self.chunk_left < 0:
                if len(self.raw) < 2:
                    return
                self.raw = self.raw[2:]
                self.chunk_left = 0
                continue
            line_end = self.raw.find(b"\r\n")
            if line_end < 0:
                return
            size = int(self.raw[:line_end].split(b";")[0], 16)
            self.raw = self.raw[line_end + 2:]
            self.chunk_left = size if size else 0
            if size == 0:
                return


async def subscribe(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    ready = asyncio.Event()
    counter = [0, args.subscribers]
    lags: list[float] = []
    protocols = []
    request = (f"GET /events/stream HTTP/1.1\r\nHost: 127.0.0.1:{args.port}\r\n"
               "Accept: text/event-stream\r\n\r\n").encode()
    for _ in range(args.subscribers):
        transport, protocol = await loop.create_connection(
            lambda: Subscriber(lags, ready, counter), "127.0.0.1", args.port)
        transport.write(request)
        protocols.append(protocol)
    await asyncio.wait_for(ready.wait(), 60)
    bad = [p.status for p in protocols if b" 200 " not in p.status + b" "]
    if bad:
        raise RuntimeError(f"subscribers got {bad[:3]}")
    print("READY", flush=True)
    expected = int(await loop.run_in_executor(None, sys.stdin.readline))
    deadline = time.monotonic() + args.timeout
    while min(p.messages for p in protocols) < expected and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    counts = sorted(p.messages for p in protocols)
    lags.sort()
    emit({"subscribers": args.subscribers, "messages": len(lags), "expected_each": expected,
          "complete": counts[0] >= expected,
          "per_subscriber_min": counts[0], "per_subscriber_max": counts[-1],
          "p50_ms": percentile(lags, 0.5), "p99_ms": percentile(lags, 0.99),
          "max_ms": lags[-1] if lags else None})


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
