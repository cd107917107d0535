"""``python -m raysleuth`` runs the command line."""

from raysleuth.cli import run

run()
