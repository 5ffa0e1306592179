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
    InventoryMig,
    InventoryNode,
    Skipped,
    from_node,
    gpu_instance_profile,
    gres_type,
    mig_instances,
    mig_slurm_type,
    real_memory,
    render,
    slurm_mig_device,
)
from gpufleet.protocol.mig import PROFILES, slurm_type


def gpus(count: int, model: str = "NVIDIA H200", start: int = 0) -> tuple[InventoryGpu, ...]:
    return tuple(InventoryGpu(i, model) for i in range(start, start + count))


def mig(profile: str, family: str = "H200") -> InventoryMig:
    """An instance of `profile` as the agent reports it on a GPU of `family`: its slices and NVML's memory size."""
    offered = PROFILES[family][profile]
    return InventoryMig(profile, offered.slices, offered.memory_mib)


def mig_gpus(
    count: int, instances: tuple[InventoryMig, ...], model: str = "NVIDIA H200", start: int = 0
) -> tuple[InventoryGpu, ...]:
    """`count` GPUs in MIG mode, each with `instances`."""
    return tuple(InventoryGpu(i, model, True, instances) for i in range(start, start + count))


ALL_1G_18GB = (mig("1g.18gb"),) * 7  # 16384 MiB each: Slurm's 1g.16gb
H200_3G_4G = (mig("3g.71gb"), mig("4g.71gb"))
H200_1G_1G_2G_3G = (mig("1g.18gb"), mig("1g.18gb"), mig("2g.35gb"), mig("3g.71gb"))
H100 = "NVIDIA H100 80GB HBM3"
H100_ALL_1G = (mig("1g.10gb", "H100-80GB"),) * 7


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


def test_a_gpu_in_mig_mode_without_instances_is_rendered_as_a_whole_gpu_with_a_warning() -> None:
    rendered = render([node("gpu001", gpus=(InventoryGpu(0, "NVIDIA H200", mig_enabled=True),))])
    assert "Gres=gpu:h200:1" in rendered.nodes_block
    assert body(rendered.gres_conf, GRES_CONF_HEADER) == ["NodeName=gpu001 Name=gpu Type=h200 File=/dev/nvidia0"]
    assert rendered.warnings == ["gpu001: MIG is enabled on GPU 0 but it has no MIG instances; rendered as a whole GPU"]


@pytest.mark.parametrize(
    ("profile", "expected"),
    [
        ("1g.18gb", "1g.18gb"),
        ("7g.141gb", "7g.141gb"),
        ("MIG 3g.71gb", "3g.71gb"),  # NVML's profile info name
        ("1c.3g.71gb", "3g.71gb"),  # a compute instance smaller than its GPU instance: Slurm names the GI
        ("1g.18gb+me", "1g.18gb"),  # media extension: Slurm names it by slices and memory alone
        ("1G.5GB", "1g.5gb"),
        ("", None),
        ("unknown", None),
        ("12g.5gb", None),
    ],
)
def test_the_gpu_instance_profile_of_a_mig_profile_name(profile: str, expected: str | None) -> None:
    assert gpu_instance_profile(profile) == expected


