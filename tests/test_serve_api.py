"""`steerkit serve` over HTTP: a real uvicorn server on 127.0.0.1 serving a tiny engine, driven by the official
`openai` client and httpx: completions, chat, streaming, n > 1 and seeds, steering fields, traces, models,
health and metrics."""

from __future__ import annotations

import json

import httpx
import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from serve_support import ServerThread, tiny_engine, tiny_parts  # noqa: E402

from steerkit.serving.app import ServerSettings, create_app  # noqa: E402
from steerkit.serving.metrics import ServerMetrics  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server():
    metrics = ServerMetrics()
    engine = tiny_engine(tiny_parts(), max_running=8, max_queue=32, observer=metrics)
    app = create_app(engine, settings=ServerSettings(timeout_s=30, max_n=4), metrics=metrics)
    with ServerThread(app) as running:
        running.engine, running.metrics = engine, metrics
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def model(server):
    return server.engine.model_name


def post(server, path, body, **kw):
    return httpx.post(server.url + path, json=body, timeout=60, **kw)


def test_models_lists_the_model_and_its_steering(server, client, model):
    models = client.models.list()
    assert [m.id for m in models.data] == [model]
    raw = httpx.get(server.url + "/v1/models").json()
    assert raw["data"][0]["steering"]["rewards"] == ["tiny"]


def test_completion_with_the_openai_client(client, model):
    out = client.completions.create(model=model, prompt="The quick brown", max_tokens=6, seed=3)
    choice = out.choices[0]
    assert isinstance(choice.text, str) and choice.finish_reason in {"stop", "length"}
    assert out.usage.completion_tokens >= 1 and out.usage.prompt_tokens >= 1
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    if choice.finish_reason == "length":
        assert out.usage.completion_tokens == 6


def test_chat_goes_through_the_chat_template(client, model, server):
    out = client.chat.completions.create(model=model, messages=[{"role": "system", "content": "Be brief."},
                                                                {"role": "user", "content": "Hello there"}],
                                         max_tokens=5, seed=1)
    assert out.choices[0].message.role == "assistant"
    assert isinstance(out.choices[0].message.content, str)
    tokenizer = server.engine.tokenizer
    templated = tokenizer.apply_chat_template([{"role": "system", "content": "Be brief."},
                                               {"role": "user", "content": "Hello there"}],
                                              tokenize=False, add_generation_prompt=True)
    assert out.usage.prompt_tokens == len(tokenizer(templated, add_special_tokens=False)["input_ids"])
    same = client.completions.create(model=model, prompt=templated, max_tokens=5, seed=1)
    assert same.choices[0].text == out.choices[0].message.content


def test_same_seed_same_output_and_n_rows_use_seed_plus_i(client, model):
    first = client.completions.create(model=model, prompt="Numbers and symbols", max_tokens=8, seed=11, n=3)
    again = client.completions.create(model=model, prompt="Numbers and symbols", max_tokens=8, seed=11, n=3)
    texts = [c.text for c in first.choices]
    assert texts == [c.text for c in again.choices]
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert [c.model_extra["seed"] for c in first.choices] == [11, 12, 13]
    for i in range(3):  # choice i alone, with seed 11 + i, is the same text
        alone = client.completions.create(model=model, prompt="Numbers and symbols", max_tokens=8, seed=11 + i)
        assert alone.choices[0].text == texts[i]
    assert len(set(texts)) > 1  # the rows are different samples


def test_a_list_of_prompts_is_prompt_major(client, model):
    out = client.completions.create(model=model, prompt=["The quick", "You are"], max_tokens=4, seed=0, n=2)
    assert [c.model_extra["seed"] for c in out.choices] == [0, 1, 2, 3]
    alone = client.completions.create(model=model, prompt="You are", max_tokens=4, seed=2)
    assert out.choices[2].text == alone.choices[0].text


def test_without_a_seed_each_choice_reports_the_seed_that_reproduces_it(client, model):
    out = client.completions.create(model=model, prompt="The lazy dog", max_tokens=6, temperature=1.0)
    seed = out.choices[0].model_extra["seed"]
    again = client.completions.create(model=model, prompt="The lazy dog", max_tokens=6, seed=seed)
    assert again.choices[0].text == out.choices[0].text


