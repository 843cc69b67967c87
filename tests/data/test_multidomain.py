"""Multi-domain datasets (PACS, MNIST+USPS, ``<domain>/<class>/`` folders), CINIC-10 and CelebA on
generated files with the hub schemas; the ``domain`` partitioners, ``--holdout-domain`` and
``ood_acc``; partition export/import with the held-out domain and ``client_domains``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image as PILImage

from datasets import ClassLabel, Dataset, Features, Image, Value
from pflbench.cli import cli
from pflbench.config.identity import partition_identity
from pflbench.config.run_config import RunConfig, with_base_defaults
from pflbench.data.dataset import load_dataset
from pflbench.data.domains import client_domain_names, domain, domain_dirichlet, held_out_indices
from pflbench.data.partition import make_partition
from pflbench.data.partitioners import dirichlet
from pflbench.data.presets import partition_document, read_partition_file
from pflbench.errors import ConfigError
from pflbench.registry import ALGORITHMS
from pflbench.runs.execute import execute
from pflbench.runs.prepare import prepare
from pflbench.store.reader import partition_of
from pflbench.testing import Harness

PACS_CLASSES = ["dog", "elephant", "giraffe", "guitar", "horse", "house", "person"]
PACS_DOMAINS = ["art_painting", "cartoon", "photo", "sketch"]
CINIC_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
DIGITS = ClassLabel(names=[str(d) for d in range(10)])


pytestmark = pytest.mark.usefixtures("offline_hub")  # tests/data/conftest.py


def _parquet(root: Path, split: str, columns: dict, features: Features) -> None:
    (root / "data").mkdir(parents=True, exist_ok=True)
    Dataset.from_dict(columns, features=features).to_parquet(str(root / "data" / f"{split}-00000-of-00001.parquet"))


def write_pacs(root: Path, per_domain: dict[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    """flwrlabs/pacs's schema: image (RGB), domain (string), label (7-class ClassLabel); one train split."""
    rng = np.random.default_rng(seed)
    domains = [d for d, n in per_domain.items() for _ in range(n)]
    images = rng.integers(0, 256, (len(domains), 12, 12, 3), dtype=np.uint8)
    labels = rng.integers(0, 7, len(domains))
    features = Features({"image": Image(), "domain": Value("string"), "label": ClassLabel(names=PACS_CLASSES)})
    _parquet(root, "train", {"image": list(images), "domain": domains, "label": labels.tolist()}, features)
    return {"image": images, "domain": np.asarray(domains), "label": labels}


def write_digits(root: Path, name: str, splits: dict[str, int], side: int, seed: int) -> np.ndarray:
    """ylecun/mnist and flwrlabs/usps's schema: image (L, side×side), label (ClassLabel 0..9)."""
    rng = np.random.default_rng(seed)
    labels = []
    for split, n in splits.items():
        images = rng.integers(0, 256, (n, side, side), dtype=np.uint8)
        split_labels = rng.integers(0, 10, n)
        features = Features({"image": Image(), "label": DIGITS})
        _parquet(root / name, split, {"image": list(images), "label": split_labels.tolist()}, features)
        labels.append(split_labels)
    return np.concatenate(labels)


# ----------------------------------------------------------------------------- the loaders


def test_pacs_schema_loads_with_domains_as_groups(tmp_path: Path) -> None:
    written = write_pacs(tmp_path / "pacs", {"art_painting": 5, "cartoon": 4, "photo": 3, "sketch": 6})
    data = load_dataset("pacs", {"data_dir": str(tmp_path / "pacs"), "size": 8})
    assert data.inputs.shape == (18, 3, 8, 8) and data.num_classes == 7
    assert data.labels.tolist() == written["label"].tolist()
    assert data.groups.tolist() == written["domain"].tolist()
    assert data.info["domains"] == PACS_DOMAINS and data.info["group_column"] == "domain"
    assert data.info["classes"] == PACS_CLASSES
    full = load_dataset("pacs", {"data_dir": str(tmp_path / "pacs"), "size": 12})  # no resize at 12
    assert torch.equal(full.inputs, torch.from_numpy(written["image"]).permute(0, 3, 1, 2))


