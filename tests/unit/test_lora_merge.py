"""steerkit merges a saved LoRA adapter itself (steerkit/rewards/lora.py): loading a LoRA reward model needs no peft.

(a) the merge equals peft's ``merge_and_unload`` on a Llama-style backbone (nn.Linear) and on a GPT-2 one
(Conv1D, weights stored in × out), with random non-zero factors, so a wrong scale or transpose fails;
(b) a saved LoRA reward directory (sequence and token-level) loads with peft unimportable and scores as the
peft-merged model does; (c) an adapter that does not fit the backbone or its settings is refused.
"""

from __future__ import annotations

import copy
import sys
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import GPT2Config, GPT2LMHeadModel

pytest.importorskip("peft")  # the reference merge and the saving side (training) use peft

from steerkit.errors import RewardModelFormatError  # noqa: E402
from steerkit.rewards import lora as lora_module  # noqa: E402
from steerkit.rewards import model as model_module  # noqa: E402
from steerkit.rewards.backbones import truncate  # noqa: E402
from steerkit.rewards.lora import lora_config, merge_lora, resolve_lora  # noqa: E402
from steerkit.rewards.model import LoraSettings, RewardModel  # noqa: E402
from steerkit.rewards.token.model import TokenRewardModel  # noqa: E402
from steerkit.testing import make_tokenizer, random_lora, save_tiny_lm, tiny_lm  # noqa: E402

TEXTS = ["You are a wonderful friend", "I hate it, this is terrible", "12 apples and 3.5 pears"]


def peft_merge(backbone, settings: LoraSettings, state: dict, source: str = ""):
    """steerkit's former loading path: attach the adapter with peft and ``merge_and_unload``."""
    from peft import get_peft_model, set_peft_model_state_dict

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        wrapped = get_peft_model(backbone, lora_config(settings, backbone))
    result = set_peft_model_state_dict(wrapped, state)
    assert not result.unexpected_keys
    return wrapped.merge_and_unload()


def backbone(family: str, seed: int = 0):
    tokenizer = make_tokenizer()
    if family == "llama":
        lm = tiny_lm(tokenizer, seed=seed, layers=3)
    else:
        torch.manual_seed(seed)
        lm = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=3, n_head=4, n_positions=64,
                                        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id))
    base = lm.eval().base_model
    truncate(base, 2)  # as a reward model keeps its first layers: the adapter names the truncated backbone's modules
    return base


@pytest.mark.parametrize("family,targets", [
    ("llama", ["q_proj", "v_proj", "down_proj"]),  # square, narrower (GQA) and wider-in projections
    ("llama", None),  # the family's default targets (resolve_lora)
    ("gpt2", ["c_attn", "c_proj"]),  # Conv1D; c_proj is a suffix of both attn.c_proj and mlp.c_proj
])
def test_merge_equals_peft_merge_and_unload(family, targets):
    from peft import get_peft_model_state_dict

    settings = resolve_lora(LoraSettings(r=4, alpha=12, target_modules=targets), backbone(family))
    original, ours = backbone(family), backbone(family)
    wrapped = random_lora(backbone(family), settings)
    state = {k: v.detach().clone() for k, v in get_peft_model_state_dict(wrapped, save_embedding_layers=False).items()}
    assert all(k.startswith(lora_module.KEY_PREFIX) for k in state) and len(state) >= 4
    assert not any(".2." in k for k in state)  # the third block was truncated away before the adapter was made
    reference = wrapped.merge_and_unload()
    merged = merge_lora(ours, settings, state)
    expected, got, before = reference.state_dict(), merged.state_dict(), original.state_dict()
    assert set(got) == set(expected)
    changed = [k for k in got if not torch.equal(got[k], before[k])]
    assert changed and all(".lora_" not in k for k in got)
    assert all((got[k] - before[k]).abs().max() > 1e-2 for k in changed)  # a real update, not rounding
    for key in got:
        torch.testing.assert_close(got[key], expected[key], rtol=0, atol=1e-6, msg=key)
    ids = torch.randint(3, 200, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).last_hidden_state, reference(input_ids=ids).last_hidden_state,
                                   rtol=0, atol=1e-5)


