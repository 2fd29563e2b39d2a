"""`python3 -m kit`: the command line (kit/cli)."""

from kit.cli import main

main()
