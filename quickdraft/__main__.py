import sys

from quickdraft.cli import main

sys.exit(main())
