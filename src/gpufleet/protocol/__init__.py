"""The wire protocol between node agents and the head node.

Both sides import these pydantic models, so one definition fixes the JSON on the wire,
the validation the head applies and the limits it enforces. Nothing here may import the
server's dependencies: the agent installs without them.
"""
