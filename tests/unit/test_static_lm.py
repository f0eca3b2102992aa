"""The static-shape step (steerkit/engine/static_lm.py, ``compile=True``) and the int8 and bf16 LMs (``dtype=``) on tiny
random models: the static layout gives the eager engine's logits through every way rows join and leave, the compiled
step gives the eager engine's tokens, a shape compiles once, and bad options are typed errors."""

import json

import pytest
import torch
from typer.testing import CliRunner

import steerkit
from steerkit.assembly import lm_runner
from steerkit.cli import app
from steerkit.config import SteeringConfig
from steerkit.engine.lm_cache import LMBatch
from steerkit.engine.lm_int8 import Int8Linear, as_bf16_lm, as_int8
from steerkit.engine.static_lm import MIN_WIDTH, StaticLM, StaticLMBatch, bucket
from steerkit.errors import ConfigError, InvalidArgumentError
from steerkit.rewards.sequence.scorer import RewardModelScorer
from steerkit.serving.engine import Engine
from steerkit.serving.requests import RowSpec
from steerkit.steering import SteeringTerm
from steerkit.testing import compared_top_logits, tiny_lm


def _drive(batch, tokenizer, script_steps=150):
    """Greedy decoding with rows joining (one longer than every row so far), leaving, the batch emptying to one
    row, two joining at once and a chunked prefill: the logits of every step."""
    batch.prefill_padded([[5, 6, 7, 8, 9], [10, 11], list(range(12, 24))], tokenizer)
    seen = []
    for step in range(script_steps):
        seen.append(batch.logits.clone())
        batch.advance(batch.logits.argmax(-1))
        if step == 20:
            batch.join([batch.prefill(list(range(30, 76)))])  # 46 tokens: longer than the 33 columns written
        elif step == 40:
            batch.keep(torch.tensor([3, 0, 2]))
        elif step == 60:
            batch.keep(torch.tensor([1]))
        elif step == 61:
            batch.join([batch.prefill([7] * 9), batch.prefill([8] * 3)])
        elif step == 70:
            job = batch.prefill_job(list(range(40, 60)), chunk=6)
            done = None
            while done is None:
                done = job.run_chunk()
            batch.join([done])
    return seen


def test_buckets_are_powers_of_two_times_the_smallest():
    assert [bucket(n) for n in (1, 2, 3, 5, 8, 9)] == [1, 2, 4, 8, 8, 16]
    assert [bucket(n, MIN_WIDTH) for n in (1, 128, 129, 300)] == [128, 128, 256, 512]


def test_the_static_layout_gives_the_eager_engines_logits_as_rows_join_and_leave(lm, tokenizer):
    eager = _drive(LMBatch(lm), tokenizer)
    static_batch = StaticLM(lm, compiled=False).make_batch()
    static = _drive(static_batch, tokenizer)
    assert [e.shape for e in eager] == [s.shape for s in static]
    assert max((e - s).abs().max().item() for e, s in zip(eager, static)) < 1e-5
    # the run outgrew the smallest width (a 46-token row plus 130 steps) and shrank to one slot and back
    assert static_batch.width >= 2 * MIN_WIDTH and static_batch.slots == bucket(static_batch.size)


def test_keep_crops_columns_and_picks_the_smallest_bucket(lm, tokenizer):
    batch = StaticLM(lm, compiled=False).make_batch()
    batch.prefill_padded([[5] * 40, [6] * 3, [7] * 3], tokenizer)
    assert (batch.slots, batch.width, batch.t) == (4, MIN_WIDTH, 40)
    batch.keep(torch.tensor([2]))
    assert (batch.slots, batch.size, batch.t) == (1, 1, 3)  # the 37 columns only the long row used are gone
    assert batch.mask[0, :3].tolist() == [1, 1, 1] and int(batch.mask[0].sum()) == 3


