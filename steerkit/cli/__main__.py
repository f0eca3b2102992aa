"""``python -m steerkit.cli``: the same as the ``steerkit`` command."""

from .main import main

main()
