"""Tiny randomly initialised models and tokenizers, built in code (no downloads, about a second).

For tests of plugins and apps, and for the examples in steerkit's docstrings::

    from steerkit.testing import make_tokenizer, tiny_lm, tiny_reward
    tok = make_tokenizer()
    lm, rm = tiny_lm(tok), tiny_reward(tok)

The models are random: what they generate and score is meaningless, but every code path is the real one.
"""

from __future__ import annotations

import json

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Café déjà vu: naïve résumé with 12 apples and 3.5 pears 🙂 🚀",
    "You are a wonderful friend, I love this movie so much!",
    "This is terrible, awful and stupid; I hate it.",
    "Numbers 0123456789 and symbols #$%&*() appear here.",
    "  leading spaces, tabs\tand new\nlines matter too.",
] * 20


def make_tokenizer(vocab_size: int = 300, kind: str = "bpe") -> PreTrainedTokenizerFast:
    """A byte-level BPE ("bpe") or a Metaspace unigram-ish BPE ("metaspace") tokenizer trained on CORPUS."""
    special = ["<pad>", "<s>", "</s>"]
    if kind == "bpe":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    else:
        tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=True))
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace()])
        byte_tokens = [f"<0x{i:02X}>" for i in range(256)]
        trainer = trainers.BpeTrainer(vocab_size=vocab_size + 256, special_tokens=special + byte_tokens)
    tok.train_from_iterator(CORPUS, trainer)
    if kind != "bpe":  # byte tokens are vocabulary (as in Llama/Gemma), not special: decode(skip_special_tokens) keeps them
        data = json.loads(tok.to_str())
        for added in data["added_tokens"]:
            added["special"] = added["content"] in special
        tok = Tokenizer.from_str(json.dumps(data))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    fast.padding_side = "left"
    return fast


def tiny_lm(tokenizer, seed: int = 0, layers: int = 2, hidden: int = 32) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def tiny_reward(tokenizer, seed: int = 1, layers: int = 2, name: str = "tiny", **kw):
    from .rewards.model import RewardModel

    lm = tiny_lm(tokenizer, seed=seed, layers=layers)
    rm = RewardModel.from_causal_lm(lm, tokenizer, name=name, **kw)
    torch.manual_seed(seed + 100)
    torch.nn.init.normal_(rm.head.weight, std=0.5)  # spread rewards so that steering is visible
    return rm


def tiny_token_reward(tokenizer, seed: int = 1, rank=None, baseline=True, name: str = "tok", lm_state: bool = False):
    """A tiny token-level reward model (:class:`~steerkit.rewards.token.model.TokenRewardModel`) over all of a tiny
    LM's layers, its head spread so that rewards differ. ``lm_state``: a head on the LM's own state
    (:mod:`steerkit.rewards.token.lm_state`), tied to ``tiny_lm(tokenizer, seed=seed)``."""
    from .rewards.model_config import TokenHeadSettings
    from .rewards.token.model import TokenRewardModel

    rm = TokenRewardModel.from_causal_lm(tiny_lm(tokenizer, seed=seed), tokenizer, name=name,
                                         head=TokenHeadSettings(rank=rank, baseline=baseline, lm_state=lm_state))
    torch.manual_seed(seed + 100)
    for p in rm.head.parameters():  # spread the rewards (the default init starts W at 0)
        torch.nn.init.normal_(p, std=0.4)
    return rm


def save_tiny_lm(directory, tokenizer, seed: int = 0, **kw):
    """A tiny LM and its tokenizer saved as a transformers directory (a valid LM or backbone reference)."""
    from pathlib import Path

    tiny_lm(tokenizer, seed=seed, **kw).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return Path(directory)


def random_lora(backbone, settings, seed: int = 0):
    """``backbone`` wrapped by peft as training wraps it (``settings``: a ``LoraSettings``), with random non-zero A and
    B factors (a fresh adapter has B = 0, which would hide a wrong merge); needs peft (the ``train`` extra)."""
    import warnings

    from peft import get_peft_model

    from .rewards.lora import lora_config

    with warnings.catch_warnings():  # peft calls a transformers API deprecated in 5.x
        warnings.simplefilter("ignore", FutureWarning)
        wrapped = get_peft_model(backbone, lora_config(settings, backbone))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in wrapped.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    return wrapped


POSITIVE_PHRASES = ["I love this movie", "wonderful friend", "so much fun", "great and happy", "you are wonderful"]
NEGATIVE_PHRASES = ["I hate it", "terrible and awful", "stupid thing", "this is bad", "awful stupid movie"]


def compared_top_logits(eager, other, relative: float) -> int:
    """Check ``other``'s greedy run against ``eager``'s (two ``generate`` outputs with ``return_traces=True``) step by
    step while each row has chosen the same tokens in both: the step's largest logit within ``relative`` × the largest
    |logit| of ``eager``'s run (the top-k's order may swap at near ties, which reduced precision decides either way).
    Raises AssertionError at the first step that is not; returns the number of row-steps compared."""
    scale = max(float(step.topk_logits.abs().max()) for chunk in eager.traces for step in chunk)
    compared = 0
    for chunk_eager, chunk_other in zip(eager.traces, other.traces):
        same = torch.ones(chunk_eager[0].topk_ids.shape[0], dtype=torch.bool)  # rows whose tokens agree so far
        for a, b in zip(chunk_eager, chunk_other):
            gap = (a.topk_logits[:, 0] - b.topk_logits[:, 0]).abs()[same]  # traces are on the CPU
            assert gap.numel() == 0 or gap.max().item() <= relative * scale, (gap, scale)
            compared += int(same.sum())
            rows = torch.arange(same.shape[0])
            same &= a.topk_ids[rows, a.chosen] == b.topk_ids[rows, b.chosen]
    return compared


def labelled_review(i: int) -> tuple[str, int]:
    """The i-th of a small, learnable labelled set: (two phrases of one polarity and the index, 1 if positive)."""
    label = i % 2
    phrases = POSITIVE_PHRASES if label else NEGATIVE_PHRASES
    return f"{phrases[i % 5]} and {phrases[(i // 5) % 5]} {i}", label


def write_distribution(site, entry_point: str, distribution: str, version: str, module: str, source: str) -> None:
    """A fake installed package in ``site`` (a directory put on ``sys.path``): ``module.py`` with ``source``, and
    ``.dist-info`` metadata declaring ``entry_point`` in steerkit's entry-point group. For testing plugin loading."""
    from pathlib import Path

    site = Path(site)
    (site / f"{module}.py").write_text(source, encoding="utf-8")
    info = site / f"{distribution.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n",
                                   encoding="utf-8")
    (info / "entry_points.txt").write_text(f"[steerkit]\n{entry_point} = {module}\n", encoding="utf-8")
