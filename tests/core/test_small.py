import pytest

from gpufleet.core import hostlist
from gpufleet.core.durations import parse_duration
from gpufleet.core.errors import InvalidInput


def test_hostlist_expands_ranges_in_order_without_duplicates() -> None:
    assert hostlist.expand(["gpu[001-003]", "gpu002", "cpu1"]) == ["gpu001", "gpu002", "gpu003", "cpu1"]
    assert hostlist.collect(["gpu001", "gpu002", "gpu003"]) == "gpu[001-003]"


@pytest.mark.parametrize("bad", ["gpu[001-", "gpu[3-1]", "gpu[a-b]", ""])
def test_hostlist_rejects_malformed(bad: str) -> None:
    with pytest.raises(InvalidInput):
        hostlist.expand([bad])


def test_hostlist_caps_huge_expansions() -> None:
    with pytest.raises(InvalidInput, match=r"too large|more than"):
        hostlist.expand(["n[0-999999]"])


@pytest.mark.parametrize(("text", "seconds"), [("45s", 45), ("30m", 1800), ("1h", 3600), ("7d", 604800)])
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["1", "h", "0h", "-1h", "1y", "1.5h"])
def test_bad_durations(bad: str) -> None:
    with pytest.raises(InvalidInput):
        parse_duration(bad)


def test_a_periodic_loop_runs_on_wake_without_pushing_its_period_out() -> None:
    """Twenty wakes in a row, then quiet: the loop keeps its period (a wake is an extra pass, not the
    scheduled one, so it must not move the next scheduled pass a period further each time)."""
    import asyncio

    from gpufleet.core.loops import run_periodic

    async def scenario() -> tuple[int, int]:
        stop, wake = asyncio.Event(), asyncio.Event()
        passes = 0

        async def step() -> None:
            nonlocal passes
            passes += 1

        task = asyncio.create_task(run_periodic("test", 0.2, step, stop, wake=wake))
        for _ in range(20):
            await asyncio.sleep(0.01)
            wake.set()
        await asyncio.sleep(0.05)
        woken = passes
        await asyncio.sleep(1.0)  # about five periodic passes
        stop.set()
        await task
        return woken, passes - woken

    woken, periodic = asyncio.run(scenario())
    assert woken >= 15  # each wake ran a pass soon after (wakes close together may merge)
    assert 3 <= periodic <= 7


def test_a_burst_of_wakes_costs_a_pass_per_gap() -> None:
    """A scheduler woken by each of a burst of submissions runs once per `wake_gap_s`, not once per wake,
    and still runs soon after the burst's last wake."""
    import asyncio

    from gpufleet.core.loops import run_periodic

    async def scenario() -> tuple[int, float]:
        stop, wake = asyncio.Event(), asyncio.Event()
        at: list[float] = []
        loop = asyncio.get_running_loop()

        async def step() -> None:
            at.append(loop.time())

        task = asyncio.create_task(run_periodic("test", 10.0, step, stop, wake=wake, wake_gap_s=0.2))
        await asyncio.sleep(0.05)  # the first pass
        started = loop.time()
        for _ in range(100):  # a wake every 10 ms for a second
            wake.set()
            await asyncio.sleep(0.01)
        last_wake = loop.time()
        await asyncio.sleep(0.4)
        stop.set()
        await task
        during = [t for t in at if started <= t <= last_wake]
        after = [t - last_wake for t in at if t > last_wake]
        return len(during), min(after, default=1.0)

    during, lag = asyncio.run(scenario())
    assert 3 <= during <= 7  # about one pass per 0.2 s over the 1 s burst, not a hundred
    assert lag <= 0.3  # the burst's last wake is served within about a gap


def test_a_slow_woken_pass_waits_in_proportion_before_the_next() -> None:
    """A pass that takes long (a scheduler over a huge queue) is followed, under a stream of wakes, by a wait
    of about 19 times its length (WAKE_SHARE 5 %), not by the fixed gap: wakes cannot make it eat a core."""
    import asyncio

    from gpufleet.core.loops import WAKE_SHARE, run_periodic

    async def scenario() -> int:
        stop, wake = asyncio.Event(), asyncio.Event()
        passes = 0

        async def step() -> None:
            nonlocal passes
            passes += 1
            await asyncio.sleep(0.05)  # each pass takes 50 ms: the next woken one waits about 0.95 s

        task = asyncio.create_task(run_periodic("test", 10.0, step, stop, wake=wake, wake_gap_s=0.01))
        for _ in range(150):  # a wake every 10 ms for 1.5 s
            wake.set()
            await asyncio.sleep(0.01)
        stop.set()
        await task
        return passes

    assert WAKE_SHARE == 0.05
    passes = asyncio.run(scenario())
    assert 2 <= passes <= 3  # the first, then one per second of wakes; with the fixed gap alone about 25
