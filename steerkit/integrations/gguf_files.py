"""GGUF files at another precision, for llama.cpp (``engine="llama.cpp"``) and its benchmarks.

:func:`convert_gguf` rewrites a GGUF model with every quantized tensor dequantized (``F32``) or requantized
(``Q8_0``, ``F16``), keeping its metadata (architecture, tokenizer, chat template) as it is. From the packaged
4-bit SmolLM2 it makes the F32 file whose weights are exactly the ones steerkit's own engine runs (it dequantizes
the same file), so llama.cpp and the transformers engine can be compared on equal weights. Uses the ``gguf``
package (a dependency of transformers' GGUF loading); no llama.cpp build is needed.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import InvalidArgumentError, ModelFormatError
from ..files import atomic_path

TARGETS = ("F32", "F16", "Q8_0")


def convert_gguf(source: str | os.PathLike, destination: str | os.PathLike, target: str = "F32") -> Path:
    """Write ``source`` (a GGUF file) to ``destination`` with its weight matrices at ``target`` precision
    (``F32``, ``F16`` or ``Q8_0``; 1-D tensors such as norms stay F32). The file appears whole or not at all."""
    import numpy as np
    from gguf import GGMLQuantizationType as Q
    from gguf import GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import dequantize, quantize

    if target not in TARGETS:
        raise InvalidArgumentError(f"target={target!r}: choose one of {', '.join(TARGETS)}.")
    source, destination = Path(source), Path(destination)
    try:
        reader = GGUFReader(source)
    except (OSError, ValueError) as exc:
        raise ModelFormatError(f"{source}: not a readable GGUF file ({exc}).") from None
    arch = reader.fields["general.architecture"].contents()
    with atomic_path(destination) as tmp:
        writer = GGUFWriter(tmp, arch)
        for key, field in reader.fields.items():
            if key.startswith("GGUF.") or key in {"general.architecture", "general.file_type"}:
                continue
            kind = field.types[0]
            sub = field.types[-1] if kind == GGUFValueType.ARRAY else None
            writer.add_key_value(key, field.contents(), kind, sub)
        qtype = {"F32": Q.F32, "F16": Q.F16, "Q8_0": Q.Q8_0}[target]
        writer.add_file_type({"F32": 0, "F16": 1, "Q8_0": 7}[target])  # llama_ftype: ALL_F32, MOSTLY_F16, MOSTLY_Q8_0
        for tensor in reader.tensors:
            values = dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
            values = values.reshape([int(n) for n in reversed(tensor.shape)])
            if values.ndim < 2 or qtype == Q.F32:
                writer.add_tensor(tensor.name, np.ascontiguousarray(values))
            elif qtype == Q.F16:
                writer.add_tensor(tensor.name, values.astype(np.float16))
            else:
                writer.add_tensor(tensor.name, quantize(values, qtype), raw_dtype=qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return destination
