"""Issue 26's hate-speech training sources: the conversion script's parsing (tiny data built here), the
training config `plugins/steerkit-toxicity/train.yaml` (0.3.0's and 0.4.0's new sources, licences, and the
leave-one-source-out fold over them), and, where ../shared/data has the converted files, that they read as the
data README says and share nothing with the functional cases."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from conftest import SHARED_DATA
from steerkit.training.config import TrainConfig
from steerkit.training.data import normalise

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "plugins" / "steerkit-toxicity"
CONFIG = PLUGIN / "train.yaml"
NEW_GROUPS = ["ToxiGen statements", "Stormfront"]  # 0.3.0 (0.4.0 adds "Reddit counterspeech")
#: the EDOS experiment (0.5.0's train_0.5.0.yaml + EDOS with counter-speech copies; not shipped)
EDOS_CONFIG = PLUGIN / "train_edos_experiment.yaml"
#: where the converted files are: $STEERKIT_DATA_ROOT (a data root with them, as train.yaml's --data-root), else
#: ../shared/data
DATA = Path(os.environ["STEERKIT_DATA_ROOT"]) if os.environ.get("STEERKIT_DATA_ROOT") else SHARED_DATA
NEW_FILES = [DATA / "toxicity" / "toxigen_human_statements" / "statements.csv",
             DATA / "toxicity" / "stormfront_hate_speech" / "train.csv",
             DATA / "toxicity" / "stormfront_hate_speech" / "test.csv",
             DATA / "toxicity" / "reddit_counterspeech" / "train.csv",
             DATA / "toxicity" / "reddit_counterspeech" / "dev.csv"]
requires_hate_data = pytest.mark.skipif(
    not all(p.is_file() for p in NEW_FILES),
    reason=f"the converted hate-speech files are not under {DATA / 'toxicity'} (set STEERKIT_DATA_ROOT to a data root "
           "that has them) "
           "(plugins/steerkit-toxicity/data/convert_hate_sources.py --toxigen --stormfront and "
           "convert_counter_speech.py --reddit write them)")


def requires_converted(files: list[Path], what: str, flags: str):
    """Skip unless ``files`` (converted by convert_hate_sources.py ``flags``) are all under the data root."""
    return pytest.mark.skipif(not all(p.is_file() for p in files),
                              reason=f"the {what} files are not under {DATA / 'toxicity'} (convert_hate_sources.py "
                                     f"{flags} writes them; set STEERKIT_DATA_ROOT to that data root)")


def data_script(name: str):
    """A conversion script of plugins/steerkit-toxicity/data/ (scripts, not a package), imported."""
    spec = importlib.util.spec_from_file_location(name, PLUGIN / "data" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_with_data(config_name: str):
    """The dataset of a config of the plugin, read from the data root (its sources and held-out sets)."""
    return TrainConfig.from_file(PLUGIN / config_name, overrides={"data_root": str(DATA)}).read_dataset()


def held_sets(dataset) -> dict:
    """Held-out set name -> its examples."""
    return {s.display_name: ex for s, ex, _ in dataset.eval_sets}


def trained_examples(dataset, *groups: str) -> list:
    """The training and dev examples of the sources with these metrics names."""
    return [e for e in dataset.train + dataset.dev if dataset.sources[e.source].metrics_name in groups]


def assert_shares_no_text(trained: set[str], held: dict, names) -> None:
    """No normalised text of ``trained`` is in any of the held-out sets ``names``."""
    for name in names:
        assert not trained & {normalise(e.text) for e in held[name]}, name


@pytest.fixture(scope="module")
def convert():
    return data_script("convert_hate_sources")


def test_label_and_group_come_from_the_upstream_file_name(convert):
    assert convert.label_and_group("prompts/hate_asian_1k.txt") == ("hate", "asian")
    assert convert.label_and_group("demonstrations/disability/neutral_mental_disability_sentences.txt") == (
        "neutral", "mental_disability")
    assert convert.label_and_group("demonstrations/religion/hate_muslim.txt") == ("hate", "muslim")
    with pytest.raises(ValueError):
        convert.label_and_group("prompts/README.txt")


def test_a_prompt_line_is_unescaped_and_split_into_statements(convert):
    # upstream writes repr(prompt)[1:-1] of "- s1\n- s2\n-": newlines and backslashes arrive escaped
    line = r"- they are all lazy\n- a slash \\ and caf\xe9 stay\n-" + "\n"
    assert convert.prompt_statements(line) == ["they are all lazy", "a slash \\ and caf\u00e9 stay"]
    assert convert.prompt_statements("   \n") == []


def test_toxigen_statements_are_merged_once_with_the_demonstration_text(convert):
    demos = {"demonstrations/race/hate_black_sentences.txt": "they don't belong here\nthey don't belong here\n"}
    prompts = {"prompts/hate_black_1k.txt": r"- they dont belong here\n- go back\n-" + "\n",
               "prompts/neutral_black_1k.txt": r"- black history matters\n-" + "\n",
               "prompts/hate_immigrant_1k.txt": r"- go back\n-" + "\n"}
    rows = {r["text"]: r for r in convert.merge_toxigen(demos, prompts)}
    # the prompt's copy lost its apostrophe upstream: one statement, with the demonstration's text
    assert set(rows) == {"they don't belong here", "go back", "black history matters"}
    assert rows["they don't belong here"]["files"] == ("demonstrations/race/hate_black_sentences.txt;"
                                                       "prompts/hate_black_1k.txt")
    assert rows["go back"]["groups"] == "black;immigrant" and rows["go back"]["label"] == "hate"
    assert rows["black history matters"]["label"] == "neutral"


def test_a_statement_with_both_labels_is_an_error(convert):
    prompts = {"prompts/hate_women_1k.txt": r"- women drive\n-", "prompts/neutral_women_1k.txt": r"- Women drive.\n-"}
    with pytest.raises(ValueError, match="(?i)women drive"):
        convert.merge_toxigen({}, prompts)


def test_stormfront_rows_join_metadata_and_text_and_split_off_the_test_sample(convert):
    metadata = ("file_id,user_id,subforum_id,num_contexts,label\n"
                "1_1,9,1346,0,noHate\n1_2,9,1346,1,hate\n2_1,8,1345,0,relation\n")
    texts = {"1_1": "Nice  weather\n", "1_2": "They ruin every place .", "2_1": "and them too"}
    train, test = convert.join_stormfront(metadata, texts, test_ids={"1_2"})
    assert [r["file_id"] for r in train] == ["1_1", "2_1"] and [r["file_id"] for r in test] == ["1_2"]
    assert train[0] == {"file_id": "1_1", "subforum_id": "1346", "num_contexts": "0", "label": "noHate",
                        "text": "Nice weather"}
    assert "user_id" not in test[0]
    with pytest.raises(ValueError, match="3_1"):
        convert.join_stormfront(metadata + "3_1,7,1,0,hate\n", texts, set())


EDOS_CSV = """rewire_id,text,label_sexist,label_category,label_vector,split
e-1,"Women  just aren't suited
for this.",sexist,4. prejudiced discussions,4.2 x,train
e-2,She won the race.,not sexist,none,none,test
e-3,Good morning.,not sexist,none,none,dev
"""


def test_edos_rows_split_by_upstream_split_with_upstream_labels(convert):
    splits = convert.split_edos(EDOS_CSV)
    assert splits["train"] == [{"rewire_id": "e-1", "label": "sexist", "category": "4. prejudiced discussions",
                                "text": "Women just aren't suited for this."}]  # spacing collapsed
    assert [r["rewire_id"] for r in splits["test"]] == ["e-2"] and [r["rewire_id"] for r in splits["dev"]] == ["e-3"]
    # a split or label upstream does not define is an error, not a silently dropped row
    with pytest.raises(ValueError, match="e-9.*split"):
        convert.split_edos(EDOS_CSV + "e-9,x,sexist,none,none,validation\n")
    with pytest.raises(ValueError, match="e-9.*label"):
        convert.split_edos(EDOS_CSV + "e-9,x,maybe,none,none,train\n")


def test_profane_rows_of_one_label_are_relabelled_at_the_threshold(convert):
    rows = [{"text": "a", "label": "not sexist"}, {"text": "b", "label": "not sexist"},
            {"text": "c", "label": "sexist"}]
    scores = {"a": convert.PROFANE_AT, "b": convert.PROFANE_AT - 1e-6, "c": 1.0}
    flagged = convert.relabel_profane(rows, lambda texts: [scores[t] for t in texts], "not sexist",
                                      "not sexist, profane")
    assert flagged == 1  # the sexist row is never scored or relabelled
    assert [r["label"] for r in rows] == ["not sexist, profane", "not sexist", "sexist"]


IMPLICIT_TSV = (
    "post\tclass\n"
    "is it true that they are going to shoot white people nov 4th ?\timplicit_hate\n"
    "white people are the majority .\tnot_hate\n"
    "White people   are the majority.\tnot_hate\n"  # the same words: one row
    "a text with two labels\tnot_hate\n"
    "A text with two labels!\texplicit_hate\n"  # the same words, another class: both dropped
)


def test_implicit_hate_posts_are_read_once_and_split_by_their_text(convert):
    splits = convert.split_implicit_hate(IMPLICIT_TSV)
    rows = splits["train"] + splits["test"]
    assert sorted(r["label"] for r in rows) == ["implicit_hate", "not_hate"]
    assert {"label": "not_hate", "text": "white people are the majority ."} in rows
    # the held-out tenth is a function of the words alone, so a post lands on the same side whatever the file order
    for row in rows:
        assert (row in splits["test"]) == convert.held_out(convert.key(row["text"]), convert.IMPLICIT_HATE_TEST_SHARE)
    share = sum(convert.held_out(f"post {i}", 0.1) for i in range(20000)) / 20000
    assert 0.09 < share < 0.11
    with pytest.raises(ValueError, match="line 2: unknown class"):
        convert.split_implicit_hate("post\tclass\nx\thateful\n")
    with pytest.raises(ValueError, match="header"):
        convert.split_implicit_hate("text\tlabel\nx\tnot_hate\n")


SBIC_CSV = """offensiveYN,HITId,post,dataSource
1.0,h1,Why do they always ... ?,r/meanjokes
0.5,h1,Why do they always ... ?,r/meanjokes
,h1,Why do they always ... ?,r/meanjokes
0.0,h2,good morning,t/founta
1.0,h3,a forum sentence,Stormfront
,h4,nobody rated this,Gab
"""


def test_sbic_posts_get_the_mean_rating_and_trained_sources_are_left_out(convert):
    rows = convert.aggregate_sbic(SBIC_CSV)
    assert rows == [{"label": "0.7500", "annotators": 2, "source": "r/meanjokes", "text": "Why do they always ... ?"},
                    {"label": "0.0000", "annotators": 1, "source": "t/founta", "text": "good morning"}]
    with pytest.raises(ValueError, match="h9"):
        convert.aggregate_sbic(SBIC_CSV + "2.0,h9,x,Gab\n")


def test_the_implicit_hate_experiment_is_the_shipped_recipe_plus_the_corpus():
    config = TrainConfig.from_file(PLUGIN / "train_implicit_hate_experiment.yaml").model_dump()
    shipped = TrainConfig.from_file(CONFIG).model_dump()
    assert [s for s in config["data"] if s["group"] != "Implicit Hate"] == shipped["data"]
    assert config["eval"][:len(shipped["eval"])] == shipped["eval"]
    assert {s["name"] for s in config["eval"][len(shipped["eval"]):]} == {"Implicit Hate test", "SBIC dev"}
    where = {"output_dir", "checkpoint_dir", "card", "intended_use", "limitations", "data", "eval", "augment"}
    assert {k for k in shipped if shipped[k] != config[k]} <= where
    assert [v["sources"] for v in config["augment"]["views"] if v["transforms"] == ["detokenize"]] == [
        [*[v["sources"] for v in shipped["augment"]["views"] if v["transforms"] == ["detokenize"]][0], "Implicit Hate"]]


def test_edos_trains_on_sexist_and_civil_not_sexist_posts_and_evaluates_on_its_test_split():
    config = TrainConfig.from_file(EDOS_CONFIG)
    previous = TrainConfig.from_file(PLUGIN / "train_0.5.0.yaml")
    # the experiment is 0.5.0's recipe plus EDOS, and writes nothing into the package
    assert [s.name for s in config.data if s.metrics_name != "EDOS"] == [s.name for s in previous.data]
    assert "steerkit_toxicity" not in str(config.output_dir)
    edos = [s for s in config.data if s.metrics_name == "EDOS"]
    assert [s.transform.map for s in edos] == [{"sexist": 1}, {"not sexist": 0}]  # `not sexist, profane` skipped
    assert all(s.path == "toxicity/edos_sexism/train.csv" and s.skip_invalid and "CC0" in s.licence for s in edos)
    test = [s for s in config.eval if s.path == "toxicity/edos_sexism/test.csv"]
    assert len(test) == 1 and test[0].transform.map == {"sexist": 1, "not sexist": 0}


def test_the_shipped_recipe_is_the_light_edos_experiment_at_seed_0():
    """0.8.0 (train.yaml) is train_edos_light_experiment.yaml (0.5.0's recipe and data, EDOS at half the weight, no
    counter-speech copies of it) with seed 0, written into the package; 0.5.0's own config writes under runs/ only."""
    shipped = TrainConfig.from_file(CONFIG).model_dump()
    experiment = TrainConfig.from_file(PLUGIN / "train_edos_light_experiment.yaml").model_dump()
    where = {"output_dir", "checkpoint_dir", "card", "intended_use", "limitations"}
    assert shipped["seed"] == 0 and experiment["seed"] == 1
    assert {k for k in shipped if shipped[k] != experiment[k]} - where == {"seed"}
    assert [s["weight"] for s in shipped["data"] if s["group"] == "EDOS"] == [0.5, 0.25]
    previous = TrainConfig.from_file(PLUGIN / "train_0.5.0.yaml")
    for path in (previous.output_dir, previous.card, previous.checkpoint_dir):
        assert (ROOT / "runs") in Path(path).resolve().parents, path


