#!/usr/bin/env python3
"""PreToolUse hook: refuse recursive forced deletes (exit 2, the reason on stderr)."""

import json
import re
import sys

DANGEROUS = re.compile(r"\brm\s+(-\w*[rR]\w*f\w*|-\w*f\w*[rR]\w*|-[rR]\s+-f|-f\s+-[rR])\b")

data = json.load(sys.stdin)
command = data.get("tool_input", {}).get("command", "")
if DANGEROUS.search(command):
    print(f"Blocked: `{command}` deletes recursively; remove files one by one.", file=sys.stderr)
    sys.exit(2)
sys.exit(0)
