"""Template mining on real kernel logs, and burst detection against a template's own baseline."""

from __future__ import annotations

from pathlib import Path

from gpufleet.logs.framing import frame
from gpufleet.logs.templates import BurstDetector, TemplateSet

KERNEL_LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "kernel-logs"
XID79 = "NVRM: Xid (PCI:{bus}): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


def messages(name: str) -> list[str]:
    return [frame(line)[2] for line in (KERNEL_LOGS / name).read_text(errors="replace").splitlines()]


def test_the_same_line_from_another_gpu_nic_or_device_is_the_same_template() -> None:
    templates = TemplateSet()
    first = templates.add(XID79.format(bus="0000:19:00"))
    assert first.new
    again = templates.add(XID79.format(bus="0001:2a:00"))
    assert (again.template_id, again.new) == (first.template_id, False)
    assert "<PCI>" in again.template
    cable = "mlx5_core {bus}: Port module event: module {n}, Cable plugged"
    nic = templates.add(cable.format(bus="0000:3b:00.1", n=1))
    assert nic.new
    assert not templates.add(cable.format(bus="0000:86:00.0", n=7)).new
    assert templates.add("nvidia-nvswitch3: open (major=510)").new
    assert not templates.add("nvidia-nvswitch11: open (major=511)").new
    assert len(templates) == 3


def test_real_logs_fold_into_far_fewer_templates_than_lines() -> None:
    templates = TemplateSet()
    lines = messages("Thunderbird_2k.log") + messages("kmsg.1.log") + messages("kmsg-xid13-xid43.log")
    for message in lines:
        templates.add(message)
    assert len(lines) > 2000
    assert len(templates) < len(lines) / 15
    # ... and a line seen before is never new again
    assert not any(templates.add(message).new for message in messages("kmsg.1.log"))


def test_a_snapshot_restores_every_template() -> None:
    templates = TemplateSet()
    for message in messages("kmsg-xid79-sxid20034-nvlink-down.log"):
        templates.add(message)
    restored = TemplateSet(templates.snapshot())
    assert restored.ids() == templates.ids()
    assert not any(restored.add(message).new for message in messages("kmsg-xid79-sxid20034-nvlink-down.log"))
    assert restored.add("a line of a kind never written before by anything").new


def run_windows(detector: BurstDetector, counts: list[dict[int, int]], template: int = 1) -> list[list[bool]]:
    """Feed one window per entry ({node: lines}); return the burst changes each window's close gave."""
    out = []
    for index, by_node in enumerate(counts):
        for node, n in by_node.items():
            for _ in range(n):
                detector.count(template, node)
        out.append([b.firing for b in detector.advance((index + 1) * detector.window_s)])
    return out


def test_a_template_far_above_its_baseline_bursts_and_the_burst_ends() -> None:
    detector = BurstDetector(window_s=60, factor=10, min_count=50, warmup=10)
    detector.advance(0)
    changes = run_windows(detector, [{7: 2}] * 12 + [{7: 3, 9: 300}] + [{7: 2}])
    assert changes[:12] == [[]] * 12
    assert changes[12] == [True]
    assert changes[13] == [False]
    assert detector.rates[1].baseline < 3  # the burst was not folded into the baseline


def test_the_burst_names_the_node_that_wrote_most_of_it() -> None:
    detector = BurstDetector(window_s=60, factor=10, min_count=50, warmup=3)
    detector.advance(0)
    run_windows(detector, [{1: 1}] * 3)
    for node, n in {1: 5, 2: 400, 3: 20}.items():
        for _ in range(n):
            detector.count(1, node)
    (burst,) = detector.advance(4 * 60)
    assert (burst.firing, burst.count, burst.top_node, burst.top_count) == (True, 425, 2, 400)
    (end,) = detector.advance(5 * 60)
    assert (end.firing, end.top_node) == (False, 2)  # the alert to resolve is the one naming node 2


def test_no_burst_before_warmup_or_below_the_minimum_count() -> None:
    detector = BurstDetector(window_s=60, factor=10, min_count=50, warmup=10)
    detector.advance(0)
    assert run_windows(detector, [{1: 500}] + [{1: 1}] * 9) == [[]] * 10  # a new template's first windows
    detector = BurstDetector(window_s=60, factor=10, min_count=50, warmup=2)
    detector.advance(0)
    assert run_windows(detector, [{1: 0}, {1: 1}, {1: 1}, {1: 40}]) == [[]] * 4  # 40x, but under 50 lines


def test_quiet_windows_lower_the_baseline_and_state_survives_a_round_trip() -> None:
    detector = BurstDetector(window_s=60, factor=10, min_count=5, warmup=2)
    detector.advance(0)
    run_windows(detector, [{1: 100}, {1: 100}])
    before = detector.rates[1].baseline
    detector.advance(20 * 60)  # 17 quiet windows
    assert detector.rates[1].baseline < before / 4
    copy = BurstDetector(window_s=60, factor=10, min_count=5, warmup=2)
    copy.loads(detector.dumps())
    assert copy.rates == detector.rates
    assert copy.window == detector.window
