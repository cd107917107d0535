"""``python -m raysleuth`` runs the command line."""

import sys

from raysleuth.cli import main

sys.exit(main())
