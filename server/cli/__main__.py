"""`python -m server.cli`: the `corral` command."""

import sys

from . import main

sys.exit(main())
