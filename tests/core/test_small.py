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
