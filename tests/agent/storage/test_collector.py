"""The agent's StorageCollector over Lustre and GPFS mounts, the real recorded outputs of `lctl`, `lfs df`,
`mmhealth` and `mmdf` (tests/fixtures/storage, provenance in SOURCES.md) standing in for the programs:
each mount gets its own file system's figures, the programs run once per detail interval, and never for
a mount whose probe did not answer (they would hang on it too), which keeps its last figures."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from gpufleet.agent.checks.mounts import Mount
from gpufleet.agent.storage.collector import StorageCollector
from gpufleet.agent.storage.probe import ProbeResult

FIXTURES = Path(__file__).parents[2] / "fixtures" / "storage"


def text(name: str) -> str:
    return (FIXTURES / name).read_text()


class Recorded:
    """A StorageSource whose programs print the recorded outputs; counts what ran."""

    def __init__(self) -> None:
        self.table = {
            "/scratch2": Mount("lustre", False, "10.0.0.1@o2ib:/snx11035"),  # lfs df's file system
            "/tesfs": Mount("lustre", False, "10.0.0.1@tcp:/tesfs"),  # lctl's osc imports
            "/lustre": Mount("lustre", False, "10.0.0.1@o2ib:10.0.0.2@o2ib:/a361000"),  # lctl's llite stats
            "/gpfs/project": Mount("gpfs", False, "project"),
            "/home": Mount("ext4", False, "/dev/sda2"),  # not shared: not watched
        }
        self.hung: set[str] = set()
        self.ran: Counter[str] = Counter()

    def mounts(self) -> dict[str, Mount]:
        return dict(self.table)

    def probe(self, path: str) -> ProbeResult:
        if path in self.hung:
            return ProbeResult("hung", 5.0, "no answer within 5 s")
        return ProbeResult("ok", 0.002, "", None, 4096.0, 2048.0, 1024.0, 100.0, 90.0)

    def mountstats(self) -> str | None:
        self.ran["mountstats"] += 1
        return None

    def lustre_params(self) -> str | None:
        self.ran["lctl"] += 1
        return text("lctl-osc-state.txt") + text("lctl-llite-stats-2.14.txt")

    def lustre_df(self, mountpoint: str) -> str | None:
        self.ran[f"lfs df {mountpoint}"] += 1
        return text("lfs-df-nersc-scratch2.txt") if mountpoint == "/scratch2" else None

    def gpfs_health(self) -> str | None:
        self.ran["mmhealth"] += 1
        return text("mmhealth-node-show-Y.txt")

    def gpfs_df(self, device: str) -> str | None:
        self.ran[f"mmdf {device}"] += 1
        return text("mmdf-Y.txt") if device == "project" else None


def test_each_mount_gets_its_own_file_systems_figures_once_per_detail_interval() -> None:
    source = Recorded()
    now = [1000.0]
    collector = StorageCollector(source, detail_interval_s=60.0, clock=lambda: now[0])
    first = collector.collect()
    assert sorted(first.entities) == ["fs:/gpfs/project", "fs:/lustre", "fs:/scratch2", "fs:/tesfs"]
    assert [(m.mountpoint, m.fstype) for m in first.mounts] == [
        ("/gpfs/project", "gpfs"),
        ("/lustre", "lustre"),
        ("/scratch2", "lustre"),
        ("/tesfs", "lustre"),
    ]
    scratch = first.entities["fs:/scratch2"]
    assert scratch["fs_state"] == 0
    assert round(scratch["lustre_ost_fill_max_pct"]) == 83  # what lfs df printed for OST0006
    assert round(scratch["lustre_mdt_fill_max_pct"]) == 5
    assert scratch["lustre_targets_inactive"] == 0
    assert "lustre_targets" not in scratch  # tesfs's imports are not snx11035's
    tesfs = first.entities["fs:/tesfs"]
    assert (tesfs["lustre_targets"], tesfs["lustre_targets_unhealthy"]) == (8, 1)  # OST0000 DISCONN
    assert "lustre_ost_fill_max_pct" not in tesfs
    lustre = first.entities["fs:/lustre"]
    assert lustre["fs_ops"] > 0
    assert lustre["lustre_read_bytes"] == 44179456
    project = first.entities["fs:/gpfs/project"]
    assert (project["gpfs_health"], project["gpfs_node_health"]) == (0.0, 1.0)  # HEALTHY; the node TIPS
    assert project["gpfs_inodes_used"] == 430741822
    assert project["fs_size_bytes"] == 4096  # the probe's figures beside the program's
    assert source.ran == Counter(
        {"lctl": 1, "lfs df /scratch2": 1, "lfs df /tesfs": 1, "lfs df /lustre": 1, "mmhealth": 1, "mmdf project": 1}
    )

    now[0] += 30  # within the detail interval: the programs do not run, the figures stay
    again = collector.collect()
    assert again.entities["fs:/tesfs"]["lustre_targets_unhealthy"] == 1
    assert again.entities["fs:/gpfs/project"]["gpfs_inodes_used"] == 430741822
    assert sum(source.ran.values()) == 6


def test_a_mount_that_does_not_answer_is_not_asked_again_and_keeps_its_last_figures() -> None:
    source = Recorded()
    now = [1000.0]
    collector = StorageCollector(source, detail_interval_s=60.0, clock=lambda: now[0])
    collector.collect()
    source.hung = {"/scratch2", "/gpfs/project"}
    source.ran.clear()
    now[0] += 61
    hung = collector.collect()
    assert source.ran == Counter({"lctl": 1, "lfs df /tesfs": 1, "lfs df /lustre": 1})  # no lfs df, mmhealth, mmdf
    scratch = hung.entities["fs:/scratch2"]
    assert scratch["fs_state"] == 1
    assert "fs_size_bytes" not in scratch
    assert round(scratch["lustre_ost_fill_max_pct"]) == 83  # its last figures

    source.hung = set(source.table)
    source.ran.clear()
    now[0] += 61
    collector.collect()
    assert source.ran == Counter()  # nothing answers: no program runs at all


@pytest.mark.parametrize("missing", ["lustre_params", "gpfs_health"])
def test_a_program_that_is_not_installed_gives_no_figures(missing: str, monkeypatch: pytest.MonkeyPatch) -> None:
    source = Recorded()
    monkeypatch.setattr(source, missing, lambda: None)
    values = StorageCollector(source).collect().entities
    if missing == "lustre_params":
        assert "lustre_targets" not in values["fs:/tesfs"]
        assert round(values["fs:/scratch2"]["lustre_ost_fill_max_pct"]) == 83  # lfs df still ran
    else:
        assert "gpfs_health" not in values["fs:/gpfs/project"]
        assert values["fs:/gpfs/project"]["gpfs_inodes_used"] == 430741822  # mmdf still ran
    assert values["fs:/gpfs/project"]["fs_state"] == 0
