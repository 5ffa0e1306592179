"""`GET /api/v1/slurm/config`: slurm.conf's node and partition lines and a gres.conf, from the inventory.

The head renders (it has the inventory); the CLI, run on the Slurm controller where the files are, places the
lines in slurm.conf and writes gres.conf (`gpufleet slurm config`). Reading needs `nodes:read`: the text
says no more than `GET /api/v1/nodes` does.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from gpufleet.api.deps import Ctx, allow, tx
from gpufleet.auth.policy import Permission
from gpufleet.auth.schemas import Principal
from gpufleet.inventory import categories
from gpufleet.inventory import service as inventory
from gpufleet.jobs.slurm import config

router = APIRouter(prefix="/slurm", tags=["slurm"])


class SkippedNodeOut(BaseModel):
    name: str
    reason: str


class SlurmConfigOut(BaseModel):
    slurm_conf: str = Field(
        description="the NodeName and PartitionName lines, which go between '# BEGIN gpufleet managed nodes' "
        "and '# END gpufleet managed nodes' in slurm.conf"
    )
    gres_conf: str = Field(description="the whole gres.conf")
    nodes: list[str] = Field(description="the nodes rendered, by name")
    partitions: list[str] = Field(description="the partitions rendered, the default one first")
    skipped: list[SkippedNodeOut] = Field(description="nodes left out, and why")
    warnings: list[str] = Field(description="what an admin should know about the rendered text")


@router.get("/config")
def slurm_config(
    _: Annotated[Principal, allow(Permission.NODES_READ)],
    ctx: Ctx,
    default_partition: Annotated[
        str,
        Query(max_length=63, description="the partition holding every node (Default=YES); categories get their own"),
    ] = config.DEFAULT_PARTITION,
) -> SlurmConfigOut:
    """Render slurm.conf's node and partition lines and gres.conf from every node's last inventory."""
    with tx(ctx, readonly=True) as db:
        found = inventory.list_nodes(db)
        settings = categories.resolve_many(db, found)  # the `partition` setting, where set, names the partition
        nodes = [config.from_node(n, settings[n.name]["partition"].value) for n in found]
    return config_out(config.render(nodes, default_partition=default_partition))


def config_out(rendered: config.SlurmConfig) -> SlurmConfigOut:
    """The rendered configuration as the API answers it."""
    return SlurmConfigOut(
        slurm_conf=rendered.nodes_block,
        gres_conf=rendered.gres_conf,
        nodes=rendered.nodes,
        partitions=rendered.partitions,
        skipped=[SkippedNodeOut(name=s.name, reason=s.reason) for s in rendered.skipped],
        warnings=rendered.warnings,
    )
