"""A sweep's wall time accounted: the ledger's arithmetic and the one line `run` prints of it."""

from __future__ import annotations

import time

import pytest

from bench.clock import ACCOUNTS, Ledger, summary


def test_ledger_accounts_add_up_to_the_wall_time_with_the_rest_as_other():
    ledger = Ledger()
    ledger.add("training", 60.0)
    ledger.add("test", 10.0)
    ledger.add("records", 5.0)
    ledger.add("records", -1.0)  # a clock's jitter never takes time away
    with ledger.timing("waiting"):
        time.sleep(0.01)
    table = ledger.table(100.0)
    assert set(table["seconds"]) == {*ACCOUNTS, "other"}
    assert table["seconds"]["records"] == 5.0 and table["seconds"]["waiting"] >= 0.01
    assert abs(sum(table["seconds"].values()) - 100.0) < 0.05
    assert table["share"]["training"] == 0.6
    with pytest.raises(KeyError, match="unknown account"):
        ledger.add("lunch", 1.0)


def test_nested_timings_count_each_second_once():
    """A timing inside another (the floor phase's rows, timed as floor, records and waiting inside the floor's
    table update) gives its seconds to its own account only: the accounts never sum past the wall."""
    ledger = Ledger()
    start = time.perf_counter()
    with ledger.timing("floor"):
        time.sleep(0.05)
        with ledger.timing("waiting"):
            time.sleep(0.1)
            with ledger.timing("records"):
                time.sleep(0.05)
        with ledger.timing("records"):
            time.sleep(0.02)
        ledger.add("test", 0.03)  # measured by the caller within the floor's time (a run's scoring)
        time.sleep(0.03)
    wall = time.perf_counter() - start
    s = ledger.seconds
    assert 0.1 <= s["waiting"] < 0.14 and 0.07 <= s["records"] < 0.11 and 0.05 <= s["floor"] < 0.09
    assert s["floor"] + s["waiting"] + s["records"] + s["test"] == pytest.approx(wall, abs=0.01)
    assert not ledger.open


def test_summary_is_one_line_largest_share_first_with_what_is_not_training():
    ledger = Ledger()
    ledger.add("training", 90.0)
    ledger.add("test", 6.0)
    ledger.add("records", 0.2)  # under 0.5%: left out of the line
    line = summary(ledger.table(100.0))
    assert "\n" not in line
    assert line.startswith("0:01:40 wall: training 90%, test 6%, other 4%")
    assert "records" not in line and line.endswith("(not training: 10%)")
