"""PostToolUse hook: append one JSON line per tool call to a log file.

The log lives in the system temp directory (corral-hooks-example.log). The
hook prints nothing and exits 0, so it never changes the conversation.
"""

import json
import os
import sys
import tempfile
import time

LOG = os.path.join(tempfile.gettempdir(), "corral-hooks-example.log")


def main() -> int:
    event = json.load(sys.stdin)
    response = event.get("tool_response")
    if not isinstance(response, str):
        response = json.dumps(response, ensure_ascii=False)
    record = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "session_id": event.get("session_id"),
        "tool_name": event.get("tool_name"),
        "tool_input": event.get("tool_input"),
        "tool_response": response[:500],
        "transcript_path": event.get("transcript_path"),  # the conversation so far, JSONL
        "corral": event.get("corral"),  # {agent, digest, turn_id}; absent under Claude Code
    }
    with open(LOG, "a", encoding="utf-8") as log:
        log.write(json.dumps(record, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
