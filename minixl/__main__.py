"""`python -m minixl`: the command line (hand-written)."""

from .cli import run

run()
