#!/usr/bin/env python3
"""Writes what it received (stdin, cwd, project dir variables) as JSON to the file argv[1]."""

import json
import os
import sys

seen = {
    "stdin": json.load(sys.stdin),
    "cwd": os.getcwd(),
    "CORRAL_PROJECT_DIR": os.environ.get("CORRAL_PROJECT_DIR"),
    "CLAUDE_PROJECT_DIR": os.environ.get("CLAUDE_PROJECT_DIR"),
}
with open(sys.argv[1] + ".tmp", "w") as f:
    json.dump(seen, f)
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
