"""From samples and events to verdicts, drains, resumes and alerts, on a real database."""

from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.inventory import service as inventory
from gpufleet.inventory.liveness import Change
from gpufleet.inventory.models import Node
from gpufleet.inventory.schemas import NodeSettings
from gpufleet.inventory.states import NodeState
from gpufleet.jobs import service as jobs
from gpufleet.jobs.builtin import BuiltinWorkloadManager
from gpufleet.monitoring import alerts
from gpufleet.monitoring.health import HealthJudge
from gpufleet.monitoring.models import Alert
from gpufleet.monitoring.tracker import HealthTracker
from gpufleet.protocol.metrics import EntityValues, NodeEvent, Sample
from gpufleet.workers.monitoring_loops import MonitoringLoops


class Harness:
    def __init__(self, sessions: sessionmaker[Session], clock: FakeClock) -> None:
        self.sessions = sessions
        self.clock = clock
        self.sent: list[tuple[str, str]] = []
        self.workload = BuiltinWorkloadManager(clock)
        judge = HealthJudge(tracker=HealthTracker(), workload=self.workload, resume_after_rounds=3)
        self.loops = MonitoringLoops(
            sessions=sessions, clock=clock, judge=judge, is_leader=lambda: True, on_alerts=self.record
        )
        with transaction(sessions) as s:
            node = inventory.add_nodes(s, clock, ["n1"], NodeSettings())[0]
            node.expected_gpus = 8
            self.node_id = node.id

    def record(self, fired: list[Alert]) -> None:
        self.sent += [(a.rule, a.status) for a in fired if not a.silenced]

    def sample(self, gpus: int = 8, missing: int | None = None) -> None:
        self.clock.advance(5)
        entities = [EntityValues(entity="host", values={"cpu_util": 5.0})]
        entities += [
            EntityValues(entity=f"gpu:{i}", values={"gpu_util": 0.0, "ecc_dbe_volatile": 0.0})
            for i in range(gpus)
            if i != missing
        ]
        self.loops.ingest(self.node_id, [Sample(ts=self.clock.now(), entities=entities)])
        self.loops.health_once()

    def node(self) -> Node:
        with transaction(self.sessions, readonly=True) as s:
            node = s.get(Node, self.node_id)
            assert node is not None
            return node


