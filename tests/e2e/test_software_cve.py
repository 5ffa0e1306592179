"""Issue 9 end to end, with real processes: simulated nodes' agents read their software with the real
collector and send it; an advisory imported with the CLI is matched by the leader's pass; the report,
the version matrix and the drift name the node left on an older image."""

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FIXTURES
from tests.e2e.conftest import Head, cli_json, run_cli, start_sim, wait_for

pytestmark = pytest.mark.e2e
FAST = {"GPUFLEET_CVE_EVALUATE_INTERVAL_S": "0.5"}
# Ubuntu's own OSV record of CVE-2023-4911 ("Looney Tunables"): glibc on 22.04 fixed in 2.35-0ubuntu3.4
# (tests/fixtures/advisories, provenance in tests/fixtures/SOURCES.md).
LOONEY_TUNABLES = FIXTURES / "advisories" / "UBUNTU-CVE-2023-4911.json"


@pytest.fixture
def head(heavy: None, tmp_path: Path) -> Iterator[Head]:
    """Under the heavy lock: a head, simulated agents and CLI processes would starve the 200-node
    join storm's heartbeats on the other worker."""
    started = Head(tmp_path, env=FAST).start()
    yield started
    started.kill(signal.SIGTERM)


def test_a_node_on_an_older_image_is_found_by_an_imported_advisory(head: Head, tmp_path: Path) -> None:
    sim = start_sim(tmp_path, head.url, head.join_token(4), 4, "--software")
    try:

        def matrix() -> dict[str, Any]:
            found: dict[str, Any] = head.api("GET", "/api/v1/assets/matrix")
            return found

        # every node reported (not only one of each image): the agents send in their own time
        wait_for(lambda: sum(len(n) for n in matrix().get("kernel", {}).values()) == 4, 60)
        assert matrix()["kernel"] == {
            "5.15.0-126-generic": ["sim001", "sim002", "sim003"],
            "5.15.0-91-generic": ["sim004"],
        }
        assert set(matrix()["driver"]) == {"580.159.04"}  # what the simulated NVML reports

        imported = run_cli(tmp_path, "cve", "import", str(LOONEY_TUNABLES), server=head.url)
        assert imported.returncode == 0, imported.stderr
        assert imported.stdout.strip() == "1 new, 0 updated, 0 unchanged"

        def report() -> list[dict[str, Any]]:
            found: list[dict[str, Any]] = cli_json(tmp_path, head.url, "cve", "report")
            return found

        wait_for(lambda: len(report()) == 1, 30)
        (problem,) = report()
        assert (problem["problem"], problem["severity"], problem["cvss_score"], problem["nodes"]) == (
            "CVE-2023-4911",
            "high",
            7.8,
            ["sim004"],
        )
        assert [(p["package"], p["installed"], p["fixed"]) for p in problem["packages"]] == [
            ("libc-bin", ["2.35-0ubuntu3.1"], "2.35-0ubuntu3.4"),
            ("libc6", ["2.35-0ubuntu3.1"], "2.35-0ubuntu3.4"),
        ]
        drift = run_cli(tmp_path, "assets", "drift", server=head.url)
        assert "1 node run kernel 5.15.0-91-generic; the category mostly runs 5.15.0-126-generic" in drift.stdout
        where = cli_json(tmp_path, head.url, "assets", "where", "glibc", "<2.35-0ubuntu3.4")
        assert sorted({w["node"] for w in where}) == ["sim004"]
    finally:
        sim.send_signal(signal.SIGINT)
        sim.wait(timeout=30)
