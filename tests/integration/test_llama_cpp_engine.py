"""``engine="llama.cpp"`` (issue 25, item 1): the engine core with llama.cpp running the LM, on the packaged
SmolLM2 GGUF and the same weights at F32.

* **Agreement on equal weights.** The packaged Q4_1 file dequantized to an F32 GGUF holds exactly the weights
  steerkit's own engine runs (it dequantizes the same file). Greedy RAD through llama.cpp picks the same token as
  steerkit's engine at every step of their common prefix where the two LMs' top-k sets agree and the best
  reweighted score leads the second by more than the logits' measured disagreement (a tie within float noise may
  go either way); the first divergence must be such a step.
* **Both llama.cpp paths are one step.** ``generate(engine="llama.cpp")`` equals llama-cpp-python's own loop with
  :class:`~steerkit.integrations.llama_cpp.LlamaCppRAD`, token for token.
* **Rows and slots.** A batch equals each prompt alone; batches in chunks reuse llama.cpp's sequences.
* **Surfaces.** The CLI (``--engine``), a config file (``engine: llama.cpp``) and ``steerkit serve`` with the real
  ``openai`` client give the Python API's tokens; bad choices are typed errors.

Skips, with the install command, where llama-cpp-python is absent."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import NO_LLAMA_CPP, generate_cli, requires_smollm2
from serve_support import queued_tokens

llama_cpp = pytest.importorskip("llama_cpp", reason=NO_LLAMA_CPP)

pytestmark = [pytest.mark.integration, requires_smollm2, pytest.mark.slow, pytest.mark.timeout(900)]

LM = "smollm2-135m-instruct"
PROMPTS = ["You are such a", "The weather today is", "I think that people who", "Once upon a time",
           "My neighbour told me that"]


@pytest.fixture(scope="module")
def f32_gguf(tmp_path_factory):
    from steerkit.integrations.gguf_files import convert_gguf
    from steerkit.models import resolve

    return convert_gguf(resolve(LM).location, tmp_path_factory.mktemp("gguf") / "smollm2-f32.gguf", "F32")


@pytest.fixture(scope="module")
def hf():
    from steerkit.models import load_causal_lm_cached

    return load_causal_lm_cached(LM)[:2]


def _choices(out, row):
    return [(s.topk_ids[row], s.topk_logits[row], s.scores[row], int(s.chosen[row])) for s in out.traces[0]]


@pytest.mark.parametrize("rewards", [{"toxicity-token": -20.0}, {"toxicity": -20.0}], ids=["token", "sequence"])
def test_greedy_rad_agrees_with_steerkits_engine_on_f32_weights(f32_gguf, hf, rewards):
    import steerkit
    from steerkit.engine.llama_cpp_lm import LlamaCppLM

    model, tokenizer = hf
    prompts = PROMPTS if "toxicity-token" in rewards else PROMPTS[:2]
    kwargs = dict(rewards=rewards, k=20, max_new_tokens=32, do_sample=False, return_traces=True)
    ours = steerkit.generate(prompts, lm=(model, tokenizer), **kwargs)
    theirs = steerkit.generate(prompts, lm=(LlamaCppLM(str(f32_gguf), threads=1), tokenizer), **kwargs)
    compared = identical = 0
    for row in range(len(prompts)):
        for step, (a, b) in enumerate(zip(_choices(ours, row), _choices(theirs, row))):
            ids_a, z_a, scores_a, pick_a = a
            ids_b, z_b, scores_b, pick_b = b
            if pick_a < 0 or pick_b < 0:  # the row has finished (its end-of-sequence token was compared already)
                assert pick_a == pick_b
                break
            same_topk = set(ids_a.tolist()) == set(ids_b.tolist())
            if same_topk:  # the two LMs' logits of the same candidates: F32 on both sides, so close
                order = {t: i for i, t in enumerate(ids_b.tolist())}
                gap = float((z_a - z_b[[order[t] for t in ids_a.tolist()]]).abs().max())
                assert gap < 0.05, f"row {row} step {step}: logits differ by {gap} on equal weights"
            top2 = scores_a.sort(descending=True).values[:2]
            clear = same_topk and float(top2[0] - top2[1]) > 2 * gap + 1e-3
            token_a, token_b = int(ids_a[pick_a]), int(ids_b[pick_b])
            if clear:
                compared += 1
                assert token_a == token_b, f"row {row} step {step}: top-k agree with a clear lead, tokens differ"
            if token_a != token_b:
                break  # the texts part here (a near tie or different top-k): nothing after is comparable
            identical += 1
    assert compared >= 20 * len(prompts) // 2, f"only {compared} steps compared"
    assert identical >= compared


def test_the_llama_cpp_lm_stops_where_steerkits_engine_stops(f32_gguf, hf):
    from steerkit.decoding import eos_ids
    from steerkit.engine.llama_cpp_lm import LlamaCppLM

    model, tokenizer = hf
    lm = LlamaCppLM(str(f32_gguf), threads=1)
    assert eos_ids(lm, tokenizer) == eos_ids(model, tokenizer)  # not llama.cpp's wider end-of-generation set
    assert lm.vocab_size == model.config.vocab_size and lm.config.max_position_embeddings == 8192


def test_generate_through_llama_cpp_equals_llama_cpp_pythons_own_loop():
    import steerkit
    from steerkit.integrations.llama_cpp import LlamaCppRAD, load_llama
    from steerkit.models import load_tokenizer, resolve

    prompt = PROMPTS[0]
    ours = steerkit.generate([prompt], lm=LM, engine="llama.cpp", rewards={"toxicity-token": -20}, k=20,
                             max_new_tokens=24, do_sample=False)
    tokenizer = load_tokenizer(LM)
    llm = load_llama(resolve(LM).location, n_ctx=256, n_threads=1, verbose=False)
    rad = LlamaCppRAD.from_rewards(tokenizer, {"toxicity-token": -20}, k=20)
    ids = tokenizer(prompt)["input_ids"]
    theirs = llm.create_completion(ids, max_tokens=24, temperature=0, top_k=0, top_p=1.0, min_p=0.0,
                                   repeat_penalty=1.0, logits_processor=llama_cpp.LogitsProcessorList([rad]))
    assert ours.texts[0] == theirs["choices"][0]["text"]


def test_a_batch_equals_each_row_alone_and_sequences_are_reused():
    import steerkit

    kwargs = dict(lm=LM, engine="llama.cpp", rewards={"toxicity-token": -10}, k=10, max_new_tokens=16,
                  do_sample=False)
    together = steerkit.generate(PROMPTS[:3], **kwargs)
    chunked = steerkit.generate(PROMPTS[:3], batch_size=2, **kwargs)  # 2 rows, then 1: sequences given back
    alone = [steerkit.generate([p], **kwargs).texts[0] for p in PROMPTS[:3]]
    assert together.texts == alone == chunked.texts


def test_a_context_grows_to_the_shape_asked_not_the_product_of_two_shapes():
    """A few long rows, then many short ones: the context is re-created for the many short rows (64 x 256 cells),
    not for 64 rows of the earlier 4,096 tokens (6 GB of KV for SmolLM2: a wide generate after a server's
    reservation in one process was killed for memory)."""
    from steerkit.engine.llama_cpp_lm import LlamaCppLM
    from steerkit.models import resolve

    lm = LlamaCppLM(resolve(LM).location, threads=1)
    lm.ensure(2, 4096)
    assert (lm.slots, lm.tokens_per_slot) == (2, 4096)
    lm.ensure(64, 200)
    assert (lm.slots, lm.tokens_per_slot) == (64, 256)
    lm.ensure(8, 256)  # covered: kept
    assert (lm.slots, lm.tokens_per_slot) == (64, 256)


def test_a_decode_runs_its_rows_in_sequence_order_and_returns_them_in_the_callers():
    """llama.cpp runs tokens of a KV stream per sequence as one micro-batch only where their sequences rise by one
    from token to token; rows that came back in another order ran as one pass over the weights per row (1.6x the
    step's time at 25 rows). A decode hands llama.cpp its tokens in sequence order and gives the rows back in the
    caller's: the logits of rows listed in a scrambled order are the logits of the same rows listed in order. Free
    sequences are taken lowest first, so a batch's rows hold consecutive ones."""
    from steerkit.engine.llama_cpp_lm import LlamaCppLM
    from steerkit.models import load_tokenizer, resolve

    tokenizer = load_tokenizer(LM)
    ids = [tokenizer(p).input_ids for p in PROMPTS[:4]]
    results = []
    for order in ([0, 1, 2, 3], [2, 0, 3, 1]):  # the rows' sequences, in the order the caller lists the rows
        lm = LlamaCppLM(resolve(LM).location, threads=1)
        lm.ensure(4, 64)
        assert [lm.take_slot() for _ in range(4)] == [0, 1, 2, 3]
        seen = []
        decode_sorted = lm._decode_sorted
        lm._decode_sorted = lambda tokens, positions, slots, *rest: (seen.append(list(slots)),
                                                                      decode_sorted(tokens, positions, slots, *rest))[1]
        tokens = [t for i in order for t in ids[i]]  # row r is prompt order[r], in sequence order[r]
        positions = [p for i in order for p in range(len(ids[i]))]
        slots = [i for i in order for _ in ids[i]]
        marked = [p == len(ids[i]) - 1 for i in order for p in range(len(ids[i]))]
        prefill, _ = lm.decode(tokens, positions, slots, marked)
        step, _ = lm.decode([int(prefill[r].argmax()) for r in range(4)], [len(ids[i]) for i in order], order,
                            [True] * 4)
        assert all(call == sorted(call) for call in seen), seen  # llama.cpp saw every call in sequence order
        back = np.argsort(order)  # the rows in prompt order
        results.append((prefill[back], step[back]))
    for ordered, scrambled in zip(*results):
        np.testing.assert_array_equal(ordered, scrambled)
    lm.give_slot(1)
    lm.give_slot(0)
    assert lm.take_slot() == 0 and lm.take_slot() == 1  # the lowest free sequence first, whatever the order given back


def test_rows_with_one_prompt_run_it_once_and_share_its_cache():
    """``num_return_sequences`` rows of one prompt: llama.cpp decodes the prompt once and the other rows copy its
    sequence, so their first and next logits are the first row's, bitwise; greedy copies give the text of the
    prompt alone."""
    import steerkit
    from steerkit.engine.llama_cpp_batch import LlamaCppBatch
    from steerkit.engine.llama_cpp_lm import LlamaCppLM
    from steerkit.models import load_tokenizer, resolve

    tokenizer = load_tokenizer(LM)
    a, b = (tokenizer(p).input_ids for p in PROMPTS[:2])
    lm = LlamaCppLM(resolve(LM).location, threads=1)
    batch = LlamaCppBatch(lm)
    batch.reserve(5, 64)
    decoded = []
    decode_sorted = lm._decode_sorted
    lm._decode_sorted = lambda tokens, *rest: (decoded.append(len(tokens)), decode_sorted(tokens, *rest))[1]
    batch.prefill_padded([a, b, a, a, b])
    assert decoded == [len(a) + len(b)]  # each distinct prompt once
    first = batch.logits.clone()
    assert torch.equal(first[2], first[0]) and torch.equal(first[3], first[0]) and torch.equal(first[4], first[1])
    batch.advance(torch.tensor([11, 11, 11, 42, 11]))  # rows 0, 2 (and 4 against 1) take the same next token
    step = batch.logits
    assert torch.equal(step[2], step[0]) and torch.equal(step[4], step[1])  # read the copied caches
    assert not torch.equal(step[3], step[0])  # another token, other logits: the rows are distinct sequences
    kwargs = dict(lm=LM, engine="llama.cpp", rewards={"toxicity-token": -10}, k=10, max_new_tokens=12,
                  do_sample=False)
    copies = steerkit.generate(PROMPTS[:1], num_return_sequences=3, **kwargs).texts
    assert copies == steerkit.generate(PROMPTS[:1], **kwargs).texts * 3


def test_a_requests_n_rows_copy_one_prefill_into_sequences_of_their_own():
    """The server's rows of one prompt (a request's ``n``, short or chunked) decode it once; each copy holds a
    sequence of its own, and every seeded row draws what it draws alone."""
    from steerkit.engine.llama_cpp_batch import LlamaCppBatch
    from steerkit.engine.llama_cpp_lm import LlamaCppLM
    from steerkit.models import load_tokenizer, resolve
    from steerkit.serving.engine import Engine
    from steerkit.serving.requests import RowSpec

    tokenizer = load_tokenizer(LM)
    lm = LlamaCppLM(resolve(LM).location, threads=1)
    batch = LlamaCppBatch(lm)
    batch.reserve(4, 64)
    first = batch.prefill(tokenizer(PROMPTS[0]).input_ids)
    copy = batch.copy_prefilled(first)
    assert copy.slot != first.slot and torch.equal(copy.logits, first.logits)
    batch.join([first, copy])
    batch.advance(torch.tensor([11, 11]))
    assert torch.equal(batch.logits[1], batch.logits[0])
    batch.reset()

    positions = []  # of every token llama.cpp decodes
    decode_sorted = lm._decode_sorted
    lm._decode_sorted = lambda tokens, at, *rest: (positions.extend(np.asarray(at).tolist()),
                                                   decode_sorted(tokens, at, *rest))[1]
    long_prompt = " ".join(PROMPTS)  # longer than the chunk below

    def served(specs, chunk):
        return queued_tokens(Engine(lm, tokenizer, {}, default_k=5, max_running=4, max_queue=8, prefill_chunk=chunk),
                             specs, timeout=300)

    for prompt, chunk in ((PROMPTS[1], 256), (long_prompt, 8)):
        specs = [RowSpec(prompt, 6, seed=s, temperature=1.0) for s in (1, 2, 3)]
        length = len(tokenizer(prompt).input_ids)
        assert length > chunk or chunk == 256
        counts = []  # tokens decoded at the prompt's positions: by three rows together, then by one row alone
        for run in (specs, specs[:1]):
            positions.clear()
            out = served(run, chunk)
            counts.append(sum(p < length for p in positions))
        assert counts[0] == counts[1] >= length  # the prompt once for the three rows
        together = served(specs, chunk)
        assert together == [served([spec], chunk)[0] for spec in specs]
        assert out[0] == together[0]
        assert len({tuple(t) for t in together}) > 1


def test_seeded_sampling_repeats_and_the_seed_matters():
    import steerkit

    kwargs = dict(lm=LM, engine="llama.cpp", rewards={"toxicity-token": -10}, k=20, max_new_tokens=16,
                  temperature=1.0, num_return_sequences=3)
    a = steerkit.generate(PROMPTS[:1], seed=1, **kwargs).texts
    assert a == steerkit.generate(PROMPTS[:1], seed=1, **kwargs).texts
    assert a != steerkit.generate(PROMPTS[:1], seed=2, **kwargs).texts


def test_cli_and_config_file_run_llama_cpp(tmp_path):
    import steerkit
    from typer.testing import CliRunner

    from steerkit.cli import app

    expected = steerkit.generate(PROMPTS[:1], lm=LM, engine="llama.cpp", rewards={"toxicity-token": -20}, k=20,
                                 max_new_tokens=12, do_sample=False).texts
    runner = CliRunner()
    flags = runner.invoke(app, ["generate", "--engine", "llama.cpp", "-r", "toxicity-token=-20", "--greedy", "-t",
                                "12", "--json", PROMPTS[0]])
    assert flags.exit_code == 0, flags.output
    payload = json.loads(flags.stdout)
    assert payload["engine"] == "llama.cpp"
    assert [g["text"] for g in payload["generations"]] == expected
    config = tmp_path / "steer.yaml"
    config.write_text("engine: llama.cpp\nrewards: [{name: toxicity-token, beta: -20}]\nk: 20\ndo_sample: false\n"
                      f"max_new_tokens: 12\nprompts: [{json.dumps(PROMPTS[0])}]\n")
    from_file = runner.invoke(app, ["generate", "-c", str(config), "--json"])
    assert from_file.exit_code == 0, from_file.output
    assert [g["text"] for g in json.loads(from_file.stdout)["generations"]] == expected


def test_eval_runs_llama_cpp_and_draws_the_python_apis_tokens(tmp_path):
    """``steerkit eval --engine llama.cpp``: each prompt's continuations are what ``steerkit.generate`` draws through
    llama.cpp for that unit's seed, and each record says which engine made it."""
    import steerkit
    from typer.testing import CliRunner

    from steerkit.cli import app
    from steerkit.errors import ConfigError
    from steerkit.evaluation.prompts import unit_seed

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": {"text": p}}) + "\n" for p in PROMPTS[:2]))
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["eval", "toxicity", "--engine", "llama.cpp", "-p", f"tiny={prompts}", "-r",
                                      "toxicity-token", "-b", "20", "--no-baseline", "-n", "3", "-t", "10", "--seed",
                                      "5", "--stage", "generate", "-q", "-o", str(out)])
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (out / "generations.jsonl").read_text().splitlines()]
    assert len(records) == 2 and {(r["engine"], r["compiled"]) for r in records} == {("llama.cpp", False)}
    for r in records:
        expected = steerkit.generate([r["prompt"]], lm=LM, engine="llama.cpp", rewards={"toxicity-token": -20}, k=20,
                                     max_new_tokens=10, num_return_sequences=3, seed=unit_seed(5, "tiny", r["index"]))
        assert r["continuations"] == expected.texts
    refused = CliRunner().invoke(app, ["eval", "toxicity", "--engine", "llama.cpp", "--compile", "-p", str(prompts),
                                       "-o", str(tmp_path / "refused")])
    assert isinstance(refused.exception, ConfigError) and "compile and dtype apply" in str(refused.exception)
    assert "(got" not in str(refused.exception)  # a check across fields does not echo the whole config


