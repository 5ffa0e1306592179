"""`gpufleet doctor`: what is wrong with this head or node, and how to fix it.

`checks` holds the checks, plain functions over what was observed; `probes` observes (the head over
HTTP, the database, NVML, systemd, the disk); `command` wires them into the CLI command. The package
sits outside `gpufleet.cli` because the head's database check needs the server's dependencies, which
the CLI must not import; `gpufleet.entry` registers the command.
"""
