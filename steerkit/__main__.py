"""``python -m steerkit``: the same as the ``steerkit`` command."""

from steerkit.cli import main

main()
