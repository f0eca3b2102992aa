"""The compiled step's grouped-query attention (:func:`steerkit.compiling.install_gqa_attention`): the same numbers as
transformers' own ``sdpa`` attention, compiled and eager."""

from __future__ import annotations

import warnings

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from steerkit.compiling import _gqa_sdpa, install_gqa_attention


class _Layer(torch.nn.Module):
    num_key_value_groups = 3  # 6 query heads over 2 KV heads, as SmolLM2's 9 over 3


def _inputs(queries: int, columns: int = 16):
    generator = torch.Generator().manual_seed(queries)
    query = torch.randn(2, 6, queries, 8, generator=generator)
    key, value = (torch.randn(2, 2, columns, 8, generator=generator) for _ in range(2))
    mask = torch.ones(2, 1, queries, columns, dtype=torch.bool)
    mask[0, :, :, :5] = False  # row 0's first columns are padding, as in a static cache
    mask[1, :, :, -3:] = False
    return query, key, value, mask


def test_installed_once_and_transformers_own_outside_compile():
    install_gqa_attention()
    installed = AttentionInterface._global_mapping["sdpa"]
    install_gqa_attention()
    assert AttentionInterface._global_mapping["sdpa"] is installed and installed.steerkit_gqa
    layer = _Layer()
    for queries in (1, 4):
        args = (layer, *_inputs(queries))
        ours, _ = installed(*args, scaling=0.3)
        theirs, _ = sdpa_attention_forward(*args, scaling=0.3)
        assert torch.equal(ours, theirs)  # eagerly it is transformers' function itself


def test_compiled_grouped_attention_matches_the_repeated_heads():
    with warnings.catch_warnings():  # torch 2.13's inductor imports its own deprecated torch.jit.script_method
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.script_method` is deprecated",
                                category=DeprecationWarning)
        import torch._inductor.compile_fx  # noqa: F401
    layer = _Layer()

    def ours(query, key, value, mask):
        return _gqa_sdpa(layer, query, key, value, mask, scaling=0.3, transformers_sdpa=sdpa_attention_forward)[0]

    def theirs(query, key, value, mask):
        return sdpa_attention_forward(layer, query, key, value, mask, scaling=0.3)[0]

    compiled_ours, compiled_theirs = torch.compile(ours, dynamic=False), torch.compile(theirs, dynamic=False)
    for queries in (1, 4):  # a decode step's single query; a reward's block of candidates
        args = _inputs(queries)
        expected = theirs(*args)
        assert expected.shape == (2, queries, 6, 8)
        for got in (compiled_ours(*args), compiled_theirs(*args)):
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
