"""Progress on stderr (nas.progress): a bar on a terminal; in a log (stderr a file or a
pipe), plain lines at most every so many seconds, with the count, the rate and the time
left, and none for a run shorter than that."""

from __future__ import annotations

import io
import re
import sys

import pytest

from nas.progress import LOG_EVERY_S, Progress, log_every_s


class _Log(io.StringIO):
    def isatty(self) -> bool:
        return False


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _run(stream, monkeypatch, n=5, skip=0, **kw) -> str:
    monkeypatch.setattr(sys, "stderr", stream)
    with Progress(n + skip, "scoring", **kw) as p:
        if skip:
            p.skip(skip)
        for _ in range(n):
            p.update(1)
    return stream.getvalue()


def test_a_log_gets_plain_lines_with_count_rate_and_eta(monkeypatch):
    out = _run(_Log(), monkeypatch, log_every=0.0).splitlines()
    assert "\r" not in "".join(out)
    # one line an update (the limit is 0 s here), then the closing one
    assert len(out) == 5 + 1
    assert re.fullmatch(r"scoring: 1/5 \(20 %\), \S+(/s| s each), ETA \d+:\d\d:\d\d", out[0])
    assert re.fullmatch(r"scoring: 5/5 \(100 %\), .*ETA 0:00:00", out[4])
    assert re.fullmatch(r"scoring: 5/5 \(100 %\) in \d+:\d\d:\d\d", out[5])


def test_a_short_run_in_a_log_prints_nothing(monkeypatch):
    assert _run(_Log(), monkeypatch, log_every=3600.0) == ""


def test_a_resumed_run_counts_the_earlier_items_but_not_in_its_rate(monkeypatch):
    out = _run(_Log(), monkeypatch, n=2, skip=8, log_every=0.0).splitlines()
    assert out[0].startswith("scoring: 8/10 (80 %), -, ETA -")  # nothing done this run yet
    assert out[1].startswith("scoring: 9/10 (90 %), ")


def test_a_terminal_gets_the_bar_and_off_is_silent(monkeypatch):
    out = _run(_Tty(), monkeypatch, log_every=0.0)
    assert out.count("\r") == 6 and "[" in out and out.endswith("\n")
    assert _run(_Log(), monkeypatch, enabled=False, log_every=0.0) == ""


@pytest.mark.parametrize("raw,expected", [(None, LOG_EVERY_S), ("5", 5.0), ("0", 0.0),
                                          ("-1", LOG_EVERY_S), ("soon", LOG_EVERY_S)])
def test_the_log_interval_can_be_set_by_environment(monkeypatch, raw, expected):
    if raw is None:
        monkeypatch.delenv("PUZZLE_NAS_LOG_EVERY", raising=False)
    else:
        monkeypatch.setenv("PUZZLE_NAS_LOG_EVERY", raw)
    assert log_every_s() == expected