def test_bad_choices_are_typed_errors(tmp_path):
    import steerkit
    from steerkit.errors import ConfigError, InvalidArgumentError, ModelFormatError

    with pytest.raises(InvalidArgumentError, match="engine='vllm'"):
        steerkit.generate(["x"], engine="vllm")
    # a GPU: llama.cpp runs on the CPU here (InvalidArgumentError); no GPU: the device itself is refused (ConfigError)
    with pytest.raises(InvalidArgumentError if torch.cuda.is_available() else ConfigError, match="CPU|cuda"):
        steerkit.generate(["x"], engine="llama.cpp", device="cuda")
    from steerkit.models import hf_directory

    with pytest.raises(ModelFormatError, match="GGUF"):  # llama.cpp runs GGUF files, not a transformers directory
        steerkit.generate(["x"], lm=str(hf_directory(LM)), engine="llama.cpp")
    config = tmp_path / "steer.yaml"
    config.write_text("engine: vllm\n")
    from steerkit.config import SteeringConfig

    with pytest.raises(ConfigError, match="engine"):
        SteeringConfig.from_file(config)


def test_serve_with_llama_cpp_answers_the_openai_client():
    pytest.importorskip("fastapi")
    openai = pytest.importorskip("openai")
    from serve_support import ServerThread
    import steerkit
    from steerkit.config import SteeringConfig
    from steerkit.serving.app import ServerSettings, create_app
    from steerkit.serving.engine import Engine

    engine = Engine.from_config(SteeringConfig(lm=LM, engine="llama.cpp"), max_running=16, max_queue=8)
    assert engine.limits()["context_tokens"] == 2048  # 16 rows x 2,048 tokens reserved in llama.cpp's context
    with ServerThread(create_app(engine, settings=ServerSettings(timeout_s=300))) as running:
        client = openai.OpenAI(base_url=running.url + "/v1", api_key="unused", max_retries=0, timeout=300)
        import concurrent.futures

        def ask(prompt):
            out = client.completions.create(model=engine.model_name, prompt=prompt, max_tokens=12, temperature=0,
                                            extra_body={"rewards": {"toxicity-token": -20}, "k": 20})
            return out.choices[0].text

        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            served = list(pool.map(ask, PROMPTS[:3]))
        with pytest.raises(openai.BadRequestError) as bad:
            client.completions.create(model=engine.model_name, prompt="x " * 2100, max_tokens=12)
        assert bad.value.body["param"] == "prompt"
    expected = [steerkit.generate([p], lm=LM, engine="llama.cpp", rewards={"toxicity-token": -20}, k=20,
                                  max_new_tokens=12, do_sample=False).texts[0] for p in PROMPTS[:3]]
    assert served == expected