def test_the_candidate_config_names_the_new_sources_with_their_licences():
    config = TrainConfig.from_file(CONFIG)
    new = [s for s in config.data if s.metrics_name in NEW_GROUPS]
    assert {s.metrics_name for s in new} == set(NEW_GROUPS)
    assert all(s.licence for s in new)
    # the functional cases and upstream's Stormfront test sample are evaluated, never trained on
    trained = {Path(s.path).name for s in config.data}
    assert "toxicity.jsonl" not in trained and "test.csv" not in trained
    assert {"toxicity.jsonl", "test.csv"} <= {Path(s.path).name for s in config.eval}


@pytest.mark.parametrize("group", NEW_GROUPS)
def test_each_new_source_can_be_held_out_whole(group):
    config = TrainConfig.from_file(CONFIG, overrides={"leave_out": [group]})
    kept, held = config.split_leave_out()
    assert held and {s.group for s in held} == {f"left out: {group}"}
    assert group not in {s.metrics_name for s in kept} and len(kept) + len(held) == len(config.data)


@requires_hate_data
def test_the_converted_files_read_with_the_documented_counts():
    config = TrainConfig.from_file(CONFIG, overrides={"data_root": str(DATA)})
    dataset = config.read_dataset()
    by_name = {st.name: st for st in dataset.stats}
    assert by_name["ToxiGen statements"].rows == 688
    assert by_name["Stormfront (hate)"].used == 957
    assert by_name["Stormfront (no hate)"].used == 5000  # limit over 9,268 noHate sentences
    stormfront_test = next(ex for s, ex, _ in dataset.eval_sets if s.display_name == "Stormfront test")
    assert len(stormfront_test) == 478 and sum(e.label for e in stormfront_test) == 239
    toxigen = [e for e in dataset.train + dataset.dev if dataset.sources[e.source].display_name == "ToxiGen statements"]
    assert sum(e.label for e in toxigen) == 382
    # 0.4.0: Reddit counter-speech without profanity (the converter labels the other 169 `counter-profane`)
    assert by_name["Reddit counterspeech (counter-speech)"].used == 332
    assert by_name["Reddit counterspeech (hate speech)"].used == 860
    assert by_name["Reddit counterspeech (counter-speech)"].skip_reasons == {"label invalid": 860 + 169}


