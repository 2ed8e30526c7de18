"""``python -m quickdraft``: the command line."""

import sys

from quickdraft.cli import main

sys.exit(main())