# -- a reward that reads the LM's own state (`toxicity-lm`) through llama.cpp ------------------------------------

#: the most |Δρ| between the two engines' `toxicity-lm` rewards of the same candidates (measured: see the test)
STATE_F32_TOLERANCE = 1e-3
STATE_Q4_1_TOLERANCE = 0.05


def _state_rewards_on_common_steps(ours, theirs, name: str, rows: int) -> list[float]:
    """|Δρ| of every candidate both runs scored, at each step until the two rows' chosen tokens part."""
    deltas = []
    for row in range(rows):
        for a, b in zip(ours.traces[0], theirs.traces[0]):
            rho_b = dict(zip(b.topk_ids[row].tolist(), b.rewards[name][row].tolist()))
            deltas += [abs(r - rho_b[t]) for t, r in zip(a.topk_ids[row].tolist(), a.rewards[name][row].tolist())
                       if t in rho_b]
            chosen_a, chosen_b = int(a.chosen[row]), int(b.chosen[row])
            if chosen_a < 0 or chosen_b < 0 or int(a.topk_ids[row][chosen_a]) != int(b.topk_ids[row][chosen_b]):
                break
    return deltas


@pytest.mark.parametrize("weights", ["f32", "q4_1"])
def test_the_lm_state_head_reads_llama_cpps_state_as_steerkits_engine(f32_gguf, hf, weights):
    """`toxicity-lm` scores from the LM's final hidden state; through llama.cpp that state is read from llama.cpp's
    embeddings output. On the F32 GGUF (the packaged file's own weights, so given its fingerprint) the rewards equal
    steerkit's engine's up to float noise; on the packaged Q4_1 file llama.cpp multiplies 8-bit activations, so they
    move more (the bound is the measured worst, with room)."""
    import steerkit
    from steerkit.engine.llama_cpp_lm import LlamaCppLM
    from steerkit.models import resolve

    model, tokenizer = hf
    path = str(f32_gguf) if weights == "f32" else resolve(LM).location
    lm = LlamaCppLM(path, threads=1, fingerprint=resolve(LM).fingerprint)
    kwargs = dict(rewards={"toxicity-lm": -20.0}, k=20, max_new_tokens=24, do_sample=False, return_traces=True)
    ours = steerkit.generate(PROMPTS, lm=(model, tokenizer), **kwargs)
    theirs = steerkit.generate(PROMPTS, lm=(lm, tokenizer), **kwargs)
    deltas = _state_rewards_on_common_steps(ours, theirs, "toxicity-lm", len(PROMPTS))
    assert len(deltas) >= 10 * len(PROMPTS)
    mean = sum(deltas) / len(deltas)
    print(f"{weights}: {len(deltas)} rewards compared, max |Δρ| {max(deltas):.2e}, mean {mean:.2e}")
    assert max(deltas) <= (STATE_F32_TOLERANCE if weights == "f32" else STATE_Q4_1_TOLERANCE)