@pytest.mark.parametrize(
    ("instance", "expected"),
    [
        # Slurm's name: slices and NVML's memory in GiB, rounded half away from zero; not NVIDIA's profile name
        (InventoryMig("1g.18gb", 1, 16384), "1g.16gb"),  # H200
        (InventoryMig("7g.141gb", 7, 143360), "7g.140gb"),  # H200
        (InventoryMig("3g.40gb", 3, 40192), "3g.39gb"),  # A100 80GB: 39.25 GiB
        (InventoryMig("3g.40gb", 3, 40448), "3g.40gb"),  # H100 80GB: 39.5 GiB, rounded up
        (InventoryMig("1g.10gb", 1, 9728), "1g.10gb"),  # A100 80GB: 9.5 GiB, rounded up
        (InventoryMig("3g.71gb", 3, 65536), "3g.64gb"),  # the instance's own memory, whatever the tables say
        (InventoryMig("", 2, 20096), "2g.20gb"),  # no profile: slices and memory are enough
        # no memory reported: the profile's type where the tables give it one over every model
        (InventoryMig("1g.18gb"), "1g.16gb"),
        (InventoryMig("1c.3g.71gb", 1), "3g.65gb"),  # a compute instance: its GPU instance's type
        (InventoryMig("3g.40gb"), None),  # 3g.39gb on an A100 80GB, 3g.40gb on an H100: unknown
        (InventoryMig("1g.99gb"), None),
        (InventoryMig(""), None),
    ],
)
def test_a_mig_instance_gets_the_type_slurm_gives_it(instance: InventoryMig, expected: str | None) -> None:
    assert mig_slurm_type(instance) == expected


@pytest.mark.parametrize(
    ("model", "kind", "device"),
    [
        ("NVIDIA H200", "1g.16gb", "nvidia_h200_1g.16gb"),
        ("NVIDIA A100-SXM4-80GB", "3g.39gb", "nvidia_a100_3g.39gb"),  # cut at the first '-', as gpu_nvml.c does
        ("NVIDIA H100 80GB HBM3", "1g.10gb", "nvidia_h100_80gb_hbm3_1g.10gb"),
    ],
)
def test_the_name_slurm_gives_a_mig_device(model: str, kind: str, device: str) -> None:
    assert slurm_mig_device(model, kind) == device
    assert kind in device  # what Slurm needs of a configured type: a substring of the device's name


def test_eight_h200_of_seven_1g_18gb_are_56_mig_gpus_of_slurms_type_read_by_autodetect() -> None:
    """slurmd names an H200's 1g.18gb (16384 MiB) nvidia_h200_1g.16gb: slurm.conf must say 1g.16gb."""
    nodes = [node(f"gpu{i:03}", category="mig", gpus=mig_gpus(8, ALL_1G_18GB), expected_gpus=8) for i in (1, 2)]
    rendered = render(nodes)
    assert body(rendered.nodes_block, NODES_BLOCK_HEADER)[0] == (
        "NodeName=gpu[001-002] CPUs=224 RealMemory=2063360 Gres=gpu:1g.16gb:56"
    )
    assert "1g.18gb" not in rendered.nodes_block
    assert body(rendered.gres_conf, GRES_CONF_HEADER) == ["NodeName=gpu[001-002] AutoDetect=nvml"]
    assert rendered.warnings == []


def test_a_node_mixes_whole_gpus_and_mig_gpus() -> None:
    mixed = gpus(4) + mig_gpus(4, ALL_1G_18GB, start=4)
    rendered = render([node("gpu001", gpus=mixed, expected_gpus=8), node("gpu002", gpus=gpus(8), expected_gpus=8)])
    assert body(rendered.nodes_block, NODES_BLOCK_HEADER)[:2] == [
        "NodeName=gpu001 CPUs=224 RealMemory=2063360 Gres=gpu:h200:4,gpu:1g.16gb:28",
        "NodeName=gpu002 CPUs=224 RealMemory=2063360 Gres=gpu:h200:8",
    ]
    # NVML gives Slurm the whole GPUs of a MIG node too; a node without MIG keeps its File= line
    assert body(rendered.gres_conf, GRES_CONF_HEADER) == [
        "NodeName=gpu001 AutoDetect=nvml",
        "NodeName=gpu002 Name=gpu Type=h200 File=/dev/nvidia[0-7]",
    ]
    assert rendered.warnings == []


def test_a_mixed_layout_counts_each_type_smallest_first() -> None:
    layouts = mig_gpus(6, H200_3G_4G) + mig_gpus(2, H200_1G_1G_2G_3G, start=6)
    rendered = render([node("gpu001", gpus=layouts, expected_gpus=8)])
    assert "Gres=gpu:1g.16gb:4,gpu:2g.33gb:2,gpu:3g.65gb:8,gpu:4g.65gb:6\n" in rendered.nodes_block
    assert body(rendered.gres_conf, GRES_CONF_HEADER) == ["NodeName=gpu001 AutoDetect=nvml"]