@requires_hate_data
def test_the_new_sources_share_no_text_with_the_functional_cases():
    names = ("toxicity.jsonl", "toxicity_more.jsonl", "toxicity_named.jsonl", "sentiment.jsonl")
    cases = [json.loads(line) for name in names
             for line in (ROOT / "tests" / "functional" / name).read_text(encoding="utf-8").splitlines()
             if line.strip()]
    functional = {normalise(c["text"]) for c in cases}
    config = TrainConfig.from_file(CONFIG, overrides={"data_root": str(DATA), "eval": []})
    dataset = config.read_dataset()
    new = {normalise(e.text) for e in dataset.train + dataset.dev
           if dataset.sources[e.source].metrics_name in [*NEW_GROUPS, "Reddit counterspeech", "EDOS"]}
    assert len(new) > 6000 and not new & functional


IMPLICIT_FILES = [DATA / "toxicity" / "implicit_hate" / "train.csv", DATA / "toxicity" / "implicit_hate" / "test.csv",
                  DATA / "toxicity" / "sbic" / "dev.csv"]


@requires_hate_data
@requires_converted(IMPLICIT_FILES, "Implicit Hate and SBIC", "--implicit-hate --sbic")
def test_the_implicit_hate_files_read_with_the_documented_counts_and_miss_the_functional_cases():
    dataset = read_with_data("train_implicit_hate_experiment.yaml")
    by_name = {st.name: st for st in dataset.stats}
    assert by_name["Implicit Hate (hate)"].used == 6388 + 966
    assert by_name["Implicit Hate (not hate)"].used == 9921  # the 2,002 profane not-hate posts are skipped
    held = held_sets(dataset)
    assert len(held["Implicit Hate test"]) == 2161 and sum(e.label for e in held["Implicit Hate test"]) == 695 + 114
    assert len(held["SBIC dev"]) == 3997 and sum(e.label >= 0.5 for e in held["SBIC dev"]) == 2245
    trained = {normalise(e.text) for e in trained_examples(dataset, "Implicit Hate")}
    assert len(trained) > 16000
    assert_shares_no_text(trained, held, ["functional cases"])



