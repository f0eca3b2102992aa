"""The tiny models of the test suite live in :mod:`steerkit.testing` (also used by the docstring examples), and here
those of other model families."""

import torch

from steerkit.testing import (  # noqa: F401
    CORPUS, labelled_review, make_tokenizer, save_tiny_lm, tiny_lm, tiny_reward, tiny_token_reward,
    write_distribution,
)


def family_lm(family: str, tokenizer, seed: int = 0, layers: int = 3, hidden: int = 32):
    """A tiny random causal LM of one family, with the test tokenizer's vocabulary and special tokens."""
    import transformers as tf

    torch.manual_seed(seed)
    special = dict(pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                   eos_token_id=tokenizer.eos_token_id, vocab_size=len(tokenizer))
    common = dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                  max_position_embeddings=128, **special)
    if family == "gpt2":
        config = tf.GPT2Config(n_embd=hidden, n_layer=layers, n_head=4, n_positions=128, **special)
        cls = tf.GPT2LMHeadModel
    elif family == "gpt_neox":
        config, cls = tf.GPTNeoXConfig(intermediate_size=2 * hidden, **common), tf.GPTNeoXForCausalLM
    elif family == "opt":
        config, cls = tf.OPTConfig(ffn_dim=2 * hidden, word_embed_proj_dim=hidden, **common), tf.OPTForCausalLM
    elif family == "phi":
        config, cls = tf.PhiConfig(intermediate_size=2 * hidden, **common), tf.PhiForCausalLM
    elif family == "qwen2":
        config, cls = tf.Qwen2Config(intermediate_size=2 * hidden, num_key_value_heads=2, **common), tf.Qwen2ForCausalLM
    elif family == "gemma3":  # sliding-window layers: layer_types must be cut with the blocks
        config = tf.Gemma3TextConfig(intermediate_size=2 * hidden, num_key_value_heads=2, head_dim=8,
                                     sliding_window=64, **common)
        cls = tf.Gemma3ForCausalLM
    elif family == "llama":
        config, cls = tf.LlamaConfig(intermediate_size=2 * hidden, num_key_value_heads=2, **common), tf.LlamaForCausalLM
    else:
        raise ValueError(family)
    return cls(config).eval()


class TwoProducts(torch.nn.Module):
    """Two linear layers (64 -> 128 -> 64) of seeded random weights: the smallest model whose compiled step has
    matrix products for inductor's C++ GEMM template (tests of steerkit's compile-time caches)."""

    def __init__(self, seed: int = 0):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.up = torch.nn.Linear(64, 128)
        self.down = torch.nn.Linear(128, 64)
        for p in self.parameters():
            p.data = torch.randn(p.shape, generator=generator) * 0.1

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))
