"""The evaluation runner: streaming JSONL, resume after an interruption, metrics, report and plots."""

import json

import pytest

from steerkit.errors import ConfigError, DataError
from steerkit.evaluation import EvalConfig, EvalRunner
from steerkit.evaluation.prompts import load_prompts
from steerkit.evaluation.scorers.base import BaseScorer
from steerkit.evaluation.store import JsonlStore
from steerkit.rewards.sequence.scorer import RewardModelScorer
from tiny import tiny_lm

PROMPTS = ["The quick", "I love", "This is", "Numbers and", "You are"]


class VowelScorer(BaseScorer):
    name = "vowels"
    measures = "toxicity"
    description = "share of vowels (a stand-in judge)"

    def _score(self, texts):
        return [sum(c in "aeiou" for c in t) / max(len(t), 1) for t in texts]


class HasO(BaseScorer):
    name = "has-o"
    measures = "sentiment"
    description = "1 if the text contains an o"

    def _score(self, texts):
        return [1.0 if "o" in t else 0.0 for t in texts]


@pytest.fixture
def prompt_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": i, "prompt": {"text": t}}) + "\n" for i, t in enumerate(PROMPTS)))
    return path


@pytest.fixture(scope="module")
def eval_lm(tokenizer):
    return tiny_lm(tokenizer, seed=9)


def make_runner(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm, out="run", **cfg):
    values = {"betas": [5, 40], "num_continuations": 3, "max_new_tokens": 5, **cfg}
    config = EvalConfig(task="toxicity", prompts=[{"path": str(prompt_file), "name": "tiny"}], reward="tiny",
                        output=str(tmp_path / out), **values)
    return EvalRunner(config, lm=(lm, tokenizer), rewards={"tiny": RewardModelScorer(reward_model, name="tiny")},
                      scorers=[VowelScorer(), HasO()], eval_lm=(eval_lm, tokenizer), progress=False)


def lines(path):
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]


def test_full_run_writes_every_artifact(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm):
    runner = make_runner(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm)
    result = runner.run()
    out = tmp_path / "run"
    gens = lines(out / "generations.jsonl")
    assert len(gens) == len(PROMPTS) * 3  # 3 settings: unsteered-k20, k20-beta5, k20-beta40
    assert {g["setting"] for g in gens} == {"unsteered-k20", "k20-beta5", "k20-beta40"}
    assert all(len(g["continuations"]) == 3 for g in gens)
    assert len(lines(out / "scores.jsonl")) == 2 * len(gens)
    assert len(lines(out / "fluency.jsonl")) == len(gens)
    rows = {r["setting"]: r for r in result["results"]}
    for r in rows.values():
        assert r["num_prompts"] == len(PROMPTS)
        assert r["perplexity"] > 1 and r["perplexity_median"] > 1 and 0 <= r["dist2"] <= 1 and r["tokens_per_second"] > 0
        assert set(r["scorers"]) == {"vowels", "has-o"}
        assert set(r["scorers"]["vowels"]) == {"avg_max_toxicity", "toxic_rate", "mean_toxicity"}
    assert rows["k20-beta40"]["rewards"] == [{"name": "tiny", "beta": -40.0}]  # toxicity: steer away
    report = (out / "report.md").read_text()
    assert "Avg Max Toxicity" in report and "Positive Rate" in report and "RAD β=40" in report and "median ppl" in report
    plots = {p.name for p in (out / "plots").iterdir()}
    assert {"toxicity_vs_perplexity_tiny_vowels.png", "toxicity_vs_perplexity_tiny_vowels.json",
            "positive_rate_vs_perplexity_tiny_has-o.png", "trace_k20-beta40.png", "trace_k20-beta40.json"} <= plots
    data = json.loads((out / "plots" / "toxicity_vs_perplexity_tiny_vowels.json").read_text())
    for x in ("perplexity", "perplexity_median"):  # one row of panels per perplexity summary
        series = [s for s in data["series"] if s.get("metric") == "avg_max_toxicity" and s["x"] == x]
        assert [p["beta"] for s in series for p in s["points"]] == [0.0, 5.0, 40.0]
        assert [p["x"] for s in series for p in s["points"]] == [rows[n][x] for n in ("unsteered-k20", "k20-beta5", "k20-beta40")]
    trace = json.loads((out / "traces" / "k20-beta40.json").read_text())
    assert 1 <= len(trace["steps"]) <= 5
    step = trace["steps"][0]
    assert len(step["candidates"]) == 20 and len(step["rewards"]["tiny"]) == 20 and 0 <= step["chosen"] < 20


