"""Corral's `/mcp` against the official MCP conformance suite.

The suite is the npm package `@modelcontextprotocol/conformance` (0.1.13,
Node 20+), installed into `.conformance/` by `make conformance` (`make test`
does it wherever npm exists). Without Node or the install, these tests skip
and say why.

Every server scenario of the suite is either run (the generic ones the
contract names) or excluded below with the reason. The run scenarios go all
at once, each its own `conformance server --scenario` process, against one
Corral on loopback serving the repository's definitions.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.servers import REPO, REPO_DEFINITIONS, corral_server

VERSION = "0.1.13"
PACKAGE = REPO / ".conformance" / "node_modules" / "@modelcontextprotocol" / "conformance"
TIMEOUT_S = 90

SCENARIOS = [
    "server-initialize",
    "ping",
    "tools-list",
    "resources-list",
    "prompts-list",
    "server-sse-multiple-streams",
    "dns-rebinding-protection",
    "logging-set-level",
    "completion-complete",
]

# Each of these drives a fixture of the suite's reference "everything" server
# (tools `test_*`, resources `test://…`, prompts `test_*`): Corral's tools are
# its agents, its resources its definitions and its prompts its skills, so
# there is nothing for them to find. What they would check about Corral's own
# tools, resources and prompts is covered by tests/test_mcp_server.py.
FIXTURE = "calls a fixture of the suite's reference server that Corral does not have"
EXCLUDED = {
    "tools-call-simple-text": FIXTURE,
    "tools-call-image": FIXTURE + " (agents answer text)",
    "tools-call-audio": FIXTURE + " (agents answer text)",
    "tools-call-embedded-resource": FIXTURE,
    "tools-call-mixed-content": FIXTURE,
    "tools-call-with-logging": FIXTURE,
    "tools-call-error": FIXTURE,
    "tools-call-with-progress": FIXTURE + " (Corral's progress: test_mcp_server.py)",
    "json-schema-2020-12": FIXTURE,
    "resources-read-text": FIXTURE,
    "resources-read-binary": FIXTURE + " (definitions are text)",
    "resources-templates-read": FIXTURE,
    "prompts-get-simple": FIXTURE,
    "prompts-get-with-args": FIXTURE,
    "prompts-get-embedded-resource": FIXTURE,
    "prompts-get-with-image": FIXTURE,
    # Server-to-client requests: the contract asks for none (and the 2026-07-28 era forbids them).
    "tools-call-sampling": "needs sampling from the server, which the contract does not ask for",
    "tools-call-elicitation": "needs elicitation from the server, which the contract does not ask for",
    "elicitation-sep1034-defaults": "needs elicitation from the server, which the contract does not ask for",
    "elicitation-sep1330-enums": "needs elicitation from the server, which the contract does not ask for",
    # Optional capabilities the contract does not ask for.
    "resources-subscribe": "resources/subscribe is optional and not offered (list_changed is)",
    "resources-unsubscribe": "resources/subscribe is optional and not offered (list_changed is)",
    "server-sse-polling": FIXTURE + " (test_reconnection) and needs SSE resumability (an event store), "
                          "which the contract does not ask for",
}


def _suite() -> list[str]:
    """The command that runs the suite, or a skip saying what is missing."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not on PATH: the MCP conformance suite needs Node 20+")
    major = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout
    if int(major.strip().lstrip("v").split(".")[0] or 0) < 20:
        pytest.skip(f"node {major.strip()} is too old: the MCP conformance suite needs Node 20+")
    manifest = PACKAGE / "package.json"
    if not manifest.is_file():
        pytest.skip("the MCP conformance suite is not installed: run `make conformance` (needs npm)")
    installed = json.loads(manifest.read_text("utf-8"))["version"]
    if installed != VERSION:
        pytest.skip(f"conformance {installed} is installed, these tests expect {VERSION}: "
                    "rm -rf .conformance && make conformance")
    return [node, str(PACKAGE / "dist" / "index.js")]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, Any]]]:
    """Run SCENARIOS all at once: scenario -> {"exit": code, "checks": [...], "output": text}."""
    suite = _suite()
    tmp = tmp_path_factory.mktemp("conformance")
    with corral_server(REPO_DEFINITIONS, tmp / "state") as base_url:
        running = {
            name: subprocess.Popen(
                [*suite, "server", "--url", f"{base_url}/mcp", "--scenario", name, "-o", str(tmp / name)],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp)
            for name in SCENARIOS
        }
        found: dict[str, dict[str, Any]] = {}
        try:
            for name, process in running.items():
                output, _ = process.communicate(timeout=TIMEOUT_S)
                checks = [c for f in (tmp / name).glob("*/checks.json")
                          for c in json.loads(f.read_text("utf-8"))]
                found[name] = {"exit": process.returncode, "checks": checks, "output": output}
        finally:
            for process in running.values():
                if process.poll() is None:
                    process.kill()
                    process.wait()
    yield found


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario_passes(results: dict[str, dict[str, Any]], scenario: str) -> None:
    result = results[scenario]
    failed = [c for c in result["checks"] if c["status"] == "FAILURE"]
    assert result["checks"], f"{scenario} recorded no checks:\n{result['output']}"
    assert not failed, json.dumps(failed, indent=2)
    assert result["exit"] == 0, result["output"]


def test_every_server_scenario_is_run_or_excluded() -> None:
    """A new suite version's scenarios must be looked at, not silently ignored."""
    listing = subprocess.run([*_suite(), "list", "--server"], capture_output=True, text=True,
                             timeout=TIMEOUT_S, env=os.environ | {"NO_COLOR": "1"}, check=True).stdout
    listed = {line.strip()[2:] for line in listing.splitlines() if line.strip().startswith("- ")}
    assert listed, listing
    assert not set(SCENARIOS) & set(EXCLUDED)
    assert listed == set(SCENARIOS) | set(EXCLUDED)
