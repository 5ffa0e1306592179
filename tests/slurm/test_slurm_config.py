"""slurm.conf's node and partition lines and gres.conf rendered from inventory data (no Slurm needed here;
test_slurm_config_real.py has Slurm read what is rendered)."""

from __future__ import annotations

from datetime import UTC, datetime

import hostlist as pyhostlist
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.core.errors import InvalidInput
from gpufleet.inventory.models import Gpu, Node
from gpufleet.jobs.slurm.config import (
    GRES_CONF_HEADER,
    NODES_BLOCK_HEADER,
    InventoryGpu,
    InventoryNode,
    Skipped,
    from_node,
    gres_type,
    real_memory,
    render,
)


def gpus(count: int, model: str = "NVIDIA H200", start: int = 0) -> tuple[InventoryGpu, ...]:
    return tuple(InventoryGpu(i, model) for i in range(start, start + count))


def node(name: str, **kwargs: object) -> InventoryNode:
    values: dict[str, object] = {"reported": True, "cpus": 224, "memory_mib": 2063937, "hostname": name}
    values.update(kwargs)
    return InventoryNode(name=name, **values)  # type: ignore[arg-type]


def body(text: str, header: str) -> list[str]:
    assert text.startswith(header)
    return text[len(header) :].splitlines()


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("NVIDIA H200", "h200"),
        ("NVIDIA H100 80GB HBM3", "h100_80gb_hbm3"),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),
        ("Tesla V100-SXM2-16GB", "v100-sxm2-16gb"),
        ("Tesla T4", "t4"),
        ("NVIDIA GeForce RTX 4090", "rtx_4090"),
        ("Quadro RTX 8000", "rtx_8000"),
        ("NVIDIA RTX A6000", "rtx_a6000"),
        ("NVIDIA", "nvidia"),  # nothing but the vendor: keep it rather than an empty type
        ("GeForce 4090", "gpu4090"),  # digits alone would read as a count in gpu:<type>:<count>
        ("Odd: name, with=chars  (x)", "odd_name_with_chars_x"),
        ("  ", "unknown"),
        ("---", "unknown"),
    ],
)
def test_gpu_models_become_gres_types(model: str, expected: str) -> None:
    assert gres_type(model) == expected


@given(st.text(max_size=200))
def test_every_gres_type_is_one_slurm_word(model: str) -> None:
    kind = gres_type(model)
    assert 0 < len(kind) <= 64
    assert all(c.isascii() and (c.isalnum() or c in "_-") for c in kind)
    assert not kind.isdigit()
    assert kind == kind.lower()


def test_nodes_of_one_shape_share_a_line_and_categories_get_partitions() -> None:
    nodes = [node(f"gpu{i:03}", category="h200", gpus=gpus(8), expected_gpus=8) for i in range(1, 17)]
    nodes += [node(f"cpu{i:02}", cpus=64, memory_mib=515000) for i in (1, 2)]
    nodes += [node("a100-01", category="a100", cpus=128, memory_mib=1031000, gpus=gpus(4, "NVIDIA A100-SXM4-80GB"))]
    rendered = render(nodes)
    assert body(rendered.nodes_block, NODES_BLOCK_HEADER) == [
        "NodeName=a100-01 CPUs=128 RealMemory=1030144 Gres=gpu:a100-sxm4-80gb:4",
        "NodeName=cpu[01-02] CPUs=64 RealMemory=514048",
        "NodeName=gpu[001-016] CPUs=224 RealMemory=2063360 Gres=gpu:h200:8",
        "PartitionName=all Nodes=a100-01,cpu[01-02],gpu[001-016] Default=YES State=UP",
        "PartitionName=a100 Nodes=a100-01 State=UP",
        "PartitionName=h200 Nodes=gpu[001-016] State=UP",
    ]
    assert body(rendered.gres_conf, GRES_CONF_HEADER) == [
        "NodeName=a100-01 Name=gpu Type=a100-sxm4-80gb File=/dev/nvidia[0-3]",
        "NodeName=gpu[001-016] Name=gpu Type=h200 File=/dev/nvidia[0-7]",
    ]
    assert rendered.partitions == ["all", "a100", "h200"]
    assert len(rendered.nodes) == 19
    assert rendered.skipped == []
    assert rendered.warnings == []


def test_a_node_that_differs_breaks_the_range() -> None:
    nodes = [node(f"gpu{i:03}", gpus=gpus(8)) for i in range(1, 6)]
    nodes[2] = node("gpu003", gpus=gpus(8), memory_mib=1031000)
    lines = body(render(nodes).nodes_block, NODES_BLOCK_HEADER)
    assert lines[:2] == [
        "NodeName=gpu[001-002,004-005] CPUs=224 RealMemory=2063360 Gres=gpu:h200:8",
        "NodeName=gpu003 CPUs=224 RealMemory=1030144 Gres=gpu:h200:8",
    ]


