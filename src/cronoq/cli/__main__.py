"""`python -m cronoq.cli`: the same as the `cronoq` script."""

from cronoq.cli import main

main()
