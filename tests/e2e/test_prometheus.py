"""Debian's Prometheus scraping a real head with a read-only token, using the files `gpufleet export
prometheus` wrote: DCGM-named series arrive with the inventory's labels, and a simulated ECC fault
fires the exported rules inside Prometheus (a fatal Xid, uncorrectable ECC, the node failed)."""

import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.prometheus.names import GPU_LABELS
from tests.e2e.conftest import Head, cli_json, free_port, run_cli, start_sim, wait_for
from tests.prometheus_service import prometheus_server, promtool, query

pytestmark = pytest.mark.e2e
FAST = {"GPUFLEET_METRICS_INTERVAL_S": "0.5"}


def _firing(url: str) -> set[tuple[str, str, str]]:
    alerts: list[dict[str, Any]] = httpx.get(f"{url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
    return {
        (a["labels"]["alertname"], a["labels"].get("node", ""), a["labels"].get("gpu", ""))
        for a in alerts
        if a["state"] == "firing"
    }


def test_prometheus_scrapes_the_head_and_fires_the_exported_rules(tmp_path: Path) -> None:
    promtool()  # skips (or fails in CI) here, before any process starts, if Prometheus is missing
    head = Head(tmp_path, env=FAST).start()
    sim = start_sim(tmp_path, head.url, head.join_token(2), 2, "--gpus-per-node", "4", env=FAST)
    try:
        head.api("POST", "/api/v1/users", json={"username": "prometheus", "role": "viewer"})
        token = cli_json(tmp_path, head.url, "token", "create", "--user", "prometheus", "--scope", "read")["token"]
        out = tmp_path / "prometheus"
        out.mkdir()
        (out / "token").write_text(token + "\n")
        made = run_cli(
            tmp_path,
            "export",
            "prometheus",
            "--out",
            str(out),
            "--server",
            head.url,
            "--token-file",
            str(out / "token"),
            "--scrape-interval",
            "1",
            "--evaluation-interval",
            "1",
        )
        assert made.returncode == 0, made.stderr
        wait_for(lambda: [n["state"] for n in head.nodes()] == ["up", "up"], 30)
        inventory = {gpu["index"]: gpu for gpu in head.api("GET", "/api/v1/nodes/sim001")["gpus"]}

        with prometheus_server(out / "prometheus.yml", tmp_path / "prometheus-state", free_port()) as url:
            wait_for(lambda: len(query(url, 'DCGM_FI_DEV_GPU_UTIL{node="sim001"}')) == 4, 30, interval=0.5)
            assert query(url, 'up{job="gpufleet"}')[0]["value"][1] == "1"  # the read-only token is enough
            for series in query(url, 'DCGM_FI_DEV_GPU_UTIL{node="sim001"}'):
                labels = series["metric"]
                assert set(labels) == {"__name__", *GPU_LABELS, "job", "instance"}
                gpu = inventory[int(labels["gpu"])]
                assert (labels["UUID"], labels["modelName"], labels["pci_bus_id"]) == (
                    gpu["uuid"],
                    gpu["model"],
                    gpu["pci_bus_id"],
                )
                assert labels["device"] == f"nvidia{labels['gpu']}"
            assert len(query(url, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")) == 8  # its exact name, both nodes
            assert {s["metric"]["node"] for s in query(url, "gpufleet_node_up == 1")} == {"sim001", "sim002"}
            assert _firing(url) == set()

            injected = run_cli(tmp_path, "sim", "fault", "sim001", "--kind", "ecc-dbe", "--gpu", "2", server=head.url)
            assert injected.returncode == 0, injected.stderr
            expected = {
                ("GpuXidFatal", "sim001", "2"),
                ("GpuUncorrectableEccErrors", "sim001", "2"),
                ("NodeFailed", "sim001", ""),
            }
            wait_for(lambda: expected <= _firing(url), 30, interval=0.5)
            assert {a for a in _firing(url) if a[1] != "sim001"} == set()
    finally:
        sim.send_signal(signal.SIGINT)
        sim.wait(timeout=30)
        head.kill(signal.SIGTERM)