def test_generate_reserves_its_whole_length_so_the_width_never_changes(lm, tokenizer):
    batch = StaticLM(lm, compiled=False).make_batch()
    batch.reserve(2, 5 + 300)
    batch.prefill_padded([[5] * 5, [6] * 2], tokenizer)
    assert batch.width == bucket(306, MIN_WIDTH)
    server = StaticLM(lm, compiled=False).make_batch()
    assert server.reserve(16, 2048, budget=32768) == 2048  # a server sizes nothing ahead
    server.prefill_padded([[5] * 5], tokenizer)
    assert server.width == MIN_WIDTH


def _generate(lm, tokenizer, reward_model, **kw):
    reward = RewardModelScorer(reward_model, context="full")
    return steerkit.generate(["ab cd", "hello there friend", "x"], lm=(lm, tokenizer),
                             rewards=[SteeringTerm(reward, -4.0, name="tiny")], k=5, max_new_tokens=24, eos_token_id=[], **kw)


@pytest.fixture
def fresh_lm(tokenizer):
    """The session's tiny LM rebuilt as a new object: what a process has compiled is per model object, so a test that
    counts compilations must not share its model with another test."""
    return tiny_lm(tokenizer)


def test_compiled_generate_gives_the_eager_tokens_greedy_and_seeded(fresh_lm, tokenizer, reward_model,
                                                                     inductor_cache, capfd):
    """One compiled shape (3 rows -> 4 slots x 128 tokens) serves greedy and sampled decoding; a second run of the
    same shape does not compile again (dynamo is told to fail on any recompilation)."""
    eager = _generate(fresh_lm, tokenizer, reward_model, do_sample=False)
    compiled = _generate(fresh_lm, tokenizer, reward_model, do_sample=False, compile=True)
    assert torch.equal(eager.sequences, compiled.sequences)
    err = capfd.readouterr().err
    assert "compiling the decode step for 4 row(s) x 128 tokens" in err and "compiled in" in err
    assert any(inductor_cache.iterdir())  # the kernels are cached on disk
    eager_s = _generate(fresh_lm, tokenizer, reward_model, do_sample=True, seed=3)
    with torch._dynamo.config.patch(error_on_recompile=True):
        compiled_s = _generate(fresh_lm, tokenizer, reward_model, do_sample=True, seed=3, compile=True)
    assert torch.equal(eager_s.sequences, compiled_s.sequences)
    assert "compiling" not in capfd.readouterr().err


@pytest.mark.parametrize("compiled", [False, True], ids=["static-eager", "static-compiled"])
def test_the_server_runs_the_static_step_and_every_row_equals_generate_alone(compiled, fresh_lm, tokenizer,
                                                                              reward_model, capfd):
    """The server's engine on the static step: six rows with different k, β, temperatures and lengths through four
    running slots (rows join and leave, the bucket changes): each equals the eager ``generate`` of that row alone.
    Compiled, every row bucket up to ``max_running`` compiles while the engine is built, none while it serves."""
    from test_engine import SPECS, solo

    reward = RewardModelScorer(reward_model, context="full")
    engine = Engine(StaticLM(fresh_lm, compiled=compiled), tokenizer, {"tiny": reward}, default_k=5, max_running=4,
                    max_queue=16)
    warmed = capfd.readouterr().err
    assert [f"for {n} row(s) x 128 tokens" in warmed for n in (1, 2, 4)] == [compiled] * 3
    engine.start()
    try:
        results = [h.result(timeout=120) for h in engine.submit_all(SPECS)]
    finally:
        engine.shutdown(0)
    assert "compiling" not in capfd.readouterr().err
    for spec, res in zip(SPECS, results):
        assert res.token_ids == solo(fresh_lm, tokenizer, reward, spec)[0], spec