@pytest.mark.parametrize(("mem_total", "real"), [(2063937, 2063360), (2063360, 2063360), (2047, 1024), (1000, 1000)])
def test_real_memory_is_memtotal_rounded_down_to_a_gib(mem_total: int, real: int) -> None:
    assert real_memory(mem_total) == real


def test_nodes_whose_memtotal_differs_by_a_few_mib_share_a_line() -> None:
    nodes = [node("gpu001", memory_mib=2063937), node("gpu002", memory_mib=2063921)]
    assert body(render(nodes).nodes_block, NODES_BLOCK_HEADER)[0] == "NodeName=gpu[001-002] CPUs=224 RealMemory=2063360"


def test_a_node_with_two_models_gets_one_gres_line_per_type() -> None:
    mixed = (InventoryGpu(0, "NVIDIA A100-SXM4-80GB"), InventoryGpu(1, "Tesla T4"), InventoryGpu(3, "Tesla T4"))
    rendered = render([node("mix", gpus=mixed, expected_gpus=3)])
    assert "NodeName=mix CPUs=224 RealMemory=2063360 Gres=gpu:a100-sxm4-80gb:1,gpu:t4:2" in rendered.nodes_block
    assert body(rendered.gres_conf, GRES_CONF_HEADER) == [
        "NodeName=mix Name=gpu Type=a100-sxm4-80gb File=/dev/nvidia0",
        "NodeName=mix Name=gpu Type=t4 File=/dev/nvidia[1,3]",
    ]


def test_the_host_name_is_written_only_where_it_differs_from_the_node_name() -> None:
    nodes = [
        node("gpu001", hostname="gpu001.cluster.example"),  # the short name is the node's name
        node("gpu002", hostname="gpu002"),
        node("sim001", hostname="vm.example"),
        node("n1.example", hostname="n1.example"),
        node("gpu003", hostname=None),
    ]
    lines = body(render(nodes).nodes_block, NODES_BLOCK_HEADER)
    assert lines[0] == "NodeName=gpu[001-003],n1.example CPUs=224 RealMemory=2063360"
    assert lines[1] == "NodeName=sim001 NodeHostname=vm CPUs=224 RealMemory=2063360"


def test_nodes_that_never_reported_are_skipped_not_rendered_empty() -> None:
    rendered = render([node("gpu001", gpus=gpus(8)), InventoryNode("gpu002", reported=False, category="h200")])
    assert rendered.skipped == [Skipped("gpu002", "no inventory reported yet (the agent has not joined)")]
    assert "gpu002" not in rendered.nodes_block + rendered.gres_conf
    assert "PartitionName=h200" not in rendered.nodes_block  # its only node was skipped
    assert rendered.nodes == ["gpu001"]


def test_no_nodes_renders_the_headers_alone() -> None:
    rendered = render([InventoryNode("new", reported=False)])
    assert rendered.nodes_block == NODES_BLOCK_HEADER
    assert rendered.gres_conf == GRES_CONF_HEADER
    assert rendered.partitions == []


def test_unknown_cpus_and_memory_are_left_to_slurm_and_said() -> None:
    rendered = render([node("gpu001", cpus=0, memory_mib=None)])
    assert "NodeName=gpu001\n" in rendered.nodes_block
    assert rendered.warnings == [
        "gpu001: no CPU count in the inventory; CPUs= left to Slurm (default 1)",
        "gpu001: no memory size in the inventory; RealMemory= left to Slurm (default 1 MiB)",
    ]


def test_a_node_missing_a_gpu_is_rendered_with_what_it_should_have() -> None:
    rendered = render([node("gpu001", gpus=gpus(7), expected_gpus=8), node("gpu002", gpus=gpus(8), expected_gpus=8)])
    assert "NodeName=gpu[001-002] CPUs=224 RealMemory=2063360 Gres=gpu:h200:8" in rendered.nodes_block
    assert "NodeName=gpu[001-002] Name=gpu Type=h200 File=/dev/nvidia[0-7]" in rendered.gres_conf
    assert rendered.warnings == [
        "gpu001: reports 7 of its 8 GPUs; rendered with 8, so Slurm keeps it out of service until it is repaired"
    ]


def test_a_missing_gpu_of_unknown_model_is_not_invented() -> None:
    mixed = (InventoryGpu(0, "NVIDIA H200"), InventoryGpu(1, "Tesla T4"))
    rendered = render([node("mix", gpus=mixed, expected_gpus=3)])
    assert "Gres=gpu:h200:1,gpu:t4:1" in rendered.nodes_block
    assert "the model of the missing ones is unknown" in rendered.warnings[0]


def test_mig_is_rendered_as_whole_gpus_with_a_warning() -> None:
    rendered = render([node("gpu001", gpus=(InventoryGpu(0, "NVIDIA H200", mig_enabled=True),))])
    assert "Gres=gpu:h200:1" in rendered.nodes_block
    assert rendered.warnings == [
        "gpu001: MIG is enabled on GPU 0; rendered as a whole GPU (MIG slices need Slurm's AutoDetect=nvml)"
    ]


