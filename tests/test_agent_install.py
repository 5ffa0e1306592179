"""The agent, the simulator and the CLI must run where the server's dependencies are not installed."""

import subprocess
import sys

SERVER_ONLY = ["fastapi", "starlette", "uvicorn", "sqlalchemy", "alembic", "psycopg", "jinja2", "multipart"]

PROBE = f"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {SERVER_ONLY!r}:
            raise ImportError("server dependency imported on an agent-only install: " + name)
        return None
sys.meta_path.insert(0, Block())
import gpufleet.agent.main, gpufleet.sim.runner, gpufleet.cli.app
sys.argv = ["gpufleet", "agent", "--help"]
from gpufleet.entry import main
main()
"""


def test_agent_imports_no_server_dependency() -> None:
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert "--join-token" in result.stdout


def test_the_blocker_would_notice() -> None:
    probe = PROBE.replace("import gpufleet.agent.main", "import gpufleet.api.app, gpufleet.agent.main")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode != 0
    assert "server dependency imported" in result.stderr