def test_the_server_compiles_its_rewards_scoring_before_it_serves(fresh_lm, tokenizer, reward_model, capfd):
    """A served reward whose scoring is compiled (``steerkit serve --compile``; on a CPU, ``torch-int8`` where the CPU
    multiplies int8): its candidate scoring and commit compile for every row bucket up to ``max_running`` at the
    default k while the engine is built, with the LM's steps; rows at that k then compile nothing, the warm-up rows
    leave no count behind, and each row picks the tokens the eager ``generate`` picks for it alone."""
    from test_engine import solo

    reward = RewardModelScorer(reward_model, context="full").compiled_form(compiled=True)
    engine = Engine(StaticLM(fresh_lm, compiled=True), tokenizer, {"tiny": reward}, default_k=5, max_running=4,
                    max_queue=16)
    warmed = capfd.readouterr().err
    for rows in (1, 2, 4):
        assert f"compiling a reward's candidate scoring for {rows} row(s) x 64 prefix x 8 candidate tokens" in warmed
        assert f"compiling a reward's commit for {rows} row(s)" in warmed
    assert engine.stats()["steps"] == 0 and engine.stats()["tokens"] == 0
    specs = [RowSpec(prompt, 6, temperature=0.0, rewards={"tiny": beta})
             for prompt, beta in [("a b", -3.0), ("c", 2.0), ("d e f", -1.0), ("b", -4.0), ("e e", 1.5)]]
    engine.start()
    try:
        results = [h.result(timeout=120) for h in engine.submit_all(specs)]
    finally:
        engine.shutdown(0)
    assert "compiling" not in capfd.readouterr().err
    eager = RewardModelScorer(reward_model, context="full")
    for spec, res in zip(specs, results):
        assert res.token_ids == solo(fresh_lm, tokenizer, eager, spec)[0], spec


def test_served_rows_past_the_compiled_shapes_run_eagerly_and_the_server_compiles_nothing(fresh_lm, tokenizer, capfd):
    """Rows the server's start-up did not compile for: a prompt longer than the LM's width (128 tokens) and the
    reward's prefix (64), and a row with another k. The steps of those shapes run eagerly in the serving loop, with one
    line on stderr each, instead of compiling there (minutes on a CPU, every request waiting); each row still picks
    the eager ``generate``'s tokens. Outside the serving loop (``generate``) a new shape compiles as before."""
    from test_engine import solo

    from steerkit.compiling import compiled_step
    from steerkit.rewards.sequence.static_cache import compiled_scoring
    from steerkit.testing import tiny_reward

    reward_model = tiny_reward(tokenizer)  # its own object: what this process compiled for it is this test's alone
    eager = RewardModelScorer(reward_model, context="full")
    engine = Engine(StaticLM(fresh_lm, compiled=True), tokenizer, {"tiny": eager.compiled_form(compiled=True)},
                    default_k=5, max_running=2, max_queue=8)
    assert "a reward's candidate scoring for 2 row(s) x 64 prefix x 8 candidate tokens" in capfd.readouterr().err
    long_prompt = " ".join(["hello world"] * 15)
    assert len(tokenizer(long_prompt).input_ids) > MIN_WIDTH
    specs = [RowSpec(long_prompt, 10, temperature=0.0, rewards={"tiny": -3.0}),
             RowSpec("ab", 12, temperature=0.0, rewards={"tiny": 2.0}, k=12)]
    engine.start()
    try:
        results = [h.result(timeout=120) for h in engine.submit_all(specs)]
    finally:
        engine.shutdown(0)
    err = capfd.readouterr().err
    assert "compiling" not in err
    assert f"the decode step for 2 row(s) x {2 * MIN_WIDTH} tokens was not compiled at start-up" in err
    assert "a reward's candidate scoring for 2 row(s) x 256 prefix x 16 candidate tokens was not compiled" in err
    step, scoring = compiled_step(fresh_lm), compiled_scoring(reward_model)
    assert step.shapes == {("1 row(s)", "128 tokens"), ("2 row(s)", "128 tokens")}
    assert step.eager_shapes[("2 row(s)", f"{2 * MIN_WIDTH} tokens")] >= 9  # the long row's steps after its first
    # --compile-tokens' default, 127: the 64- and 128-column reward contexts, at the default k
    assert {shape[1] for shape in scoring.shapes} == {"64 prefix", "128 prefix"}
    assert all("8 candidate" in shape[2] for shape in scoring.shapes)
    assert sum(scoring.eager_shapes.values()) >= 11
    for spec, res in zip(specs, results):
        assert res.token_ids == solo(fresh_lm, tokenizer, eager, spec)[0], spec
    steerkit.generate([long_prompt], lm=(fresh_lm, tokenizer), max_new_tokens=2, do_sample=False, compile=True)
    assert "compiling the decode step for 1 row(s) x 256 tokens" in capfd.readouterr().err


