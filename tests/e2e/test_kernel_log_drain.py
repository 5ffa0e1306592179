"""Issue 8's must-show, with real processes: an Xid 79 line written into a simulated node's kernel
log is read by its agent, classified, and drains the node, naming the GPU at that PCI address; the
line and its event are kept at the head, listed and searchable; the leader mines both lines into
templates, and the ordinary one, a template never seen, becomes an event of its own."""

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Head, cli_json, run_cli, start_sim, wait_for

pytestmark = pytest.mark.e2e
FAST = {
    "GPUFLEET_METRICS_INTERVAL_S": "0.5",
    "GPUFLEET_LOG_TEMPLATE_LEARNING_S": "0",  # no learning day: every new template is an event
    "GPUFLEET_LOG_TEMPLATE_PASS_S": "0.5",
}
# GPU 2 of a simulated HGX node sits at bus 3A (sim/nvml.py); the line is a real Xid 79 capture's.
XID79_GPU2 = (
    "[6781741.548779] NVRM: Xid (PCI:0000:3a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
)

# A real API mismatch as rsyslog writes it, newlines as #012
# (tests/fixtures/kernel-logs/host-crash-driver-lines-real.txt, line 18).
MISMATCH = (
    "Jun 30 11:07:05 gpu-0 kernel: NVRM: API mismatch: the client has the version 535.54.03, but#012NVRM: this kernel"
    " module has the version 530.30.02.  Please#012NVRM: make sure that this kernel module and all NVIDIA driver#012"
    "NVRM: components have the same version."
)


@pytest.fixture
def fast_head(heavy: None, tmp_path: Path) -> Iterator[Head]:
    head = Head(tmp_path, env=FAST).start()
    yield head
    head.kill(signal.SIGTERM)


def test_an_xid79_line_in_the_kernel_log_drains_the_node(fast_head: Head, tmp_path: Path) -> None:
    head = fast_head
    sim = start_sim(tmp_path, head.url, head.join_token(2), 2, env=FAST)
    try:

        def health() -> dict[str, dict[str, Any]]:
            return {row["node"]: row for row in head.api("GET", "/api/v1/health")}

        wait_for(lambda: len(health()) == 2 and all(r["health"] == "healthy" for r in health().values()), 60)
        kern_log = tmp_path / "sim" / "nodes" / "sim001.kern.log"
        with kern_log.open("a") as fh:
            fh.write("[    5.2] IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready\n" + XID79_GPU2 + "\n")
        wait_for(lambda: health()["sim001"]["drained"], 15)
        node = health()["sim001"]
        assert node["health"] == "failed"
        assert "GPU 2: Xid 79 (GPU has fallen off the bus)" in node["reasons"]
        assert node["drain_reason"] == "gpufleet: GPU 2: Xid 79 (GPU has fallen off the bus)"
        assert health()["sim002"]["health"] == "healthy"  # the other node's log holds nothing

        # Kept at the head and searchable: the event, and the ordinary line beside it.
        wait_for(lambda: len(head.api("GET", "/api/v1/logs", params={"node": "sim001"})) == 2, 10)
        events = cli_json(tmp_path, head.url, "events", "list", "--node", "sim001", "--kind", "xid")
        assert [(e["kind"], e["code"], e["gpu"], e["severity"], e["line"]) for e in events] == [
            ("xid", 79, 2, "critical", XID79_GPU2)
        ]
        wait_for(lambda: len(cli_json(tmp_path, head.url, "logs", "templates", "--new")) == 2, 15)
        templates = cli_json(tmp_path, head.url, "logs", "templates", "--category", "")
        assert {(t["first_node"], t["count"]) for t in templates} == {("sim001", 1)}
        assert any(
            t["template"] == "IPv<NUM>: ADDRCONF(NETDEV_CHANGE): eth<NUM>: link becomes ready" for t in templates
        )
        found = cli_json(tmp_path, head.url, "logs", "search", "link", "ready")
        assert [(f["node"], f["kind"], f["severity"]) for f in found] == [("sim001", "log_template", "info")]
        shown = run_cli(tmp_path, "events", "list", "--severity", "critical", server=head.url)
        assert shown.returncode == 0, shown.stderr
        assert "xid 79" in shown.stdout

        # A driver upgraded without a reboot: the agent (started before) still reads NVML, but no job can
        # run CUDA. The kernel's API mismatch line drains the node before a job lands on it.
        with (tmp_path / "sim" / "nodes" / "sim002.kern.log").open("a") as fh:
            fh.write(MISMATCH + "\n")
        wait_for(lambda: health()["sim002"]["drained"], 15)
        assert health()["sim002"]["health"] == "failed"
        assert "differ" in health()["sim002"]["drain_reason"]
    finally:
        sim.send_signal(signal.SIGINT)
        sim.wait(timeout=30)
