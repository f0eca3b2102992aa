"""The console script ``steerkit``: runs the app and turns every failure into one line and an exit code.

Exit codes: 0 success, 2 a usage or input error (a :class:`~steerkit.errors.SteerkitError`, a bad option),
1 an internal error (a steerkit bug: ``STEERKIT_DEBUG=1`` shows the traceback), 130 interrupted.
"""

from __future__ import annotations

import errno
import os
import sys
import warnings

import typer
from rich.markup import escape

from ..errors import InvalidArgumentError, SteerkitError, SteerkitWarning
from .app import build_app


def main(argv: list[str] | None = None) -> None:
    """The console script: user mistakes print one ``error:`` line on stderr and exit 2, never a traceback.

    Exit codes: 0 success, 1 an internal error (a steerkit bug: set STEERKIT_DEBUG=1 for the traceback),
    2 a usage or input error, 130 interrupted.
    """
    args = sys.argv[1:] if argv is None else list(argv)
    warnings.formatwarning = _format_warning
    try:
        _check_utf8(args)
        command = typer.main.get_command(build_app(plugins=True))
        _prepare_help(command)
        code = command.main(args=args, prog_name="steerkit", standalone_mode=False)
    except SteerkitError as exc:
        _fail(str(exc))
    except KeyboardInterrupt:
        _fail("interrupted", code=130)
    except Exception as exc:  # noqa: BLE001
        if type(exc).__module__.split(".")[0] in {"click", "typer"}:
            _cli_exception(exc)
        if isinstance(exc, OSError):
            if exc.errno == errno.EPIPE:  # `steerkit ... | head`
                raise SystemExit(0) from None
            if os.environ.get("STEERKIT_DEBUG") != "1":
                target = f": {exc.filename}" if exc.filename else ""
                _fail(f"{exc.strerror or exc}{target}")
        if os.environ.get("STEERKIT_DEBUG") == "1":
            raise
        # a bug, not a user mistake: say so in one line
        _fail(f"internal error ({type(exc).__name__}: {_one_line(str(exc))}). This is a steerkit bug; "
              "STEERKIT_DEBUG=1 shows the traceback for a report.", code=1)
    raise SystemExit(code if isinstance(code, int) else 0)


def _cli_exception(exc: Exception):
    """typer/click usage errors (bad option values, unknown options, missing arguments) as one line, exit 2.

    typer >= 0.22 vendors click, so its exceptions are matched by name, not by class.
    """
    name = type(exc).__name__
    ctx = getattr(exc, "ctx", None)
    if name == "NoArgsIsHelpError":  # `steerkit`, `steerkit export`: typer printed the help; exit 2 as click does
        raise SystemExit(2) from None
    if name == "Abort":
        _fail("interrupted", code=130)
    if name == "Exit":
        raise SystemExit(getattr(exc, "exit_code", 0)) from None
    where = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
    message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
    _fail(message + where, code=getattr(exc, "exit_code", 2) or 2)


_default_formatwarning = warnings.formatwarning


def _format_warning(message, category, filename, lineno, line=None) -> str:
    """steerkit's own warnings as one ``warning:`` line; anything else in Python's usual format."""
    if issubclass(category, SteerkitWarning):
        return f"warning: {_one_line(str(message))}\n"
    return _default_formatwarning(message, category, filename, lineno, line)


def _one_line(text: str, limit: int = 2000) -> str:
    text = " | ".join(part.strip() for part in str(text).strip().splitlines() if part.strip())
    return text if len(text) <= limit else text[:limit] + "…"


def _fail(message: str, code: int = 2):
    sys.stderr.write(f"error: {_one_line(message)}\n")
    sys.stderr.flush()
    raise SystemExit(code) from None


def _check_utf8(args: list[str]) -> None:
    """Arguments that are not UTF-8 reach Python as lone surrogates; refuse them before they reach a tokenizer."""
    for i, arg in enumerate(args):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidArgumentError(
                f"command-line argument {i + 1} is not valid UTF-8 (position {exc.start}: {arg[:40]!r}); "
                "pass UTF-8 text (check the terminal's locale or the file the argument came from).") from None


def _prepare_help(command) -> None:
    """Every command's --help (plugins' commands included), as a user should read it:

    * boolean flags show as ``--greedy``, not ``--greedy <bool>``;
    * help texts are plain text: ``Needs pip install "steerkit-rad[ray]"`` printed as ``Needs pip install
      "steerkit-rad"`` because Rich read ``[ray]`` as a style tag and dropped it, so they are escaped; a ``\\[``
      written by hand to get past Rich is unescaped first, so it is not escaped twice.
    """
    for attr in ("help", "short_help", "epilog"):
        text = getattr(command, attr, None)
        if isinstance(text, str):
            setattr(command, attr, escape(text.replace("\\[", "[")))
    for param in command.params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
        if isinstance(getattr(param, "help", None), str):
            param.help = escape(param.help.replace("\\[", "["))
    for sub in getattr(command, "commands", {}).values():
        _prepare_help(sub)