@pytest.mark.parametrize("context, prompt, tokens", [("full", " ".join(["hello world"] * 15), 10),
                                                      ("continuation", "ab", 150)])
def test_compile_tokens_compiles_every_width_a_row_of_that_many_tokens_uses(context, prompt, tokens, fresh_lm,
                                                                             tokenizer, capfd):
    """``compile_tokens`` (``steerkit serve --compile-tokens``) 200: the LM's step at 128 and 256 columns and the
    reward's scoring at 64, 128 and 256 columns of context compile at start-up, so a row past 150 tokens runs compiled
    with nothing compiling and nothing eager in the loop, on the eager ``generate``'s tokens. A reward whose context
    holds the prompt (``full``) gets it from a 150-token prompt; one that scores the continuation alone (the default,
    every shipped reward) from 150 generated tokens: the start-up's rows for it generate their way through each
    bucket."""
    from test_engine import solo

    from steerkit.compiling import compiled_step
    from steerkit.rewards.sequence.static_cache import compiled_scoring
    from steerkit.testing import tiny_reward

    reward_model = tiny_reward(tokenizer)  # its own object: what this process compiled for it is this test's alone
    eager = RewardModelScorer(reward_model, context=context)
    engine = Engine(StaticLM(fresh_lm, compiled=True), tokenizer, {"tiny": eager.compiled_form(compiled=True)},
                    default_k=5, max_running=1, max_queue=8, compile_tokens=200)
    capfd.readouterr()
    assert compiled_step(fresh_lm).shapes == {("1 row(s)", "128 tokens"), ("1 row(s)", "256 tokens")}
    assert {shape[1] for shape in compiled_scoring(reward_model).shapes} == {"64 prefix", "128 prefix", "256 prefix"}
    spec = RowSpec(prompt, tokens, temperature=0.0, rewards={"tiny": -3.0})
    engine.start()
    try:
        result = engine.submit_all([spec])[0].result(timeout=120)
    finally:
        engine.shutdown(0)
    err = capfd.readouterr().err
    assert "compiling" not in err and "was not compiled" not in err
    assert len(result.token_ids) == tokens
    assert not compiled_step(fresh_lm).eager_shapes and not compiled_scoring(reward_model).eager_shapes
    assert result.token_ids == solo(fresh_lm, tokenizer, eager, spec)[0]


def test_int8_weights_replace_every_linear_and_stay_close_to_float32(lm):
    q = as_int8(lm)
    assert q is as_int8(lm) and q is not lm  # one copy per model; the float32 LM is untouched
    assert not any(type(m) is torch.nn.Linear for m in q.modules())
    assert any(isinstance(m, Int8Linear) for m in q.modules()) and lm.lm_head.weight.dtype == torch.float32
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    with torch.no_grad():
        a, b = lm(ids).logits, q(ids).logits
    # per-row scales: each weight is within half a step (max|w| / 254) of its float32 value
    assert (a - b).abs().max().item() < 0.02 * a.abs().max().item()
    layer = next(m for m in q.modules() if isinstance(m, Int8Linear))
    assert layer.qweight.dtype == torch.int8 and layer.qweight.abs().max().item() == 127