def test_streaming_completion_matches_the_non_streamed_text(client, model):
    whole = client.completions.create(model=model, prompt="I love this", max_tokens=8, seed=5)
    chunks = list(client.completions.create(model=model, prompt="I love this", max_tokens=8, seed=5, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_streaming_chat_with_the_openai_client(client, model):
    stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=6,
                                            seed=2, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 1
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    whole = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=6,
                                           seed=2)
    assert text == whole.choices[0].message.content


def test_raw_sse_format_ends_with_done(server):
    with httpx.stream("POST", server.url + "/v1/completions", timeout=60,
                      json={"prompt": "Hello", "max_tokens": 3, "seed": 0, "stream": True, "n": 2}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    assert all(e.startswith("data: ") for e in events)
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"text_completion"}
    finished = [c["choices"][0] for c in chunks if c["choices"][0]["finish_reason"]]
    assert sorted(f["index"] for f in finished) == [0, 1]
    assert "usage" in chunks[-1]


def test_steering_fields_change_the_output_and_traces_report_each_token(client, model):
    def greedy(rewards, trace=True):
        return client.completions.create(model=model, prompt="This is", max_tokens=10, temperature=0,
                                         extra_body={"rewards": rewards, "k": 8, "reward_trace": trace})

    plain, steered = greedy({}), greedy({"tiny": 200.0})
    assert plain.choices[0].text != steered.choices[0].text
    trace = steered.choices[0].model_extra["reward_trace"]
    assert len(trace) == steered.usage.completion_tokens
    assert all(set(t["rewards"]) == {"tiny"} and 0.0 <= t["rewards"]["tiny"] <= 1.0 for t in trace)
    assert "".join(t["token"] for t in trace) == steered.choices[0].text
    # pushing the reward up raises it along the text (the tiny reward model is random but fixed)
    down = greedy({"tiny": -200.0})
    mean = lambda out: sum(t["rewards"]["tiny"] for t in out.choices[0].model_extra["reward_trace"]) / len(
        out.choices[0].model_extra["reward_trace"])  # noqa: E731
    assert mean(steered) > mean(down)
    spec_form = greedy([{"name": "tiny", "beta": 200.0, "label": "up"}])
    assert spec_form.choices[0].text == steered.choices[0].text
    assert set(spec_form.choices[0].model_extra["reward_trace"][0]["rewards"]) == {"up"}
    assert "reward_trace" not in greedy({"tiny": 1.0}, trace=False).choices[0].model_extra


def test_stream_with_reward_trace_sends_one_trace_item_per_token(server):
    with httpx.stream("POST", server.url + "/v1/completions", timeout=60,
                      json={"prompt": "Hello", "max_tokens": 5, "seed": 0, "stream": True,
                            "rewards": {"tiny": 3}, "reward_trace": True}) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    items = [item for c in chunks for item in c["choices"][0].get("reward_trace", [])]
    assert len(items) == chunks[-1]["usage"]["completion_tokens"]
    assert all("tiny" in item["rewards"] for item in items)


def test_health_and_metrics(server, client, model):
    client.completions.create(model=model, prompt="Count me", max_tokens=3, seed=0, extra_body={"rewards": {"tiny": 1}})
    health = httpx.get(server.url + "/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    text = httpx.get(server.url + "/metrics").text
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    assert samples['steerkit_requests_total{endpoint="/v1/completions",status="200"}'] >= 1
    assert samples["steerkit_tokens_generated_total"] >= 3
    assert samples["steerkit_step_seconds_count"] >= 3
    assert samples['steerkit_reward_seconds_count{reward="tiny"}'] >= 1
    assert samples['steerkit_rows_finished_total{finish_reason="length"}'] >= 1
    assert samples["steerkit_running_rows"] == 0 and samples["steerkit_queue_depth"] == 0
    assert samples["steerkit_time_to_first_token_seconds_count"] >= 1


def test_playground_page_is_served(server):
    page = httpx.get(server.url + "/")
    assert page.status_code == 200 and "steerkit playground" in page.text


def test_stop_strings_end_the_completion_before_them(client, model):
    def greedy(**kw):
        return client.completions.create(model=model, prompt="The quick brown fox", max_tokens=24, temperature=0,
                                         **kw).choices[0]

    full = greedy()
    assert len(full.text) >= 6, full.text
    stop = full.text[4:6]
    cut = greedy(stop=[stop, "never-appears"])
    assert cut.text == full.text[:full.text.find(stop)]
    assert cut.finish_reason == "stop"


def test_derived_seeds_wrap_within_torchs_seed_range():
    from steerkit.serving.completions import derive_seed

    assert [derive_seed(7, i) for i in range(3)] == [7, 8, 9]
    assert derive_seed(2**64 - 1, 1) == -(2**63)  # past the top: back to the bottom of the range
    assert derive_seed(-(2**63), -1) == 2**64 - 1
