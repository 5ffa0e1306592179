"""Health checks as pure functions: each fault the issue names gives the verdict an operator expects."""

import csv

import pytest
from pydantic import ValidationError

from gpufleet.monitoring.checks import (
    CLOCKS_HW_THERMAL,
    CLOCKS_SW_POWER_CAP,
    FATAL_XIDS,
    HealthPolicy,
    NodeSnapshot,
    evaluate,
)
from gpufleet.protocol.metrics import NodeEvent
from tests.conftest import FIXTURES

POLICY = HealthPolicy()


def gpu(**values: float) -> dict[str, float]:
    # An H200 at rest, as in tests/fixtures/h200/nvml-probe.json (40 C, 79 W, PCIe x16, 18 NVLinks).
    base = {
        "gpu_util": 0.0,
        "gpu_temp_c": 40.0,
        "power_w": 79.3,
        "clocks_event_reasons": 0.0,
        "ecc_dbe_volatile": 0.0,
        "remapped_rows_pending": 0.0,
        "remapped_rows_failure": 0.0,
        "pcie_link_width": 16.0,
        "pcie_link_width_max": 16.0,
        "pcie_link_gen": 1.0,  # idle GPUs drop their generation: never a finding
        "pcie_link_gen_max": 5.0,
        "nvlink_links_up": 18.0,
        "nvlink_links_total": 18.0,
    }
    return base | values


def node(gpus: int = 8, **changed: dict[str, float]) -> dict[str, dict[str, float]]:
    sample = {f"gpu:{i}": gpu() for i in range(gpus)}
    sample["host"] = {"cpu_util": 3.0, "mem_used_pct": 12.0}
    sample["disk:/"] = {"disk_used_pct": 40.0}
    sample["ib:mlx5_0/1"] = {"ib_state": 4.0, "ib_phys_state": 5.0, "ib_rate_gbps": 400.0}
    sample.update(changed)
    return sample


def test_a_healthy_h200_node_is_healthy() -> None:
    verdict = evaluate(NodeSnapshot(expected_gpus=8, samples=[node()] * 3, metrics_age_s=1), POLICY)
    assert verdict.state == "healthy"
    assert verdict.reasons == ()


def test_xid79_fails_the_node_naming_the_gpu() -> None:
    event = NodeEvent(ts=1.0, kind="xid", gpu=3, code=79, message="GPU has fallen off the bus")
    verdict = evaluate(NodeSnapshot(expected_gpus=8, samples=[node()], events=[event]), POLICY)
    assert verdict.state == "failed"
    assert verdict.reasons == ("GPU 3: Xid 79 (GPU has fallen off the bus)",)


def test_an_application_xid_only_degrades() -> None:
    event = NodeEvent(ts=1.0, kind="xid", gpu=0, code=13)
    assert evaluate(NodeSnapshot(expected_gpus=8, samples=[node()], events=[event]), POLICY).state == "degraded"


# Where gpufleet's Xid table and NVSentinel's copy of NVIDIA's catalog part ways, on purpose: 109 and 54
# are FATAL there, but a context-switch timeout is nearly always the application's hang and reduced
# clocking from missing auxiliary power is a warning until someone looks; NVSentinel marks 63 codes
# it has no guidance for (UNEXPECTED_ERR_REPORT_ISSUE) FATAL, where an unknown Xid here only warns.
DELIBERATELY_MILDER = {54, 109}


def test_the_fatal_xids_agree_with_nvidias_catalog() -> None:
    with (FIXTURES / "gpu-reference" / "nvsentinel-xid-errors-mapping.csv").open() as fh:
        rows = [row for row in csv.reader(fh) if row and row[0].isdigit()]
    catalog = {int(row[0]): row[3].strip() for row in rows}
    guided = {int(row[0]) for row in rows if row[2].strip() != "UNEXPECTED_ERR_REPORT_ISSUE"}
    assert {code: catalog[code] for code in FATAL_XIDS} == dict.fromkeys(FATAL_XIDS, "FATAL")
    fatal_there = {code for code in guided if catalog[code] == "FATAL"}
    # 78 and 151 (vGPU start, key rotation) concern VMs only; 162 has no name in that copy to check against.
    assert fatal_there - FATAL_XIDS == DELIBERATELY_MILDER | {78, 151, 162}
    for harmless in (13, 31, 43, 45, 63, 92, 94):  # application errors and informational events
        assert catalog[harmless] == "NONFATAL"
        assert harmless not in FATAL_XIDS


def test_a_categorys_xid_actions_override_the_table() -> None:
    event = NodeEvent(ts=1.0, kind="xid", gpu=0, code=13)
    snapshot = NodeSnapshot(expected_gpus=8, samples=[node()], events=[event])
    assert evaluate(snapshot, POLICY).state == "degraded"
    strict = POLICY.model_copy(update={"xid_actions": {13: "drain"}})
    assert evaluate(snapshot, strict).reasons == (
        "GPU 0: Xid 13 (graphics engine exception (usually an application fault))",
    )
    lenient = POLICY.model_copy(update={"xid_actions": {13: "ignore"}})
    assert evaluate(snapshot, lenient).state == "healthy"


def test_what_the_log_line_suggested_counts_unless_the_policy_says_otherwise() -> None:
    nonfatal = NodeEvent(ts=1.0, kind="xid", gpu=2, code=144, suggested="warn")  # "SAW_MVB Nonfatal ..."
    snapshot = NodeSnapshot(expected_gpus=8, samples=[node()], events=[nonfatal])
    assert evaluate(snapshot, POLICY).state == "degraded"  # the table alone would drain for 144
    strict = POLICY.model_copy(update={"xid_actions": {144: "drain"}})
    assert evaluate(snapshot, strict).state == "failed"


