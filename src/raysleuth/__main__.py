"""``python -m raysleuth`` runs the command line."""

from raysleuth.entry import run

run()
