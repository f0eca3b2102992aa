"""The data of token-level distillation: a teacher's rewards of every step's top-k candidates on LM samples.

Prompts are the first ``prompt_words`` words of a seeded sample of the training texts. The LM samples
continuations with plain top-k sampling (or steered by the teacher with one of ``steer_betas``, round robin over
prompts, which spreads the rewards seen); the teacher (a sequence reward model) scores the k candidates of every
step through its shared-prefix cache, which is exactly what ``steerkit.generate(..., return_traces=True)``
records. Each sample becomes::

    ids      [T]        start token (+ prompt tokens when context is "full") + the sampled continuation
    qpos     [S]        the position whose hidden state scores step s's candidates (the token before it)
    cands    [S, k]     the LM's top-k candidates of step s
    rho      [S, k]     the teacher's rewards of them
    valid    [S]        False after the row ended (EOS)

The samples are written to ``<checkpoint_dir>/distill-samples.safetensors`` after every generation batch
(atomically, with a JSON fingerprint of everything that shapes them), so an interrupted run resumes where it
stopped and a resumed training run reuses them.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import ConfigError, VocabularyMismatchError
from ..files import atomic_write_text
from ..rewards.token.model import keep_text_reward, realized_logits
from ..rewards.vocab import same_vocabulary
from ..seeds import mixed_seed

SAMPLES_NAME = "distill-samples.safetensors"
SAMPLES_STATE = "distill-samples.json"


@dataclass
class DistillSamples:
    ids: torch.Tensor  # [N, T] right padded
    mask: torch.Tensor  # [N, T]
    qpos: torch.Tensor  # [N, S]
    cands: torch.Tensor  # [N, S, k]
    rho: torch.Tensor  # [N, S, k]
    valid: torch.Tensor  # [N, S] bool

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def rows(self, index) -> "DistillSamples":
        index = torch.as_tensor(index, dtype=torch.long)
        return DistillSamples(*(getattr(self, f).index_select(0, index) for f in FIELDS))


FIELDS = ("ids", "mask", "qpos", "cands", "rho", "valid")


def prompts_from(texts: list[str], count: int, words: int, seed: int) -> list[str]:
    """``count`` prompts: the first ``words`` words of a seeded sample of ``texts`` (distinct, non-empty)."""
    rng = random.Random(f"{seed}:distill-prompts")
    seen, prompts = set(), []
    for i in rng.sample(range(len(texts)), len(texts)):
        prompt = " ".join(texts[i].split()[:words])
        if prompt and prompt not in seen:
            seen.add(prompt)
            prompts.append(prompt)
            if len(prompts) == count:
                break
    return prompts


def fingerprint(config, prompts: list[str]) -> str:
    payload = {"distill": config.distill.model_dump(mode="json"), "seed": config.seed, "prompts": prompts,
               "backbone": config.backbone}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def load_or_sample(config, texts: list[str], directory: Path, student_tokenizer, start_token_id: int,
                   log=print) -> DistillSamples:
    """The samples for ``config.distill``: read from ``directory`` when complete, else (re)sampled from where an
    interrupted run stopped."""
    from functools import cache

    from ..assembly import assemble
    from ..terms import reference_loader

    d = config.distill
    prompts = prompts_from(texts, d.prompts, d.prompt_words, config.seed)
    if len(prompts) < 2:
        raise ConfigError("distill: the training texts give fewer than 2 distinct prompts; add data.")
    key = fingerprint(config, prompts)
    parts = _read(directory, key)
    done = sum(len(p) for p in parts)
    if done >= len(prompts):
        return _merge(parts)
    # one setting per steer_betas value, round robin over batches; the LM and the teacher's model sample where
    # the student trains (the set-up path places them on config.device)
    load = cache(reference_loader())  # the teacher is loaded once
    setups = [assemble(d.lm, [{"name": d.teacher, "beta": beta, "label": "teacher", "context": d.context}], k=d.k,
                       device=config.device, load=load) for beta in d.steer_betas]
    if not same_vocabulary(setups[0].tokenizer, student_tokenizer):
        raise VocabularyMismatchError(f"distill.lm {d.lm!r} has another vocabulary than the student's backbone "
                                      f"{config.backbone!r}; sample with an LM of the backbone's family.")
    log(f"distillation samples: {done}/{len(prompts)} done; sampling from {d.lm!r}, teacher {d.teacher!r}, k={d.k}")
    size = d.generation_batch_size
    for lo in range(done, len(prompts), size):
        chunk = prompts[lo:lo + size]
        generator = setups[(lo // size) % len(setups)].generator()
        out = generator.generate(chunk, max_new_tokens=d.max_new_tokens, temperature=d.temperature,
                                 seed=mixed_seed(config.seed, 7919, lo), return_traces=True)
        parts.append(_from_traces(out, chunk, d.context, student_tokenizer, start_token_id))
        _write(directory, parts, key)
        log(f"distillation samples: {min(lo + size, len(prompts))}/{len(prompts)}")
    return _merge(parts)


def _from_traces(out, prompts, context, tokenizer, start: int) -> DistillSamples:
    steps = out.traces[0]  # on the sampling device; the samples are kept (and saved) on the CPU
    cands = torch.stack([t.topk_ids for t in steps], 1).cpu()  # [B, S, k]
    rho = torch.stack([t.rewards["teacher"] for t in steps], 1).float().cpu()
    valid = torch.stack([t.chosen >= 0 for t in steps], 1).cpu()  # [B, S]
    B, S, _ = cands.shape
    heads = [[start] + (tokenizer(p, add_special_tokens=False)["input_ids"] if context == "full" else [])
             for p in prompts]
    width = max(len(h) for h in heads) + S
    ids = torch.full((B, width), int(tokenizer.pad_token_id or 0), dtype=torch.long)
    mask = torch.zeros((B, width), dtype=torch.long)
    qpos = torch.zeros((B, S), dtype=torch.long)
    for b, head in enumerate(heads):
        row = head + out.sequences[b, :S].tolist()
        ids[b, :len(row)] = torch.tensor(row)
        mask[b, :len(head) + int(valid[b].sum())] = 1
        qpos[b] = len(head) - 1 + torch.arange(S)
    return DistillSamples(ids, mask, qpos, cands, rho, valid)


def _merge(parts: list[DistillSamples]) -> DistillSamples:
    width = max(p.ids.shape[1] for p in parts)
    steps = max(p.qpos.shape[1] for p in parts)

    def pad(t, dim, size):
        shape = [0, 0] * (t.dim() - dim - 1) + [0, size - t.shape[dim]]
        return torch.nn.functional.pad(t, shape)

    return DistillSamples(
        torch.cat([pad(p.ids, 1, width) for p in parts]), torch.cat([pad(p.mask, 1, width) for p in parts]),
        torch.cat([pad(p.qpos, 1, steps) for p in parts]), torch.cat([pad(p.cands, 1, steps) for p in parts]),
        torch.cat([pad(p.rho, 1, steps) for p in parts]), torch.cat([pad(p.valid, 1, steps) for p in parts]))


def _write(directory: Path, parts: list[DistillSamples], key: str) -> None:
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    merged = _merge(parts)
    tensors = {f: getattr(merged, f).contiguous() for f in FIELDS}
    tensors["valid"] = tensors["valid"].to(torch.uint8)
    tmp = directory / f".{SAMPLES_NAME}.tmp{os.getpid()}"
    save_file(tensors, str(tmp))
    os.replace(tmp, directory / SAMPLES_NAME)
    atomic_write_text(directory / SAMPLES_STATE, json.dumps({"fingerprint": key, "rows": len(merged)}))


def _read(directory: Path, key: str) -> list[DistillSamples]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        state = json.loads((directory / SAMPLES_STATE).read_text(encoding="utf-8"))
        if state.get("fingerprint") != key:
            return []
        tensors = load_file(str(directory / SAMPLES_NAME))
    except (OSError, ValueError, SafetensorError):
        return []
    tensors["valid"] = tensors["valid"].bool()
    return [DistillSamples(*(tensors[f] for f in FIELDS))]


def candidate_predictions(model, samples: DistillSamples) -> torch.Tensor:
    """The student's rewards [N, S, k] of the samples' candidates (one forward over each sequence)."""
    positions = torch.arange(samples.ids.shape[1])[None].expand_as(samples.ids)
    device = model.output_embeddings.device
    query, offset, _ = model.project(samples.ids.to(device), attention_mask=samples.mask.to(device),
                                     position_ids=positions.to(device))
    qpos = samples.qpos.to(device)
    q = query.gather(1, qpos[..., None].expand(-1, -1, query.shape[-1]))  # [N, S, d]
    off = offset.gather(1, qpos)  # [N, S]
    cands = samples.cands.to(device)
    emb = model.output_embeddings[cands]  # [N, S, k, d]
    logits = (emb * q[:, :, None]).sum(-1) + off[..., None]
    # a textless candidate (end of text) keeps the committed text's reward, as in decoding
    ids, mask = samples.ids.to(device), samples.mask.to(device)
    current = realized_logits(query, offset, model.output_embeddings, ids, mask, model.textless_ids).gather(1, qpos)
    return model.output(keep_text_reward(logits, cands, current, model.textless_ids))


@torch.no_grad()
def agreement(model, samples: DistillSamples, batch_size: int = 32) -> dict:
    """How well a token-level model reproduces the teacher's candidate rewards: MSE, Pearson r over every
    candidate, and how often both pick the same best candidate of a step (top-1 agreement)."""
    preds, targets, same = [], [], []
    was_training = model.training
    model.eval()
    for lo in range(0, len(samples), batch_size):
        part = samples.rows(range(lo, min(lo + batch_size, len(samples))))
        p = candidate_predictions(model, part).cpu()
        v = part.valid
        preds.append(p[v].flatten())
        targets.append(part.rho[v].flatten())
        same.append((p.argmax(-1) == part.rho.argmax(-1))[v])
    model.train(was_training)
    p, t = torch.cat(preds).double(), torch.cat(targets).double()
    r = torch.corrcoef(torch.stack([p, t]))[0, 1].item() if len(p) > 1 else float("nan")
    return {"n_candidates": int(len(p)), "mse": float(((p - t) ** 2).mean()), "pearson": r,
            "top1_agreement": float(torch.cat(same).double().mean()), "teacher_mean": float(t.mean())}