SBIC_AGG_CSV = """,post,offensiveYN,dataSource
0,"why do they always ... ?",0.6666666666666666,r/meanjokes
1,a forum sentence,1.0,Stormfront
2,"Why do they
 always ... ?",0.0,Gab
3,good morning,0.0,t/founta
"""


def test_aggregated_sbic_keeps_the_mean_rating_once_a_text_and_leaves_out_trained_sources(convert):
    assert convert.aggregated_sbic(SBIC_AGG_CSV) == [
        {"label": "0.6667", "source": "r/meanjokes", "text": "why do they always ... ?"},
        {"label": "0.0000", "source": "t/founta", "text": "good morning"}]
    with pytest.raises(ValueError, match="offensiveYN 1.5"):
        convert.aggregated_sbic(SBIC_AGG_CSV + "4,x,1.5,Gab\n")


CAD_TSV = ("id\ttext\tlabels\n"
           "a1-post\tThey are vermin[linebreak]all of them\tIdentityDirectedAbuse\n"
           "a2-comment\tCalling them vermin is vile\tCounterSpeech\n"
           "a3-comment\tyou are an idiot and \"so\" are they\tCounterSpeech,PersonDirectedAbuse\n"
           "a4-comment\tnice weather\tNeutral\n"
           "a5-comment\t[linebreak]\tNeutral\n")


def test_cad_entries_are_abuse_where_any_abuse_category_is_given_and_lose_their_line_markers(convert):
    rows = convert.read_cad(CAD_TSV)
    assert [(r["id"], r["label"], r["text"]) for r in rows] == [
        ("a1-post", "abuse", "They are vermin all of them"),
        ("a2-comment", "counter speech", "Calling them vermin is vile"),
        ("a3-comment", "abuse", 'you are an idiot and "so" are they'), ("a4-comment", "neutral", "nice weather")]
    assert rows[2]["categories"] == "CounterSpeech,PersonDirectedAbuse"
    with pytest.raises(ValueError, match="a9.*Slur"):
        convert.read_cad(CAD_TSV + "a9\tx\tSlur\n")


def test_gab_hate_corpus_posts_are_hate_for_either_hate_category_and_vulgar_alone_otherwise(convert):
    tsv = ("text\thd\tcv\tvo\nthey should all be shot\t0\t1\t0\nfilth, all of them\t1\t0\t1\n"
           "what the hell\t0\t0\t1\nhello\t0\t0\t0\n")
    assert [(r["label"], r["text"]) for r in convert.read_ghc(tsv)] == [
        ("hate", "they should all be shot"), ("hate", "filth, all of them"), ("vulgar", "what the hell"),
        ("none", "hello")]
    with pytest.raises(ValueError, match="line 2"):
        convert.read_ghc("text\thd\tcv\tvo\nx\t2\t0\t0\n")


def test_training_rows_whose_text_is_held_out_are_dropped(convert):
    train = [{"text": "They are  vermin."}, {"text": "hello there"}, {"text": "good day"}]
    assert convert.drop_held_out_texts(train, [{"text": "they are vermin"}], [{"text": "Good day!"}]) == 2
    assert train == [{"text": "hello there"}]


CAD_CONFIGS = ["train_cad_experiment.yaml", "train_cad_ghc_experiment.yaml"]


@pytest.mark.parametrize("name", CAD_CONFIGS)
def test_the_cad_experiments_are_the_shipped_recipe_plus_their_sources(name):
    config = TrainConfig.from_file(PLUGIN / name).model_dump()
    shipped = TrainConfig.from_file(CONFIG).model_dump()
    added = {"CAD"} | ({"Gab Hate Corpus"} if "ghc" in name else set())
    assert [s for s in config["data"] if s["group"] not in added] == shipped["data"]
    assert {s["group"] for s in config["data"]} - {s["group"] for s in shipped["data"]} == added
    assert config["eval"][:len(shipped["eval"])] == shipped["eval"]
    assert [s["name"] for s in config["eval"][len(shipped["eval"]):]] == [
        "CAD test", "GHC test", "SBIC dev", "SBIC test", "Implicit Hate test"]
    where = {"output_dir", "checkpoint_dir", "card", "intended_use", "limitations", "data", "eval"}
    assert {k for k in shipped if shipped[k] != config[k]} <= where
    # each training file is the converter's train split; the test splits are held out
    assert {s["path"] for s in config["data"] if s["group"] in added} <= {
        "toxicity/cad/train.csv", "toxicity/gab_hate_corpus/train.csv"}


