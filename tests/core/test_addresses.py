"""Addresses a node must not fetch an operator's URL from, in every spelling an HTTP client reads."""

import pytest

from gpufleet.core import addresses


@pytest.mark.parametrize(
    ("host", "why"),
    [
        ("169.254.169.254", "link-local"),
        ("2852039166", "link-local"),  # 169.254.169.254 as one number
        ("0xa9fea9fe", "link-local"),
        ("::ffff:a9fe:a9fe", "link-local"),
        ("fe80::1", "link-local"),
        ("fd00:ec2::254", "link-local"),  # AWS's IPv6 metadata service
        ("100.100.100.200", "link-local"),  # Alibaba Cloud's
        ("127.0.0.1", "loopback"),
        ("127.1", "loopback"),
        ("LOCALHOST.", "loopback"),
        ("0.0.0.0", "loopback"),  # noqa: S104 - the address under test
        ("224.0.0.1", "multicast"),
    ],
)
def test_a_spelled_address_no_node_may_fetch_from_is_refused(host: str, why: str) -> None:
    assert why in (addresses.refused_host(host) or "")


@pytest.mark.parametrize("host", ["10.0.0.5", "s3.example.com", "2001:db8::1", "objects.internal"])
def test_ordinary_hosts_pass(host: str) -> None:
    assert addresses.refused_host(host) is None


def test_at_fetch_time_the_resolved_addresses_count_and_loopback_passes() -> None:
    assert addresses.refused_resolved("localhost", 80) is None  # an object store on the node itself
    assert "link-local" in (addresses.refused_resolved("169.254.169.254", 80) or "")
    assert addresses.refused_resolved("no-such-host.invalid", 80) is None  # left to the connection to fail