def test_steering_lowers_the_reward_it_steers_against(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm):
    runner = make_runner(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm, fluency=False, trace=False,
                         plots=False, betas=[200], num_continuations=6)
    runner._scorers = [VowelScorer()]
    runner.run(["generate"])
    gens = list(runner.generations)
    mean = {}
    for setting in ("unsteered-k20", "k20-beta200"):
        texts = [t for g in gens if g["setting"] == setting for t in g["continuations"]]
        mean[setting] = sum(reward_model.score_texts(texts)) / len(texts)
    assert mean["k20-beta200"] < mean["unsteered-k20"] - 0.05


def test_interrupted_run_resumes_without_duplicates_or_losses(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm):
    reference = make_runner(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm, out="ref", trace=False, plots=False)
    expected = reference.run()

    runner = make_runner(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm, out="run", trace=False, plots=False)
    calls = {"n": 0}
    original = runner.generator

    def interrupting(setting):
        gen = original(setting)
        inner = gen.generate

        def generate(*a, **kw):
            calls["n"] += 1
            if calls["n"] == 7:  # Ctrl-C in the middle of the 7th unit (prompt 3, setting 1)
                raise KeyboardInterrupt
            return inner(*a, **kw)

        gen.generate = generate
        return gen

    runner.generator = interrupting
    with pytest.raises(KeyboardInterrupt):
        runner.run()
    path = tmp_path / "run" / "generations.jsonl"
    assert len(lines(path)) == 6
    with path.open("a") as fh:  # a kill during a write leaves a partial line behind
        fh.write('{"prompt_set": "tiny", "index": 2, "setting": "k20-be')

    resumed = make_runner(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm, out="run", trace=False, plots=False)
    assert len(resumed.pending()) == len(PROMPTS) * 3 - 6
    done_before = {(g["prompt_set"], g["index"], g["setting"]) for g in lines(path)}
    result = resumed.run()
    records = lines(path)
    keys = [(g["prompt_set"], g["index"], g["setting"]) for g in records]
    assert len(keys) == len(set(keys)) == len(PROMPTS) * 3  # no duplicates, nothing lost
    assert done_before <= set(keys)
    # the resumed run is identical to an uninterrupted one (per-prompt seeds)
    ref = {(g["prompt_set"], g["index"], g["setting"]): g["continuations"] for g in lines(tmp_path / "ref" / "generations.jsonl")}
    assert {k: g["continuations"] for k, g in zip(keys, records)} == ref
    strip = lambda res: [{k: v for k, v in r.items() if k not in ("tokens_per_second", "seconds", "seconds_per_prompt")}
                         for r in res["results"]]
    assert strip(result) == strip(expected)
    # running again does nothing new
    again = make_runner(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm, out="run", trace=False, plots=False)
    assert again.pending() == [] and again.generate() == 0 and again.score() == 0 and again.compute_fluency() == 0
    assert len(lines(path)) == len(PROMPTS) * 3