def test_the_default_partition_can_be_renamed() -> None:
    rendered = render([node("gpu001", category="h200")], default_partition="batch")
    assert "PartitionName=batch Nodes=gpu001 Default=YES State=UP" in rendered.nodes_block


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("DEFAULT", "cannot be called DEFAULT"),
        ("default", "cannot be called DEFAULT"),
        ("two words", "invalid partition name"),
        ("", "invalid partition name"),
        ("a,b", "invalid partition name"),
        ("h200", "has the default partition's name"),
    ],
)
def test_a_bad_default_partition_is_refused(name: str, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        render([node("gpu001", category="h200")], default_partition=name)


def test_a_category_slurm_would_read_as_defaults_gets_no_partition() -> None:
    rendered = render([node("gpu001", category="Default")])
    assert "PartitionName=Default" not in rendered.nodes_block
    assert rendered.partitions == ["all"]
    assert rendered.warnings == [
        "category 'Default' cannot name a Slurm partition; its nodes are only in the default one"
    ]


def test_the_device_files_can_be_elsewhere() -> None:
    rendered = render([node("gpu001", gpus=gpus(2))], device_prefix="/tmp/dev/fakegpu")
    assert "File=/tmp/dev/fakegpu[0-1]" in rendered.gres_conf


def test_the_same_inventory_renders_the_same_text_whatever_its_order() -> None:
    nodes = [node(f"gpu{i:03}", category="c" + str(i % 3), gpus=gpus(i % 4)) for i in range(1, 30)]
    assert render(nodes) == render(list(reversed(nodes)))


def test_from_node_reads_a_node_row() -> None:
    row = Node(
        name="gpu001",
        category="h200",
        hostname="gpu001.example",
        cpus=224,
        memory_total_mib=2063937,
        inventory_at=datetime(2026, 1, 1, tzinfo=UTC),
        expected_gpus=2,
        gpus=[
            Gpu(index=1, uuid="b", model="NVIDIA H200", pci_bus_id="1", memory_total_mib=1, mig_mode="enabled"),
            Gpu(index=0, uuid="a", model="NVIDIA H200", pci_bus_id="0", memory_total_mib=1, mig_mode="disabled"),
        ],
    )
    assert from_node(row) == InventoryNode(
        name="gpu001",
        reported=True,
        category="h200",
        hostname="gpu001.example",
        cpus=224,
        memory_mib=2063937,
        gpus=(InventoryGpu(1, "NVIDIA H200", True), InventoryGpu(0, "NVIDIA H200", False)),
        expected_gpus=2,
    )
    assert not from_node(Node(name="new", expected_gpus=0)).reported


MODELS = ["NVIDIA H200", "NVIDIA H100 80GB HBM3", "Tesla T4"]


@st.composite
def inventories(draw: st.DrawFn) -> list[InventoryNode]:
    names = draw(st.sets(st.integers(1, 60), min_size=1, max_size=25))
    out = []
    for number in sorted(names):
        models = draw(st.lists(st.sampled_from(MODELS), max_size=8))
        out.append(
            node(
                f"n{number:02}",
                category=draw(st.sampled_from([None, "a", "b"])),
                cpus=draw(st.sampled_from([64, 128])),
                gpus=tuple(InventoryGpu(i, m) for i, m in enumerate(models)),
                expected_gpus=len(models),
            )
        )
    return out


@settings(max_examples=60, deadline=None)
@given(inventories())
def test_every_node_is_on_exactly_one_line_with_its_own_gpus(nodes: list[InventoryNode]) -> None:
    rendered = render(nodes)
    named: dict[str, list[str]] = {}
    for line in body(rendered.nodes_block, NODES_BLOCK_HEADER):
        first, _, rest = line.partition(" ")
        key, _, value = first.partition("=")
        if key == "NodeName":
            for name in pyhostlist.expand_hostlist(value):
                named.setdefault(name, []).append(rest)
    assert sorted(named) == sorted(n.name for n in nodes)
    for n in nodes:
        (rest,) = named[n.name]
        counts: dict[str, int] = {}
        for gpu in n.gpus:
            counts[gres_type(gpu.model)] = counts.get(gres_type(gpu.model), 0) + 1
        gres = ",".join(f"gpu:{t}:{c}" for t, c in sorted(counts.items()))
        assert rest.endswith(f" Gres={gres}") if gres else "Gres=" not in rest
    files: dict[str, int] = {}
    for line in body(rendered.gres_conf, GRES_CONF_HEADER):
        words = dict(w.split("=", 1) for w in line.split())
        for name in pyhostlist.expand_hostlist(words["NodeName"]):
            files[name] = files.get(name, 0) + len(pyhostlist.expand_hostlist(words["File"]))
    assert files == {n.name: len(n.gpus) for n in nodes if n.gpus}
