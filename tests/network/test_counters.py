"""gpufleet.network.counters: rates from two readings of one switch, across counter wraps, cleared
counters, restarts and renumbered ports, never negative and never past what the counter allows."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.network import counters
from gpufleet.network.counters import growth, port_rates, restarted
from gpufleet.network.snmp import PortReading, SwitchReading

WRAP32 = 2**32
WRAP64 = 2**64


def port(
    index: int = 1, name: str = "Ethernet1", *, bits: int = 64, speed: int | None = 10_000, **counts: int
) -> PortReading:
    base = dict.fromkeys(("in_octets", "out_octets", "in_errors", "out_errors", "in_discards", "out_discards"), 0)
    base.update(counts)
    return PortReading(
        index=index,
        name=name,
        alias="",
        admin_up=True,
        oper_up=True,
        oper_status="up",
        speed_mbps=speed,
        counter_bits=bits,
        **base,
    )


def switch(*ports: PortReading, uptime_s: float = 1000.0) -> SwitchReading:
    return SwitchReading("leaf01", "", "", uptime_s, list(ports), [], [])


def test_plain_growth_is_bits_and_events_per_second() -> None:
    before = switch(port(in_octets=1_000, out_octets=5_000, in_errors=3, out_discards=10))
    after = switch(port(in_octets=126_000, out_octets=5_000, in_errors=13, out_discards=16), uptime_s=1010.0)
    assert port_rates(before, 100.0, after, 110.0) == {
        1: {
            "in_bps": 100_000.0,  # 125,000 octets in 10 s
            "out_bps": 0.0,
            "in_errors_per_s": 1.0,
            "out_errors_per_s": 0.0,
            "in_discards_per_s": 0.0,
            "out_discards_per_s": 0.6,
        }
    }


def test_32_bit_octets_across_one_wrap() -> None:
    before = switch(port(bits=32, speed=1000, in_octets=WRAP32 - 1_000_000))
    after = switch(port(bits=32, speed=1000, in_octets=24_000_000))  # 25,000,000 octets later
    rates = port_rates(before, 0.0, after, 10.0)
    assert rates[1]["in_bps"] == pytest.approx(25_000_000 * 8 / 10)


def test_32_bit_wrap_faster_than_the_link_is_a_cleared_counter() -> None:
    # one wrap would mean 1.2 GB in 10 s on a 100 Mb/s port: it was cleared, not wrapped
    before = switch(port(bits=32, speed=100, in_octets=3_000_000_000))
    after = switch(port(bits=32, speed=100, in_octets=5_000))
    assert "in_bps" not in port_rates(before, 0.0, after, 10.0)[1]


def test_32_bit_counter_that_fell_far_is_a_cleared_counter() -> None:
    # a wrap would be 4.29e9 - 100: more than half the counter's range, so it was cleared
    before = switch(port(bits=32, speed=None, in_octets=1_000, in_errors=500))
    after = switch(port(bits=32, speed=None, in_octets=900, in_errors=2))
    rates = port_rates(before, 0.0, after, 60.0)[1]
    assert "in_bps" not in rates
    assert "in_errors_per_s" not in rates
    assert rates["out_bps"] == 0.0


def test_error_counters_are_32_bit_even_beside_64_bit_octets() -> None:
    before = switch(port(bits=64, in_errors=WRAP32 - 5))
    after = switch(port(bits=64, in_errors=15))
    assert port_rates(before, 0.0, after, 10.0)[1]["in_errors_per_s"] == pytest.approx(2.0)


def test_64_bit_counter_going_down_gives_no_rate() -> None:
    before = switch(port(in_octets=WRAP64 - 10, out_octets=900))
    after = switch(port(in_octets=50, out_octets=100))
    rates = port_rates(before, 0.0, after, 10.0)[1]
    assert "in_bps" not in rates
    assert "out_bps" not in rates
    assert rates["in_errors_per_s"] == 0.0


@pytest.mark.parametrize(
    ("before_s", "after_s", "elapsed_s", "restart"),
    [
        (1000.0, 1010.0, 10.0, False),
        (1000.0, 1000.0, 60.0, False),  # a recording's frozen uptime is no restart
        (1000.0, 5.0, 10.0, True),  # went back
        (counters.UPTIME_WRAP_S - 4.0, 6.0, 10.0, False),  # its own 497-day wrap
        (counters.UPTIME_WRAP_S - 4.0, 6.0, 3600.0, True),  # back, but not where a wrap would be
        (counters.UPTIME_WRAP_S / 2, 6.0, 10.0, True),
    ],
)
def test_restart(before_s: float, after_s: float, elapsed_s: float, restart: bool) -> None:
    assert restarted(before_s, after_s, elapsed_s) is restart


def test_restart_gives_no_rates_at_all() -> None:
    before = switch(port(in_octets=5_000_000, in_errors=100), uptime_s=86_400.0)
    after = switch(port(in_octets=10_000, in_errors=0), uptime_s=30.0)
    assert port_rates(before, 0.0, after, 60.0) == {}


def test_restart_with_counters_above_the_old_ones_still_gives_nothing() -> None:
    # back up and busier than before within the interval: the counters say nothing of it, the uptime does
    before = switch(port(in_octets=1_000), uptime_s=86_400.0)
    after = switch(port(in_octets=50_000_000), uptime_s=20.0)
    assert port_rates(before, 0.0, after, 60.0) == {}


def test_renumbered_new_and_gone_ports() -> None:
    before = switch(port(1, "Ethernet1", in_octets=100), port(2, "Ethernet2", in_octets=100))
    after = switch(port(1, "Ethernet9", in_octets=200), port(3, "Ethernet3", in_octets=200))
    assert port_rates(before, 0.0, after, 10.0) == {}


def test_octets_changing_width_give_no_octet_rate() -> None:
    before = switch(port(bits=32, in_octets=100, in_errors=1))
    after = switch(port(bits=64, in_octets=5_000_000_000, in_errors=2))
    rates = port_rates(before, 0.0, after, 10.0)[1]
    assert "in_bps" not in rates
    assert rates["in_errors_per_s"] == pytest.approx(0.1)


def test_missing_counters_and_empty_intervals() -> None:
    before = switch(replace(port(in_octets=100), out_octets=None, in_errors=None))
    after = switch(port(in_octets=200, out_octets=100, in_errors=7))
    rates = port_rates(before, 0.0, after, 10.0)[1]
    assert set(rates) == {"in_bps", "out_errors_per_s", "in_discards_per_s", "out_discards_per_s"}
    assert port_rates(before, 10.0, after, 10.0) == {}
    assert port_rates(before, 10.0, after, 5.0) == {}


@pytest.mark.parametrize(
    ("before", "now", "bits", "most", "expected"),
    [
        (5, 5, 32, None, 0),
        (WRAP32 - 1, 0, 32, None, 1),
        (WRAP32 - 1, WRAP32 // 2 - 2, 32, None, WRAP32 // 2 - 1),  # just under half the range
        (WRAP32 - 1, WRAP32 // 2 - 1, 32, None, None),  # half the range or more: cleared
        (WRAP32 - 10, 10, 32, 19.0, None),  # faster than the link
        (WRAP32 - 10, 10, 32, 20.0, 20),
        (WRAP64 - 1, 0, 64, None, None),
        (0, WRAP64 - 1, 64, None, WRAP64 - 1),
        (-1, 5, 32, None, None),  # outside the width: not a counter
        (0, WRAP32, 32, None, None),
    ],
)
def test_growth(before: int, now: int, bits: int, most: float | None, expected: int | None) -> None:
    assert growth(before, now, bits, most_if_wrapped=most) == expected


COUNTER = st.sampled_from([32, 64]).flatmap(
    lambda bits: st.tuples(st.just(bits), st.integers(0, 2**bits - 1), st.integers(0, 2**bits - 1))
)


@given(
    octets=COUNTER,
    errors=st.tuples(st.integers(0, WRAP32 - 1), st.integers(0, WRAP32 - 1)),
    elapsed=st.floats(min_value=1e-3, max_value=1e6, allow_nan=False),
    speed=st.one_of(st.none(), st.integers(1, 1_600_000)),
    uptimes=st.tuples(st.floats(0, 4e7), st.floats(0, 4e7)),
)
def test_rates_are_never_negative_nor_past_the_counter_width(
    octets: tuple[int, int, int],
    errors: tuple[int, int],
    elapsed: float,
    speed: int | None,
    uptimes: tuple[float, float],
) -> None:
    bits, octets_before, octets_now = octets
    before = switch(port(bits=bits, speed=speed, in_octets=octets_before, in_errors=errors[0]), uptime_s=uptimes[0])
    after = switch(port(bits=bits, speed=speed, in_octets=octets_now, in_errors=errors[1]), uptime_s=uptimes[1])
    for rates in port_rates(before, 0.0, after, elapsed).values():
        for name, value in rates.items():
            assert value >= 0.0
            if name == "in_bps":
                assert value <= (2**bits - 1) * 8 / elapsed
                if octets_now < octets_before:  # a wrap: half the range at most, and the link's speed
                    assert bits == 32
                    assert value < 2**31 * 8 / elapsed
                    if speed is not None:
                        assert value <= speed * 1e6 * counters.LINK_SLACK * (1 + 1e-9)
            else:
                assert value <= (WRAP32 - 1) / elapsed


@given(
    bits=st.sampled_from([32, 64]),
    start=st.integers(0, 2**64 - 1),
    grown=st.integers(0, 2**31 - 1),
    elapsed=st.floats(min_value=1.0, max_value=3600.0),
)
def test_a_single_wrap_of_what_the_link_can_carry_is_counted_exactly(
    bits: int, start: int, grown: int, elapsed: float
) -> None:
    size = 2**bits
    before = start % size
    now = (before + grown) % size
    link = 1.6e12 / 8 * elapsed  # what a 1.6 Tb/s link carries in the interval: more than any 32-bit wrap
    got = growth(before, now, bits, most_if_wrapped=None if bits == 64 else link)
    if bits == 64 and now < before:
        assert got is None  # a 64-bit counter going down is a cleared one
    else:
        assert got == grown