def save_lora_reward(directory, backbone_dir, cls=RewardModel, targets=None):
    """A LoRA reward model over a saved tiny backbone, saved as training saves it (peft's adapter keys), and its
    scores computed by the unmerged peft model."""
    rm = cls.from_backbone(str(backbone_dir), 2, name="tinylora")
    settings = resolve_lora(LoraSettings(r=4, alpha=8, target_modules=targets), rm.backbone)
    rm.config = rm.config.model_copy(update={"method": "lora", "lora": settings})
    rm.backbone = random_lora(rm.backbone, settings, seed=5)
    torch.nn.init.normal_(rm.head.weight if cls is RewardModel else rm.head.bias, std=0.5)
    rm.eval().save_pretrained(directory)
    return directory, rm.score_texts(TEXTS)


def block_peft(monkeypatch):
    """Make peft unimportable, cached submodules included (``from peft.x import y`` would reuse those)."""
    for name in [n for n in sys.modules if n == "peft" or n.startswith("peft.")] + ["peft"]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError):
        import peft  # noqa: F401
    with pytest.raises(ImportError):
        from peft import get_peft_model  # noqa: F401


@pytest.mark.parametrize("cls", [RewardModel, TokenRewardModel])
def test_a_lora_reward_loads_without_peft_and_scores_as_peft_merged(cls, tmp_path, monkeypatch):
    backbone_dir = save_tiny_lm(tmp_path / "backbone", make_tokenizer(), seed=3)
    directory, unmerged = save_lora_reward(tmp_path / "rm", backbone_dir, cls)
    with monkeypatch.context() as patch:  # the former loading path, through peft
        patch.setattr(model_module, "merge_lora", peft_merge)
        with_peft = cls.from_pretrained(directory)
    block_peft(monkeypatch)
    loaded = cls.from_pretrained(directory)
    assert not any(".lora_" in k for k in loaded.state_dict())
    for key, value in with_peft.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[key], value, rtol=0, atol=1e-6, msg=key)
    scores = loaded.score_texts(TEXTS)
    assert scores == pytest.approx(with_peft.score_texts(TEXTS), abs=1e-6)
    assert scores == pytest.approx(unmerged, abs=1e-5)
    assert len(set(round(s, 4) for s in scores)) == len(TEXTS)  # a head that tells the texts apart
    from steerkit.rewards.loading import load_reward

    assert load_reward(str(directory)).model.score_texts(TEXTS) == pytest.approx(scores, abs=1e-6)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    backbone_dir = save_tiny_lm(root / "backbone", make_tokenizer(), seed=3)
    directory, _ = save_lora_reward(root / "rm", backbone_dir, targets=["q_proj", "v_proj"])
    return directory


def corrupt(saved, tmp_path, edit_state=None, edit_config=None):
    import shutil

    target = shutil.copytree(saved, tmp_path / "corrupt")
    adapter = target / model_module.ADAPTER_NAME
    state = load_file(str(adapter))
    if edit_state:
        state = edit_state(state)
        save_file({k: v.clone().contiguous() for k, v in state.items()}, str(adapter))
    if edit_config:
        config = model_module.read_config(target)
        (target / model_module.CONFIG_NAME).write_text(edit_config(config).model_dump_json(), encoding="utf-8")
    return target


def _drop_one(state):
    return {k: v for k, v in state.items() if not k.endswith("layers.1.self_attn.v_proj.lora_B.weight")}


def _extra_module(state):
    key = next(k for k in state if "q_proj.lora_A" in k)
    return {**state, key.replace("q_proj", "k_proj"): state[key],
            key.replace("q_proj", "k_proj").replace("lora_A", "lora_B"): torch.zeros(16, 4)}


