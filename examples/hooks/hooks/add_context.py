"""UserPromptSubmit hook: add context for the model to every prompt.

It answers with JSON on stdout, exit 0: `hookSpecificOutput.additionalContext`
is added to what the model sees, next to the user's prompt.
"""

import json
import os
import sys
import tempfile
import time

SCRATCH = os.path.join(tempfile.gettempdir(), "corral-hooks-demo")


def main() -> int:
    event = json.load(sys.stdin)
    context = (
        f"Current UTC time: {time.strftime('%Y-%m-%d %H:%M', time.gmtime())}. "
        f"Bash works in the scratch folder {SCRATCH}; deleting files there is not allowed. "
        f"The prompt is {len(event.get('prompt', ''))} characters long."
    )
    print(json.dumps({
        "hookSpecificOutput": {
            "hookEventName": "UserPromptSubmit",
            "additionalContext": context,
        }
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
