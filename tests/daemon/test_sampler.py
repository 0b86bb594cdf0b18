"""The corridor sampler on the scripted (simulated) device source, sample by sample with an
explicit clock: the trailing-window minimum, seconds below the floor and the breach count,
floors by index/uuid/percentage, failing cards, a missing source, and overruns."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from rankscope.daemon.devices import DeviceError, ScriptedSource, parse_script, write_script
from rankscope.daemon.flags import parse_bytes
from rankscope.daemon.sampler import Periodic, Sampler, parse_floors

GiB = 1 << 30


def card(index: int = 0, free: int = 40 * GiB, **extra: Any) -> dict[str, Any]:
    return {
        "index": index,
        "uuid": f"GPU-sim-{index}",
        "model": "Simulated H200",
        "total": 80 * GiB,
        "free": free,
        **extra,
    }


def make(tmp_path: Path, cards: list[dict[str, Any]], floors: str = "", **kw: Any) -> Sampler:
    path = tmp_path / "cards.json"
    write_script(path, cards)
    return Sampler(ScriptedSource(path), floors=parse_floors(floors), **kw)


def view(sampler: Sampler, now: float, index: int = 0) -> Any:
    return next(v for v in sampler.views(now) if v.identity.index == index)


def test_window_minimum_keeps_a_trough_until_it_leaves_the_window(tmp_path: Path) -> None:
    s = make(tmp_path, [card(free=40 * GiB)], window=15.0)
    path = tmp_path / "cards.json"
    s.sample(0.0)
    write_script(path, [card(free=3 * GiB)])
    s.sample(0.1)
    write_script(path, [card(free=38 * GiB)])
    for i in range(2, 100):
        s.sample(i * 0.1)
    v = view(s, 9.9)
    assert v.free == 38 * GiB
    assert v.free_min == 3 * GiB  # 9.8 s after the trough: still inside 15 s
    assert view(s, 15.05).free_min == 3 * GiB  # t=0.1 is inside (0.05, 15.05]
    assert view(s, 15.15).free_min == 38 * GiB  # and outside (0.15, 15.15]
    assert view(s, 40.0).free_min is None  # nothing sampled for a whole window: unmeasured


def test_window_minimum_matches_brute_force(tmp_path: Path) -> None:
    path = tmp_path / "cards.json"
    write_script(path, [card(free=0)])
    s = Sampler(ScriptedSource(path), window=1.0)
    values = [(i * 7919) % 50 * GiB // 10 for i in range(200)]
    for i, free in enumerate(values):
        write_script(path, [card(free=free)])
        s.sample(i * 0.1)
        now = i * 0.1
        expected = min(f for j, f in enumerate(values[: i + 1]) if j * 0.1 > now - 1.0)
        assert view(s, now).free_min == expected, i


def test_breach_seconds_and_count(tmp_path: Path) -> None:
    path = tmp_path / "cards.json"
    s = make(tmp_path, [card(free=40 * GiB)], floors="10GiB")
    frees = [40, 40, 5, 5, 5, 40, 40, 9, 40]  # GiB, one sample each 100 ms
    for i, free in enumerate(frees):
        write_script(path, [card(free=free * GiB)])
        s.sample(i * 0.1)
    v = view(s, 0.8)
    assert v.floor == 10 * GiB
    assert v.breaches == 2  # two downward crossings
    # Each sample below the floor counts the interval before it: 3 + 1 samples.
    assert v.breach_seconds == pytest.approx(0.4)
    assert v.margin == 5 * GiB - 10 * GiB  # signed: worst instant minus floor


def test_no_floor_means_no_breach_accounting(tmp_path: Path) -> None:
    s = make(tmp_path, [card(free=1)])
    s.sample(0.0)
    v = view(s, 0.0)
    assert v.floor is None and v.breaches is None and v.breach_seconds is None
    assert v.margin is None


def test_floors_by_index_uuid_and_percentage(tmp_path: Path) -> None:
    cards = [card(0), card(1), card(2)]
    s = make(tmp_path, cards, floors="5%,1=2GiB,GPU-sim-2=3GiB")
    s.sample(0.0)
    floors = {v.identity.index: v.floor for v in s.views(0.0)}
    assert floors == {0: round(0.05 * 80 * GiB), 1: 2 * GiB, 2: 3 * GiB}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2GiB", 2 * GiB),
        ("1.5GB", 1_500_000_000),
        ("512Mi", 512 << 20),
        ("100", 100),
        ("1 kib", 1024),
    ],
)
def test_parse_bytes(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "2XB", "-1GiB", "nan", "1e999GB"])
def test_parse_bytes_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="byte size"):
        parse_bytes(text)


@pytest.mark.parametrize("text", ["0=", "=2GiB", "0=2Gigs", "101%", "x%"])
def test_parse_floors_refuses_with_the_item(text: str) -> None:
    with pytest.raises(ValueError, match="corridor floor"):
        parse_floors(text)


def test_a_failing_card_is_counted_and_the_others_keep_sampling(tmp_path: Path) -> None:
    path = tmp_path / "cards.json"
    s = make(tmp_path, [card(0), card(1)], interval=0.1)
    s.sample(0.0)
    assert s.up()
    write_script(path, [card(0, fail="GPU is lost"), card(1, free=7 * GiB)])
    s.sample(0.1)
    v0, v1 = view(s, 0.1, 0), view(s, 0.1, 1)
    assert not v0.up and v0.free is None and v0.errors == 1
    assert v1.up and v1.free == 7 * GiB
    assert not s.up()
    # Backoff: the failing card is not read again at once.
    s.sample(0.15)
    assert view(s, 0.15, 0).errors == 1
    write_script(path, [card(0, free=6 * GiB), card(1, free=7 * GiB)])
    s.sample(0.5)
    v0 = view(s, 0.5, 0)
    assert v0.up and v0.free == 6 * GiB and v0.errors == 1  # recovered, count kept
    assert s.up()


def test_a_card_that_keeps_failing_makes_the_source_reopen(tmp_path: Path) -> None:
    path = tmp_path / "cards.json"
    s = make(tmp_path, [card(0)], interval=0.1)
    s.sample(0.0)
    write_script(path, [card(0, fail="GPU is lost")])
    opens: list[float] = []
    real_open = s.source.open

    def counted_open() -> Any:
        opens.append(t)
        return real_open()

    s.source.open = counted_open  # type: ignore[method-assign]
    t = 0.0
    while view(s, t).errors < 3:
        t += 0.1
        s.sample(t)
    assert not opens
    s.sample(t + 60)  # past the backoff: the source is reopened
    assert opens


def test_a_missing_source_is_down_and_recovers(tmp_path: Path) -> None:
    path = tmp_path / "cards.json"
    s = Sampler(ScriptedSource(path), interval=0.1)
    s.sample(0.0)
    assert not s.up() and s.source_errors == 1 and s.views(0.0) == []
    assert "No such file" in (s.source_failing or "")
    s.sample(0.05)  # within the backoff: not retried
    assert s.source_errors == 1
    write_script(path, [card(0, free=9 * GiB)])
    s.sample(1.0)
    assert s.up() and s.source_failing is None
    assert view(s, 1.0).free == 9 * GiB


def test_a_broken_script_takes_the_source_down_with_the_reason(tmp_path: Path) -> None:
    path = tmp_path / "cards.json"
    s = make(tmp_path, [card(0, free=9 * GiB)])
    s.sample(0.0)
    path.write_text('{"cards": [{"index": 0, "total": 10, "free": "lots"}]}')
    s.sample(0.1)
    assert not s.up()
    assert "cards[0].free" in (s.source_failing or "")
    assert view(s, 0.1).free is None and not view(s, 0.1).up  # a stale value is no sample
    write_script(path, [card(0, free=8 * GiB)])
    s.sample(5.0)
    assert s.up() and view(s, 5.0).free == 8 * GiB


def test_counters_survive_a_reopen_and_a_vanished_card_keeps_its_series(tmp_path: Path) -> None:
    path = tmp_path / "cards.json"
    s = make(tmp_path, [card(0, free=1 * GiB), card(1)], floors="2GiB")
    s.sample(0.0)
    write_script(path, [card(0, free=1 * GiB)])  # card 1 gone: the card list changed
    s.sample(0.1)
    v0, v1 = view(s, 0.1, 0), view(s, 0.1, 1)
    assert v0.breaches == 1  # not reset by the reopen
    assert not v1.up and v1.free is None and v1.breaches == 0


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("[]", "expected an object"),
        ('{"cards": [{"total": 1, "free": 2}]}', "exceeds total"),
        ('{"cards": [{"total": 1, "free": 1}, {"index": 0, "total": 1, "free": 1}]}', "twice"),
        ('{"cards": [{"total": 1, "free": 1, "processes": {"x": 1}}]}', "not a pid"),
        ('{"cards": [{"total": 1, "free": 1, "processes": {"5": -1}}]}', "processes[5]"),
        ('{"cards": [{"total": true, "free": 1}]}', "cards[0].total"),
    ],
)
def test_parse_script_names_the_field(doc: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        parse_script(doc, "x.json")


def test_scripted_source_rereads_only_on_change(tmp_path: Path) -> None:
    path = tmp_path / "cards.json"
    write_script(path, [card(0, free=5, processes={"123": 7, "124": None})])
    src = ScriptedSource(path)
    [ident] = src.open()
    assert (ident.index, ident.uuid, ident.total) == (0, "GPU-sim-0", 80 * GiB)
    assert src.read_processes(0) == {123: 7, 124: None}
    assert not src.changed() and src.read_free(0) == 5
    write_script(path, [card(0, free=6)])
    assert not src.changed() and src.read_free(0) == 6  # same card list: no reopen needed
    write_script(path, [card(3, free=6)])
    assert src.changed()
    with pytest.raises(DeviceError, match="no longer scripted"):
        src.read_free(1)


def test_periodic_counts_overruns() -> None:
    def slow() -> None:
        time.sleep(0.03)

    p = Periodic("test-overrun", 0.01, slow)
    p.start()
    time.sleep(0.2)
    p.stop()
    assert p.overruns >= 3

    ticks = threading.Event()
    q = Periodic("test-ontime", 0.2, ticks.set)  # only a 200 ms stall would overrun
    q.start()
    assert ticks.wait(2)
    time.sleep(0.5)
    q.stop()
    assert q.overruns == 0


def test_periodic_after_each_waits_the_interval_after_a_run_ends() -> None:
    runs: list[tuple[float, float]] = []

    def slow() -> None:
        start = time.monotonic()
        time.sleep(0.03)
        runs.append((start, time.monotonic()))

    p = Periodic("test-after-each", 0.02, slow, after_each=True)
    p.start()
    time.sleep(0.3)
    p.stop()
    assert len(runs) >= 3 and p.overruns == 0
    assert all(nxt[0] - end >= 0.02 for (_, end), nxt in itertools.pairwise(runs))


def test_the_window_stays_bounded_without_scrapes(tmp_path: Path) -> None:
    path = tmp_path / "cards.json"
    s = make(tmp_path, [card(free=0)], interval=0.1, window=1.0)
    for i in range(300):  # rising free: the monotonic deque keeps every entry in the window
        write_script(path, [card(free=i)])
        s.sample(i * 0.1)
    [state] = s._cards
    assert len(state.window) <= 10  # one window of samples, however long nobody scraped
