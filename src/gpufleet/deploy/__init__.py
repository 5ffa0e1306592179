"""Putting gpufleet on machines: the systemd units of the head and the agent (`units`), and the small
program that starts, stops and watches an agent where systemd does not run (`agent_ctl`).

Stdlib, `core` and the node-name rule of `protocol.messages` only: the CLI renders units
(`gpufleet server|agent install-unit`) and the head renders the same units for an agent rollout
(`provisioning.agent_deploy`); see docs/deploy-agents.md.
"""