def test_mnist_usps_pools_two_domains_at_one_size(tmp_path: Path) -> None:
    mnist = write_digits(tmp_path / "digits", "mnist", {"train": 6, "test": 2}, 28, seed=1)
    usps = write_digits(tmp_path / "digits", "usps", {"train": 4, "test": 3}, 16, seed=2)
    data = load_dataset("mnist_usps", {"data_dir": str(tmp_path / "digits")})
    assert data.inputs.shape == (15, 1, 28, 28) and data.num_classes == 10
    assert data.labels.tolist() == [*mnist.tolist(), *usps.tolist()]
    assert data.groups.tolist() == ["mnist"] * 8 + ["usps"] * 7
    small = load_dataset("mnist_usps", {"data_dir": str(tmp_path / "digits"), "size": 16})
    assert small.inputs.shape == (15, 1, 16, 16)


def test_mnist_usps_without_usps_says_how_to_get_it(tmp_path: Path) -> None:
    write_digits(tmp_path / "digits", "mnist", {"train": 4}, 28, seed=1)
    with pytest.raises(ConfigError, match="flwrlabs/usps") as error:
        load_dataset("mnist_usps", {"data_dir": str(tmp_path / "digits")})
    assert "\n" not in str(error.value) and "save_to_disk" in str(error.value)


def test_imagefolder_domains_reads_domain_and_class_folders(tmp_path: Path) -> None:
    layout = {("clipart", "cat"): 2, ("clipart", "dog"): 1, ("real", "dog"): 3, ("real", "bird"): 1}
    for (domain_name, label), count in layout.items():
        folder = tmp_path / "images" / domain_name / label
        folder.mkdir(parents=True)
        for i in range(count):
            PILImage.fromarray(np.full((6, 6, 3), 10 * i, np.uint8)).save(folder / f"{i}.png")
    data = load_dataset("imagefolder_domains", {"path": str(tmp_path / "images")})
    assert data.info["classes"] == ["bird", "cat", "dog"]  # the union over domains, sorted
    assert data.info["domains"] == ["clipart", "real"]
    assert data.labels.tolist() == [1, 1, 2, 0, 2, 2, 2]
    assert data.groups.tolist() == ["clipart"] * 3 + ["real"] * 4
    assert data.inputs.shape == (7, 3, 6, 6)


def test_cinic10_pools_its_three_splits(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    features = Features({"image": Image(), "label": ClassLabel(names=CINIC_CLASSES)})
    labels = []
    for split, n in (("train", 5), ("validation", 4), ("test", 3)):
        split_labels = rng.integers(0, 10, n)
        images = list(rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8))
        _parquet(tmp_path / "cinic", split, {"image": images, "label": split_labels.tolist()}, features)
        labels.append(split_labels)
    data = load_dataset("cinic10", {"data_dir": str(tmp_path / "cinic")})
    assert data.inputs.shape == (12, 3, 32, 32) and data.num_classes == 10 and data.groups is None
    assert sorted(data.info["splits"].items()) == [("test", 3), ("train", 5), ("validation", 4)]
    by_split = dict(zip(("train", "validation", "test"), labels))
    assert data.labels.tolist() == [v for split in data.info["splits"] for v in by_split[split].tolist()]


def write_celeba(root: Path, celebrities: dict[int, int], seed: int = 0) -> dict[str, np.ndarray]:
    """flwrlabs/celeba's schema (two of its 40 boolean attributes): image, celeb_id (int64), Male, Smiling."""
    rng = np.random.default_rng(seed)
    ids = [c for c, n in celebrities.items() for _ in range(n)]
    smiling, male = rng.random(len(ids)) < 0.5, rng.random(len(ids)) < 0.5
    features = Features({"image": Image(), "celeb_id": Value("int64"), "Male": Value("bool"), "Smiling": Value("bool")})
    images = list(rng.integers(0, 256, (len(ids), 10, 8, 3), dtype=np.uint8))
    columns = {"image": images, "celeb_id": ids, "Male": male.tolist(), "Smiling": smiling.tolist()}
    _parquet(root, "train", columns, features)
    return {"celeb_id": np.asarray(ids), "Smiling": smiling, "Male": male}


