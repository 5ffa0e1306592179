"""InfiniBand ports from a sysfs tree: built from a real H100 node's port files, plus a port that is down."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from gpufleet.agent.metrics.infiniband import IbCollector, SysfsInfiniband, leading_number, rate_gbps

SNAPSHOT = Path(__file__).resolve().parent.parent / "fixtures" / "infiniband" / "ib-sysfs-h100-snapshot.csv"
COUNTER_COLUMNS = ("link_downed", "link_error_recovery", "symbol_error", "port_rcv_errors")


def _write_port(root: Path, device: str, port: str, files: dict[str, str]) -> None:
    base = root / device / "ports" / port
    (base / "counters").mkdir(parents=True)
    for name, text in files.items():
        (base / name).write_text(text + "\n")


@pytest.fixture
def h100_sysfs(tmp_path: Path) -> Path:
    """/sys/class/infiniband of the H100 node in the snapshot, one file per value as the kernel lays it out."""
    root = tmp_path / "infiniband"
    with SNAPSHOT.open() as f:
        for row in csv.DictReader(f):
            files = {"state": row["state"], "phys_state": row["phys_state"], "rate": row["rate"]}
            files |= {f"counters/{c}": row[c] for c in COUNTER_COLUMNS}
            _write_port(root, row["device"], row["port"], files)
    return root


def test_every_port_of_the_h100_node(h100_sysfs: Path) -> None:
    entities = IbCollector(SysfsInfiniband(h100_sysfs)).collect().entities

    assert sorted(entities) == [
        f"ib:{d}/1" for d in ("mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9")
    ] + ["ib:mlx5_bond_0/1"]
    assert entities["ib:mlx5_1/1"] == {
        "ib_state": 4.0,  # 4: ACTIVE
        "ib_phys_state": 5.0,  # 5: LinkUp
        "ib_rate_gbps": 400.0,  # 400 Gb/sec (4X NDR)
        "ib_link_downed": 255.0,  # an 8-bit counter, saturated
        "ib_link_error_recovery": 0.0,
        "ib_symbol_errors": 0.0,
        "ib_rcv_errors": 14.0,
    }  # no port_xmit_discards file in this tree: left out
    assert entities["ib:mlx5_bond_0/1"]["ib_rate_gbps"] == 200.0  # 200 Gb/sec (2X NDR)


def test_a_port_that_is_down(h100_sysfs: Path) -> None:
    # The kernel's own spellings (drivers/infiniband/core/sysfs.c), and a counter without a PMA.
    _write_port(
        h100_sysfs,
        "mlx5_2",
        "1",
        {
            "state": "1: DOWN",
            "phys_state": "2: Polling",
            "rate": "10 Gb/sec (4X SDR)",
            "counters/symbol_error": "N/A (no PMA)",
        },
    )

    values = IbCollector(SysfsInfiniband(h100_sysfs)).collect().entities["ib:mlx5_2/1"]

    assert values == {"ib_state": 1.0, "ib_phys_state": 2.0, "ib_rate_gbps": 10.0}


def test_a_node_without_infiniband_has_no_ports(tmp_path: Path) -> None:
    out = IbCollector(SysfsInfiniband(tmp_path / "absent")).collect()

    assert out.entities == {}
    assert out.problems == []


@pytest.mark.parametrize(
    ("text", "number"),
    [("4: ACTIVE\n", 4), ("5: LinkUp", 5), ("7: Phy Test\n", 7), ("ACTIVE", None), ("", None), (None, None)],
)
def test_leading_number(text: str | None, number: int | None) -> None:
    assert leading_number(text) == number


@pytest.mark.parametrize(
    ("text", "gbps"),
    [("400 Gb/sec (4X NDR)\n", 400.0), ("2.5 Gb/sec (1X SDR)", 2.5), ("56 Gb/sec (4X FDR)", 56.0), ("N/A", None)],
)
def test_rate(text: str, gbps: float | None) -> None:
    assert rate_gbps(text) == gbps
