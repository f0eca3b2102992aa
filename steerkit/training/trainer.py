"""The training loop behind ``steerkit train``.

Order of work, chosen so that nothing already trained is ever lost:

1. read and validate every data file (a bad row raises DataError before any output is touched);
2. build the reward model (methods ``lora`` via peft, ``head`` with a frozen backbone, ``full``);
3. train with the paper's cumulative loss, periodic dev evaluation and atomic checkpoints; Ctrl-C
   writes a checkpoint and stops; ``resume=True`` continues from the newest checkpoint and, with the
   same seed, reaches the same weights as an uninterrupted run (data order and learning rate are pure
   functions of the step, and the optimizer state and RNG are restored exactly);
4. evaluate on the dev split (per source) and the held-out sets, then write the reward-model directory
   (weights, metrics.json, README.md model card) into a temporary directory and swap it into place.

What is never deleted: an existing ``output_dir`` is refused unless it is safe to replace
(:mod:`steerkit.training.output`). In ``checkpoint_dir`` only what checkpointing writes is removed (``step-*``,
``latest``, the temporaries of interrupted writes), and the directory itself only if this run created it and it
is then empty.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from ..devices import resolve_device
from ..threads import set_threads
from ..errors import ConfigError, RewardModelFormatError
from ..rewards.model import RewardModel, lora_config, resolve_lora
from .augment import augment
from .config import TrainConfig
from .data import Dataset, epoch_indices, length_grouped_batches
from .loss import LOSSES
from .loop import Callbacks, DevMonitor, Tokenized, TrainingLoop, label_loss, prepare_dirs, tokenize_dataset
from .loop import learning_rate, trainable_parameters  # noqa: F401 (their home until the loop had one)
from .output import portable_data, write_output
from .metrics import final_metrics
from .runtime import hardware, log


@dataclass
class TrainResult:
    output_dir: Path
    metrics: dict
    steps: int
    seconds: float


def build_model(config: TrainConfig) -> RewardModel:
    """A fresh reward model set up for ``config.method`` (seeded, so two builds are identical)."""
    torch.manual_seed(config.seed)
    from ..rewards.kinds import get_kind

    model = get_kind(config.kind).new_model(config)  # the kind's model class (rewards/kinds.py)
    lora = None
    if config.method == "lora":  # default targets resolved from the backbone's family and saved explicitly
        try:
            lora = resolve_lora(config.lora, model.backbone)
        except RewardModelFormatError as exc:
            raise ConfigError(str(exc)) from None
    model.config = model.config.model_copy(update={
        "method": config.method, "lora": lora, "tokenizer": config.backbone})  # stated explicitly in the saved config
    if config.method in {"head", "lora"}:
        model.backbone.requires_grad_(False)
    else:  # "full" fine-tunes the kept transformer layers; the token embeddings (shared with the LM) stay frozen
        model.backbone.get_input_embeddings().requires_grad_(False)
    if config.method == "lora":
        try:
            from peft import get_peft_model
        except ImportError:
            raise ConfigError("method 'lora' needs peft: pip install 'steerkit-rad[train]' (or pick method 'head').") from None
        try:
            with warnings.catch_warnings():  # peft calls a transformers API deprecated in 5.x (harmless)
                warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
                model.backbone = get_peft_model(model.backbone, lora_config(lora, model.backbone))
        except ValueError as exc:
            raise ConfigError(f"lora.target_modules {lora.target_modules} do not fit backbone "
                              f"{config.backbone!r}: {exc}") from None
    model.head.requires_grad_(True)
    return model


def train(config: TrainConfig, *, resume: bool = False, overwrite: bool = False, progress: bool = True,
          callbacks: Callbacks | None = None) -> TrainResult:
    """Train a reward model as configured and write its directory to ``config.output_dir``.

    ``overwrite`` (or ``config.overwrite``) allows replacing an existing reward-model directory at
    ``output_dir`` and discarding an earlier run's checkpoints; see the module docstring for what is never
    deleted."""
    callbacks = callbacks or Callbacks()
    if config.distill is not None:  # token-level distillation from a sequence reward model (training/distill.py)
        from .distill import train_distilled

        return TrainResult(*train_distilled(config, resume=resume, overwrite=overwrite, progress=progress,
                                            callbacks=callbacks, build=build_model))
    overwrite = overwrite or config.overwrite
    set_threads(config.threads)  # None: steerkit's default (see steerkit.threads)
    device = resolve_device(config.device)  # a wrong --device fails before any data is read
    started = time.perf_counter()
    dataset, augmented = read_training_data(config)
    dirs = prepare_dirs(config, resume=resume, overwrite=overwrite)

    model = build_model(config).to(device)
    tokens = tokenize_dataset(model, dataset, config)
    loop = TrainingLoop(config, model, dirs, dataset.file_hashes, callbacks=callbacks, progress=progress)
    run = loop.run(LabelLoss(model, dataset, tokens, config, device), resume=resume)
    state, total, examples_seen, loop_seconds = run.state, run.total, run.examples_seen, run.seconds
    train_seconds = state.elapsed_before + loop_seconds

    eval_start = time.perf_counter()
    metrics = final_metrics(model, dataset, tokens.dev, tokens.eval_sets, config)
    model.to("cpu")  # saved from the CPU whatever it trained on
    eval_seconds = time.perf_counter() - eval_start
    metrics["training"] = {
        "steps": total, "batch_size": config.batch_size, "examples_seen_this_process": examples_seen,
        "train_seconds": round(train_seconds, 1), "eval_seconds": round(eval_seconds, 1),
        "examples_per_second": round(examples_seen / max(loop_seconds, 1e-9), 2) if examples_seen else None,
        "wall_seconds_this_process": round(time.perf_counter() - started, 1),
        "resumed_from": state.resumed_from, "hardware": hardware(device), "method": config.method,
        "num_layers": model.config.num_layers, "trainable_parameters": run.trainable,
        "loss": config.loss, "max_length": config.max_length, "lr": config.learning_rate, "seed": config.seed,
    }
    metrics.update(_data_metrics(dataset, config, augmented, state.history))
    output = write_output(model, config, metrics, overwrite=overwrite)
    loop.finish()
    log(f"wrote {output} ({train_seconds:.0f} s training, {eval_seconds:.0f} s evaluation)")
    return TrainResult(output, metrics, total, train_seconds)


def read_training_data(config: TrainConfig) -> tuple[Dataset, tuple[list, list[str]]]:
    """The configured data, its training split augmented (dev and test rows never are); ``(added rows,
    obfuscation lexicon)`` for metrics.json. Warns when nothing will measure the trained model."""
    dataset = config.read_dataset()
    sources = dataset.sources
    added, copies, lexicon = augment(dataset.train, [(s.display_name, s.metrics_name) for s in sources],
                                     config.augment, config.seed, [s.path for s in sources])
    dataset.train.extend(added)
    for index, count in copies.items():
        dataset.stats[index].augmented = count
    if not dataset.dev and not dataset.eval_sets:
        # Only reachable with dev_fraction 0 (build_dataset raises when a dev split is asked for and impossible).
        # A warning, not an error: training on every row and evaluating elsewhere (`steerkit eval`) is legitimate,
        # but the user should know that metrics.json and the card will hold no measurement of the model.
        message = ("dev_fraction is 0 and no eval set is given: nothing measures the trained model, so metrics.json "
                   "and the model card will have no dev or test metrics. Set dev_fraction > 0 or add --eval FILE.")
        warnings.warn(message, UserWarning, stacklevel=3)
    return dataset, (added, lexicon)


class _BatchPlan:
    """Which training rows make up step ``s``: a pure function of the seed and the step (so a resumed run sees
    the same batches), length-grouped within each weighted epoch; one epoch's plan is kept at a time."""

    def __init__(self, dataset: Dataset, tokens: Tokenized, config: TrainConfig):
        self.dataset, self.config = dataset, config
        self.weights = [s.weight for s in dataset.sources]
        self.lengths = [len(r) for r in tokens.train]
        self.per_epoch = len(self._epoch(0))
        self._cached = (-1, [])

    def _epoch(self, epoch: int) -> list[list[int]]:
        order = epoch_indices(self.dataset.train, self.weights, self.config.seed, epoch)
        return length_grouped_batches(order, self.lengths, self.config.batch_size, self.config.seed, epoch)

    def batch(self, step: int) -> list[int]:
        epoch, index = divmod(step, self.per_epoch)
        if epoch != self._cached[0]:
            self._cached = (epoch, self._epoch(epoch))
        return self._cached[1][index]


