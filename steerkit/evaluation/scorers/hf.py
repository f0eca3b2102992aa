"""Scorers backed by models: any Hugging Face sequence classifier, or a steerkit reward model.

``hf-classifier`` is what the paper used for sentiment (the SST-2 DistilBERT text-classification
pipeline); pass ``model=distilbert/distilbert-base-uncased-finetuned-sst-2-english`` with hub access,
or a local directory. ``label`` names the class whose probability is the score (``POSITIVE`` for
sentiment, ``toxic`` for a toxicity classifier).
"""

from __future__ import annotations

from ...errors import ModelNotFoundError, PluginError
from .base import BaseScorer, MEASURES


class HFClassifierScorer(BaseScorer):
    name = "hf-classifier"

    def __init__(self, model: str, label: str | None = None, measures: str = "sentiment", threshold: float = 0.5,
                 batch_size: int = 32, max_length: int = 512, device: str | None = None):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if measures not in MEASURES:
            raise PluginError(f"hf-classifier: measures must be one of {', '.join(MEASURES)}, got {measures!r}.")
        from pathlib import Path

        from ...devices import resolve_device
        from ...models import raise_if_remote_code, check_no_remote_code, check_safetensors_weights

        device = resolve_device(device) if device else None
        if Path(str(model)).expanduser().is_dir():  # refused up front: model code, pickled weights
            check_no_remote_code(Path(str(model)).expanduser())
            check_safetensors_weights(Path(str(model)).expanduser())
        try:
            # never run code shipped with the model, never unpickle weights
            self.tokenizer = AutoTokenizer.from_pretrained(model, trust_remote_code=False)
            self.model = AutoModelForSequenceClassification.from_pretrained(
                model, trust_remote_code=False, use_safetensors=True).eval()
        except OSError as exc:
            raise ModelNotFoundError(
                f"hf-classifier could not load {model!r} ({exc}). Pass a local directory with a sequence-"
                "classification checkpoint (safetensors weights), or a hub id on a machine with hub access.") from None
        except ValueError as exc:
            raise_if_remote_code(str(model), exc)
            raise
        if device:
            self.model.to(device)
        id2label = {int(i): str(l) for i, l in self.model.config.id2label.items()}
        if label is None:
            label = _default_label(id2label, measures)
        matches = [i for i, l in id2label.items() if l.lower() == str(label).lower()]
        if not matches:
            raise PluginError(f"hf-classifier: label {label!r} is not one of the model's labels "
                              f"{sorted(id2label.values())}; pass label=...")
        self.index, self.label = matches[0], id2label[matches[0]]
        self.multi_label = getattr(self.model.config, "problem_type", None) == "multi_label_classification"
        self.measures, self.threshold, self.batch_size, self.max_length = measures, threshold, batch_size, max_length
        self.reference = model
        self.description = f"HF text classifier {model}: probability of label {self.label!r}."
        self._torch = torch

    def _score(self, texts: list[str]) -> list[float]:
        torch = self._torch
        enc = self.tokenizer(texts, return_tensors="pt", padding=True, truncation=True, max_length=self.max_length)
        enc = {k: v.to(self.model.device) for k, v in enc.items()}
        with torch.no_grad():
            logits = self.model(**enc).logits.float()
        probs = torch.sigmoid(logits) if self.multi_label else torch.softmax(logits, dim=-1)
        return probs[:, self.index].tolist()


def _default_label(id2label: dict[int, str], measures: str) -> str:
    wanted = ("positive", "pos", "label_1") if measures == "sentiment" else ("toxic", "toxicity", "offensive", "label_1")
    by_name = {l.lower(): l for l in id2label.values()}
    for w in wanted:
        if w in by_name:
            return by_name[w]
    if len(id2label) == 2:
        return id2label[1]
    raise PluginError(f"hf-classifier: cannot guess the target label among {sorted(id2label.values())}; pass label=...")


class RewardModelTextScorer(BaseScorer):
    """Scores finished texts with a steerkit reward model (``reward:REF``). Not independent of steering by
    the same model: useful as a sanity check that steering moved its own objective."""

    name = "reward"

    def __init__(self, reward: str, measures: str = "toxicity", threshold: float = 0.5, batch_size: int = 64):
        from ...rewards.loading import load_reward

        if measures not in MEASURES:
            raise PluginError(f"reward scorer: measures must be one of {', '.join(MEASURES)}, got {measures!r}.")
        loaded = load_reward(reward) if isinstance(reward, str) else reward
        self.model = getattr(loaded, "model", loaded)
        if not hasattr(self.model, "score_texts"):
            raise PluginError(f"reward scorer: {reward!r} is not a reward model with score_texts().")
        self.name = f"reward:{reward}" if isinstance(reward, str) else f"reward:{getattr(loaded, 'name', 'model')}"
        self.measures, self.threshold, self.batch_size = measures, threshold, batch_size
        self.description = (f"steerkit reward model {reward!r} scoring the finished continuation "
                            "(not independent of a run steered by the same model).")

    def _score(self, texts: list[str]) -> list[float]:
        return self.model.score_texts(texts, batch_size=self.batch_size)
