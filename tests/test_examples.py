"""The examples run as the README says, from a checkout whose virtualenv is not activated.

`make serve` and `.venv/bin/corral serve examples/...` run Corral's own Python without putting
`.venv/bin` on PATH; an example whose MCP server is `python3 servers/weather.py` must still get
the interpreter that has the `mcp` package.
"""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import httpx
import pytest

from tests.support.client import talk
from tests.support.servers import REPO, ServerProcess

pytestmark = pytest.mark.anyio
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"  # no virtualenv on it: as in a fresh shell


async def test_the_mcp_weather_example_runs_without_an_activated_virtualenv(tmp_path: Path) -> None:
    without_venv = {"PATH": SYSTEM_PATH, "VIRTUAL_ENV": ""}
    with ServerProcess(REPO / "examples" / "mcp-weather", tmp_path / "state", env=without_venv) as server, \
            anyio.fail_after(60):
        async with httpx.AsyncClient(base_url=server.url, timeout=30, trust_env=False) as client:
            _, answer = await talk(client, "forecaster", "weather in Lisbon", bound=45)
    assert answer["status"] == "completed", answer
    assert answer["output"].startswith("Tomorrow's forecast for Lisbon"), answer["output"]
    assert "unavailable" not in answer["output"]


async def test_an_mcp_server_that_cannot_start_is_named_in_the_log(tmp_path: Path) -> None:
    defs = tmp_path / "defs"
    defs.mkdir()
    for name in ("agent.yaml", "model.yaml"):
        (defs / name).write_text((REPO / "examples" / "mcp-weather" / name).read_text())
    (defs / "mcp.yaml").write_text("kind: MCPServer\nname: weather\ntransport: stdio\n"
                                   "command: corral-no-such-mcp-server\ntimeout_s: 5\n")
    with ServerProcess(defs, tmp_path / "state", env={"PATH": os.environ["PATH"]}) as server, \
            anyio.fail_after(60):
        async with httpx.AsyncClient(base_url=server.url, timeout=30, trust_env=False) as client:
            _, answer = await talk(client, "forecaster", "weather in Lisbon", bound=45)
        line = server.wait_for_line(lambda text: "MCP server weather could not be used" in text, 10)
    assert line is not None, server.stderr
    assert "corral-no-such-mcp-server" in line or "No such file" in line or "not found" in line, line
    assert answer["status"] == "completed"
