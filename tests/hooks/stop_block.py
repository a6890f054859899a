#!/usr/bin/env python3
"""Stop hook: the first time, make the agent go on and run the tests; then let it stop.

Remembers that it blocked with a marker file in the folder argv[1] (else $STOP_MARKER_DIR).
"""

import json
import os
import pathlib
import sys

data = json.load(sys.stdin)
folder = sys.argv[1] if len(sys.argv) > 1 else os.environ["STOP_MARKER_DIR"]
marker = pathlib.Path(folder) / f"blocked-{data['session_id']}"
if data.get("stop_hook_active") or marker.exists():
    sys.exit(0)
marker.touch()
print(json.dumps({"decision": "block", "reason": "Run the tests before you finish."}))