def _deeper_layer(state):
    return {**state, **{k.replace("layers.1.", "layers.2."): v for k, v in state.items() if "layers.1." in k}}


def _transposed(state):
    key = next(k for k in state if "q_proj.lora_A" in k)
    return {**state, key: state[key].T.contiguous()}


def _foreign_key(state):
    return {**state, "base_model.model.layers.0.self_attn.q_proj.lora_magnitude_vector": torch.ones(32)}  # DoRA


def _unprefixed(state):
    return {k.removeprefix("base_model.model."): v for k, v in state.items()}


def _integer(state):
    key = next(k for k in state if "q_proj.lora_B" in k)
    return {**state, key: state[key].to(torch.int64)}


@pytest.mark.parametrize("edit_state,edit_config,message", [
    (_drop_one, None, "only one of lora_A / lora_B"),
    (_extra_module, None, "it adapts layers.0.self_attn.k_proj"),
    (_deeper_layer, None, "it adapts layers.2."),
    (_transposed, None, "have shapes (32, 4)"),
    (_foreign_key, None, "no LoRA factor steerkit merges"),
    (_unprefixed, None, "no LoRA factor steerkit merges"),
    (_integer, None, "floating-point"),
    (None, lambda c: c.model_copy(update={"lora": c.lora.model_copy(update={"r": 8})}), "lora.r=8"),
    (None, lambda c: c.model_copy(update={"lora": c.lora.model_copy(update={"target_modules": ["q_proj"]})}),
     "it adapts layers.0.self_attn.v_proj"),
    (None, lambda c: c.model_copy(update={"lora": c.lora.model_copy(update={"target_modules": ["q_proj", "v_proj",
                                                                                               "o_proj"]})}),
     "it lacks layers.0.self_attn.o_proj"),
    (None, lambda c: c.model_copy(update={"lora": c.lora.model_copy(update={"r": 0})}), "at least 1"),
    (None, lambda c: c.model_copy(update={"lora": c.lora.model_copy(update={"target_modules": ["mlp"]})}),
     "name no Linear or Conv1D layer"),
])
def test_a_mismatched_adapter_is_refused(saved, tmp_path, monkeypatch, edit_state, edit_config, message):
    block_peft(monkeypatch)
    target = corrupt(saved, tmp_path, edit_state, edit_config)
    with pytest.raises(RewardModelFormatError) as info:
        RewardModel.from_pretrained(target)
    assert message in str(info.value) and model_module.ADAPTER_NAME in str(info.value)


def test_lora_settings_a_plain_merge_cannot_honour_are_refused(saved, tmp_path):
    """rslora / DoRA change the update (scale alpha/√r, a magnitude vector): the config format has no field for them,
    so a directory that asks for one is refused as invalid instead of merged wrongly."""
    target = corrupt(saved, tmp_path)
    path = target / model_module.CONFIG_NAME
    path.write_text(path.read_text(encoding="utf-8").replace('"r": 4', '"r": 4, "use_rslora": true'), encoding="utf-8")
    with pytest.raises(RewardModelFormatError, match="use_rslora"):
        RewardModel.from_pretrained(target)


def test_a_refused_adapter_leaves_the_backbone_untouched():
    base = backbone("llama")
    before = copy.deepcopy(base.state_dict())
    settings = resolve_lora(LoraSettings(r=4, alpha=8), base)
    from peft import get_peft_model_state_dict

    state = dict(get_peft_model_state_dict(random_lora(backbone("llama"), settings), save_embedding_layers=False))
    bad_key = sorted(state)[-1]
    state[bad_key] = state[bad_key][:, :2]  # the last module checked is the one that does not fit
    with pytest.raises(RewardModelFormatError):
        merge_lora(base, settings, state)
    assert all(torch.equal(v, before[k]) for k, v in base.state_dict().items())
