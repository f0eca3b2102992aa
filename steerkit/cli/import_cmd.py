"""``steerkit import``: convert reward models from other formats into steerkit reward-model directories."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from .common import err

import_app = typer.Typer(no_args_is_help=True, help="Import reward models from other formats (the RAD paper's).")


@import_app.command("rad")
def import_rad_command(
    checkpoint: Path = typer.Argument(..., metavar="CHECKPOINT",
                                      help="RAD reward-model state dict (.bin/.pt/.safetensors, or its directory)."),
    backbone: str = typer.Option(..., "--backbone", "-b",
                                 help="Model it was fine-tuned from: packaged name, directory or hub id (gpt2)."),
    out: Path = typer.Option(..., "--out", "-o", help="Reward-model directory to write (new or empty)."),
    name: str = typer.Option("rad", "--name", help="Name of the reward (shown in traces and scores)."),
    attribute: str = typer.Option("", "--attribute", help="What rho measures, e.g. 'probability the text is toxic'."),
    output_index: int = typer.Option(0, "--output-index", min=0,
                                     help="Head output read as rho when the head has several (RAD reads 0)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing steerkit reward model at --out."),
    as_json: bool = typer.Option(False, "--json", help="Print the written reward config as JSON."),
):
    """Convert an official RAD reward model (a GPT-2 state dict with a 1-output lm_head) to a steerkit directory.

    rho is read as clamp(head(h), 0, 1) from the text's own ids (no start token), as in the paper. Use it like
    any reward, e.g.
    steerkit generate "Hello" --reward DIR=-50
    """
    from ..rewards.model import CONFIG_NAME
    from ..rewards.rad_import import import_rad_checkpoint

    directory = import_rad_checkpoint(checkpoint, backbone, out, name=name, attribute=attribute,
                                      output_index=output_index, overwrite=overwrite)
    config = json.loads((directory / CONFIG_NAME).read_text(encoding="utf-8"))
    if as_json:
        typer.echo(json.dumps(config))
        return
    err.print(f"wrote {directory}: reward {config['name']!r}, {config['num_layers']} layers of "
              f"{config['backbone']!r}, output clamp, no start token; use it as --reward {directory}=BETA")


def register(app: typer.Typer) -> None:
    app.add_typer(import_app, name="import")
