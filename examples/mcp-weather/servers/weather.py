"""A tiny offline MCP server with one tool, `forecast(city)`.

Deterministic: the forecast is derived from a hash of the city name, so the
same city always gets the same weather and no network is needed. Written with
the official MCP Python SDK (`mcp` 2.x, high-level `MCPServer` API).

    python3 servers/weather.py                  # stdio (what Corral launches)
    python3 servers/weather.py --http 8765      # streamable HTTP on 127.0.0.1:8765/mcp
"""

from __future__ import annotations

import hashlib
import string
import sys
from typing import Annotated

from mcp.server.mcpserver import MCPServer
from pydantic import Field

SKIES = ("sunny", "partly cloudy", "overcast", "light rain", "showers", "thunderstorms", "fog")
WINDS = ("calm", "a light breeze", "a moderate wind", "strong gusts")

server = MCPServer("weather", instructions="Offline, deterministic weather forecasts.")


@server.tool(description="Tomorrow's weather forecast for a city (offline and deterministic).")
def forecast(city: Annotated[str, Field(description="The city, e.g. Lisbon.")]) -> str:
    """Tomorrow's forecast for `city`."""
    name = string.capwords(city) or "Nowhere"
    seed = hashlib.sha256(name.lower().encode()).digest()
    sky = SKIES[seed[0] % len(SKIES)]
    high = -5 + seed[1] % 36
    low = high - 3 - seed[2] % 8
    if high <= 1 and sky in ("light rain", "showers"):
        sky = "snow"
    wind = WINDS[seed[3] % len(WINDS)]
    return f"{name}: {sky}, {low}°C to {high}°C, {wind}."


def main(argv: list[str]) -> None:
    if len(argv) == 2 and argv[0] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(argv[1]))
    elif not argv:
        server.run("stdio")
    else:
        sys.exit("usage: weather.py [--http PORT]")


if __name__ == "__main__":
    main(sys.argv[1:])
