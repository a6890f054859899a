#!/usr/bin/env python3
"""`barrier.py DIR ME OTHER`: touch DIR/ME, then wait (bounded) for DIR/OTHER: only hooks
running at the same time both get through."""

import pathlib
import sys
import time

sys.stdin.read()
where = pathlib.Path(sys.argv[1])
(where / sys.argv[2]).touch()
deadline = time.monotonic() + 10
while not (where / sys.argv[3]).exists():
    if time.monotonic() > deadline:
        sys.exit(1)
    time.sleep(0.01)
