"""Every bench script's entry point (`run_main(main)`): Ctrl-C is one line and exit 130, as `ithaca generate`
says it, not a traceback of wherever it landed (18 to 47 lines: a poll, a tokenizer, an email parser)."""

from __future__ import annotations

import sys
from pathlib import Path


def run_main(main):
    """`main()`'s result; a KeyboardInterrupt ends the script with one line and exit 130."""
    try:
        return main()
    except KeyboardInterrupt:
        print(f"{Path(sys.argv[0]).name}: interrupted", file=sys.stderr)
        sys.exit(130)