def test_3g_40gb_is_3g_39gb_on_an_a100_80gb_and_3g_40gb_on_an_h100() -> None:
    a100 = mig_gpus(4, (mig("3g.40gb", "A100-80GB"), mig("4g.40gb", "A100-80GB")), "NVIDIA A100-SXM4-80GB")
    h100 = mig_gpus(4, (mig("3g.40gb", "H100-80GB"), mig("4g.40gb", "H100-80GB")), H100)
    rendered = render([node("a100-01", gpus=a100), node("h100-01", gpus=h100)])
    assert body(rendered.nodes_block, NODES_BLOCK_HEADER)[:2] == [
        "NodeName=a100-01 CPUs=224 RealMemory=2063360 Gres=gpu:3g.39gb:4,gpu:4g.39gb:4",
        "NodeName=h100-01 CPUs=224 RealMemory=2063360 Gres=gpu:3g.40gb:4,gpu:4g.40gb:4",
    ]
    assert rendered.warnings == []


def test_the_mig_instances_are_part_of_a_node_shape() -> None:
    nodes = [
        node("gpu001", gpus=mig_gpus(8, ALL_1G_18GB)),
        node("gpu002", gpus=mig_gpus(8, H200_3G_4G)),
        node("gpu003", gpus=mig_gpus(8, ALL_1G_18GB)),
        # the same profiles on other GPUs of the node: the same text, so the same line
        node("gpu004", gpus=gpus(1) + mig_gpus(1, ALL_1G_18GB, start=1)),
        node("gpu005", gpus=mig_gpus(1, ALL_1G_18GB) + gpus(1, start=1)),
    ]
    rendered = render(nodes)
    assert body(rendered.nodes_block, NODES_BLOCK_HEADER)[:3] == [
        "NodeName=gpu[001,003] CPUs=224 RealMemory=2063360 Gres=gpu:1g.16gb:56",
        "NodeName=gpu002 CPUs=224 RealMemory=2063360 Gres=gpu:3g.65gb:8,gpu:4g.65gb:8",
        "NodeName=gpu[004-005] CPUs=224 RealMemory=2063360 Gres=gpu:h200:1,gpu:1g.16gb:7",
    ]
    assert body(rendered.gres_conf, GRES_CONF_HEADER) == [
        "NodeName=gpu[001,003] AutoDetect=nvml",
        "NodeName=gpu002 AutoDetect=nvml",
        "NodeName=gpu[004-005] AutoDetect=nvml",
    ]


def test_a_mig_instance_without_memory_takes_its_profiles_type_or_is_left_out_and_said() -> None:
    """Without a memory size, 1g.18gb is 1g.16gb on every model that has it; 3g.40gb is 3g.39gb on an A100 80GB
    and 3g.40gb on an H100, so it cannot be told, nor can an unknown profile."""
    no_memory = (InventoryMig("1g.18gb"), InventoryMig("1g.18gb", 1), InventoryMig("3g.40gb"), InventoryMig(""))
    rendered = render([node("gpu001", gpus=mig_gpus(1, (*no_memory, InventoryMig("odd"), mig("1g.18gb"))))])
    assert "Gres=gpu:1g.16gb:3\n" in rendered.nodes_block
    assert rendered.warnings == [
        "gpu001: GPU 0 has 3 MIG instance(s) whose Slurm type is unknown (no memory size reported, and no profile "
        "that tells it); left out of Gres=, so Slurm does not schedule them"
    ]