def test_celeba_smiling_label_and_celebrities_as_clients(tmp_path: Path) -> None:
    written = write_celeba(tmp_path / "celeba", {7: 12, 3: 15, 11: 4, 20: 13})
    data = load_dataset("celeba", {"data_dir": str(tmp_path / "celeba"), "size": "6x5"})
    assert data.inputs.shape == (44, 3, 6, 5) and data.num_classes == 2
    assert data.labels.tolist() == written["Smiling"].astype(int).tolist()
    assert data.groups.tolist() == [str(c) for c in written["celeb_id"]]
    male = load_dataset("celeba", {"data_dir": str(tmp_path / "celeba"), "attribute": "Male"})
    assert male.labels.tolist() == written["Male"].astype(int).tolist()
    with pytest.raises(ConfigError, match="attribute='Smile' is not one of .*Male, Smiling"):
        load_dataset("celeba", {"data_dir": str(tmp_path / "celeba"), "attribute": "Smile"})
    config = RunConfig(
        dataset="celeba", data_dir=str(tmp_path / "celeba"), partition="natural", num_clients=3, min_size=10
    )
    split = make_partition(config, data)
    owners = [set(data.groups[np.concatenate([tr, va, te])]) for tr, va, te in zip(split.train, split.val, split.test)]
    assert sorted(o.pop() for o in owners) == ["20", "3", "7"]  # celebrity 11 has < min_size samples


@pytest.mark.parametrize("name, hub_id", [("pacs", "flwrlabs/pacs"), ("cinic10", "flwrlabs/cinic10")])
def test_offline_without_data_is_one_clear_line(name: str, hub_id: str) -> None:
    with pytest.raises(ConfigError, match=hub_id) as error:
        load_dataset(name)
    assert "\n" not in str(error.value) and "--data-dir" in str(error.value)


def test_missing_domain_column_is_named(tmp_path: Path) -> None:
    features = Features({"image": Image(), "label": ClassLabel(names=PACS_CLASSES)})
    _parquet(tmp_path / "pacs", "train", {"image": [np.zeros((4, 4, 3), np.uint8)], "label": [1]}, features)
    with pytest.raises(ConfigError, match="no column 'domain'"):
        load_dataset("pacs", {"data_dir": str(tmp_path / "pacs")})


# ----------------------------------------------------------------------------- the partitioners

# 11 samples of domain "a", 5 of "b", 8 of "c", interleaved
GROUPS = np.asarray(list("abcabcabcabcabcacacaaaac"))
LABELS = np.arange(len(GROUPS)) % 3


def test_domain_gives_each_domain_k_over_d_clients_in_name_order() -> None:
    clients = domain(LABELS, 6, np.random.default_rng(0), groups=GROUPS, min_size=2)
    assert client_domain_names(GROUPS, clients) == ["a", "a", "b", "b", "c", "c"]
    # a domain of n samples split into 2: sizes ⌈n/2⌉ and ⌊n/2⌋, every sample exactly once
    assert [len(c) for c in clients] == [6, 5, 3, 2, 4, 4]
    assert sorted(np.concatenate(clients).tolist()) == list(range(len(GROUPS)))


def test_holdout_domain_is_given_to_no_client() -> None:
    clients = domain(LABELS, 4, np.random.default_rng(0), groups=GROUPS, min_size=2, holdout_domain="b")
    assert client_domain_names(GROUPS, clients) == ["a", "a", "c", "c"]
    assert held_out_indices(GROUPS, "b").tolist() == [1, 4, 7, 10, 13]
    assert not set(np.concatenate(clients).tolist()) & set(held_out_indices(GROUPS, "b").tolist())


def test_domain_dirichlet_is_dirichlet_inside_each_domain() -> None:
    clients = domain_dirichlet(LABELS, 6, np.random.default_rng(1), groups=GROUPS, alpha=0.1, min_size=1)
    rng, expected = np.random.default_rng(1), []
    for name in ("a", "b", "c"):  # domains in name order, one stream
        members = np.flatnonzero(GROUPS == name)
        expected += [members[part] for part in dirichlet(LABELS[members], 2, rng, alpha=0.1, min_size=1)]
    assert [c.tolist() for c in clients] == [e.tolist() for e in expected]
    assert client_domain_names(GROUPS, clients) == ["a", "a", "b", "b", "c", "c"]


