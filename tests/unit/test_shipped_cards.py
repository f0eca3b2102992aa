"""The shipped model cards (``model_cards/*.md`` and the README.md in each packaged reward-model directory) are exactly
what ``steerkit/training/card.py`` renders from the model's own training config (``plugins/*/train*.yaml``: its
attribute, limitations, data) and its shipped ``metrics.json``, so card text and card code cannot drift apart
(issue 27, item 8: a sentiment card said "do not treat them as probabilities of harm")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from steerkit.training.card import render_card
from steerkit.training.config import DATA_ROOT_ENV, TrainConfig

ROOT = Path(__file__).resolve().parents[2]


def _ships_a_model(config_path: Path) -> bool:
    """A config whose output directory is in its plugin's package and holds a trained model (a shipped one); a
    candidate or experiment config writes under runs/ (git-ignored), where a local run may have left a model."""
    output = Path(TrainConfig.from_file(config_path).output_dir).resolve()
    return config_path.parent.resolve() in output.parents and (output / "reward_config.json").is_file()


CONFIGS = sorted(p for p in ROOT.glob("plugins/*/train*.yaml") if _ships_a_model(p))
REGENERATE = ("re-render it from the repository root: python -c \"import json; from pathlib import Path; "
              "from steerkit.training.config import TrainConfig; from steerkit.training.card import render_card; "
              "c = TrainConfig.from_file('{config}'); d = Path(c.output_dir); "
              "t = render_card(c, json.loads((d / 'metrics.json').read_text())); "
              "[p.write_text(t, encoding='utf-8') for p in (d / 'README.md', Path(c.card))]\"")


def rendered(config_path: Path) -> tuple[TrainConfig, str]:
    config = TrainConfig.from_file(config_path)
    metrics = json.loads((Path(config.output_dir) / "metrics.json").read_text(encoding="utf-8"))
    return config, render_card(config, metrics)


@pytest.mark.parametrize("config_path", CONFIGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_shipped_card_is_what_card_py_renders(config_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the card's "Reproduce:" line names the config relative to the working directory
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    config, card = rendered(config_path.relative_to(ROOT))
    hint = REGENERATE.format(config=config_path.relative_to(ROOT).as_posix())
    packaged = Path(config.output_dir) / "README.md"
    assert packaged.read_text(encoding="utf-8") == card, f"{packaged} differs from the rendered card; {hint}"
    assert config.card, f"{config_path} names no `card:` file in model_cards/"
    assert Path(config.card).read_text(encoding="utf-8") == card, f"{config.card} differs; {hint}"


def test_every_shipped_card_is_checked():
    cards, packaged = set(), set()
    for config_path in CONFIGS:
        config = TrainConfig.from_file(config_path)
        cards.add(Path(config.card).resolve())
        packaged.add((Path(config.output_dir) / "README.md").resolve())
    assert cards == {p.resolve() for p in ROOT.glob("model_cards/*.md")}
    shipped = {p.parent / "README.md" for p in ROOT.glob("plugins/*/*/*/reward_config.json")}
    assert {p.resolve() for p in shipped} <= packaged


def test_no_shipped_card_speaks_of_harm_unless_its_attribute_does():
    for config_path in CONFIGS:
        config, card = rendered(config_path)
        if "toxic" not in config.attribute:
            for path, text in (("rendered", card), (config.card, Path(config.card).read_text(encoding="utf-8")),
                               (Path(config.output_dir) / "README.md",
                                (Path(config.output_dir) / "README.md").read_text(encoding="utf-8"))):
                assert "harm" not in text.lower(), f"{path}: the card of {config.name!r} ({config.attribute}) " \
                                                   "mentions harm"