def test_xid79_drains_alerts_and_a_healed_node_comes_back_on_its_own(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    h = Harness(sessions, clock)
    h.sample()
    assert (h.node().health, h.node().drain_reason) == ("healthy", None)

    xid = NodeEvent(ts=clock.now() + 1, kind="xid", gpu=3, code=79, message="GPU has fallen off the bus")
    h.loops.events(h.node_id, [xid])
    h.loops.health_once()  # judged on the event itself, not at the next sample
    node = h.node()
    assert node.health == "failed"
    assert node.health_reasons == ["GPU 3: Xid 79 (GPU has fallen off the bus)"]
    assert node.drain_reason == "gpufleet: GPU 3: Xid 79 (GPU has fallen off the bus)"
    assert node.drained_by == "gpufleet"
    assert h.sent == [("NodeFailed", "firing")]

    h.sample(missing=3)  # the GPU is gone from NVML: still failed, and no second page
    assert h.node().health == "failed"
    assert h.sent == [("NodeFailed", "firing")]

    for expected_drained in (True, True, False):  # healed: three healthy samples, then resumed
        h.sample()
        assert (h.node().drained_at is not None) is expected_drained
    assert h.node().health == "healthy"
    assert h.sent == [("NodeFailed", "firing"), ("NodeFailed", "resolved")]


def test_a_host_fault_keeps_the_node_drained_until_its_next_channel(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    """An API mismatch is not mended by healthy GPU samples (the agent started before the upgrade still reads
    NVML): only the reboot or agent restart that fixes it, which opens a new channel, lets the node back."""
    h = Harness(sessions, clock)
    h.sample()
    fault = NodeEvent(ts=clock.now() + 1, kind="host_fault", message="libraries differ", suggested="reboot")
    h.loops.events(h.node_id, [fault])
    for _ in range(5):
        h.sample()
        assert (h.node().health, h.node().drain_reason) == ("failed", "gpufleet: libraries differ")
    h.loops.judge.tracker.forget(h.node_id)  # what the channel's end does (api.routers.agent)
    for _ in range(3):
        h.sample()
    assert (h.node().health, h.node().drained_at) == ("healthy", None)


def test_a_drain_made_by_a_person_is_never_undone(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    h = Harness(sessions, clock)
    with transaction(sessions) as s:
        jobs.drain(s, h.workload, "n1", "swapping a PSU", "user:olivia")
    for _ in range(5):
        h.sample()
    node = h.node()
    assert node.health == "healthy"
    assert (node.drain_reason, node.drained_by) == ("swapping a PSU", "user:olivia")


def test_a_person_taking_over_a_gpufleet_drain_keeps_it(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    h = Harness(sessions, clock)
    h.sample(gpus=7)  # a GPU missing: drained by gpufleet
    assert h.node().drain_reason == "gpufleet: 7 of 8 GPUs report"
    with transaction(sessions) as s:
        jobs.drain(s, h.workload, "n1", "RMA ticket 4711", "user:olivia")
    for _ in range(4):
        h.sample()
    assert h.node().drain_reason == "RMA ticket 4711"


def test_node_down_fires_and_coming_back_resolves(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    h = Harness(sessions, clock)
    h.loops.liveness_changed([Change(h.node_id, "n1", NodeState.DOWN, "no heartbeat for 2.5 s")])
    h.loops.health_once()
    h.loops.liveness_changed([Change(h.node_id, "n1", NodeState.UP, "heartbeat")])
    h.loops.health_once()
    assert h.sent == [("NodeDown", "firing"), ("NodeDown", "resolved")]


def test_a_silence_mutes_notifications_but_not_the_alert(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    h = Harness(sessions, clock)
    with transaction(sessions) as s:
        alerts.add_silence(s, clock, "NodeFailed", "n1", 3600, "user:olivia", "known bad, RMA open")
    h.sample(gpus=7)
    assert h.sent == []
    with transaction(sessions, readonly=True) as s:
        firing = alerts.list_alerts(s, status="firing")
    assert [(a.rule, a.silenced) for a in firing] == [("NodeFailed", True)]
    clock.advance(3600)
    h.loops.liveness_changed([Change(h.node_id, "n1", NodeState.DOWN, "gone")])
    h.loops.health_once()
    assert h.sent == [("NodeDown", "firing")]  # another rule: not silenced


def test_stale_metrics_are_noticed_without_new_data(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    h = Harness(sessions, clock)
    h.sample()
    clock.advance(20)  # the agent hangs: heartbeats go on, samples stop
    h.loops.health_once(full=True)
    node = h.node()
    assert (node.health, node.health_reasons) == ("degraded", ["no metrics for 20 s"])
    assert node.drained_at is None
    assert h.sent == [("NodeDegraded", "firing")]


def test_a_threshold_rule_fires_for_the_gpu_and_resolves(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    h = Harness(sessions, clock)

    def hot_sample(temp: float) -> None:
        clock.advance(30)
        entities = [EntityValues(entity=f"gpu:{i}", values={"gpu_temp_c": temp if i == 5 else 40.0}) for i in range(8)]
        h.loops.ingest(h.node_id, [Sample(ts=clock.now(), entities=entities)])
        h.loops.health_once()

    for _ in range(5):  # 120 s at 87 C: the built-in GpuTemperatureHigh (>= 85 for 120 s) fires
        hot_sample(87)
    with transaction(sessions, readonly=True) as s:
        firing = alerts.list_alerts(s, status="firing")
    assert [(a.rule, a.gpu, a.labels.get("gpu"), a.severity) for a in firing] == [
        ("GpuTemperatureHigh", 5, "5", "warning")
    ]
    assert h.node().drained_at is None  # an alert, not a health failure
    hot_sample(60)
    assert h.sent[-1] == ("GpuTemperatureHigh", "resolved")


def test_a_category_policy_decides_for_its_nodes(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    from gpufleet.monitoring import rules
    from gpufleet.monitoring.checks import HealthPolicy

    h = Harness(sessions, clock)
    with transaction(sessions) as s:
        s.get(Node, h.node_id).category = "dev"  # type: ignore[union-attr]
        rules.set_policy(s, clock, "dev", HealthPolicy(disabled=["gpu_count"]), "user:olivia")
    h.sample(gpus=7)  # a GPU missing, but this category does not count GPUs
    assert (h.node().health, h.node().drained_at) == ("healthy", None)


def test_the_parts_of_a_split_sample_are_judged_together(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    h = Harness(sessions, clock)
    clock.advance(5)
    first = [EntityValues(entity=f"gpu:{i}", values={"gpu_util": 1.0}) for i in range(4)]
    second = [EntityValues(entity=f"gpu:{i}", values={"gpu_util": 1.0}) for i in range(4, 8)]
    h.loops.ingest(h.node_id, [Sample(ts=clock.now(), entities=first)])
    h.loops.ingest(h.node_id, [Sample(ts=clock.now(), entities=second)])  # same time: the second part
    h.loops.health_once()
    assert h.node().health == "healthy"  # all 8 GPUs counted, not 4