def test_domain_bad_inputs_are_one_clear_line() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(
        ConfigError, match=r"--holdout-domain 'd' is not a domain of this dataset; its domains: a, b, c"
    ):
        domain(LABELS, 4, rng, groups=GROUPS, min_size=1, holdout_domain="d")
    with pytest.raises(ConfigError, match=r"--num-clients 4 is not a multiple of the 3 training domains \(a, b, c\)"):
        domain(LABELS, 4, rng, groups=GROUPS, min_size=1)
    with pytest.raises(ConfigError, match="needs a dataset with domains"):
        domain(LABELS, 3, rng, groups=None)
    with pytest.raises(ConfigError, match=r"domain 'b' \(5 samples\): 2 clients × min_size=3 needs 6 samples"):
        domain(LABELS, 6, rng, groups=GROUPS, min_size=3)


def test_same_seed_same_indices() -> None:
    first = domain_dirichlet(LABELS, 3, np.random.default_rng(5), groups=GROUPS, alpha=0.5, min_size=1)
    again = domain_dirichlet(LABELS, 3, np.random.default_rng(5), groups=GROUPS, alpha=0.5, min_size=1)
    assert all(np.array_equal(x, y) for x, y in zip(first, again))


# ----------------------------------------------------------------------------- runs, files, CLI


def pacs_config(root: Path, **overrides: object) -> RunConfig:
    write_pacs(root / "pacs", {"art_painting": 40, "cartoon": 36, "photo": 30, "sketch": 24})
    settings: dict = dict(
        algo="fedavg",
        dataset="pacs",
        data_dir=str(root / "pacs"),
        dataset_option=("size=8",),
        partition="domain",
        num_clients=3,
        min_size=5,
        holdout_domain="sketch",
        model="mlp",
        rounds=2,
        out=str(root / "out"),
    )
    return RunConfig(**{**settings, **overrides})


def test_holdout_partition_records_ood_and_client_domains(tmp_path: Path) -> None:
    config = pacs_config(tmp_path)
    dataset = load_dataset("pacs", config.dataset_options())
    split = make_partition(config, dataset)
    sketch = np.flatnonzero(dataset.groups == "sketch")
    assert split.ood.tolist() == sketch.tolist() and split.stats["ood_samples"] == 24
    assert split.client_domains == ["art_painting", "cartoon", "photo"]
    for k, name in enumerate(split.client_domains):
        held = np.concatenate([split.train[k], split.val[k], split.test[k]])
        assert set(dataset.groups[held]) == {name} and len(held) == int((dataset.groups == name).sum())
    document = split.to_json()
    assert document["ood_indices"] == sketch.tolist() and document["client_domains"] == split.client_domains
    again = make_partition(config, dataset)  # same seed, same indices
    assert all(np.array_equal(a, b) for a, b in zip(split.train + split.test, again.train + again.test))
    plain = make_partition(RunConfig(**{**config.__dict__, "holdout_domain": None, "num_clients": 4}), dataset)
    assert "ood_indices" not in plain.to_json() and len(plain.ood) == 0
    assert plain.client_domains == PACS_DOMAINS
    mixed = make_partition(RunConfig(**{**config.__dict__, "holdout_domain": None, "partition": "iid"}), dataset)
    assert "client_domains" not in mixed.to_json()  # clients of no single domain


def test_export_and_import_keep_ood_and_domains(tmp_path: Path) -> None:
    config = pacs_config(tmp_path)
    dataset = load_dataset("pacs", config.dataset_options())
    split = make_partition(config, dataset)
    document = partition_document(
        config,
        dataset,
        split.train,
        split.test,
        split.public,
        split.val,
        ood=split.ood,
        client_domains=split.client_domains,
    )
    path = tmp_path / "pacs-partition.json"
    path.write_text(json.dumps(document))
    imported = make_partition(
        RunConfig(**{**config.__dict__, "partition_file": str(path), "holdout_domain": None}), dataset
    )
    for name in ("train", "val", "test"):
        assert all(np.array_equal(a, b) for a, b in zip(getattr(split, name), getattr(imported, name)))
    assert imported.ood.tolist() == split.ood.tolist() and imported.client_domains == split.client_domains
    run_json = tmp_path / "partition.json"  # a run's partition.json reads back the same way
    run_json.write_text(json.dumps(split.to_json()))
    preset = read_partition_file(run_json)
    assert preset.ood.tolist() == split.ood.tolist() and preset.client_domains == split.client_domains
    document["ood"] = [int(split.train[0][0])]  # a sample both trained on and held out
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError, match="assigned 2 times"):
        make_partition(RunConfig(**{**config.__dict__, "partition_file": str(path), "holdout_domain": None}), dataset)


