#!/usr/bin/env python3
"""A hook that never answers; writes its pid to $HANG_PIDFILE first, if set."""

import os
import sys
import time

pidfile = os.environ.get("HANG_PIDFILE")
if pidfile:
    with open(pidfile + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(pidfile + ".tmp", pidfile)
sys.stdin.read()
while True:
    time.sleep(3600)
