"""What the command modules share: the stderr console, and ``REF=BETA`` reward flags read by the one parser of
rewards input (:func:`steerkit.params.parse_reward_string`).

Light to import (no torch): every command module imports it, and ``steerkit --help`` imports every command module."""

from __future__ import annotations

from rich.console import Console


def parse_reward_weight(text: str) -> tuple[str, float]:
    """The ``--reward REF=BETA`` flags' parser: :func:`steerkit.params.parse_reward_string` (imported when used)."""
    from ..params import parse_reward_string

    return parse_reward_string(text)


class MessageConsole(Console):
    """A Rich console for steerkit's one-line messages (notes, progress summaries, "interrupted: …").

    * Never hard-wrapped (``soft_wrap``): Rich would otherwise break a message at the console width (80 columns
      when stderr is piped, or ``$COLUMNS``), so a log or a caller matching a message would depend on the
      terminal width and on the length of the paths in it. A terminal still folds a long line visually.
    * No markup, emoji codes or highlighting unless a call asks for it (``markup=True``, with
      :func:`rich.markup.escape` on what it interpolates): messages interpolate paths and commands, and Rich
      would take ``[abc]`` in ``/data/[abc]/out`` or ``steerkit[ray]`` for a style tag and drop it.
    """

    def __init__(self, **kwargs):
        kwargs.setdefault("soft_wrap", True)
        kwargs.setdefault("markup", False)
        kwargs.setdefault("emoji", False)
        kwargs.setdefault("highlight", False)
        super().__init__(**kwargs)


def message_console(*, stderr: bool = True) -> MessageConsole:
    """The console for user-facing messages (stderr unless asked): see :class:`MessageConsole`."""
    return MessageConsole(stderr=stderr)


err = message_console()


#: ``--backend`` help, one text for every command (tests/unit/test_cli_backend_help.py checks it names every built-in)
BACKEND_HELP = ("Reward backend: auto (an ONNX export runs on onnx, anything else on torch), torch, onnx, onnx-int8, "
                "torch-bf16, torch-bf16-compute, torch-int8, llama.cpp, llama.cpp-q8, or a plugin's (docs/backends.md).")


ENGINE_HELP = ("What runs the LM: steerkit (transformers) or llama.cpp (a packaged or .gguf LM, on the CPU; "
               "docs/llama_cpp.md). \\[default: steerkit]")
COMPILE_HELP = ("steerkit's engine on the static-shape step compiled by torch.compile: faster per token once compiled "
                "(the first run of a shape compiles for up to a few minutes; cached on disk). \\[default: no-compile]")
EVAL_COMPILE_HELP = ("Generate on steerkit's static-shape step compiled by torch.compile (the same tokens at fp32). "
                     "\\[default: where the run's decode steps pay for compiling on its device]")
DTYPE_HELP = ("The LM's weights in steerkit's engine: float32 (as loaded), bfloat16 (bf16 weights and matmuls; fast on "
              "CPUs with AVX512_BF16 or AMX, and on CUDA) or int8 (weight-only). \\[default: float32]")
