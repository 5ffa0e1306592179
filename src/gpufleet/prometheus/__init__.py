"""Prometheus and Grafana compatibility: names, exposition, scrape and rule files, a dashboard.

gpufleet's metrics go out under dcgm-exporter's names and labels (GPUs) and `gpufleet_*` names
(everything else), so existing DCGM dashboards and rules work unchanged. The head's `/metrics`, the
agent's optional local `/metrics` and `gpufleet export` all use this package, so it imports nothing
server-side. Only `exposition` needs prometheus-client (installed with the agent and server extras);
the generators the CLI uses are plain Python.
"""