def test_the_stance_experiment_is_cad_ghc_with_the_gab_hate_posts_in_both_stance_copies():
    config = TrainConfig.from_file(PLUGIN / "train_cad_ghc_stance_experiment.yaml").model_dump()
    base = TrainConfig.from_file(PLUGIN / "train_cad_ghc_experiment.yaml").model_dump()
    shipped = TrainConfig.from_file(CONFIG).model_dump()
    assert {k for k in base if base[k] != config[k]} == {"output_dir", "checkpoint_dir", "card", "augment"}
    assert "steerkit_toxicity" not in str(config["output_dir"])
    stance = {"denounce", "endorse"}
    for view, before in zip(config["augment"]["views"], shipped["augment"]["views"], strict=True):
        if set(view["transforms"]) & stance:
            assert view == {**before, "sources": [*before["sources"], "Gab Hate Corpus"]}
        else:
            assert view == before
    assert sum(bool(set(v["transforms"]) & stance) for v in config["augment"]["views"]) == 2


CAD_FILES = [*(DATA / "toxicity" / "cad" / f"{split}.csv" for split in ("train", "dev", "test")),
             *(DATA / "toxicity" / "gab_hate_corpus" / f"{split}.csv" for split in ("train", "test")),
             DATA / "toxicity" / "sbic" / "test.csv"]


@requires_hate_data
@requires_converted([*IMPLICIT_FILES, *CAD_FILES], "CAD, Gab Hate Corpus, SBIC and Implicit Hate",
                    "--cad --ghc --sbic --sbic-test --implicit-hate")
def test_the_cad_and_gab_files_read_with_the_documented_counts_and_miss_the_held_out_texts():
    dataset = read_with_data("train_cad_ghc_experiment.yaml")
    by_name = {st.name: st for st in dataset.stats}
    assert by_name["CAD (abuse)"].used == 2394
    assert by_name["CAD (not abuse)"].used == 9270 + 98  # neutral and counter speech; 1,577 profane neutral skipped
    assert by_name["GHC (hate)"].used == 1938
    assert by_name["GHC (not hate)"].used == 17902  # 1,403 profane and 727 vulgar-only posts skipped
    held = held_sets(dataset)
    assert len(held["CAD test"]) == 5305 and sum(e.label for e in held["CAD test"]) == 906
    assert len(held["GHC test"]) == 4793 + 509 and sum(e.label for e in held["GHC test"]) == 509
    assert len(held["SBIC test"]) == 3997 and sum(e.label >= 0.5 for e in held["SBIC test"]) == 2330
    trained = {normalise(e.text) for e in trained_examples(dataset, "CAD", "Gab Hate Corpus")}
    assert_shares_no_text(trained, held, ["functional cases", "CAD test", "GHC test"])
    assert len(trained) > 30000

# -- DynaHate (convert_hate_sources.py --dynahate-splits --dynahate; train_dynahate_experiment.yaml)

def test_dynahate_lines_pair_texts_with_their_labels(convert):
    rows = convert.read_dynahate("Women are  inferior\nI love dogs\n\t\n", "1\n0\n0\n")
    assert rows == [{"label": "hate", "text": "Women are inferior"}, {"label": "nothate", "text": "I love dogs"}]
    with pytest.raises(ValueError, match="2 texts against 3 labels"):
        convert.read_dynahate("a\nb\n", "1\n0\n1\n")
    with pytest.raises(ValueError, match="line 2"):
        convert.read_dynahate("a\nb\n", "1\nhate\n")


def test_dynahate_entries_of_the_release_test_split_are_held_out_by_their_words(convert):
    official = convert.read_dynahate_split("text\tlabel\nwomen are inferior\thate\nim not a fan of rain\tnothate\n")
    assert official == {"women are inferior": "hate", "im not a fan of rain": "nothate"}
    rows = [{"label": "hate", "text": "Women are inferior!"},
            {"label": "nothate", "text": "I'm not a fan of rain."},
            {"label": "hate", "text": "women are INFERIOR"},  # a duplicate of the first
            {"label": "hate", "text": "Cats are evil"}, {"label": "nothate", "text": "cats are evil."},  # two labels
            {"label": "hate", "text": "Dev entry"}, {"label": "nothate", "text": "Other"}]
    splits, dropped = convert.split_dynahate(rows, {"test": official, "dev": {"dev entry": "hate",
                                                                               "other": "hate"}})
    assert [(r["text"], r["official"]) for r in splits["test"]] == [("Women are inferior!", "test"),
                                                                   ("I'm not a fan of rain.", "test")]
    assert [(r["text"], r["official"]) for r in splits["train"]] == [("Dev entry", "dev")]
    assert dropped == {"duplicate": 2, "two labels": 1, "label differs from the release's dev split": 1}


def test_the_dynahate_experiment_is_the_shipped_recipe_plus_dynahate():
    config = TrainConfig.from_file(PLUGIN / "train_dynahate_experiment.yaml").model_dump()
    shipped = TrainConfig.from_file(CONFIG).model_dump()
    assert [s for s in config["data"] if s["group"] != "DynaHate"] == shipped["data"]
    (dyna,) = [s for s in config["data"] if s["group"] == "DynaHate"]
    assert dyna["path"] == "toxicity/dynahate/train.csv" and "MIT" in dyna["licence"]
    assert config["eval"][:len(shipped["eval"])] == shipped["eval"]
    assert [s["name"] for s in config["eval"][len(shipped["eval"]):]] == [
        "DynaHate test", "CAD test", "GHC test", "SBIC dev", "SBIC test", "Implicit Hate test"]
    assert {k for k in shipped if shipped[k] != config[k]} <= {"output_dir", "checkpoint_dir", "card", "data", "eval",
                                                               "intended_use", "limitations"}
    assert "steerkit_toxicity" not in str(config["output_dir"])


