from gpufleet.auth.throttle import LoginThrottle
from gpufleet.core.clock import FakeClock


def test_the_wait_doubles_after_the_free_failures_and_is_capped() -> None:
    clock = FakeClock()
    throttle = LoginThrottle(clock, free_failures=3, base_delay_s=1, max_delay_s=8)
    waits = []
    for _ in range(7):
        throttle.failed("alice", "10.0.0.1")
        waits.append(throttle.wait_s("alice", "10.0.0.1"))
    assert waits == [0, 0, 1, 2, 4, 8, 8]


def test_names_and_addresses_are_slowed_independently() -> None:
    clock = FakeClock()
    throttle = LoginThrottle(clock, free_failures=1)
    for i in range(3):
        throttle.failed(f"user{i}", "10.0.0.1")  # one address spraying names
    assert throttle.wait_s("someone-else", "10.0.0.1") > 0
    assert throttle.wait_s("someone-else", "10.0.0.2") == 0
    for i in range(3):
        throttle.failed("bob", f"10.1.0.{i}")  # many addresses on one name
    assert throttle.wait_s("bob", "10.9.9.9") > 0


def test_success_clears_the_name_and_old_failures_are_forgotten() -> None:
    clock = FakeClock()
    throttle = LoginThrottle(clock, free_failures=0, forget_after_s=100)
    throttle.failed("alice", "a")
    throttle.succeeded("alice")
    assert throttle.wait_s("alice", "b") == 0
    assert throttle.wait_s("carol", "a") > 0  # the address still counts
    clock.advance(101)
    assert throttle.wait_s("carol", "a") == 0


def test_memory_is_bounded() -> None:
    throttle = LoginThrottle(FakeClock(), max_keys=10)
    for i in range(100):
        throttle.failed(f"u{i}", "x")
    assert len(throttle._failures) <= 10
