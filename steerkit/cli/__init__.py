"""The ``steerkit`` command line (typer), one module per command group.

``generate``, ``score``, ``setup`` (and ``demo``), ``train``, ``plugins``, ``export``, ``evaluate`` (``eval``),
``import_cmd`` (``import``)
each expose ``register(app)``; :mod:`steerkit.cli.app` builds the app from them and adds the commands that
plugins register through the ``register_commands`` hook; :mod:`steerkit.cli.main` is the console script,
which prints every user error as one line and exits 2.
"""

from .app import build_app
from .common import err, parse_reward_weight
from .main import main

#: The app with steerkit's own commands (what ``typer.testing.CliRunner`` tests invoke); the console script
#: :func:`main` builds one that also has the plugins' commands.
app = build_app()

__all__ = ["app", "build_app", "err", "main", "parse_reward_weight"]
