"""Per-port rates from two polls of one switch: pure arithmetic, no SNMP.

A switch's counters only grow, and wrap to 0 past their width (2^32 or 2^64). The rate over an interval
is the growth over its length, where the growth can be known:

- a counter that went down wrapped once, if it could have: a 32-bit counter, whose wrapped growth is
  under half its range and (for octets, where the port's speed is known) no faster than the link;
  anything else that went down (any 64-bit counter, which at 400 Gb/s wraps in 11 years, or a growth
  no link could carry) was cleared, and gives no rate for that interval;
- the switch restarted (sysUpTime went back, other than by its own 497-day wrap): no rates at all
  for the interval, as every counter started again from 0;
- a port whose ifIndex now names another interface (its name changed), or whose octets changed width
  (the HC counters appeared or went away): no rates for that port;
- an interval of no length, or a counter either poll lacks: no rate.

So a rate is never negative, never more than the counter's width allows over the interval, and never
a spike made of a restart or a cleared counter. Rates are bits per second for octets (`in_bps`,
`out_bps`), events per second for errors and discards (`in_errors_per_s`...). Errors and discards are
always 32-bit counters (IF-MIB has no 64-bit ones); octets are `PortReading.counter_bits` wide.
"""

from __future__ import annotations

from gpufleet.network.snmp import PortReading, SwitchReading

UPTIME_WRAP_S = 2**32 / 100  # sysUpTime is TimeTicks (hundredths of a second), 32 bits: 497.1 days
UPTIME_SLACK_S = 30.0  # how far a wrapped sysUpTime may stray from the wall clock's interval
LINK_SLACK = 1.1  # a wrapped octet counter may imply up to the link's speed plus this share (framing, clocks)
ERROR_BITS = 32

# rate name -> (the PortReading counter, bits per unit: 8 for octets, 0 for per-second counts)
RATES = {
    "in_bps": ("in_octets", 8),
    "out_bps": ("out_octets", 8),
    "in_errors_per_s": ("in_errors", 0),
    "out_errors_per_s": ("out_errors", 0),
    "in_discards_per_s": ("in_discards", 0),
    "out_discards_per_s": ("out_discards", 0),
}


def port_rates(
    previous: SwitchReading, previous_at: float, current: SwitchReading, current_at: float
) -> dict[int, dict[str, float]]:
    """Each port's rates over the interval between two readings of one switch, taken at `previous_at`
    and `current_at` (seconds on one clock: monotonic, or wall time). Keyed by ifIndex; a port with no
    rate this interval is left out, and so is a rate that cannot be known (see the module's doc)."""
    elapsed = current_at - previous_at
    if elapsed <= 0 or restarted(previous.uptime_s, current.uptime_s, elapsed):
        return {}
    before = {p.index: p for p in previous.ports}
    rates: dict[int, dict[str, float]] = {}
    for port in current.ports:
        old = before.get(port.index)
        if old is None or old.name != port.name:  # new, or the ifIndex now names another interface
            continue
        found = _rates(old, port, elapsed)
        if found:
            rates[port.index] = found
    return rates


def _rates(old: PortReading, new: PortReading, elapsed: float) -> dict[str, float]:
    found: dict[str, float] = {}
    for rate, (counter, bits_per_unit) in RATES.items():
        before, now = getattr(old, counter), getattr(new, counter)
        if before is None or now is None:
            continue
        if bits_per_unit:  # octets
            if old.counter_bits != new.counter_bits:
                continue
            width = new.counter_bits
            speed = new.speed_mbps or old.speed_mbps
            most = speed * 1e6 / 8 * elapsed * LINK_SLACK if speed else None
            grown = growth(before, now, width, most_if_wrapped=most)
        else:
            grown = growth(before, now, ERROR_BITS)
        if grown is not None:
            found[rate] = grown * (bits_per_unit or 1) / elapsed
    return found


def growth(before: int, now: int, bits: int, most_if_wrapped: float | None = None) -> int | None:
    """How much a `bits`-wide counter grew from `before` to `now`, or None where that cannot be known:
    a 64-bit counter that went down (cleared), or a 32-bit one whose single wrap would mean growing by
    half its range or more, or by more than `most_if_wrapped` (what the link could carry).
    Values outside the width are refused (None) as well."""
    size = 1 << bits
    if not (0 <= before < size and 0 <= now < size):
        return None
    if now >= before:
        return now - before
    if bits >= 64:
        return None
    wrapped = now + size - before
    if wrapped >= size // 2 or (most_if_wrapped is not None and wrapped > most_if_wrapped):
        return None
    return wrapped


def restarted(uptime_before_s: float, uptime_now_s: float, elapsed_s: float) -> bool:
    """Whether the switch's SNMP agent restarted between two readings: its sysUpTime went back, unless
    by its own wrap at 2^32 hundredths of a second, which leaves it where the interval says it should be."""
    if uptime_now_s >= uptime_before_s:
        return False
    progressed = uptime_now_s + UPTIME_WRAP_S - uptime_before_s  # had it wrapped once
    return abs(progressed - elapsed_s) > UPTIME_SLACK_S + 0.1 * elapsed_s