def test_scoring_resumes_too(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm):
    runner = make_runner(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm, fluency=False, trace=False)
    runner.run(["generate"])
    calls = []

    class Counting(VowelScorer):
        def _score(self, texts):
            calls.append(len(texts))
            return super()._score(texts)

    runner._scorers = [Counting()]
    runner.score(chunk_prompts=4)
    assert sum(calls) == len(PROMPTS) * 3 * 3
    scores = tmp_path / "run" / "scores.jsonl"
    kept = scores.read_text().splitlines()[:5]
    scores.write_text("\n".join(kept) + "\n")
    calls.clear()
    again = make_runner(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm, fluency=False, trace=False)
    again._scorers = [Counting()]
    again.score()
    assert sum(calls) == (len(PROMPTS) * 3 - 5) * 3


def test_metrics_use_prompts_finished_under_every_setting(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm):
    runner = make_runner(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm, fluency=False, trace=False, plots=False)
    runner.generate(limit=7)  # prompts 0 and 1 under all 3 settings, prompt 2 under one
    runner.score()
    result = runner.compute_metrics()
    assert {r["num_prompts"] for r in result["results"]} == {2}


def test_changed_parameters_refuse_to_mix_with_old_generations(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm):
    make_runner(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm, fluency=False).generate(limit=2)
    with pytest.raises(ConfigError, match="other parameters"):
        make_runner(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm, max_new_tokens=7)
    # adding a β to the grid is fine: old units are reused, new ones are pending
    more = make_runner(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm, betas=[5, 40, 80])
    assert len(more.pending()) == len(PROMPTS) * 4 - 2


def test_changed_prompt_file_is_detected(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm):
    make_runner(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm).generate(limit=1)
    prompt_file.write_text(json.dumps({"prompt": {"text": "Something else"}}) + "\n")
    with pytest.raises(DataError, match="prompt file changed"):
        make_runner(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm)


def test_composed_setting_steers_with_two_rewards(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm):
    from tiny import tiny_reward

    other = RewardModelScorer(tiny_reward(tokenizer, seed=7, name="other"), name="other")
    config = EvalConfig(task="sentiment", prompts=[{"path": str(prompt_file), "name": "tiny", "limit": 2}],
                        betas=[], num_continuations=2, max_new_tokens=4, output=str(tmp_path / "composed"),
                        settings=[{"name": "both", "k": 10, "rewards": [{"name": "tiny", "beta": -30},
                                                                          {"name": "other", "beta": 30}]}])
    runner = EvalRunner(config, lm=(lm, tokenizer), rewards={"tiny": RewardModelScorer(reward_model, name="tiny"),
                                                             "other": other},
                        scorers=[VowelScorer(), HasO()], eval_lm=(eval_lm, tokenizer), progress=False)
    result = runner.run()
    assert [r["setting"] for r in result["results"]] == ["unsteered-k20", "both"]
    trace = json.loads((tmp_path / "composed" / "traces" / "both.json").read_text())
    assert set(trace["steps"][0]["rewards"]) == {"tiny", "other"}
    assert "both (tiny β=-30, other β=+30)" in (tmp_path / "composed" / "report.md").read_text()


def test_estimate_reports_per_setting_costs(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm):
    est = make_runner(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm).estimate()
    assert est["prompts"] == len(PROMPTS) and est["settings"] == 3
    assert set(est["generation"]) == {"unsteered-k20", "k20-beta5", "k20-beta40"}
    assert est["total_seconds"] > 0 and est["fluency_seconds"] > 0
    assert not (tmp_path / "run" / "generations.jsonl").exists() or not lines(tmp_path / "run" / "generations.jsonl")


# -- prompt files and the store ----------------------------------------------------------------------
def test_load_prompts_dotted_field_limit_offset(tmp_path, prompt_file):
    prompts = load_prompts(prompt_file, "prompt.text", limit=2, offset=1)
    assert [(p.index, p.text) for p in prompts] == [(1, "I love"), (2, "This is")]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": {"text": "ok"}}\n{"prompt": {"txt": "x"}}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: no field 'prompt.text'.*available: \['txt'\]"):
        load_prompts(bad)
    bad.write_text('{"prompt": {"text": "ok"}}\nnot json\n')
    with pytest.raises(DataError, match="bad.jsonl:2: not valid JSON"):
        load_prompts(bad)
    bad.write_text('{"prompt": {"text": ""}}\n')
    with pytest.raises(DataError, match="non-empty"):
        load_prompts(bad)
    with pytest.raises(DataError, match="does not exist"):
        load_prompts(tmp_path / "missing.jsonl")


