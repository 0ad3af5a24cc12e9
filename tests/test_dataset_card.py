"""The dataset card: the right licence per source, and a folder Hugging Face ``datasets`` loads
as train/dev/test (pairs) and as the ``overlays`` config."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
import yaml

from pipeline.noise.export import PAIRS_SCHEMA, dataset_card, split_tables

COUNTS = {"pairs": 3, "by_split": {"train": 2, "test": 1}, "by_noise_level": {"record": 3},
          "by_intent": {"laboratory": 3}, "by_operator": {"drop_evidence": 3}}


def card_header(kind: str) -> dict:
    text = dataset_card({"source": {"kind": kind}, "seed": 0, "counts": COUNTS})
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n")[1])


@pytest.mark.parametrize("kind, license", [("demo", "odbl"), ("mimic", "other"), ("synthetic", "apache-2.0")])
def test_card_licence_follows_the_source(kind, license):
    header = card_header(kind)
    assert header["license"] == license
    if kind == "mimic":
        assert header["license_name"].startswith("physionet-credentialed")
        assert header["license_link"].startswith("https://physionet.org/")


def test_card_configs_name_real_splits():
    configs = {c["config_name"]: c for c in card_header("demo")["configs"]}
    assert set(configs) == {"default", "overlays"} and configs["default"]["default"] is True
    for config in configs.values():
        assert [f["split"] for f in config["data_files"]] == ["train", "test"]  # no dev pairs: no dev file


def fake_pair(i: int, split: str) -> dict:
    pair = {f.name: f"{f.name}-{i}" for f in PAIRS_SCHEMA if f.type == "string"}
    changes = [["labevents", "delete", 100 + i, None, None], ["labevents", "update", 200 + i, "valuenum", "7.5"]]
    return {**pair, "pair_id": f"p{i}", "seed": 0, "split": split, "changes": json.dumps(changes)}


def test_hugging_face_loads_the_folder_by_split(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    pairs = [fake_pair(0, "train"), fake_pair(1, "train"), fake_pair(2, "test")]  # dev left empty on purpose
    for name, table in split_tables(pairs).items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, tmp_path / name)
    pq.write_table(split_tables(pairs)["splits/pairs-train.parquet"], tmp_path / "pairs.parquet")
    (tmp_path / "README.md").write_text(dataset_card({"source": {"kind": "demo"}, "seed": 0, "counts": COUNTS}))

    loaded = datasets.load_dataset(str(tmp_path), cache_dir=str(tmp_path / "cache"))
    assert not (tmp_path / "splits" / "pairs-dev.parquet").exists()
    assert {s: loaded[s].num_rows for s in loaded} == {"train": 2, "test": 1}
    assert loaded["test"][0]["pair_id"] == "p2" and loaded["train"].column_names == PAIRS_SCHEMA.names
    overlays = datasets.load_dataset(str(tmp_path), "overlays", cache_dir=str(tmp_path / "cache"))
    assert {s: overlays[s].num_rows for s in overlays} == {"train": 4, "test": 2}
    flat = datasets.load_dataset("parquet", data_files=str(tmp_path / "pairs.parquet"),
                                 cache_dir=str(tmp_path / "cache"))
    assert flat["train"].num_rows == 2
