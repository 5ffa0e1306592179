"""Running the head over its life: backups of its state and restores onto a new machine (`backup`,
`restore`), and what an upgrade of gpufleet will do to its database (`gpufleet server --check-upgrade`,
over `migrations.status`). Head-side only: the agent and the CLI never load it.
"""
