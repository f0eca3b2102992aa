"""Every seed steerkit derives, in one place.

A user gives one seed; steerkit derives the seeds of its parts from it with these rules only, so that a
resumed run, a row served among others, and a row generated alone draw the same random numbers:

* :func:`offset_seed` — choice ``i`` of a request with ``n`` choices (OpenAI's ``n``): ``seed + i``, wrapped
  into the range ``torch.manual_seed`` accepts. Used by the HTTP server and batch files.
* :func:`keyed_seed` — a seed that is a pure function of named parts (``(seed, prompt set, prompt index)``
  in evaluation runs, so a resumed run produces exactly what an uninterrupted one would).
* :func:`mixed_seed` — a training stream's seed: ``seed * salt + offset`` (each stream its own salt, e.g.
  the data order of one epoch, the distillation prompts of one batch).
* :func:`unit_hash` — a uniform number in [0, 1) from a string key (data selection that must not depend on
  the process, unlike ``hash()``).
"""

from __future__ import annotations

import hashlib

#: The seeds ``torch.manual_seed`` accepts (negative seeds are taken modulo 2**64).
SEED_RANGE = (-(2**63), 2**64 - 1)
_SEED_SPAN = SEED_RANGE[1] - SEED_RANGE[0] + 1


def wrap_seed(seed: int) -> int:
    """``seed`` wrapped into :data:`SEED_RANGE`."""
    return (int(seed) - SEED_RANGE[0]) % _SEED_SPAN + SEED_RANGE[0]


def offset_seed(seed: int, index: int) -> int:
    """The seed of choice ``index`` of a request: ``seed + index``, wrapped into :data:`SEED_RANGE`."""
    return wrap_seed(int(seed) + int(index))


def keyed_seed(*parts) -> int:
    """A 32-bit seed that depends only on ``parts`` (their ``str`` joined by ``|``): stable across processes."""
    return int(hashlib.sha256("|".join(str(p) for p in parts).encode()).hexdigest()[:8], 16)


def mixed_seed(seed: int, salt: int, offset: int = 0) -> int:
    """A training stream's seed: ``seed * salt + offset`` (distinct salts keep the streams apart)."""
    return int(seed) * int(salt) + int(offset)


def unit_hash(key: str) -> float:
    """A uniform number in [0, 1) from a string (stable across processes, unlike ``hash()``)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") / 2.0**64