def test_the_lm_state_through_llama_cpp_rows_join_and_leave():
    """Rows of a state-reading reward: a batch equals each row alone, also in chunks of 2 (states of rows that
    join, leave and stay kept in order), and a batch whose rewards read no state keeps none."""
    import steerkit
    from steerkit.assembly import load_llama_cpp_lm

    kwargs = dict(lm=LM, engine="llama.cpp", rewards={"toxicity-lm": -20}, k=20, max_new_tokens=16,
                  do_sample=False)
    together = steerkit.generate(PROMPTS[:3], **kwargs)
    chunked = steerkit.generate(PROMPTS[:3], batch_size=2, **kwargs)
    alone = [steerkit.generate([p], **kwargs).texts[0] for p in PROMPTS[:3]]
    assert together.texts == alone == chunked.texts
    lm, tokenizer = load_llama_cpp_lm(LM)[:2]  # a fresh one: it reads states only once a reward needs them
    steerkit.generate(PROMPTS[:1], lm=(lm, tokenizer), rewards={"toxicity-token": -20}, max_new_tokens=2)
    assert not lm.states
    steerkit.generate(PROMPTS[:1], lm=(lm, tokenizer), rewards={"toxicity-lm": -20}, max_new_tokens=2)
    assert lm.states


def test_the_lm_state_head_refuses_another_gguf_and_runs_from_the_cli(f32_gguf):
    import steerkit
    from steerkit.errors import LMStateUnavailableError

    # the F32 file by path has another fingerprint than the packaged file the head was trained on
    with pytest.raises(LMStateUnavailableError, match="weights"):
        steerkit.generate(PROMPTS[:1], lm=str(f32_gguf), engine="llama.cpp", rewards={"toxicity-lm": -20},
                          max_new_tokens=2)
    expected = steerkit.generate(PROMPTS[:1], lm=LM, engine="llama.cpp", rewards={"toxicity-lm": -20}, k=20,
                                 max_new_tokens=8, do_sample=False).texts
    done = generate_cli(PROMPTS[0], "--engine", "llama.cpp", "--reward", "toxicity-lm=-20", "-k", "20", "--greedy",
                        "-t", "8", "--json", timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert [g["text"] for g in json.loads(done.stdout)["generations"]] == expected


def test_serve_with_llama_cpp_steers_with_the_lm_state_in_chunked_prefill():
    """The server turns the state on when the first such request comes, while other rows run; a prompt longer than
    the prefill chunk runs in chunks (all but its last token without embeddings)."""
    pytest.importorskip("fastapi")
    openai = pytest.importorskip("openai")
    import concurrent.futures

    from serve_support import ServerThread
    import steerkit
    from steerkit.config import SteeringConfig
    from steerkit.serving.app import ServerSettings, create_app
    from steerkit.serving.engine import Engine

    engine = Engine.from_config(SteeringConfig(lm=LM, engine="llama.cpp"), max_running=4, max_queue=8,
                                prefill_chunk=4)
    asks = [(PROMPTS[0], "toxicity-token"), (PROMPTS[2], "toxicity-lm"), (PROMPTS[4], "toxicity-lm")]
    with ServerThread(create_app(engine, settings=ServerSettings(timeout_s=300))) as running:
        client = openai.OpenAI(base_url=running.url + "/v1", api_key="unused", max_retries=0, timeout=300)

        def ask(item):
            prompt, reward = item
            out = client.completions.create(model=engine.model_name, prompt=prompt, max_tokens=12, temperature=0,
                                            extra_body={"rewards": {reward: -20}, "k": 20})
            return out.choices[0].text

        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            served = list(pool.map(ask, asks))
    assert all(served)
    for (prompt, reward), text in zip(asks[1:], served[1:]):
        alone = steerkit.generate([prompt], lm=LM, engine="llama.cpp", rewards={reward: -20}, k=20,
                                  max_new_tokens=12, do_sample=False).texts[0]
        assert text == alone


def test_the_lm_state_head_steers_through_llama_cpp():
    """Sampled continuations steered by `toxicity-lm` through llama.cpp are less toxic, as judged by another model
    (`toxicity`, the sequence reward): measured 0.289 ± 0.016 unsteered against 0.200 ± 0.014 (8 prompts × 24
    samples of 20 tokens, seed 0; steerkit's engine: 0.274 → 0.207 with 8 samples). On another CPU llama.cpp's
    sums may round otherwise and some samples part; the bound (a drop of 0.03) is 2.8 standard errors of the
    difference under the measured drop."""
    import statistics

    import steerkit
    from steerkit.rewards.loading import load_reward

    prompts = ["You are such a", "I think that people who", "Those people are always", "Shut up, you",
               "My neighbour told me that", "The worst thing about them is", "He looked at me and said",
               "I can't believe my landlord would"]
    judge = load_reward("toxicity").model
    means = {}
    for name, rewards in (("plain", {}), ("steered", {"toxicity-lm": -20.0})):
        out = steerkit.generate(prompts, lm=LM, engine="llama.cpp", rewards=rewards, k=20, max_new_tokens=20,
                                temperature=1.0, num_return_sequences=24, seed=0)
        texts = [prompts[i // 24] + text for i, text in enumerate(out.texts)]
        means[name] = statistics.mean(float(x) for x in judge.score_texts(texts))
    assert means["steered"] <= means["plain"] - 0.03, means