def test_a_gpu_in_mig_mode_without_instances_beside_mig_gpus_stops_slurmd_and_is_said() -> None:
    empty = (InventoryGpu(1, "NVIDIA H200", mig_enabled=True),)
    rendered = render([node("gpu001", gpus=mig_gpus(1, ALL_1G_18GB) + empty)])
    assert "Gres=gpu:h200:1,gpu:1g.16gb:7\n" in rendered.nodes_block
    assert rendered.warnings == [
        "gpu001: MIG is enabled on GPU 1 but it has no MIG instances; rendered as a whole GPU; slurmd will not "
        "start (its NVML plugin exits on a GPU in MIG mode without instances)"
    ]


def test_a_mig_node_missing_a_gpu_is_rendered_with_it_as_a_whole_gpu() -> None:
    rendered = render([node("gpu001", gpus=mig_gpus(7, ALL_1G_18GB), expected_gpus=8)])
    assert "Gres=gpu:h200:1,gpu:1g.16gb:49\n" in rendered.nodes_block
    assert body(rendered.gres_conf, GRES_CONF_HEADER) == ["NodeName=gpu001 AutoDetect=nvml"]
    assert rendered.warnings == [
        "gpu001: reports 7 of its 8 GPUs; rendered with 8 (the missing ones as whole GPUs: their MIG layout is "
        "unknown), so Slurm keeps it out of service until it is repaired"
    ]