class LabelLoss:
    """Label training's :class:`~.loop.LossStrategy`: the length-grouped batches of :class:`_BatchPlan`, the
    configured loss (:data:`~.loss.LOSSES`) against their labels, and the dev rows monitored."""

    def __init__(self, model: RewardModel, dataset: Dataset, tokens: Tokenized, config: TrainConfig, device):
        self.dataset, self.tokens, self.config, self.device = dataset, tokens, config, device
        self.plan = _BatchPlan(dataset, tokens, config)
        self.per_epoch = self.plan.per_epoch
        self.loss_fn = LOSSES[config.loss]
        self.dev = DevMonitor(dataset, tokens.dev, config)
        self.layers = model.config.num_layers

    def batch(self, step: int) -> list[int]:
        return self.plan.batch(step)

    def loss(self, model, batch: list[int]) -> torch.Tensor:
        return label_loss(model, [self.tokens.train[i] for i in batch], [self.dataset.train[i].label for i in batch],
                          self.loss_fn, self.device)

    def size(self, batch: list[int]) -> int:
        return len(batch)

    def monitor(self, model):
        return self.dev(model)

    def describe(self, total: int, trainable: int) -> str:
        dataset, config = self.dataset, self.config
        return (f"{len(dataset.train)} train / {len(dataset.dev)} dev examples from {len(config.data)} source(s), "
                f"{self.per_epoch} steps per epoch, {total} steps, method {config.method}, "
                f"{self.layers} layers, {trainable:,} trainable parameters")


def _data_metrics(dataset: Dataset, config: TrainConfig, augmented, history: list[dict]) -> dict:
    """metrics.json's account of the data: per source, the held-out sets, augmentation, and the loss history."""
    added, lexicon = augmented
    return {
        **portable_data(dataset, config),
        "removed_eval_overlap": dataset.removed_overlap,
        "augmentation": {"views": [v.model_dump() for v in config.augment.views], "copies": len(added),
                         "obfuscation_lexicon_size": len(lexicon), "obfuscation_lexicon_sample": lexicon[:40]},
        "left_out": list(config.leave_out),
        "history": history,
    }
