#!/usr/bin/env python3
"""`say.py TEXT [CODE]`: answers TEXT and exits CODE (default 0); with exit 2, on stderr."""

import sys

sys.stdin.read()
code = int(sys.argv[2]) if len(sys.argv) > 2 else 0
print(sys.argv[1], file=sys.stderr if code == 2 else sys.stdout)
sys.exit(code)
