"""The ``llama.cpp`` reward backend (issue 25): tiny random Llama reward models exported to GGUF by steerkit's
exporter and run by llama.cpp must give the torch backend's rewards.

Measured tolerances (tiny models here, hidden 32; the shipped SmolLM2 models in tests/integration):
F32 weights and KV: rewards within 3e-7 of torch (asserted at 1e-5), from scratch and over steps with multi-token
blocks, holes, rollbacks, appends and row changes; Q8_0: within 0.03 (asserted at 0.08).
Skips, with the install command, where llama-cpp-python is absent."""

from __future__ import annotations

import sys

import pytest
import torch

import steerkit
from steerkit.errors import ExportError, SteerkitError
from steerkit.rewards.sequence.torch_cache import TorchScoringCache
from steerkit.testing import tiny_lm, tiny_reward
from conftest import NO_LLAMA_CPP

llama_cpp = pytest.importorskip("llama_cpp", reason=NO_LLAMA_CPP)

from steerkit.rewards.llama_cpp.export import UnsupportedBackboneError, cache_path  # noqa: E402
from steerkit.rewards.llama_cpp.model import LlamaCppRewardModel, LlamaCppScoringCache  # noqa: E402

F32_TOL = 1e-5
Q8_TOL = 0.08
TEXTS = ["I hate it", "the movie was wonderful and", "so"]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("STEERKIT_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def rm(tokenizer):
    return tiny_reward(tokenizer, layers=3)


def drive(tokenizer, caches, steps=12, seed=0):
    """Score and commit the same random steps on every cache (multi-token blocks with padding, a rollback, an append
    with a hole, a row change); returns the largest reward difference of each cache to the first."""
    g = torch.Generator().manual_seed(seed)
    worst = [0.0] * len(caches)
    for step in range(steps):
        B = caches[0].next_pos.shape[0] if torch.is_tensor(caches[0].next_pos) else len(caches[0].next_pos)
        k, m = 5, (1 if step % 3 else 3)
        blocks = torch.randint(3, len(tokenizer), (B, k, m), generator=g)
        mask = torch.ones_like(blocks, dtype=torch.bool)
        if m > 1:
            mask[:, :, 2] = torch.rand(B, k, generator=g) > 0.5
        scores = [c.score_blocks(blocks, mask) for c in caches]
        worst = [max(w, float((s - scores[0]).abs().max())) for w, s in zip(worst, scores)]
        choice = torch.randint(0, k, (B,), generator=g)
        for c in caches:
            c.commit_choice(choice)
            if step == 5:
                c.rollback(torch.tensor([1, 0, 2][:B]))
            if step == 7:
                c.append(torch.full((B, 2), 7), torch.tensor([[1, 1], [0, 1], [1, 0]][:B]).bool())
            if step == 9:
                c.keep_rows(torch.tensor([2, 0]))
    return worst


@pytest.mark.parametrize("precision,tol", [("f32", F32_TOL), ("q8_0", Q8_TOL)])
def test_rewards_equal_torch_from_scratch_and_over_steps(rm, tokenizer, precision, tol):
    model = LlamaCppRewardModel.from_torch(rm, precision=precision)
    scratch = torch.tensor(model.score_texts(TEXTS)) - torch.tensor(rm.score_texts(TEXTS))
    assert scratch.abs().max() < tol
    enc = rm.encode(TEXTS)
    caches = [TorchScoringCache(rm, enc["input_ids"], enc["attention_mask"]),
              LlamaCppScoringCache(model, enc["input_ids"], enc["attention_mask"])]
    assert drive(tokenizer, caches)[1] < tol
    assert caches[1].next_pos == caches[0].next_pos.tolist()


def test_add_rows_equals_fresh_sessions_and_sequences_are_given_back(rm, tokenizer):
    model = LlamaCppRewardModel.from_torch(rm, precision="f32")
    free = len(model.runtime._free)
    a_enc, b_enc, all_enc = rm.encode(TEXTS[:2]), rm.encode(TEXTS[2:]), rm.encode(TEXTS)
    a = LlamaCppScoringCache(model, a_enc["input_ids"], a_enc["attention_mask"])
    b = LlamaCppScoringCache(model, b_enc["input_ids"], b_enc["attention_mask"])
    a.add_rows(b)
    fresh = TorchScoringCache(rm, all_enc["input_ids"], all_enc["attention_mask"])
    blocks = torch.randint(3, len(tokenizer), (3, 4, 1), generator=torch.Generator().manual_seed(1))
    assert (a.score_blocks(blocks, None) - fresh.score_blocks(blocks, None)).abs().max() < F32_TOL
    a.commit_choice(torch.tensor([0, 1, 2]))
    fresh.commit_choice(torch.tensor([0, 1, 2]))
    assert drive(tokenizer, [fresh, a], steps=4)[1] < F32_TOL
    del a, b
    import gc

    gc.collect()
    model.runtime.take(0)  # released sequences are cleared by the next call into the runtime
    assert len(model.runtime._free) == free


def test_running_out_of_sequences_is_a_typed_error_that_says_what_to_lower(rm):
    from steerkit.rewards.llama_cpp.runtime import LlamaCppRewardError

    model = LlamaCppRewardModel.from_torch(rm, precision="f32")
    runtime = model.runtime
    held = runtime.take_or_raise(len(runtime._free), "the test", "nothing")
    with pytest.raises(LlamaCppRewardError, match=r"no 2 free llama.cpp sequences for one row's candidates .*: lower k"):
        runtime.take_or_raise(2, "one row's candidates", "lower k")
    runtime.release(held)
    assert runtime.take_or_raise(2, "one row's candidates", "lower k")


def test_token_level_rewards_equal_torch(tokenizer):
    from steerkit.rewards.llama_cpp.token import LlamaCppTokenModel, LlamaCppTokenSession
    from steerkit.rewards.token.model import TokenRewardModel
    from steerkit.rewards.token.session import TokenReward

    trm = TokenRewardModel.from_causal_lm(tiny_lm(tokenizer, seed=4, layers=2), tokenizer, name="tiny-token")
    torch.manual_seed(5)
    for p in trm.head.parameters():
        torch.nn.init.normal_(p, std=0.4)
    model = LlamaCppTokenModel.from_torch(trm, precision="f32")
    assert (torch.tensor(model.score_texts(TEXTS)) - torch.tensor(trm.score_texts(TEXTS))).abs().max() < F32_TOL
    ref, mine = TokenReward(trm, backend="torch"), TokenReward(model, backend="llama.cpp")
    sa, sb = ref.start(TEXTS, tokenizer), mine.start(TEXTS, tokenizer)
    assert isinstance(sb, LlamaCppTokenSession)
    g = torch.Generator().manual_seed(2)
    worst = 0.0
    for step in range(8):
        B = sa.next_pos.shape[0]
        cand = torch.randint(3, len(tokenizer), (B, 6), generator=g)
        cand[:, 0] = tokenizer.eos_token_id  # a textless candidate: the committed text's reward
        worst = max(worst, float((sa.score(cand) - sb.score(cand)).abs().max()))
        sa.commit(cand[:, 1])
        sb.commit(cand[:, 1])
        if step == 3:
            sa.keep_rows(torch.tensor([2, 0]))
            sb.keep_rows(torch.tensor([2, 0]))
        if step == 5:
            sa.add_rows(ref.start(["new row"], tokenizer))
            sb.add_rows(mine.start(["new row"], tokenizer))
    assert worst < F32_TOL


def test_generate_with_backend_llama_cpp_gives_torch_tokens(tmp_path, tokenizer, tiny_backbone_dir):
    from steerkit.rewards.model import RewardModel

    rm = RewardModel.from_backbone(str(tiny_backbone_dir), 2, name="tiny-dir")
    torch.manual_seed(0)
    torch.nn.init.normal_(rm.head.weight, std=0.5)
    directory = rm.save_pretrained(tmp_path / "rm")
    runs = {b: steerkit.generate(["The quick", "You are a"], lm=str(tiny_backbone_dir), rewards={str(directory): -20},
                                 k=8, do_sample=False, max_new_tokens=12, backend=b, return_traces=True)
            for b in ("torch", "llama.cpp")}
    assert runs["llama.cpp"].texts == runs["torch"].texts
    # the GGUF is cached by the directory's reward hash: loading again writes nothing
    from steerkit.rewards.onnx.export import reward_dir_hash

    path = cache_path(reward_dir_hash(directory), "f32")
    stamp = path.stat().st_mtime_ns
    steerkit.load_reward(str(directory), backend="llama.cpp")
    assert path.stat().st_mtime_ns == stamp


def test_a_non_llama_backbone_is_a_typed_error_naming_the_backends_to_use(tokenizer):
    import transformers as tf

    from steerkit.rewards.model import RewardModel

    config = tf.GPT2Config(n_embd=32, n_layer=1, n_head=4, n_positions=64, vocab_size=len(tokenizer))
    rm = RewardModel.from_causal_lm(tf.GPT2LMHeadModel(config).eval(), tokenizer, name="gpt2-tiny")
    with pytest.raises(UnsupportedBackboneError, match="Llama-architecture.*'gpt2'.*backend 'torch' or 'onnx'"):
        LlamaCppRewardModel.from_torch(rm)
    assert issubclass(UnsupportedBackboneError, SteerkitError)


def test_missing_llama_cpp_python_names_the_install_command(monkeypatch):
    from steerkit.rewards.llama_cpp.runtime import import_llama_cpp

    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    with pytest.raises(ExportError, match=r'CMAKE_ARGS="-DGGML_NATIVE=ON" pip install "steerkit-rad\[llama-cpp\]"'):
        import_llama_cpp()


def test_the_backends_are_registered_and_cpu_only():
    from steerkit.errors import InvalidArgumentError
    from steerkit.rewards.backends import backend_names, get_backend

    assert {"llama.cpp", "llama.cpp-q8"} <= set(backend_names())
    get_backend("llama.cpp").to_device(None, "cpu")
    with pytest.raises(InvalidArgumentError, match="CPU"):
        get_backend("llama.cpp").to_device(None, "cuda")