@pytest.mark.parametrize("name", ["train_dynahate_w025_experiment.yaml", "train_dynahate_civil_experiment.yaml"])
def test_the_dynahate_explorations_change_only_dynahate_rows(name):
    config = TrainConfig.from_file(PLUGIN / name).model_dump()
    base = TrainConfig.from_file(PLUGIN / "train_dynahate_experiment.yaml").model_dump()
    assert {k for k in base if base[k] != config[k]} == {"output_dir", "checkpoint_dir", "card", "data"}
    assert [s for s in config["data"] if s["group"] != "DynaHate"] == [
        s for s in base["data"] if s["group"] != "DynaHate"]
    dyna = {s["name"]: s for s in config["data"] if s["group"] == "DynaHate"}
    if "civil" in name:  # the profane "not hate" entries are skipped, the two classes about even an epoch
        assert dyna["DynaHate (hate)"]["transform"]["map"] == {"hate": 1}
        assert dyna["DynaHate (not hate)"]["transform"]["map"] == {"nothate": 0}
        assert dyna["DynaHate (hate)"]["weight"] == 0.25 and dyna["DynaHate (not hate)"]["weight"] == 0.5
    else:
        assert dyna["DynaHate"]["weight"] == 0.25


def test_the_token_dynahate_experiment_is_the_shipped_token_recipe_plus_dynahate():
    config = TrainConfig.from_file(PLUGIN / "train_token_dynahate_experiment.yaml").model_dump()
    shipped = TrainConfig.from_file(PLUGIN / "train_token.yaml").model_dump()
    sequence = TrainConfig.from_file(PLUGIN / "train_dynahate_experiment.yaml").model_dump()
    assert config["data"][:-1] == shipped["data"]
    assert config["data"][-1] == next(s for s in sequence["data"] if s["group"] == "DynaHate")
    assert config["eval"][:len(shipped["eval"])] == shipped["eval"]
    assert {s["name"] for s in config["eval"][len(shipped["eval"]):]} == {
        "DynaHate test", "EDOS test", "SBIC dev", "SBIC test", "Implicit Hate test"}
    assert {k for k in shipped if shipped[k] != config[k]} <= {"output_dir", "checkpoint_dir", "card", "data", "eval",
                                                               "intended_use", "limitations"}
    assert "steerkit_toxicity" not in str(config["output_dir"])


DYNAHATE_FILES = [DATA / "toxicity" / "dynahate" / f"{split}.csv" for split in ("train", "test")]


@requires_hate_data  # the config reads train.yaml's sources and the newer held-out sets too
@requires_converted([*IMPLICIT_FILES, *CAD_FILES, *DYNAHATE_FILES], "DynaHate, CAD, Gab Hate Corpus, SBIC and "
                    "Implicit Hate", "--dynahate-splits --dynahate --cad --ghc --sbic --sbic-test --implicit-hate")
def test_the_dynahate_files_read_with_the_documented_counts_and_miss_the_held_out_texts():
    dataset = read_with_data("train_dynahate_experiment.yaml")
    assert {st.name: st.used for st in dataset.stats}["DynaHate"] == 34126
    used = {st.name: st.used for st in read_with_data("train_dynahate_civil_experiment.yaml").stats}
    assert (used["DynaHate (hate)"], used["DynaHate (not hate)"]) == (18436, 9191)  # 6,499 profane skipped
    held = held_sets(dataset)
    assert len(held["DynaHate test"]) == 2145 and sum(e.label for e in held["DynaHate test"]) == 1270
    trained = {normalise(e.text) for e in trained_examples(dataset, "DynaHate")}
    assert_shares_no_text(trained, held, ["functional cases", "DynaHate test"])
    assert len(trained) > 30000


# -- ToxiGen's annotated statements (convert_hate_sources.py --toxigen-annotated --toxigen-annotated-test;
#    train_toxigen_annotated_seed{0,1}_experiment.yaml)

def test_toxigen_annotated_ratings_become_soft_labels_once_a_text(convert):
    lines = [{"text": "Muslims deserve to die", "toxicity_human": 5.0, "target_group": "muslim"},
             {"text": "they have a rich culture\\n- many of them", "toxicity_human": 1.0 + 1 / 3,
              "target_group": "asian"},
             {"text": "muslims deserve to die!", "toxicity_human": 4.0, "target_group": "muslim"}]  # same words
    rows, read = convert.read_toxigen_annotated(["\n".join(json.dumps(x) for x in lines[:2]) + "\n",
                                                 json.dumps(lines[2])])
    assert read == 3
    assert rows == [{"label": "1.0000", "toxicity_human": "5.00", "target_group": "muslim",
                     "text": "Muslims deserve to die"},
                    {"label": "0.0833", "toxicity_human": "1.33", "target_group": "asian",
                     "text": "they have a rich culture - many of them"}]
    with pytest.raises(ValueError, match="file 2, line 3: toxicity_human 0.0"):
        convert.read_toxigen_annotated(["", "\n".join([json.dumps(lines[0]), "",
                                                          json.dumps({**lines[0], "toxicity_human": 0})])])


def test_the_safenlp_toxigen_test_keeps_only_texts_outside_the_training_split(convert):
    train = [{"text": "Muslims deserve to die"}]
    items = [{"id": 0, "text": "muslims deserve to DIE", "toxicity_score": 5.0, "label": "hate",
              "target_groups": ["muslim"]},
             {"id": 1, "text": "Jewish families gathered", "toxicity_score": 1.0, "label": "neutral",
              "target_groups": ["jewish"]},
             {"id": 2, "text": "jewish families gathered.", "toxicity_score": 1.0, "label": "neutral",
              "target_groups": ["jewish"]}]
    assert convert.safenlp_toxigen_test(items, train) == [
        {"label": "neutral", "toxicity_human": "1.00", "target_group": "jewish", "text": "Jewish families gathered"}]
    with pytest.raises(ValueError, match="label 'maybe'"):
        convert.safenlp_toxigen_test([{**items[1], "label": "maybe"}], train)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_toxigen_annotated_experiments_are_the_dynahate_stance_recipe_plus_toxigen(seed):
    config = TrainConfig.from_file(PLUGIN / f"train_toxigen_annotated_seed{seed}_experiment.yaml").model_dump()
    stance = TrainConfig.from_file(PLUGIN / "train_dynahate_stance_experiment.yaml").model_dump()
    base = TrainConfig.from_file(PLUGIN / "train_dynahate_experiment.yaml").model_dump()
    assert config["data"][:-1] == stance["data"] and config["augment"] == stance["augment"]
    toxigen = config["data"][-1]
    assert (toxigen["path"], toxigen["label"], toxigen["weight"]) == ("toxicity/toxigen_annotated/train.csv", "label",
                                                                       1.0)
    assert "CDLA-Permissive-2.0" in toxigen["licence"]
    assert config["eval"][:-1] == base["eval"] and config["eval"][-1]["name"] == "ToxiGen annotated test"
    assert {k for k in stance if stance[k] != config[k]} == {"output_dir", "checkpoint_dir", "card", "data", "eval",
                                                             "seed"} - ({"seed"} if seed == 0 else set())
    assert config["seed"] == seed and f"seed{seed}" in config["output_dir"]
    assert "steerkit_toxicity" not in str(config["output_dir"])


