"""A turn's stream ends cleanly only after the turn's end (§8): a server that stops first breaks it off.

One `corral serve` (the embedded store) runs a turn held in its tool at a
gate and is stopped (SIGTERM, with a short shutdown grace): the turn is cut
off and goes on at the next start, so its streams must not look finished.
The OpenAI-compatible stream gets no `data: [DONE]` and no clean end; the
connection breaks (httpx's `RemoteProtocolError`), as a dropped connection
would, so a client tries again. (The REST turn stream across two replicas:
tests/test_replica_faults.py.)
"""

from __future__ import annotations

import signal
from pathlib import Path

import anyio
import httpx
import pytest

from tests.support.processes import wait_until
from tests.support.servers import ServerProcess
from tests.support.trees import gated_definitions, open_gate

pytestmark = pytest.mark.anyio


def waiting_at(gate: Path) -> bool:
    """Whether a gate tool process waits for `gate`."""
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(gate).encode() in (proc / "cmdline").read_bytes():
                return True
        except OSError:
            continue
    return False


async def test_an_openai_stream_cut_off_by_a_stop_is_broken_off(tmp_path: Path) -> None:
    defs, gate = gated_definitions(tmp_path / "defs"), tmp_path / "gate"
    env = {"CORRAL_SHUTDOWN_GRACE_S": "0.5"}
    chunks: list[str] = []
    try:
        with ServerProcess(defs, tmp_path / "state", env=env) as server, anyio.fail_after(60):
            messages = [{"role": "user", "content": f"wait {gate}"}]
            body = {"model": "gated", "stream": True, "messages": messages}
            async with httpx.AsyncClient(base_url=server.url, timeout=30, trust_env=False) as client:
                with pytest.raises(httpx.RemoteProtocolError):
                    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                        assert r.status_code == 200
                        async for line in r.aiter_lines():
                            chunks.append(line)
                            if line.startswith("data: {") and len(chunks) == 1:  # the first chunk
                                await wait_until(lambda: waiting_at(gate), bound=30)  # in its tool
                                server.signal(signal.SIGTERM)
                await anyio.to_thread.run_sync(server.wait, 30)
    finally:
        open_gate(gate)
    assert "data: [DONE]" not in chunks, chunks
