"""Progress on the command line: silent for short work and off a terminal (plain lines there when
asked for), a bar on one."""

from __future__ import annotations

import io

from qforge.cli.progress import Progress


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_work_under_a_second_prints_nothing():
    clock, out = Clock(), io.StringIO()
    with Progress("replay", total=1000, unit="events", stream=out, clock=clock) as progress:
        for done in range(0, 1001, 100):
            clock.now += 0.05
            progress(done, 1000)
    assert out.getvalue() == ""


def test_plain_lines_off_a_terminal_with_rate_and_eta_at_most_every_interval():
    clock, out = Clock(), io.StringIO()
    with Progress("verify", total=10_000, unit="events", stream=out, clock=clock, every=5, plain=True) as progress:
        for step in range(1, 21):
            clock.now += 1
            progress.update(step * 500)
    lines = out.getvalue().splitlines()
    assert lines[0] == "verify: 500 of 10,000 events (5 %), 500 events/s, ETA 0:19"
    assert len(lines) == 5  # at 1 s, then every 5 s (6, 11, 16), and the last line at the end
    assert lines[-1].startswith("verify: 10,000 of 10,000 events (100 %), 500 events/s")
    assert "\r" not in out.getvalue()


def test_a_bar_on_a_terminal_and_advance_without_a_total():
    clock, out = Clock(), Terminal()
    with Progress("replay", total=200, unit="events", stream=out, clock=clock) as progress:
        clock.now += 2
        progress(50, 200)
    text = out.getvalue()
    assert "\r" in text and "[######------------------]  25%" in text and "50/200 events" in text
    assert "ETA 0:06" in text and text.endswith("\n")

    clock, out = Clock(), io.StringIO()
    with Progress("drain", unit="log entries", stream=out, clock=clock, plain=True) as counter:
        for _ in range(3):
            clock.now += 1
            counter.advance(1000)
    assert out.getvalue().splitlines()[-1] == "drain: 3,000 log entries, 1,000 log entries/s, 0:03 elapsed"


def test_nothing_off_a_terminal_unless_plain_lines_are_asked_for(monkeypatch):
    def run(stream) -> str:
        clock = Clock()
        with Progress("archive", total=100, unit="positions", stream=stream, clock=clock) as progress:
            for done in range(10, 101, 10):
                clock.now += 1
                progress(done, 100)
        return stream.getvalue()

    monkeypatch.delenv("QFORGE_PROGRESS", raising=False)
    assert run(io.StringIO()) == ""
    assert "archive  [" in run(Terminal())
    monkeypatch.setenv("QFORGE_PROGRESS", "plain")
    assert run(io.StringIO()).splitlines()[-1].startswith("archive: 100 of 100 positions (100 %)")
    monkeypatch.setenv("QFORGE_PROGRESS", "off")
    assert run(Terminal()) == ""
