"""Logging: readable text by default, one JSON object per line with CORRAL_LOG_FORMAT=json.

Every record carries the id of the HTTP request it happened in (if any): the
same id the client sees in the `X-Request-ID` header and in error envelopes,
so one grep finds a failure's whole story. Secrets never reach a log line:
nothing logs a resolved `${VAR}`.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from contextvars import ContextVar

request_id: ContextVar[str | None] = ContextVar("request_id", default=None)
# The a2a-sdk logs whole request bodies (a conversation's text) at debug and every card it fetches at info.
QUIET_LOGGERS = ("httpx", "httpcore", "httpx2", "httpcore2", "a2a")


class _RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get()
        return True


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        entry = {
            "ts": f"{stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if getattr(record, "request_id", None):
            entry["request_id"] = record.request_id
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure(level: str = "info", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_RequestIdFilter())
    if fmt == "json":
        handler.setFormatter(JSONFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    # HTTP clients log each request's full URL, and a tool's URL may hold a resolved ${VAR}; the A2A SDK,
    # bodies and cards (see QUIET_LOGGERS).
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
