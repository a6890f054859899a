#!/usr/bin/env python3
"""A hook with a bug: it raises, so Python exits 1 with a traceback."""

import json
import sys

data = json.load(sys.stdin)
raise RuntimeError(f"cannot handle {data['hook_event_name']}")