def test_int8_generate_runs_eagerly_and_compiled_alike(lm, tokenizer, reward_model):
    eager = _generate(lm, tokenizer, reward_model, do_sample=False, dtype="int8")
    compiled = _generate(lm, tokenizer, reward_model, do_sample=False, dtype="int8", compile=True)
    assert torch.equal(eager.sequences, compiled.sequences)


def test_bf16_lm_runs_every_linear_in_bf16_and_stays_close_to_float32(lm):
    from steerkit.linear_precision import Bf16MatmulLinear

    b = as_bf16_lm(lm)
    assert b is as_bf16_lm(lm) and b is not lm  # one copy per model; the float32 LM is untouched
    linears = [m for m in b.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(type(m) is Bf16MatmulLinear and m.weight.dtype == torch.bfloat16 for m in linears)
    assert lm.lm_head.weight.dtype == torch.float32 and b.get_input_embeddings().weight.dtype == torch.float32
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    with torch.no_grad():
        a, c = lm(ids).logits, b(ids).logits
    assert c.dtype == torch.float32 and not torch.equal(a, c)
    # bf16 keeps 8 significant bits: each product is within a few bf16 steps (2^-8) of float32's
    assert (a - c).abs().max().item() < 0.03 * a.abs().max().item()


def test_bf16_matmul_layer_is_the_bf16_product_returned_in_float32():
    from steerkit.linear_precision import BF16_COMPUTE, convert_linears

    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(64, 48))
    x = torch.randn(5, 64)
    exact = layer(x)
    assert convert_linears(layer, BF16_COMPUTE) == 1
    y = layer(x)
    w, bias = layer[0].weight, layer[0].bias
    assert y.dtype == torch.float32 and bias.dtype == torch.float32
    # the product of the bf16-rounded input and weight (summed in float32 or wider), rounded once to bf16, plus the
    # float32 bias: within one bf16 step of it (the order of the sum may move a value across a rounding boundary)
    product = x.bfloat16().double() @ w.double().T
    assert ((y - bias).double() - product).abs().le(product.abs() * 2 ** -8 + 1e-6).all()
    assert 0 < (y - exact).abs().max().item() < 0.05


def test_bf16_generate_compiled_stays_within_bf16_rounding_of_eager(lm, tokenizer, reward_model):
    """Not token-identical in general: inductor fuses the bf16 products with their neighbours and rounds at other
    points (on SmolLM2 1-4 of 8 greedy rows part from eager: docs/performance.md), so the compiled step's logits are
    held to bf16's precision of the eager ones, step by step while the two runs have chosen the same tokens."""
    eager = _generate(lm, tokenizer, reward_model, do_sample=False, dtype="bfloat16", return_traces=True)
    compiled = _generate(lm, tokenizer, reward_model, do_sample=False, dtype="bfloat16", compile=True,
                         return_traces=True)
    compared = compared_top_logits(eager, compiled, 2 ** -6)
    assert compared >= 3 * 8  # rows x steps compared: at least 8 steps of each of the 3 rows


def test_lm_runner_wraps_in_order(lm):
    runner = lm_runner(lm, compile=True, dtype="int8")
    assert isinstance(runner, StaticLM) and runner.model is as_int8(lm)
    assert runner.eval() is runner and runner.to("cpu") is runner  # nn.Module's self-returning methods
    assert runner.config is runner.model.config and lm_runner(lm) is lm  # attribute reads reach the model
    assert isinstance(runner.make_batch(), StaticLMBatch)


@pytest.mark.parametrize("kw, message", [
    ({"compile": "yes"}, "compile must be True or False"),
    ({"dtype": "int4"}, "dtype='int4': choose one of 'float32', 'bfloat16', 'int8'"),
    ({"engine": "llama.cpp", "dtype": "bfloat16"}, "compile and dtype apply to engine='steerkit'"),
    ({"engine": "llama.cpp", "compile": True}, "compile and dtype apply to engine='steerkit'"),
    ({"engine": "llama.cpp", "dtype": "int8"}, "compile and dtype apply to engine='steerkit'"),
])
def test_bad_lm_options_are_typed_errors_before_anything_loads(kw, message):
    with pytest.raises(InvalidArgumentError, match=message):
        steerkit.generate("x", lm="/nonexistent/model", **kw)


