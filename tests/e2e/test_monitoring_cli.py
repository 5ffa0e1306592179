"""The monitoring commands through the real CLI against a real head and simulator."""

import json
import signal
from pathlib import Path

import pytest

from tests.e2e.conftest import Head, cli_json, run_cli, start_sim, wait_for

pytestmark = pytest.mark.e2e
FAST = {"GPUFLEET_METRICS_INTERVAL_S": "0.5"}


def test_metrics_rules_policies_drains_and_receivers(tmp_path: Path) -> None:
    head = Head(tmp_path, env=FAST).start()
    sim = start_sim(tmp_path, head.url, head.join_token(1), 1, env=FAST)
    try:

        def points() -> list[dict[str, float]]:
            result = run_cli(
                tmp_path,
                "metrics",
                "show",
                "sim001",
                "--gpu",
                "2",
                "--metric",
                "power_w",
                "--since",
                "5m",
                "--step",
                "1s",
                "-o",
                "json",
                server=head.url,
            )
            return [] if result.returncode else json.loads(result.stdout)["points"]

        wait_for(lambda: len(points()) >= 2, 30)
        assert all(0 < p["value"] < 800 for p in points())  # watts of a simulated H200
        table = run_cli(tmp_path, "metrics", "show", "sim001", "--metric", "cpu_util", "--since", "5m", server=head.url)
        assert table.returncode == 0
        assert "sim001 host cpu_util" in table.stdout
        bad = run_cli(tmp_path, "metrics", "show", "sim001", "--metric", "x", "--since", "soon", server=head.url)
        assert bad.returncode == 2
        assert "invalid duration" in bad.stderr

        assert run_cli(tmp_path, "health", "sim001", server=head.url).returncode in (0, 1)
        added = run_cli(
            tmp_path,
            "alert",
            "rule",
            "add",
            "GpuHot",
            "--metric",
            "gpu_temp_c",
            "--entity",
            "gpu",
            "--op",
            ">=",
            "--value",
            "83",
            "--for",
            "5m",
            server=head.url,
        )
        assert added.returncode == 0, added.stderr
        rules = {r["name"]: r for r in cli_json(tmp_path, head.url, "alert", "rule", "list")}
        assert rules["GpuHot"]["for_s"] == 300
        assert rules["GpuTemperatureHigh"]["builtin"] is True
        assert run_cli(tmp_path, "alert", "rule", "remove", "GpuTemperatureHigh", server=head.url).returncode == 4

        saved = run_cli(
            tmp_path,
            *("health-policy", "set", "default", "--disable", "pcie", "--set", "gpu_temp_c=88"),
            *("--xid-action", "13=ignore"),
            server=head.url,
        )
        assert saved.returncode == 0, saved.stderr
        policy = cli_json(tmp_path, head.url, "health-policy", "list")[0]["policy"]
        assert (policy["gpu_temp_c"], policy["xid_actions"]) == (88, {"13": "ignore"})
        refused = run_cli(tmp_path, "health-policy", "set", "default", "--xid-action", "13=later", server=head.url)
        assert refused.returncode == 2
        assert "Xid 13: 'later' is not one of" in refused.stderr

        assert (
            run_cli(tmp_path, "node", "drain", "sim001", "--reason", "firmware update", server=head.url).returncode == 0
        )
        assert cli_json(tmp_path, head.url, "node", "list")[0]["drain_reason"] == "firmware update"
        assert run_cli(tmp_path, "node", "resume", "sim001", server=head.url).returncode == 0

        silenced = run_cli(
            tmp_path, "alert", "silence", "--node", "sim001", "--for", "1h", "--comment", "rack work", server=head.url
        )
        assert silenced.returncode == 0, silenced.stderr
        assert [s["comment"] for s in cli_json(tmp_path, head.url, "alert", "silences")] == ["rack work"]

        slack = "https://hooks.slack.com/services/T0/B0/s3cr3t"
        assert (
            run_cli(tmp_path, "alert", "receiver", "add-slack", "ops", "--url", slack, server=head.url).returncode == 0
        )
        listed = run_cli(tmp_path, "alert", "receiver", "list", server=head.url)
        assert "ops" in listed.stdout
        assert "s3cr3t" not in listed.stdout
    finally:
        sim.send_signal(signal.SIGINT)
        sim.wait(timeout=30)
        head.kill(signal.SIGTERM)