@pytest.mark.parametrize("seed", [0, 1])
def test_the_rtp_variants_raise_only_the_two_rtp_weights_by_half(seed):
    config = TrainConfig.from_file(PLUGIN / f"train_toxigen_annotated_rtp_seed{seed}_experiment.yaml").model_dump()
    base = TrainConfig.from_file(PLUGIN / f"train_toxigen_annotated_seed{seed}_experiment.yaml").model_dump()
    assert {k for k in base if base[k] != config[k]} == {"output_dir", "checkpoint_dir", "card", "data"}
    changed = [(a["name"], b["weight"], a["weight"]) for a, b in zip(config["data"], base["data"], strict=True)
               if a != b]
    assert changed == [("RTP continuations", 1.0, 1.5), ("RTP prompts", 0.5, 0.75)]
    assert [{**a, "weight": 0} for a in config["data"]] == [{**b, "weight": 0} for b in base["data"]]
    assert f"rtp-seed{seed}" in config["output_dir"]


TOXIGEN_ANNOTATED_FILES = [DATA / "toxicity" / "toxigen_annotated" / f"{split}.csv" for split in ("train", "test")]


@requires_hate_data  # the config reads train.yaml's sources, DynaHate and the newer held-out sets too
@requires_converted([*IMPLICIT_FILES, *CAD_FILES, *DYNAHATE_FILES, *TOXIGEN_ANNOTATED_FILES], "ToxiGen annotated, "
                    "DynaHate, CAD, Gab Hate Corpus, SBIC and Implicit Hate", "--toxigen-annotated "
                    "--toxigen-annotated-test --dynahate-splits --dynahate --cad --ghc --sbic --sbic-test "
                    "--implicit-hate")
def test_the_toxigen_annotated_files_read_with_the_documented_counts_and_miss_the_held_out_texts():
    dataset = read_with_data("train_toxigen_annotated_seed0_experiment.yaml")
    used = {st.name: st.used for st in dataset.stats}
    assert used["ToxiGen annotated"] == 8940 and used["DynaHate"] == 34126
    held = held_sets(dataset)
    assert len(held["ToxiGen annotated test"]) == 598 and sum(e.label for e in held["ToxiGen annotated test"]) == 292
    trained = trained_examples(dataset, "ToxiGen annotated")
    assert all(0.0 <= e.label <= 1.0 for e in trained) and len({e.label for e in trained}) == 13  # 13 mean ratings
    assert_shares_no_text({normalise(e.text) for e in trained}, held, ["functional cases", "ToxiGen annotated test"])


# -- the CONAN experiment (plugins/steerkit-toxicity/data/convert_counter_speech.py; not shipped: research-only licence)

@pytest.fixture(scope="module")
def conan():
    return data_script("convert_counter_speech")


def test_conan_rows_keep_english_and_the_english_translations_only(conan):
    content = ("cn_id,hateSpeech,counterSpeech\n"
               "ENT1ST1HS1CN1,They are all the same.,Generalising about millions of people is unfair.\n"
               "FRT1ST1HS1CN1,Ils sont tous pareils.,C'est injuste.\n"
               "FRT1ST1HS1CN1T1,They are all alike.,That is unfair.\n"
               "ENT1ST1HS1CN1P1,All of them are the same.,Generalising about millions of people is unfair.\n")
    rows = conan.conan_rows(content)
    assert [label for _, label, _ in rows] == ["hate", "counter"] * 3
    assert not any("pareils" in text for text, _, _ in rows)
    with pytest.raises(ValueError, match="unexpected id"):
        conan.conan_rows("cn_id,hateSpeech,counterSpeech\nXX1,a,b\n")


def test_conan_merge_deduplicates_on_words_and_drops_label_conflicts(conan):
    rows, conflicts = conan.merge([
        ("Multitarget-CONAN", [("They  are all the same!", "hate", "MIGRANTS"),
                               ("People differ.", "counter", "MIGRANTS")]),
        ("DIALOCONAN", [("they are all the same", "hate", "JEWS"),  # the same words: kept once, the first names it
                        ("people differ", "hate", "JEWS"),  # counter-speech elsewhere: a conflict, dropped
                        ("   ", "counter", "JEWS")]),  # no words: skipped
    ])
    assert conflicts == 1
    assert rows == [{"text": "They are all the same!", "label": "hate", "dataset": "Multitarget-CONAN",
                     "target": "MIGRANTS"}]