def _accuracy(harness: Harness, indices: torch.Tensor) -> float:
    inputs, labels = harness.data.gather(indices)
    harness.model.eval()
    with torch.no_grad():
        return int((harness.model(inputs).argmax(dim=1) == labels).sum()) / len(labels)


def test_ood_acc_is_the_global_models_accuracy_on_the_held_out_domain(tmp_path: Path) -> None:
    prepared = prepare(pacs_config(tmp_path, rounds=1))
    harness = Harness(prepared)
    records: list[dict] = []
    harness.run(records.append)
    harness.load_global_model()
    expected = _accuracy(harness, torch.as_tensor(prepared.partition.ood))
    assert records[-1]["ood_acc"] == pytest.approx(expected, abs=1e-12)


def test_ood_acc_without_a_global_model_is_the_mean_personal_accuracy(tmp_path: Path) -> None:
    assert not ALGORITHMS.get("fedper").has_global_model
    prepared = prepare(pacs_config(tmp_path, algo="fedper", rounds=1))
    harness = Harness(prepared)
    records: list[dict] = []
    harness.run(records.append)
    ood = torch.as_tensor(prepared.partition.ood)
    accuracies = []
    for k in range(3):
        harness.load_personal_model(k)
        accuracies.append(_accuracy(harness, ood))
    assert records[-1]["ood_acc"] == pytest.approx(float(np.mean(accuracies)), abs=1e-12)


def test_run_reports_ood_acc_and_only_with_a_held_out_domain(tmp_path: Path) -> None:
    summary = execute(prepare(pacs_config(tmp_path)))
    assert 0 <= summary["ood_acc"] <= 1 and "ood_acc_last10" in summary
    config = pacs_config(tmp_path / "b", holdout_domain=None, num_clients=4)
    held = partition_identity(with_base_defaults(pacs_config(tmp_path / "c")).partition_spec)
    assert held["holdout_domain"] == "sketch"  # part of the run identity: another domain, another run
    assert partition_identity(with_base_defaults(config).partition_spec)["holdout_domain"] is None
    plain = execute(prepare(config))
    assert "ood_acc" not in plain


