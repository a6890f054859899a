"""Print the number of words in argv[1]."""

import sys

print(len(sys.argv[1].split()) if len(sys.argv) > 1 else 0)