@pytest.mark.parametrize("name, group, licence", [
    ("train_conan_experiment.yaml", "CONAN", "research use only"),
    ("train_reddit_counterspeech_experiment.yaml", "Reddit counterspeech", "MIT"),
    ("train_edos_experiment.yaml", "EDOS", "CC0"),
    ("train_edos_light_experiment.yaml", "EDOS", "CC0"),
    ("train_token_edos_experiment.yaml", "EDOS", "CC0"),
    ("train_implicit_hate_experiment.yaml", "Implicit Hate", "CC-BY-4.0"),
    ("train_implicit_hate_stance_experiment.yaml", "Implicit Hate", "CC-BY-4.0"),
    ("train_token_implicit_hate_experiment.yaml", "Implicit Hate", "CC-BY-4.0"),
    ("train_cad_experiment.yaml", "CAD", "CC-BY-4.0"),
    ("train_cad_ghc_experiment.yaml", "CAD", "CC-BY-4.0"),
    ("train_cad_ghc_experiment.yaml", "Gab Hate Corpus", "CC-BY-4.0"),
])
def test_the_counter_speech_experiments_are_not_shipped_configs(name, group, licence):
    """Experiments, not the shipped model (CONAN's licence allows research use only; the Reddit run is an experiment
    too): each config writes under runs/ (git-ignored), never into the plugin's package or its card, and records the
    licence on both entries of its counter-speech source."""
    config = TrainConfig.from_file(PLUGIN / name)
    for path in (config.output_dir, config.card, config.checkpoint_dir):
        assert (ROOT / "runs") in Path(path).resolve().parents, path
    sources = [s for s in config.data if s.group == group]
    assert len(sources) == 2 and all(licence in s.licence for s in sources)


# -- the Reddit counterspeech experiment (dan-hickey1/toxic-counterspeech, MIT; convert_counter_speech.py --reddit)

def test_a_reddit_reply_loses_its_markup_but_keeps_its_words(conan):
    reply = ("&gt; they are all criminals\n\nThat is a racist lie. [Source](https://example.org/a) "
             "http://x.y/z **really**&amp;#x200B;")
    assert conan.reddit_clean(reply) == "they are all criminals That is a racist lie. Source really"
    # validation_set.csv has its newlines collapsed into runs of spaces: a quote marker after one is dropped too
    assert conan.reddit_clean(">we are superior    No, you are not.   3 > 2") == (
        "we are superior No, you are not. 3 > 2")
    assert conan.reddit_clean("https://i.imgur.com/x.gif") == ""


def test_reddit_rows_keep_the_reply_of_hate_and_counter_speech_only(conan):
    content = ("id,subreddit,parent,reply,label\n"
               "a1,sub1,the parent is never used,They should all be deported.,1\n"
               "a2,sub1,they should all be deported,\"No, that is bigotry.\",2\n"
               "a3,sub2,hi,just chatting,0\n")
    assert conan.reddit_rows(content) == [("They should all be deported.", "hate", "sub1"),
                                          ("No, that is bigotry.", "counter", "sub1")]
    with pytest.raises(ValueError, match="unexpected label"):
        conan.reddit_rows("id,subreddit,parent,reply,label\nb1,s,p,r,3\n")


def test_reddit_dev_texts_leave_the_training_rows(conan):
    # validation_set.csv's extra `target` column is read the same way
    dev = conan.reddit_rows("id,subreddit,parent,reply,label,target\n"
                            "d1,s,p,Racism is not cool.,2,newcomer\n"
                            "d2,s,p,They are vermin.,1,reply_to_newcomer\n")
    train = [("racism is NOT cool!", "counter", "s"),  # the same words as a dev text: dropped from train
             ("Go back where you came from.", "hate", "s"),
             ("go back where you came from", "counter", "s"),  # the other label: a conflict, dropped
             ("Stop spreading hate.", "counter", "t"),
             ("", "hate", "t")]  # a URL-only reply, empty after cleaning: skipped
    merged = conan.merge_reddit(train, dev)
    human = {"dataset": "validation_set (human labels)", "subreddit": "s"}
    assert merged["dev"] == [{"text": "Racism is not cool.", "label": "counter", **human},
                             {"text": "They are vermin.", "label": "hate", **human}]
    assert merged["train"] == [{"text": "Stop spreading hate.", "label": "counter",
                                "dataset": "gpt_4o_labels (GPT-4o labels)", "subreddit": "t"}]
    assert merged["conflicts"] == (1, 0) and merged["in_dev"] == 1


def test_profane_counter_speech_is_flagged_and_only_civil_counter_speech_is_trained_on(conan):
    """0.4.0 trains on the counter-speech replies without profanity: the converter relabels the others
    `counter-profane` (alt-profanity-check >= 0.5), and train.yaml maps `counter` only, so they are skipped."""
    pytest.importorskip("profanity_check", reason="alt-profanity-check is not installed: pip install 'steerkit-rad[eval]'")
    rows = [{"text": "They're right. This sub is fucked up, you stupid assholes.", "label": "counter"},
            {"text": "Nobody should be judged by where they were born.", "label": "counter"},
            {"text": "Those people are a plague and should leave.", "label": "hate"}]
    assert conan.flag_profane(rows, conan.profanity_score()) == 1
    assert [r["label"] for r in rows] == ["counter-profane", "counter", "hate"]  # hate is never relabelled
    assert conan.flag_profane([{"text": "a", "label": "counter"}], lambda texts: [conan.PROFANE_AT]) == 1
    assert conan.flag_profane([{"text": "a", "label": "counter"}], lambda texts: [conan.PROFANE_AT - 1e-6]) == 0

    config = TrainConfig.from_file(CONFIG)
    reddit = [s for s in config.data if s.metrics_name == "Reddit counterspeech"]
    assert [s.transform.map for s in reddit] == [{"counter": 0}, {"hate": 1}]
    assert all(s.skip_invalid and "MIT" in s.licence for s in reddit)
    # its human-labelled replies are evaluated, never trained on
    assert "dev.csv" not in {Path(s.path).name for s in config.data}
    assert any(Path(s.path).name == "dev.csv" and s.path.startswith("toxicity/reddit_counterspeech")
               for s in config.eval)
    # the experiment keeps every counter-speech reply, profane ones included
    experiment = TrainConfig.from_file(PLUGIN / "train_reddit_counterspeech_experiment.yaml")
    assert {"counter": 0, "counter-profane": 0} in [s.transform.map for s in experiment.data]