def _invoke(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(cli, [*map(str, args)])
    return result.exit_code, result.output


def test_cli_and_config_file_runs_write_ood_acc(tmp_path: Path) -> None:
    write_pacs(tmp_path / "pacs", {"art_painting": 30, "cartoon": 30, "photo": 30, "sketch": 20})
    common = ["--dataset", "pacs", "--data-dir", tmp_path / "pacs", "--dataset-option", "size=8", "--model", "mlp"]
    common += ["--num-clients", 3, "--min-size", 5, "--rounds", 1, "--quiet"]
    code, output = _invoke(
        "run", *common, "--partition", "domain", "--holdout-domain", "photo", "--out", tmp_path / "a"
    )
    assert code == 0, output
    (folder,) = (tmp_path / "a" / "runs").iterdir()
    rounds = [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines()]
    assert "ood_acc" in rounds[-1] and "ood_acc" in json.loads((folder / "summary.json").read_text())
    partition = json.loads((folder / "partition.json").read_text())
    assert partition_of(json.loads((folder / "config.json").read_text())) == "domain holdout=photo"  # leaderboards
    assert partition["client_domains"] == ["art_painting", "cartoon", "sketch"] and len(partition["ood_indices"]) == 30
    config = tmp_path / "run.toml"
    config.write_text(
        f'dataset = "pacs"\ndata_dir = "{tmp_path / "pacs"}"\ndataset_option = ["size=8"]\nmodel = "mlp"\n'
        f'partition = "domain-dirichlet"\nalpha = 1.0\nholdout_domain = "cartoon"\nnum_clients = 3\nmin_size = 3\n'
        f'rounds = 1\nout = "{tmp_path / "b"}"\n'
    )
    code, output = _invoke("run", "--config", config, "--quiet")
    assert code == 0, output
    (folder,) = (tmp_path / "b" / "runs").iterdir()
    assert "ood_acc" in json.loads((folder / "summary.json").read_text())


def test_cli_bad_domain_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    write_pacs(tmp_path / "pacs", {"art_painting": 20, "cartoon": 20, "photo": 20, "sketch": 20})
    args = ["--dataset", "pacs", "--data-dir", tmp_path / "pacs", "--dataset-option", "size=8", "--model", "mlp"]
    args += ["--partition", "domain", "--num-clients", 3, "--holdout-domain", "painting", "--rounds", 1]
    code, output = _invoke("run", *args, "--out", tmp_path / "out")
    errors = [line for line in output.splitlines() if line.startswith("Error:")]
    assert code == 2 and len(errors) == 1, output  # (after the progress notes of loading the data)
    assert "--holdout-domain 'painting' is not a domain of this dataset; its domains: art_painting" in output
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.json"))
    code, output = _invoke("partition", *args[:-2], "--export", tmp_path / "p.json")
    assert code == 2 and not (tmp_path / "p.json").exists(), output
    code, output = _invoke("run", *args[:-4], "--partition", "dirichlet", "--holdout-domain", "sketch", "--rounds", 1)
    assert code == 2 and "--holdout-domain" in output, output


def test_cli_partition_export_round_trips(tmp_path: Path) -> None:
    write_pacs(tmp_path / "pacs", {"art_painting": 20, "cartoon": 20, "photo": 20, "sketch": 20})
    args = ["--dataset", "pacs", "--data-dir", tmp_path / "pacs", "--dataset-option", "size=8", "--min-size", 3]
    args += ["--partition", "domain", "--num-clients", 6, "--holdout-domain", "art_painting"]
    code, output = _invoke("partition", *args, "--export", tmp_path / "p.json")
    assert code == 0, output
    document = json.loads((tmp_path / "p.json").read_text())
    assert document["client_domains"] == ["cartoon"] * 2 + ["photo"] * 2 + ["sketch"] * 2
    assert document["ood"] == list(range(20)) and document["settings"]["holdout_domain"] == "art_painting"
    code, output = _invoke(
        "partition", *args[:-4], "--partition-file", tmp_path / "p.json", "--export", tmp_path / "q.json"
    )
    assert code == 0, output
    again = json.loads((tmp_path / "q.json").read_text())
    assert again["clients"] == document["clients"] and again["ood"] == document["ood"]
    assert again["client_domains"] == document["client_domains"]
    assert "20 samples of the held-out domain (ood_acc)" in output


def test_natural_partition_of_a_multi_domain_dataset_is_one_client_per_domain(tmp_path: Path) -> None:
    config = pacs_config(tmp_path, partition="natural", holdout_domain=None, num_clients=4)
    dataset = load_dataset("pacs", config.dataset_options())
    split = make_partition(config, dataset)
    owners = [
        sorted(set(dataset.groups[np.concatenate([tr, va, te])]))
        for tr, va, te in zip(split.train, split.val, split.test)
    ]
    assert owners == [[name] for name in PACS_DOMAINS]


def _records(out: Path) -> tuple[list[dict], dict]:
    (run,) = [p for p in (out / "out" / "runs").iterdir() if p.is_dir() and not p.name.startswith(".")]
    timing = ("time_s", "peak_mem_mb", "run_dir", "checkpoint")
    keep = lambda record: {k: v for k, v in record.items() if not any(t in k for t in timing)}  # noqa: E731
    rounds = [keep(json.loads(line)) for line in (run / "rounds.jsonl").read_text().splitlines()]
    return rounds, keep(json.loads((run / "summary.json").read_text()))


def test_a_killed_held_out_domain_run_resumes_to_the_same_ood_acc(tmp_path: Path) -> None:
    from pflbench.runs.api import run_experiment
    from pflbench.testing import killed_and_resumed

    def config(out: Path) -> RunConfig:
        return pacs_config(out, algo="fedper", rounds=4, checkpoint_every=2)

    # killed after round 3 (after the round-2 checkpoint)
    killed_and_resumed(run_experiment, config, tmp_path, after_round=3)
    resumed = _records(tmp_path / "killed")
    assert resumed == _records(tmp_path / "whole") and [r["round"] for r in resumed[0]] == [1, 2, 3, 4]
    assert all("ood_acc" in r for r in resumed[0]) and "ood_acc" in resumed[1]
