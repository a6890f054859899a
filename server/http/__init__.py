"""The HTTP API (Starlette): routes, SSE, errors, the OpenAI-compatible surface."""

from .app import create_app

__all__ = ["create_app"]