def test_xid_actions_are_validated() -> None:
    assert HealthPolicy.model_validate({"xid_actions": {"31": "reset_gpu"}}).xid_actions == {31: "reset_gpu"}
    with pytest.raises(ValidationError):
        HealthPolicy.model_validate({"xid_actions": {"31": "explode"}})


@pytest.mark.parametrize(
    ("change", "state", "reason"),
    [
        ({"gpu:2": gpu(ecc_dbe_volatile=2)}, "failed", "GPU 2: 2 uncorrectable ECC errors"),
        ({"gpu:2": gpu(remapped_rows_failure=1)}, "failed", "GPU 2: row remapping failed"),
        ({"gpu:2": gpu(remapped_rows_pending=1)}, "degraded", "GPU 2: row remap pending, needs a GPU reset"),
        ({"gpu:5": gpu(nvlink_links_up=16)}, "failed", "GPU 5: 2 of 18 NVLinks down"),
        ({"gpu:1": gpu(pcie_link_width=8)}, "degraded", "GPU 1: PCIe link x8 of x16"),
        ({"ib:mlx5_0/1": {"ib_state": 1.0, "ib_phys_state": 2.0}}, "failed", "InfiniBand port mlx5_0/1 is not active"),
        ({"disk:/": {"disk_used_pct": 99.0}}, "failed", "/ is 99 % full"),
        ({"disk:/": {"disk_used_pct": 93.0}}, "degraded", "/ is 93 % full"),
    ],
)
def test_each_fault_gives_its_verdict(change: dict[str, dict[str, float]], state: str, reason: str) -> None:
    verdict = evaluate(NodeSnapshot(expected_gpus=8, samples=[node(**change)]), POLICY)
    assert verdict.state == state
    assert reason in verdict.reasons


def test_a_missing_gpu_fails_the_node() -> None:
    verdict = evaluate(NodeSnapshot(expected_gpus=8, samples=[node(gpus=7)]), POLICY)
    assert verdict.state == "failed"
    assert verdict.reasons == ("7 of 8 GPUs report",)


def test_throttling_counts_only_when_it_persists() -> None:
    hot = node(**{"gpu:4": gpu(gpu_temp_c=92, clocks_event_reasons=CLOCKS_HW_THERMAL)})
    brief = NodeSnapshot(expected_gpus=8, samples=[hot, node(), node()])
    assert evaluate(brief, POLICY).state == "healthy"
    lasting = NodeSnapshot(expected_gpus=8, samples=[hot, hot, hot])
    verdict = evaluate(lasting, POLICY)
    assert verdict.state == "degraded"
    assert verdict.reasons == ("GPU 4: thermal throttling for 3 samples",)
    capped = node(**{"gpu:4": gpu(clocks_event_reasons=CLOCKS_SW_POWER_CAP)})  # a power cap under load is normal
    assert evaluate(NodeSnapshot(expected_gpus=8, samples=[capped] * 3), POLICY).state == "healthy"


def test_stale_metrics_degrade_and_a_disabled_check_is_skipped() -> None:
    stale = NodeSnapshot(expected_gpus=8, samples=[node()], metrics_age_s=16, metrics_interval_s=5)
    assert evaluate(stale, POLICY).reasons == ("no metrics for 16 s",)
    assert evaluate(stale, HealthPolicy(disabled=["metrics"])).state == "healthy"


def test_failed_reasons_come_first() -> None:
    sample = node(**{"gpu:1": gpu(pcie_link_width=8), "gpu:2": gpu(ecc_dbe_volatile=1)})
    verdict = evaluate(NodeSnapshot(expected_gpus=8, samples=[sample]), POLICY)
    assert verdict.reasons == ("GPU 2: 1 uncorrectable ECC errors", "GPU 1: PCIe link x8 of x16")


def test_the_nodes_own_checks_decide_too() -> None:
    from gpufleet.protocol.metrics import CheckResult

    results = [
        CheckResult(name="nhc-ipoib", status=0, message="ok"),
        CheckResult(name="service:slurmd", status=1, message="slurmd is failed"),
        CheckResult(name="scratch-speed", status=2, message="scratch writes at 80 MB/s"),
    ]
    verdict = evaluate(NodeSnapshot(expected_gpus=8, samples=[node()], checks=results), POLICY)
    assert verdict.state == "failed"
    assert verdict.reasons == ("service:slurmd: slurmd is failed", "scratch-speed: scratch writes at 80 MB/s")
    relaxed = HealthPolicy(disabled=["service:slurmd"])
    assert evaluate(NodeSnapshot(expected_gpus=8, samples=[node()], checks=results), relaxed).state == "degraded"


def test_a_host_fault_from_the_kernel_log_fails_the_node_unless_disabled() -> None:
    event = NodeEvent(ts=1.0, kind="host_fault", message="kernel panic: Fatal exception", suggested="drain")
    snapshot = NodeSnapshot(expected_gpus=8, samples=[node()], events=[event])
    verdict = evaluate(snapshot, POLICY)
    assert (verdict.state, verdict.reasons) == ("failed", ("kernel panic: Fatal exception",))
    warned = NodeEvent(ts=1.0, kind="host_fault", message="odd", suggested="warn")
    assert evaluate(NodeSnapshot(expected_gpus=8, samples=[node()], events=[warned]), POLICY).state == "degraded"
    assert evaluate(snapshot, HealthPolicy(disabled=["host"])).state == "healthy"