def test_config_and_cli_carry_compile_and_dtype(tmp_path, tiny_backbone_dir):
    cfg = SteeringConfig.from_dict({"compile": True, "dtype": "int8"})
    assert (cfg.compile, cfg.dtype) == (True, "int8")
    with pytest.raises(ConfigError, match="dtype"):
        SteeringConfig.from_dict({"dtype": "float16"})
    with pytest.raises(ConfigError, match="compile and dtype apply to engine='steerkit'"):
        SteeringConfig.from_dict({"engine": "llama.cpp", "compile": True})
    result = CliRunner().invoke(app, ["generate", "hello", "--lm", str(tiny_backbone_dir), "--dtype", "int8",
                                      "--no-compile", "-t", "4", "--greedy", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert (payload["compile"], payload["dtype"]) == (False, "int8") and payload["generations"][0]["num_new_tokens"] == 4
    bad = CliRunner().invoke(app, ["generate", "hello", "--lm", str(tiny_backbone_dir), "--dtype", "bf16"])
    assert isinstance(bad.exception, ConfigError) and "dtype: Input should be 'float32', 'bfloat16' or 'int8'" in str(bad.exception)


def test_the_servers_setup_path_gives_the_compiled_int8_lm(tiny_backbone_dir):
    """``steerkit serve --compile --dtype int8`` reaches the server's engine through its config (serving.loading)."""
    from steerkit.serving.loading import engine_parts

    parts = engine_parts(SteeringConfig.from_dict({"lm": str(tiny_backbone_dir), "compile": True, "dtype": "int8"}))
    assert isinstance(parts.lm, StaticLM) and parts.lm.compiled
    assert any(isinstance(m, Int8Linear) for m in parts.lm.model.modules())
    # on a CPU a float32 sequence reward's scoring stays eager (it compiles with torch-int8 on a CPU that multiplies
    # int8: test_static_scoring.py); whatever compiles has its buckets warmed when the engine is built
    sequence = [r for r in parts.rewards.values() if isinstance(r, RewardModelScorer)]
    assert sequence and all(r.static is None for r in sequence)


def test_the_servers_setup_path_gives_the_bf16_lm_and_bf16_rewards(tiny_backbone_dir, tmp_path, monkeypatch):
    """``steerkit serve --dtype bfloat16 --backend torch-bf16-compute``: the server's LM and its torch rewards multiply
    in bf16 (serving.loading, through the same config fields as every surface)."""
    from steerkit import registry
    from steerkit.linear_precision import Bf16MatmulLinear
    from steerkit.rewards.model import RewardModel
    from steerkit.serving.loading import engine_parts

    reward_dir = RewardModel.from_backbone(str(tiny_backbone_dir), name="tiny-served").save_pretrained(tmp_path / "rm")
    monkeypatch.setenv("STEERKIT_PLUGINS", "")  # the config's reward only, not every installed plugin
    registry.reset()
    try:
        parts = engine_parts(SteeringConfig.from_dict({
            "lm": str(tiny_backbone_dir), "dtype": "bfloat16", "backend": "torch-bf16-compute",
            "rewards": [{"name": str(reward_dir), "beta": -2.0}]}))
    finally:
        monkeypatch.delenv("STEERKIT_PLUGINS")
        registry.reset()
    assert any(isinstance(m, Bf16MatmulLinear) for m in parts.lm.modules())
    (reward,) = parts.rewards.values()
    assert reward.backend == "torch-bf16-compute"
    assert any(isinstance(m, Bf16MatmulLinear) for m in reward.model.backbone.modules())