def test_a_whole_gpu_type_that_would_take_the_mig_devices_is_said() -> None:
    """slurmd names an H100 80GB HBM3's 1g.10gb device nvidia_h100_80gb_hbm3_1g.10gb and gives it the longest
    configured type in that name: h100_80gb_hbm3 before 1g.10gb (test_slurm_config_real shows the refusal)."""
    mixed = gpus(1, H100) + mig_gpus(1, H100_ALL_1G, H100, start=1)
    rendered = render([node("gpu001", gpus=mixed), node("gpu002", gpus=mig_gpus(2, H100_ALL_1G, H100))])
    assert "Gres=gpu:h100_80gb_hbm3:1,gpu:1g.10gb:7\n" in rendered.nodes_block
    assert rendered.warnings == [
        "gpu001: slurmd would give its 1g.10gb MIG devices (it names them nvidia_h100_80gb_hbm3_1g.10gb) the "
        "type h100_80gb_hbm3, the longest configured type in that name, and then refuse the node for the whole "
        "GPUs left without a type; put all of its GPUs in MIG mode, or none"
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


def gpu_row(index: int, uuid: str, mig_mode: str, column: list[dict[str, object]] | None = None) -> Gpu:
    row = Gpu(index=index, uuid=uuid, model="NVIDIA H200", pci_bus_id=str(index), memory_total_mib=1, mig_mode=mig_mode)
    if column is not None:
        row.mig = column  # the JSON column the head is getting: protocol.mig.MigInstance as dicts
    return row


def test_from_node_reads_a_node_row() -> None:
    column = [
        {"uuid": f"MIG-{n}", "profile": p, "gpu_instance": n, "compute_instance": 0, "slices": int(p[0])}
        | ({"memory_mib": 65536} if n else {})  # one reported without its memory size
        for n, p in enumerate(["3g.71gb", "4g.71gb"])
    ]
    row = Node(
        name="gpu001",
        category="h200",
        hostname="gpu001.example",
        cpus=224,
        memory_total_mib=2063937,
        inventory_at=datetime(2026, 1, 1, tzinfo=UTC),
        expected_gpus=3,
        gpus=[gpu_row(1, "b", "enabled", column), gpu_row(0, "a", "disabled", []), gpu_row(2, "c", "disabled")],
    )
    assert from_node(row) == InventoryNode(
        name="gpu001",
        reported=True,
        category="h200",
        hostname="gpu001.example",
        cpus=224,
        memory_mib=2063937,
        gpus=(
            InventoryGpu(1, "NVIDIA H200", True, (InventoryMig("3g.71gb", 3), InventoryMig("4g.71gb", 4, 65536))),
            InventoryGpu(0, "NVIDIA H200", False, ()),
            InventoryGpu(2, "NVIDIA H200", False, ()),  # no `mig` at all: a head from before the column
        ),
        expected_gpus=3,
    )
    assert not from_node(Node(name="new", expected_gpus=0)).reported
    # 3g.71gb without memory: the tables' 66560 MiB; 4g.71gb its own 65536 MiB
    assert "Gres=gpu:h200:2,gpu:3g.65gb:1,gpu:4g.64gb:1\n" in render([from_node(row)]).nodes_block


def test_a_mig_column_of_the_wrong_kind_reads_as_unknown() -> None:
    column: list[object] = [{"profile": 7, "slices": "3", "memory_mib": True}, {"profile": "1g.18gb", "slices": -1}]
    assert mig_instances(column) == (InventoryMig(""), InventoryMig("1g.18gb"))
    assert mig_instances(None) == ()


MODELS = ["NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "Tesla T4"]
# MIG instances a GPU of each model may have (none: MIG off).
LAYOUTS: dict[str, list[tuple[InventoryMig, ...]]] = {
    "NVIDIA H200": [(), ALL_1G_18GB, H200_3G_4G, H200_1G_1G_2G_3G],
    H100: [(), H100_ALL_1G, (mig("3g.40gb", "H100-80GB"), mig("4g.40gb", "H100-80GB"))],
    "NVIDIA A100-SXM4-80GB": [
        (),
        (mig("3g.40gb", "A100-80GB"), mig("2g.20gb", "A100-80GB"), mig("2g.20gb", "A100-80GB")),
    ],
    "Tesla T4": [()],
}


@st.composite
def inventories(draw: st.DrawFn) -> list[InventoryNode]:
    names = draw(st.sets(st.integers(1, 60), min_size=1, max_size=25))
    out = []
    for number in sorted(names):
        models = draw(st.lists(st.sampled_from(MODELS), max_size=8))
        layouts = [draw(st.sampled_from(LAYOUTS[m])) for m in models]
        out.append(
            node(
                f"n{number:02}",
                category=draw(st.sampled_from([None, "a", "b"])),
                cpus=draw(st.sampled_from([64, 128])),
                gpus=tuple(
                    InventoryGpu(i, m, bool(p), p) for i, (m, p) in enumerate(zip(models, layouts, strict=True))
                ),
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
        whole: dict[str, int] = {}
        sliced: dict[str, int] = {}
        for gpu in n.gpus:
            if gpu.mig:
                for instance in gpu.mig:
                    kind = slurm_type(instance.slices, instance.memory_mib)
                    sliced[kind] = sliced.get(kind, 0) + 1
            else:
                whole[gres_type(gpu.model)] = whole.get(gres_type(gpu.model), 0) + 1
        gres = [f"gpu:{t}:{c}" for t, c in sorted(whole.items())]
        by_size = sorted(sliced.items(), key=lambda tc: tuple(int(x) for x in tc[0].removesuffix("gb").split("g.")))
        gres += [f"gpu:{t}:{c}" for t, c in by_size]
        assert rest.endswith(f" Gres={','.join(gres)}") if gres else "Gres=" not in rest
    files: dict[str, int] = {}
    autodetect: list[str] = []
    for line in body(rendered.gres_conf, GRES_CONF_HEADER):
        words = dict(w.split("=", 1) for w in line.split())
        if words.get("AutoDetect") == "nvml":
            assert set(words) == {"NodeName", "AutoDetect"}
            autodetect += pyhostlist.expand_hostlist(words["NodeName"])
            continue
        for name in pyhostlist.expand_hostlist(words["NodeName"]):
            files[name] = files.get(name, 0) + len(pyhostlist.expand_hostlist(words["File"]))
    assert sorted(autodetect) == sorted(n.name for n in nodes if any(g.mig for g in n.gpus))
    assert files == {n.name: len(n.gpus) for n in nodes if n.gpus and not any(g.mig for g in n.gpus)}
