#!/usr/bin/env python3
"""`record_transcript.py LOG`: appends to LOG one JSON line with the hook input and the messages the
file at `transcript_path` held while the hook ran (read as a Claude Code hook reads it: JSONL, one
entry a line). Exits 0 with no output, so it never changes the call.
"""

import json
import os
import sys

input_data = json.load(sys.stdin)
transcript = []
path = input_data.get("transcript_path")
if path and os.path.exists(path):
    with open(os.path.expanduser(path), encoding="utf-8") as f:
        transcript = [json.loads(line) for line in f if line.strip()]
with open(sys.argv[1], "a", encoding="utf-8") as log:
    log.write(json.dumps({"input": input_data, "transcript": transcript}) + "\n")
sys.exit(0)
