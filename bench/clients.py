"""HTTP clients for the model providers: httpx against aiohttp, on the same fake, in the same run.

The instant fake OpenAI model of `bench.runtime` (its own process) answers a streamed chat
completion (`stream: true`, three chunks and `[DONE]`); this process sends it with each client,
reading the answer line by line as a provider does, `BLOCK` calls with one then `BLOCK` with the
other, `ROUNDS` times (the order swapped every other round), on uvloop as `corral serve` runs. The
figure is this process's CPU per call (`time.process_time`: the client's own work; the fake's is
apart). Corral's providers use aiohttp for this reason (`server/providers/transport.py`); everything
else that calls out stays on httpx.
"""

from __future__ import annotations

import sys
import time

import aiohttp
import httpx
import uvloop

from bench.runtime import STREAM_BODY, start_fake

BLOCK = 100
ROUNDS = 10


async def measure(url: str) -> dict[str, float]:
    target = url + "/v1/chat/completions"
    async with httpx.AsyncClient(timeout=30, trust_env=False) as h, aiohttp.ClientSession() as a:

        async def with_httpx() -> None:
            async with h.stream("POST", target, json=STREAM_BODY) as response:
                async for _ in response.aiter_lines():
                    pass

        async def with_aiohttp() -> None:
            async with a.post(target, json=STREAM_BODY) as response:
                async for _ in response.content:
                    pass

        calls = {"httpx": with_httpx, "aiohttp": with_aiohttp}
        for call in calls.values():  # warm-up: connections open, code paths hot
            for _ in range(BLOCK):
                await call()
        spent = dict.fromkeys(calls, 0.0)
        for round_ in range(ROUNDS):
            for name in calls if round_ % 2 == 0 else reversed(calls):
                started = time.process_time()
                for _ in range(BLOCK):
                    await calls[name]()
                spent[name] += time.process_time() - started
    return {name: seconds * 1000 / (BLOCK * ROUNDS) for name, seconds in spent.items()}


def main(argv: list[str] | None = None) -> int:
    fake, url = start_fake()
    try:
        per_call = uvloop.run(measure(url))
    finally:
        fake.stop()
    print(f"\nmodel HTTP clients: client CPU per streamed chat completion, {BLOCK * ROUNDS} calls each, "
          "alternated")
    for name, ms in per_call.items():
        print(f"  {name:10} {ms:7.3f} ms  {ms / per_call['httpx']:.2f}x httpx")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
