#!/usr/bin/env python3
"""A hook that never answers; writes its pid to the file argv[1] first, if given."""

import os
import sys
import time

pidfile = sys.argv[1] if len(sys.argv) > 1 else None
if pidfile:
    with open(pidfile + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(pidfile + ".tmp", pidfile)
sys.stdin.read()
while True:
    time.sleep(3600)