def test_store_drops_a_partial_last_line_and_rejects_corruption(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text('{"k": 1}\n{"k": 2}\n{"k": ')
    store = JsonlStore(path, lambda r: r["k"])
    assert len(store) == 2 and path.read_text() == '{"k": 1}\n{"k": 2}\n'
    store.append({"k": 3})
    assert [json.loads(l)["k"] for l in path.read_text().splitlines()] == [1, 2, 3]
    path.write_text('{"k": 1}\ngarbage\n{"k": 2}\n')
    with pytest.raises(DataError, match="s.jsonl:2 is not valid JSON"):
        JsonlStore(path, lambda r: r["k"])


def test_store_keeps_text_with_unicode_line_separators(tmp_path):
    """Generated text holds U+2028, U+0085, form feeds…: json.dumps(ensure_ascii=False) writes them raw, so the
    store must split lines on "\n" alone (a resumed run once refused such a file as corrupted)."""
    path = tmp_path / "g.jsonl"
    texts = ["a\u2028b", "c\x85d", "e\x0cf\x0bg", "h\u2029i\x1cj\x1dk\x1el", "m\rn", "plain"]
    store = JsonlStore(path, lambda r: r["k"])
    store.extend([{"k": i, "text": t} for i, t in enumerate(texts)])
    reopened = JsonlStore(path, lambda r: r["k"])
    assert [reopened.get(i)["text"] for i in range(len(texts))] == texts
    reopened.append({"k": 99, "text": "after"})
    assert len(JsonlStore(path, lambda r: r["k"])) == len(texts) + 1


def test_fluency_on_a_subsample_of_continuations(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm):
    runner = make_runner(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm, trace=False, plots=False,
                         fluency_samples=2, betas=[5])
    result = runner.run(["generate", "fluency"])
    assert all(len(r["perplexities"]) == 2 for r in lines(tmp_path / "run" / "fluency.jsonl"))
    assert all(r["perplexity"] > 1 for r in result["results"])


def test_more_fluency_samples_extend_earlier_records(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm):
    common = dict(trace=False, plots=False, betas=[5])
    first = make_runner(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm, fluency_samples=1, **common)
    first.run(["generate", "fluency"])
    one = {(r["index"], r["setting"]): r["perplexities"] for r in lines(tmp_path / "run" / "fluency.jsonl")}
    assert all(len(v) == 1 for v in one.values())
    more = make_runner(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm, fluency_samples=3, **common)
    assert more.compute_fluency() == len(one)  # every record extended, generations untouched
    store = JsonlStore(tmp_path / "run" / "fluency.jsonl", lambda r: (r["index"], r["setting"]))
    fresh = make_runner(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm, out="fresh", fluency_samples=3,
                        **common)
    fresh.run(["generate", "fluency"])
    want = {(r["index"], r["setting"]): r["perplexities"] for r in lines(tmp_path / "fresh" / "fluency.jsonl")}
    for key, values in one.items():
        extended = store.get(key)["perplexities"]
        assert len(extended) == 3 and extended[0] == values[0]
        assert extended == pytest.approx(want[key], rel=1e-5)
    assert more.compute_fluency() == 0  # nothing left to do
    # asking for fewer again uses the first m stored values, so the metric means the same thing
    fewer = make_runner(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm, fluency_samples=1, **common)
    rows = {r["setting"]: r for r in fewer.compute_metrics()["results"]}
    firsts = {s: [one[(i, s)][0] for i in range(len(PROMPTS))] for s in rows}
    for s, r in rows.items():
        assert r["perplexity"] == pytest.approx(sum(firsts[s]) / len(firsts[s]))


def test_device_is_validated_and_recorded(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm):
    with pytest.raises(ConfigError, match="not a torch device"):
        EvalConfig.from_dict({"prompts": [{"path": str(prompt_file)}], "device": "gpu0"})
    runner = make_runner(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm, device="cpu", betas=[5])
    runner.generate(limit=1)
    assert [r["device"] for r in runner.generations] == ["cpu"]


def test_cuda_without_a_gpu_is_a_config_error(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    runner = make_runner(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm, device="cuda")
    with pytest.raises(ConfigError, match="no CUDA GPU"):
        runner.generate()


def test_a_compiled_run_writes_the_eager_runs_continuations(tmp_path, prompt_file, tokenizer, reward_model, eval_lm,
                                                           inductor_cache, monkeypatch):
    """The eager run (compile off) and a run whose config leaves compile to steerkit, on a device where compiling pays
    (the CPU made to count as one): the same continuations, and each record says how it was made."""
    import steerkit.compiling

    lm = tiny_lm(tokenizer, seed=4)  # its own object: what a process has compiled is per model object
    logs = []
    eager = make_runner(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm, out="eager", betas=[40],
                        compile=False)
    eager.generate()
    monkeypatch.setitem(steerkit.compiling.COMPILE_PAYS_AFTER_STEPS, "cpu", 1)
    auto = make_runner(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm, out="auto", betas=[40])
    auto.log = logs.append
    auto.generate()
    assert auto.config.compile is None and any("Compiling the decode step: 50 decode steps on cpu" in m for m in logs)
    runs = [lines(tmp_path / out / "generations.jsonl") for out in ("eager", "auto")]
    assert [r["continuations"] for r in runs[1]] == [r["continuations"] for r in runs[0]]
    assert {r["compiled"] for r in runs[0]} == {False} and {r["compiled"] for r in runs[1]} == {True}
    assert any(inductor_cache.iterdir())


def test_eval_compiles_by_itself_only_where_its_decode_steps_pay(tmp_path, prompt_file, lm, tokenizer, reward_model,
                                                                 eval_lm, monkeypatch):
    import steerkit.compiling
    from steerkit.compiling import compile_pays

    assert compile_pays("cuda", 1200) and compile_pays("cuda:1", 10**6) and not compile_pays("cuda", 1199)
    assert not compile_pays("cpu", 10**9) and not compile_pays(None, 10**9) and not compile_pays("mps", 10**9)
    # 5 prompts x 2 settings, 7 continuations in batches of 3 (3 forwards a unit), 5 tokens: 150 decode steps
    runner = make_runner(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm, betas=[5], num_continuations=7,
                         batch_size=3)
    todo = runner.pending()
    assert len(todo) == 10 and runner.compile_choice(todo) is False  # the CPU
    monkeypatch.setitem(steerkit.compiling.COMPILE_PAYS_AFTER_STEPS, "cpu", 150)
    assert runner.compile_choice(todo) is True and runner.compile_choice(todo[1:]) is False
    forced = make_runner(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm, out="forced", betas=[5],
                         compile=False)
    assert forced.compile_choice(forced.pending()) is False  # the config's choice stands
    assert EvalConfig.from_dict({"prompts": [{"path": str(prompt_file)}], "compile": True}).compile is True


def test_an_int8_run_draws_what_the_python_api_draws_at_int8_under_keys_of_its_own(tmp_path, prompt_file, tokenizer,
                                                                                  reward_model, eval_lm):
    """``dtype`` reaches the LM: each record of an int8 run is what ``assemble(..., dtype="int8")`` draws for that
    unit's seed, which on this model is not what float32 draws; the run's keys differ from float32's, so neither
    run directory resumes the other's generations."""
    from steerkit.assembly import assemble
    from steerkit.evaluation.prompts import unit_seed

    import torch

    lm = tiny_lm(tokenizer, seed=4)
    with torch.no_grad():  # logits spread wide enough that int8's rounding moves some draws (a random init's are flat)
        lm.lm_head.weight.mul_(300)
    f32 = make_runner(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm, out="f32", betas=[],
                      compile=False)  # unsteered: the LM's logits alone pick the tokens
    int8 = make_runner(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm, out="int8", betas=[],
                       compile=False, dtype="int8")
    assert set(int8.keys) == set(f32.keys) and all(int8.keys[n] != f32.keys[n] for n in f32.keys)
    assert int8.generate() == len(PROMPTS)
    records = lines(tmp_path / "int8" / "generations.jsonl")
    assert {(r["engine"], r["dtype"]) for r in records} == {("steerkit", "int8")}
    (setting,) = int8.settings
    cfg = int8.config
    drawn = {}
    for dtype in ("int8", "float32"):
        gen = assemble((lm, tokenizer), int8.terms(setting), k=setting.k, dtype=dtype).generator()
        drawn[dtype] = [gen.generate([r["prompt"]], max_new_tokens=cfg.max_new_tokens, do_sample=True,
                                     temperature=cfg.temperature, num_return_sequences=cfg.num_continuations,
                                     seed=unit_seed(cfg.seed, r["prompt_set"], r["index"])).texts for r in records]
    assert [r["continuations"] for r in records] == drawn["int8"]
    assert drawn["int8"] != drawn["float32"]  # else this test could not tell the two apart
    with pytest.raises(ConfigError, match="made with other parameters"):  # float32 asked of the int8 run's directory
        make_runner(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm, out="int8", betas=[], compile=False)


def test_the_default_engine_and_dtype_keep_the_keys_runs_were_made_with(prompt_file):
    """Runs made before ``engine`` and ``dtype`` existed resume: the defaults leave a setting's key as it was."""
    import hashlib

    cfg = EvalConfig.from_dict({"prompts": [{"path": str(prompt_file)}], "betas": [20]})
    for setting in cfg.grid():
        payload = {"lm": cfg.lm, "k": setting.k, "rewards": [r.model_dump() for r in setting.rewards],
                   "n": cfg.num_continuations, "max_new_tokens": cfg.max_new_tokens,
                   "temperature": cfg.temperature, "seed": cfg.seed, "backend": cfg.backend}
        assert cfg.setting_key(setting) == hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
    llama = cfg.with_overrides({"engine": "llama.cpp"})
    assert all(llama.setting_key(s) != cfg.setting_key(s) for s in cfg.grid())


@pytest.mark.parametrize("values, field", [
    ({"engine": "vllm"}, "engine"),
    ({"dtype": "int4"}, "dtype"),
    ({"engine": "llama.cpp", "compile": True}, "compile and dtype apply to engine='steerkit'"),
    ({"engine": "llama.cpp", "dtype": "int8"}, "compile and dtype apply to engine='steerkit'"),
    ({"engine": "llama.cpp", "device": "cuda"}, "runs on the CPU"),
], ids=["engine", "dtype", "llama-compile", "llama-int8", "llama-cuda"])
def test_bad_lm_options_in_an_eval_config_are_config_errors(prompt_file, values, field):
    with pytest.raises(ConfigError, match=field):
        EvalConfig.from_dict({"prompts": [{"path": str(prompt_file)}], **values})


def test_a_llama_cpp_run_leaves_compile_off_by_itself(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm,
                                                      monkeypatch):
    """Where compiling would pay, a llama.cpp run still does not compile: llama.cpp runs its own graph."""
    import steerkit.compiling

    monkeypatch.setitem(steerkit.compiling.COMPILE_PAYS_AFTER_STEPS, "cpu", 1)
    steer = make_runner(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm, out="a")
    llama = make_runner(tmp_path, prompt_file, lm, tokenizer, reward_model, eval_lm, out="b", engine="llama.cpp")
    assert steer.compile_choice(steer.pending()) is True and llama.compile_choice(llama.pending()) is False
