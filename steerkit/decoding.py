"""Reward-augmented decoding (the paper's Algorithm 1) over a batch of prompts."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Sequence

import torch

from .engine.core import EngineCore
from .engine.rows import Row
from .engine.step import chosen_index, sample
from .engine.text import cut_at_stop
from .errors import InvalidArgumentError, PromptTooLongError
from .models import context_length, text_config
from .params import SteerParams
from .steering import SteeringTerm, check_terms, warn_if_slow
from .validators import validate_int, validate_k, validate_prompts
from .terms import build_terms  # noqa: F401 (steerkit.decoding.build_terms: the Python API's rewards)


@dataclass
class StepTrace:
    """What one decoding step saw and chose, per row."""

    topk_ids: torch.Tensor  # [B, k]
    topk_logits: torch.Tensor  # [B, k]
    rewards: dict[str, torch.Tensor]  # name -> [B, k]
    scores: torch.Tensor  # [B, k]: z + Σ β ρ
    betas: dict[str, float]
    chosen: torch.Tensor  # [B]: index of the chosen token in the top-k (-1 for finished rows)

    def to_dict(self) -> dict:
        return {
            "topk_ids": self.topk_ids.tolist(), "topk_logits": self.topk_logits.tolist(),
            "rewards": {n: r.tolist() for n, r in self.rewards.items()}, "scores": self.scores.tolist(),
            "betas": self.betas, "chosen": self.chosen.tolist(),
        }


@dataclass
class GenerationOutput:
    prompts: list[str]  # one per row (each prompt repeated num_return_sequences times)
    texts: list[str]  # the continuations
    sequences: torch.Tensor  # [rows, new tokens] generated ids (pad after the end)
    num_new_tokens: list[int]
    seconds: float
    traces: list[list[StepTrace]] | None = None  # per batch chunk, per step

    @property
    def tokens_per_second(self) -> float:
        return sum(self.num_new_tokens) / self.seconds if self.seconds else float("nan")

    def to_records(self) -> list[dict]:
        return [{"prompt": p, "text": t, "num_new_tokens": n}
                for p, t, n in zip(self.prompts, self.texts, self.num_new_tokens)]


def sample_token(scores: torch.Tensor, temperature: float) -> torch.Tensor:
    """Sample one token per row from softmax(scores / T).

    :func:`~steerkit.steering.reweight` returns scores whose row maximum is 0, so a tiny T cannot overflow:
    the best candidate gets 0, the others -inf, and sampling becomes greedy instead of failing on NaN.
    """
    return sample(scores, [temperature] * scores.shape[0], None)


def eos_ids(model, tokenizer, eos_token_id=None) -> list[int]:
    ids = eos_token_id if eos_token_id is not None else getattr(model.generation_config, "eos_token_id", None)
    if ids is None:
        ids = tokenizer.eos_token_id
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    return [i for i in ids if i is not None]


class RewardAugmentedGenerator:
    r"""RAD over a loaded causal LM and any number of steering terms sharing one top-k candidate set.

    Each step takes the LM's `k` largest logits `z` per row, scores those k candidates with every term's
    reward (one forward over the shared prefix cache per reward, never a copy per candidate), and samples
    from `softmax((z + Σ β·ρ) / temperature)` (or takes its argmax).

    Args:
        model ([`PreTrainedModel`]):
            Any causal LM (`AutoModelForCausalLM`); it is put in eval mode.
        tokenizer ([`PreTrainedTokenizerBase`]):
            Its tokenizer, with left padding (see `steerkit.models.prepare_tokenizer`).
        terms (`Sequence[SteeringTerm]`, *optional*):
            Rewards with their signed weights β (β < 0 steers away); none decodes plain top-k.
        k (`int`, *optional*, defaults to 20):
            Candidates per step, in `[1, vocab_size]`.

    `generate(prompts, ...)` takes `transformers`' names (`max_new_tokens`, `do_sample`, `temperature`,
    `num_return_sequences`, `eos_token_id`, `stop_strings`) plus `seed`, `chat_template`, `return_traces`,
    `batch_size` and `progress`, and returns a [`GenerationOutput`]: `texts` (one per row, rows = prompts ×
    `num_return_sequences`), `sequences` of shape `(rows, new_tokens)`, and with `return_traces=True` one
    [`StepTrace`] per step whose `rewards[name]` and `scores` have shape `(rows, k)`.

    Examples:

    ```python
    >>> import torch
    >>> from steerkit import RewardAugmentedGenerator, SteeringTerm
    >>> from steerkit.rewards.sequence.scorer import RewardModelScorer
    >>> from steerkit.testing import make_tokenizer, tiny_lm, tiny_reward
    >>> tokenizer = make_tokenizer()
    >>> reward = RewardModelScorer(tiny_reward(tokenizer))
    >>> generator = RewardAugmentedGenerator(tiny_lm(tokenizer), tokenizer, [SteeringTerm(reward, 10.0)], k=5)
    >>> out = generator.generate(["The movie was", "You are"], max_new_tokens=4, num_return_sequences=2,
    ...                          seed=0, return_traces=True)
    >>> len(out.texts), out.sequences.shape[0]
    (4, 4)
    >>> step = out.traces[0][0]  # first batch, first step
    >>> step.rewards["tiny"].shape, step.scores.shape
    (torch.Size([4, 5]), torch.Size([4, 5]))
    >>> bool(((step.rewards["tiny"] >= 0) & (step.rewards["tiny"] <= 1)).all())
    True
    >>> bool(torch.allclose(step.scores, step.topk_logits + 10.0 * step.rewards["tiny"]))
    True

    ```
    """

    def __init__(self, model, tokenizer, terms: Sequence[SteeringTerm] = (), *, k: int = 20):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.terms = check_terms(list(terms))
        self.vocab_size = text_config(model).vocab_size
        self.k = validate_k(k, self.vocab_size)
        #: k is large for a sequence reward: a step takes long, so ``progress=True`` shows a per-step bar.
        self.slow = warn_if_slow(self.k, self.terms)

    def format_prompts(self, prompts: list[str], chat_template: bool) -> list[str]:
        if not chat_template:
            return prompts
        if not getattr(self.tokenizer, "chat_template", None):
            raise InvalidArgumentError("chat_template=True but this tokenizer has no chat template; pass plain prompts.")
        return [self.tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                   add_generation_prompt=True) for p in prompts]

    def generate(self, prompts: Sequence[str], *, max_new_tokens: int = 20, do_sample: bool = True,
                 temperature: float = 1.0, num_return_sequences: int = 1, seed: int | None = None,
                 eos_token_id=None, stop_strings: Sequence[str] | None = None, include_stop_strings: bool = True,
                 chat_template: bool = False, return_traces: bool = False, batch_size: int | None = None,
                 progress: bool = False) -> GenerationOutput:
        prompts = validate_prompts(prompts)
        params = SteerParams.create(max_new_tokens=max_new_tokens, temperature=temperature, do_sample=do_sample,
                                    seed=seed, stop=stop_strings, include_stop=include_stop_strings,
                                    zero_temperature=False)
        num_return_sequences = validate_int("num_return_sequences", num_return_sequences)
        if batch_size is not None:
            batch_size = validate_int("batch_size", batch_size, hint=" (rows decoded together) or None for all rows")
        formatted = self.format_prompts(prompts, chat_template)
        ids = self.tokenizer(formatted, add_special_tokens=False)["input_ids"]  # once per prompt, not per row
        self._check_lengths(ids, params.max_new_tokens)
        rows = [p for p in prompts for _ in range(num_return_sequences)]
        row_ids = [i for i in ids for _ in range(num_return_sequences)]
        return self.run(params, row_ids, rows, eos=eos_ids(self.model, self.tokenizer, eos_token_id),
                        return_traces=return_traces, batch_size=batch_size, progress=progress)

    def run(self, params: SteerParams, row_ids: list[list[int]], rows: list[str], *, eos: list[int],
            return_traces: bool = False, batch_size: int | None = None, progress: bool = False) -> GenerationOutput:
        """Decode ``row_ids`` (the ids the LM reads; ``rows``: the texts the rewards see) with validated ``params``,
        in batches of ``batch_size`` rows that share the default RNG (seeded with ``params.seed``)."""
        batch_size = batch_size or len(rows)
        start = time.perf_counter()
        texts, seqs, counts, traces = [], [], [], []
        rng = torch.random.fork_rng(devices=[]) if params.seed is not None else contextlib.nullcontext()
        with rng, torch.no_grad():
            if params.seed is not None:
                torch.manual_seed(params.seed)
            chunks = range(0, len(rows), batch_size)
            with _Progress(progress, len(chunks), params.max_new_tokens if self.slow else 0) as bar:
                for lo in chunks:
                    out = self._generate_batch(row_ids[lo:lo + batch_size], rows[lo:lo + batch_size], params, eos,
                                               return_traces, bar)
                    texts += out[0]
                    seqs.append(out[1])
                    counts += out[2]
                    traces.append(out[3])
                    bar.batch_done()
        width = max(s.shape[1] for s in seqs)
        pad = self.tokenizer.pad_token_id
        sequences = torch.cat([torch.nn.functional.pad(s, (0, width - s.shape[1]), value=pad) for s in seqs])
        return GenerationOutput(rows, texts, sequences, counts, time.perf_counter() - start,
                                traces if return_traces else None)

    def _check_lengths(self, prompt_ids: list[list[int]], max_new_tokens: int) -> None:
        limit = context_length(self.model)
        if limit is None:
            return
        for i, ids in enumerate(prompt_ids):
            n = len(ids)
            if n + max_new_tokens > limit:
                raise PromptTooLongError(
                    f"Prompt {i} has {n} tokens; with max_new_tokens={max_new_tokens} that exceeds the model's "
                    f"context of {limit} tokens. Shorten the prompt or lower max_new_tokens."
                )

    def _generate_batch(self, prompt_ids, raw_prompts, params: SteerParams, eos, return_traces,
                        bar: "_Progress | None" = None):
        """One batch through the engine core: rows sharing every setting and the default RNG, prefilled together;
        a finished row stays in the batch (fed padding) until every row has finished or the length is reached."""
        tok = self.tokenizer
        core = EngineCore(self.model, tok, eos=eos, vocab_size=self.vocab_size, shared_rng=True, strict=True,
                          stream_text=False)  # the texts are decoded once at the end
        rows = [Row(raw, row_ids, self.terms, self.k, params.temperature, params.max_new_tokens, list(params.stop),
                    params.include_stop) for raw, row_ids in zip(raw_prompts, prompt_ids)]
        max_new_tokens = params.max_new_tokens
        core.batch.reserve(len(rows), max(len(ids) for ids in prompt_ids) + max_new_tokens)
        core.admit(rows, together=True)
        generated, trace = [], []
        for step in range(max_new_tokens):
            report = core.step(keep_output=return_traces)
            if bar is not None:
                bar.step_done()
            generated.append(core.last_tokens)
            if return_traces:
                trace.append(self._trace(report.output, core.last_tokens, rows, step))
            if all(row.finished for row in rows) or step == max_new_tokens - 1:
                break
            core.advance()
        seq = torch.stack(generated, 1).cpu()
        texts, counts = self._decode(seq, eos, list(params.stop), params.include_stop)
        return texts, seq, counts, trace

    def _trace(self, out, tokens: torch.Tensor, rows: list, step: int) -> StepTrace:
        finished = torch.tensor([len(row.ids) < row.steps for row in rows], device=tokens.device)
        chosen = chosen_index(out.topk_ids, tokens).masked_fill(finished, -1)
        return StepTrace(out.topk_ids.cpu(), out.topk_logits.cpu(),
                         {t.name: r.cpu() for t, r in zip(self.terms, out.shaped)}, out.combined.cpu(),
                         {t.name: t.weight(step) for t in self.terms}, chosen.cpu())

    def _decode(self, seq: torch.Tensor, eos: list[int], stop_strings: list[str], include_stop: bool = True):
        texts, counts = [], []
        for row in seq.tolist():
            n = next((i for i, t in enumerate(row) if t in eos), len(row))
            text = self.tokenizer.decode(row[:n], skip_special_tokens=True)
            texts.append(cut_at_stop(text, stop_strings, include_stop))
            counts.append(min(n + 1, len(row)))
        return texts, counts


class _Progress:
    """Progress on stderr: a bar over batches when there are several, and over decoding steps (reset per
    batch) when ``steps`` > 0, i.e. when each step is slow (large k with a sequence reward)."""

    def __init__(self, enabled: bool, batches: int, steps: int = 0):
        self.enabled = enabled and (batches > 1 or steps > 0)
        self.batches, self.steps = batches, steps
        self._progress = self._batch_task = self._step_task = None

    def __enter__(self) -> "_Progress":
        if not self.enabled:
            return self
        from rich.console import Console
        from rich.errors import LiveError
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            console=Console(stderr=True), transient=True)
        try:
            progress.start()
        except LiveError:  # the caller already shows a live display: stay quiet rather than fail
            return self
        self._progress = progress
        if self.batches > 1:
            self._batch_task = progress.add_task("Generating (batches)", total=self.batches)
        if self.steps:
            self._step_task = progress.add_task("Decoding steps", total=self.steps)
        return self

    def step_done(self) -> None:
        if self._step_task is not None:
            self._progress.advance(self._step_task)

    def batch_done(self) -> None:
        if self._batch_task is not None:
            self._progress.advance(self._batch_task)
        if self._step_task is not None:
            self._progress.reset(self._step_task)

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()
