"""``steerkit export``: export reward models for other runtimes."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from .common import err

export_app = typer.Typer(no_args_is_help=True, help="Export reward models for other runtimes (ONNX).")


@export_app.command("onnx")
def export_onnx_command(
    reward: str = typer.Argument(..., metavar="REWARD_REF", help="Reward-model directory or registered reward name."),
    out: Path = typer.Option(..., "--out", "-o", help="Output directory (created; must be empty unless --force)."),
    opset: int = typer.Option(17, "--opset", help="ONNX opset."),
    force: bool = typer.Option(False, "--force", help="Replace a non-empty --out."),
    check: bool = typer.Option(True, "--check/--no-check", help="Compare onnxruntime with torch before publishing."),
    as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON."),
):
    """Export a reward model (backbone + head, past/present KV) to ONNX with a verifiable manifest.

    Use the result by passing DIR as the reward reference: it runs on onnxruntime (the default backend, auto, runs
    an export on onnx), e.g. steerkit generate "Hello" --reward DIR=-10
    """
    from ..errors import ExportError
    from ..rewards.kinds import kind_of_reference
    from ..rewards.onnx.manifest import MANIFEST_NAME, verify_export

    if out.is_dir() and any(out.iterdir()) and not force:  # fail before loading the model
        raise ExportError(f"{out} exists and is not empty; pass --force or choose another --out.")
    kind = kind_of_reference(reward)  # each kind of reward model (sequence, token-level) has its own graph
    model, reward_hash, source = kind.source(reward)
    if not as_json:
        err.print(f"exporting {model.config.name!r} ({model.config.num_layers} layers) to {out} …")
    directory = kind.export(model, out, source_hash=reward_hash, source=source, opset=opset, overwrite=force,
                            check=check)
    manifest, _, _ = verify_export(directory, expected_hash=reward_hash)
    if as_json:
        typer.echo(json.dumps(manifest))
        return
    size = sum(f["bytes"] for f in manifest["files"].values()) / 1e6
    err.print(f"wrote {directory} ({size:.1f} MB{', external data' if manifest['external_data'] else ''}; "
              f"opset {manifest['opset']}; exported in {manifest['exported_with']['seconds']} s); "
              f"manifest {directory / MANIFEST_NAME}")


@export_app.command("verify")
def verify_command(directory: Path = typer.Argument(..., help="An ONNX export directory.")):
    """Check an export's files against its manifest (hashes, tokenizer)."""
    from ..rewards.onnx.manifest import verify_export

    manifest, config, _ = verify_export(directory)
    typer.echo(f"ok: {config.name!r}, {manifest['num_layers']} layers, source {manifest['source']['reward_hash'][:16]}…")


def register(app: typer.Typer) -> None:
    app.add_typer(export_app, name="export")
