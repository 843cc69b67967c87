"""Feed malformed files to the commands that read them and count the unclean answers (issue 27).

Clean = exit code 2, exactly one ``Error:`` line on stderr, no traceback, nothing written or
changed in the working folder. Files probed: ``--partition-file`` (``run`` and ``partition``),
a run folder's ``config.json`` (``rerun``), ``summary.json`` (``gates``) and ``--config``
files (``run``; wrong types and options the run would ignore), a damaged ``tune`` study
journal (``JOURNAL_CASES``), and the options and algorithms
added later (``NEW_OPTION_CASES``, ``NEW_CONFIG_CASES``: quantity skew, feature shift, domains,
availability, stragglers, DP, attacks, robust aggregation, the new algorithms' hyperparameters:
out of range, NaN/inf/huge, wrong types, unknown names, ignored, invalid combinations), and
issue 34's trust and fault cases (``probe_trust``: a rerun never joins a recorded Ray cluster,
``load_model`` on a damaged ``models/`` folder, a full disk while checkpointing or caching,
undecodable images, config files not UTF-8, empty ``--metric``, mistyped config.json settings,
``sweep --cpus-per-run`` without Ray; the first three judged by their own rule, see there), and
the first hour's (``probe_first_hour``: bad values refused before torch is imported, with their
wall time; data that cannot be had; ``tune`` without Optuna).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/probe_bad_inputs.py [--verbose] [--only files|options|new|trust]

Prints one line per unclean case and a final JSON line ``{"cases": N, "unclean": M, ...}``.
Not a timed benchmark; the cases themselves are the tests' (tests/cli/test_bad_file_inputs.py)
plus the larger space below.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from pflbench.cli import cli

DEEP = "[" * 10000 + "]" * 10000
DATASET_SIZE = 1797  # digits


def _valid_partition() -> dict[str, Any]:
    clients = [
        {"train": list(range(k * 500, k * 500 + 400)), "test": list(range(k * 500 + 400, k * 500 + 500))}
        for k in range(3)
    ]
    return {
        "format": "pflbench-partition",
        "version": 1,
        "dataset": {"name": "digits", "size": DATASET_SIZE, "num_classes": 10},
        "num_clients": 3,
        "clients": clients,
        "public": [],
    }


def _with(document: dict[str, Any], path: tuple[Any, ...], value: Any) -> str:
    """``document`` as JSON text with the value at ``path`` replaced (``DELETE``: removed)."""
    document = json.loads(json.dumps(document))
    target = document
    for key in path[:-1]:
        target = target[key]
    if value is DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return json.dumps(document)


DELETE = object()
RAW = object()  # marks a value spliced in as raw JSON text


def partition_cases() -> dict[str, str]:
    """name → file text."""
    valid = _valid_partition()
    cases: dict[str, str] = {
        "empty file": "",
        "not JSON": "{not json",
        "null": "null",
        "a list": "[1, 2, 3]",
        "a string": '"clients"',
        "deep nesting": DEEP,
        "deep nesting in train": _with(valid, ("clients", 0, "train"), "@DEEP@").replace('"@DEEP@"', DEEP),
        "NaN index": _with(valid, ("clients", 0, "train"), "@NAN@").replace('"@NAN@"', "[NaN]"),
    }
    per_value: dict[str, Any] = {
        "ragged train": [[1, 2], [3]],
        "nested train": [[1, 2], [3, 4]],
        "string indices": ["1", "2"],
        "float indices": [1.5, 2.5],
        "integral floats": [1.0, 2.0],
        "bool indices": [True, False],
        "negative index": [-1, 2],
        "out of range index": [10**6],
        "huge index": [10**30],
        "index 2**63": [2**63],
        "index 2**64 mixed": [1, 2**64],
        "null train": None,
        "train a dict": {"a": 1},
        "train a number": 5,
        "empty train": [],
        "duplicate index": [3, 3, 4],
    }
    for name, value in per_value.items():
        cases[name] = _with(valid, ("clients", 0, "train"), value)
    cases.update(
        {
            "index in two clients": _with(valid, ("clients", 1, "train"), [0, *range(501, 900)]),
            "missing train": _with(valid, ("clients", 0, "train"), DELETE),
            "missing test": _with(valid, ("clients", 0, "test"), DELETE),
            "missing clients": _with(valid, ("clients",), DELETE),
            "clients null": _with(valid, ("clients",), None),
            "clients a dict": _with(valid, ("clients",), {"0": {}}),
            "clients of numbers": _with(valid, ("clients",), [1, 2, 3]),
            "no clients": _with(_with_obj(valid, ("num_clients",), 0), ("clients",), []),
            "num_clients mismatch": _with(valid, ("num_clients",), 7),
            "num_clients a string": _with(valid, ("num_clients",), "3"),
            "num_clients a float": _with(valid, ("num_clients",), 3.0),
            "version a string": _with(valid, ("version",), "1"),
            "version missing": _with(valid, ("version",), DELETE),
            "format wrong": _with(valid, ("format",), "something-else"),
            "dataset a string": _with(valid, ("dataset",), "digits"),
            "dataset a list": _with(valid, ("dataset",), [1]),
            "dataset size a string": _with(valid, ("dataset", "size"), "1797"),
            "dataset size negative": _with(valid, ("dataset", "size"), -5),
            "dataset size wrong": _with(valid, ("dataset", "size"), 10),
            "dataset name a number": _with(valid, ("dataset", "name"), 5),
            "dataset name wrong": _with(valid, ("dataset", "name"), "mnist"),
            "public null": _with(valid, ("public",), None),
            "public a string": _with(valid, ("public",), "all"),
            "val ragged": _with(valid, ("clients", 0, "val"), [[1], [2, 3]]),
            "val null": _with(valid, ("clients", 0, "val"), None),
            "val string": _with(valid, ("clients", 0, "val"), "x"),
            "client extra key": _with(valid, ("clients", 0, "tset"), [1]),
        }
    )
    saved = {
        "train_indices": [d["train"] for d in valid["clients"]],
        "test_indices": [d["test"] for d in valid["clients"]],
    }
    saved_variants: dict[str, Any] = {
        "saved: train_indices a number": ("train_indices", 5),
        "saved: train_indices a string": ("train_indices", "abc"),
        "saved: train_indices a dict": ("train_indices", {"0": [1]}),
        "saved: test_indices null": ("test_indices", None),
        "saved: ragged train_indices": ("train_indices", [[[1, 2], [3]], [4], [5]]),
        "saved: config a string": ("config", "digits"),
        "saved: val_indices a number": ("val_indices", 5),
        "saved: fewer test lists": ("test_indices", [[400]]),
    }
    for name, (key, value) in saved_variants.items():
        cases[name] = json.dumps({**saved, key: value})
    return cases


def _with_obj(document: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(_with(document, path, value))
    return result


def rerun_cases(config: dict[str, Any]) -> dict[str, str]:
    cases: dict[str, str] = {
        "empty file": "",
        "not JSON": "{not json",
        "null": "null",
        "a list": "[]",
        "deep nesting": DEEP,
        "deep nesting in a value": json.dumps({**config, "rounds": "@D@"}).replace('"@D@"', DEEP),
    }
    per_key: dict[str, tuple[str, Any]] = {
        "rounds a string": ("rounds", "1"),
        "rounds a float": ("rounds", 1.7),
        "rounds a bool": ("rounds", True),
        "rounds null": ("rounds", None),
        "rounds negative": ("rounds", -3),
        "lr a string": ("lr", "0.1"),
        "lr a list": ("lr", [0.1]),
        "alpha NaN": ("alpha", "@NAN@"),
        "algo a number": ("algo", 5),
        "algo unknown": ("algo", "nope"),
        "dataset null": ("dataset", None),
        "save_model a string": ("save_model", "false"),
        "log a number": ("log", 5),
        "log a string": ("log", "tensorboard"),
        "dataset_option a dict": ("dataset_option", {"a": 1}),
        "algo_hparams a list": ("algo_hparams", [1, 2]),
        "algo_hparams a string": ("algo_hparams", "x"),
        "algo_hparams unknown key": ("algo_hparams", {"nope": 1}),
        "algo_hparams wrong type": ("algo_hparams", {"lambda1": "abc"}),
        "plugins a string": ("plugins", "abc"),
        "plugins a number": ("plugins", 5),
        "code a list": ("code", [1]),
        "code.plugin_files a string": ("code", {"plugin_files": "x"}),
        "identity_hash a number": ("identity_hash", 5),
        "executor unknown": ("executor", "warp"),
        "partition unknown": ("partition", "nope"),
    }
    for name, (key, value) in per_key.items():
        text = json.dumps({**config, key: value})
        cases[name] = text.replace('"@NAN@"', "NaN")
    for key in ("rounds", "algo", "dataset"):
        cases[f"missing {key}"] = json.dumps({k: v for k, v in config.items() if k != key})
    return cases


def gates_cases(summary: dict[str, Any]) -> dict[str, str]:
    cases: dict[str, str] = {
        "no summary.json": "@MISSING@",
        "empty file": "",
        "not JSON": "{not json",
        "null": "null",
        "a list": "[]",
        "deep nesting": DEEP,
        "deep nesting in gates": json.dumps({**summary, "gates": "@D@"}).replace('"@D@"', DEEP),
    }
    per_key: dict[str, tuple[str, Any]] = {
        "gates a string": ("gates", "x"),
        "gates null": ("gates", None),
        "gates flat": ("gates", [0.1, 0.2]),
        "gates ragged": ("gates", [[0.1, 0.2], [0.3]]),
        "gates strings": ("gates", [["a", "b"]]),
        "gates empty": ("gates", []),
        "gates out of [0, 1]": ("gates", [[1.5, -2.0]]),
        "gate_frac a string": ("gate_frac_below_0.1", "x"),
        "gate_frac null": ("gate_frac_below_0.1", None),
        "gates_clients_trained a list": ("gates_clients_trained", [1]),
        "gate_blocks a number": ("gate_blocks", 5),
        "gate_blocks one per column": ("gate_blocks", ["a"] * 50),
    }
    for name, (key, value) in per_key.items():
        cases[name] = json.dumps({**summary, key: value})
    for key in ("gate_frac_below_0.1", "gate_frac_above_0.9", "gate_frac_0.4_to_0.6", "gates_clients_trained"):
        cases[f"missing {key}"] = json.dumps({k: v for k, v in summary.items() if k != key})
    return cases


# config-file cases: (suffix, text); run reads them with --rounds 1 given unless the case sets rounds
CONFIG_CASES: dict[str, tuple[str, str]] = {
    "toml rounds = 2.7": (".toml", "rounds = 2.7"),
    "toml rounds = '1'": (".toml", 'rounds = "1"'),
    "toml rounds = true": (".toml", "rounds = true"),
    "toml lr = '0.1'": (".toml", 'lr = "0.1"'),
    "toml lr = true": (".toml", "lr = true"),
    "toml seed = [1, 2]": (".toml", "seed = [1, 2]"),
    "toml save_model = 'yes'": (".toml", 'save_model = "yes"'),
    "toml save_model = 1": (".toml", "save_model = 1"),
    "toml dataset = 5": (".toml", "dataset = 5"),
    "toml num_clients = 3.0": (".toml", "num_clients = 3.0"),
    "toml mu = '0.1' (fedprox)": (".toml", 'algo = "fedprox"\nmu = "0.1"'),
    "yaml rounds: 2.7": (".yaml", "rounds: 2.7"),
    "yaml rounds: '1'": (".yaml", "rounds: '1'"),
    "yaml rounds: yes": (".yaml", "rounds: yes"),
    "yaml save_model: 'false'": (".yaml", "save_model: 'false'"),
    "yaml lr: '0.1'": (".yaml", "lr: '0.1'"),
    "yaml rounds: null": (".yaml", "rounds: null"),
    "toml momentum with adam (ignored)": (".toml", 'optimizer = "adam"\nmomentum = 0.9'),
    "toml lora_alpha without lora (ignored)": (".toml", "lora_alpha = 8.0"),
    "toml head_layers with fedavg (ignored)": (".toml", "head_layers = 2"),
    "toml alpha with iid (ignored)": (".toml", 'partition = "iid"\nalpha = 0.1'),
}
IGNORED_ON_THE_COMMAND_LINE = {
    "finetune-epochs with local (no global model)": ["--algo", "local", "--finetune-epochs", "2"],
    "ray-workers without --executor ray": ["--ray-workers", "4"],
    "ray-address without --executor ray": ["--ray-address", "auto"],
    "mlflow-uri without --log mlflow": ["--mlflow-uri", "sqlite:///x.db"],
}


def _algo(name: str, *extra: str) -> list[str]:
    return ["--algo", name, *extra]


# the options this session added (data, availability, privacy, attacks, new algorithms): extra
# arguments of a one-round digits/mlp run; each must be refused before any training starts
NEW_OPTION_CASES: dict[str, list[str]] = {
    # quantity skew and feature shift
    "sizes unknown": ["--sizes", "zipf"],
    "size-param negative (powerlaw)": ["--partition", "iid", "--sizes", "powerlaw", "--size-param", "-1"],
    "size-param NaN (lognormal)": ["--partition", "iid", "--sizes", "lognormal", "--size-param", "nan"],
    "size-param inf (powerlaw)": ["--partition", "iid", "--sizes", "powerlaw", "--size-param", "inf"],
    "size-param 0 (dirichlet)": ["--partition", "iid", "--sizes", "dirichlet", "--size-param", "0"],
    "sizes with shards": ["--partition", "shards", "--sizes", "powerlaw"],
    "sizes with dirichlet": ["--sizes", "lognormal"],
    "size-param without sizes": ["--partition", "iid", "--size-param", "2"],
    "min-size 0": ["--min-size", "0"],
    "min-size negative": ["--min-size", "-5"],
    "min-size huge": ["--min-size", "100000"],
    "min-size 10**20": ["--min-size", str(10**20)],
    "min-size huge with sizes": ["--partition", "iid", "--sizes", "powerlaw", "--min-size", "1000"],
    "feature-shift unknown": ["--feature-shift", "sepia"],
    "feature-shift twice": ["--feature-shift", "rotate,rotate"],
    "feature-shift only commas": ["--feature-shift", ",,"],
    "shift-groups 1": ["--feature-shift", "rotate", "--shift-groups", "1"],
    "shift-groups negative": ["--feature-shift", "rotate", "--shift-groups", "-2"],
    "shift-groups without feature-shift": ["--shift-groups", "2"],
    "shift-groups more than clients": ["--feature-shift", "rotate", "--shift-groups", "7"],
    "shift-groups 10**20": ["--feature-shift", "rotate", "--shift-groups", str(10**20)],
    # multi-domain data
    "partition domain without domains": ["--partition", "domain"],
    "partition domain-dirichlet without domains": ["--partition", "domain-dirichlet"],
    "holdout-domain on digits": ["--holdout-domain", "sketch"],
    "holdout-domain with partition iid": ["--partition", "iid", "--holdout-domain", "sketch"],
    "holdout-domain empty": ["--holdout-domain", ""],
    "pacs holdout-domain unknown": ["--dataset", "pacs", "--partition", "domain", "--holdout-domain", "nope"],
    "mnist_usps holdout-domain unknown": [
        "--dataset",
        "mnist_usps",
        "--partition",
        "domain",
        "--holdout-domain",
        "svhn",
    ],
    "imagefolder_domains without data-dir": ["--dataset", "imagefolder_domains", "--partition", "domain"],
    "imagefolder_domains missing data-dir": [
        "--dataset",
        "imagefolder_domains",
        "--data-dir",
        "/nonexistent/domains",
        "--partition",
        "domain",
    ],
    # availability and stragglers
    "dropout 1": ["--dropout", "1"],
    "dropout negative": ["--dropout", "-0.1"],
    "dropout NaN": ["--dropout", "nan"],
    "dropout inf": ["--dropout", "inf"],
    "dropout a word": ["--dropout", "half"],
    "availability unknown": ["--availability", "sometimes"],
    "availability-rate 0": ["--availability", "bernoulli", "--availability-rate", "0"],
    "availability-rate 1.5": ["--availability", "bernoulli", "--availability-rate", "1.5"],
    "availability-rate NaN": ["--availability", "cyclic", "--availability-rate", "nan"],
    "availability-rate without availability": ["--availability-rate", "0.3"],
    "availability-period 0": ["--availability", "cyclic", "--availability-period", "0"],
    "availability-period with bernoulli": ["--availability", "bernoulli", "--availability-period", "10"],
    "straggler-model unknown": ["--straggler-model", "pareto"],
    "straggler-sigma negative": ["--straggler-model", "lognormal", "--straggler-sigma", "-1"],
    "straggler-sigma NaN": ["--straggler-model", "lognormal", "--straggler-sigma", "nan"],
    "straggler-sigma huge": ["--straggler-model", "lognormal", "--straggler-sigma", "1e308"],
    "straggler-sigma without lognormal": ["--straggler-sigma", "2"],
    "sample-time 0": ["--deadline", "10", "--sample-time", "0"],
    "sample-time inf": ["--deadline", "10", "--sample-time", "inf"],
    "sample-time without a time model": ["--sample-time", "0.5"],
    "bandwidth 0": ["--deadline", "10", "--bandwidth", "0"],
    "bandwidth NaN": ["--deadline", "10", "--bandwidth", "nan"],
    "bandwidth without a time model": ["--bandwidth", "5"],
    "deadline 0": ["--deadline", "0"],
    "deadline negative": ["--deadline", "-3"],
    "deadline NaN": ["--deadline", "nan"],
    "deadline inf": ["--deadline", "inf"],
    "deadline-policy unknown": ["--deadline", "10", "--deadline-policy", "wait"],
    "deadline-policy partial without deadline": ["--deadline-policy", "partial"],
    "deadline partial with vmap": ["--deadline", "10", "--deadline-policy", "partial", "--executor", "vmap"],
    "deadline partial with scaffold": ["--deadline", "10", "--deadline-policy", "partial", *_algo("scaffold")],
    "deadline partial with pfedme": ["--deadline", "10", "--deadline-policy", "partial", *_algo("pfedme")],
    "deadline partial with perfedavg": ["--deadline", "10", "--deadline-policy", "partial", *_algo("perfedavg")],
    "deadline partial with ditto": ["--deadline", "10", "--deadline-policy", "partial", *_algo("ditto")],
    "over-select negative": ["--over-select", "-1"],
    "over-select NaN": ["--over-select", "nan"],
    "over-select huge": ["--frac", "0.5", "--over-select", "1e308"],
    # differential privacy
    "dp unknown": ["--dp", "server"],
    "dp-clip 0": ["--dp", "client", "--dp-clip", "0"],
    "dp-clip NaN": ["--dp", "client", "--dp-clip", "nan"],
    "dp-noise negative": ["--dp", "client", "--dp-noise", "-1"],
    "dp-noise inf": ["--dp", "sample", "--dp-noise", "inf"],
    "dp-delta 0": ["--dp", "client", "--dp-delta", "0"],
    "dp-delta 1": ["--dp", "client", "--dp-delta", "1"],
    "dp-delta NaN": ["--dp", "client", "--dp-delta", "nan"],
    "dp-adaptive-quantile 1": ["--dp", "client", "--dp-adaptive-quantile", "1"],
    "dp-adaptive-quantile negative": ["--dp", "client", "--dp-adaptive-quantile", "-0.5"],
    "dp-adaptive-quantile with dp sample": ["--dp", "sample", "--dp-adaptive-quantile", "0.5"],
    "dp-clip-lr 0": ["--dp", "client", "--dp-adaptive-quantile", "0.5", "--dp-clip-lr", "0"],
    "dp-count-noise negative": ["--dp", "client", "--dp-adaptive-quantile", "0.5", "--dp-count-noise", "-1"],
    "dp-clip without dp": ["--dp-clip", "2"],
    "dp-noise without dp": ["--dp-noise", "0.5"],
    "dp-clip-lr without adaptive": ["--dp", "client", "--dp-clip-lr", "0.5"],
    "dp-count-noise without adaptive": ["--dp", "client", "--dp-count-noise", "1"],
    "dp client with local": ["--dp", "client", *_algo("local")],
    "dp client with fedproto": ["--dp", "client", *_algo("fedproto")],
    "dp client with fedamp": ["--dp", "client", *_algo("fedamp")],
    "dp client with fedfomo": ["--dp", "client", *_algo("fedfomo")],
    "dp client with pfedhn": ["--dp", "client", *_algo("pfedhn")],
    "dp client with fedmtl": ["--dp", "client", *_algo("fedmtl")],
    "dp client with fedkd": ["--dp", "client", *_algo("fedkd")],
    "dp sample with vmap": ["--dp", "sample", "--executor", "vmap"],
    "dp sample with fedgen": ["--dp", "sample", *_algo("fedgen")],
    # attacks and robust aggregation
    "attack unknown": ["--attack", "poison"],
    "attack without attackers": ["--attack", "sign-flip"],
    "attackers 1": ["--attack", "sign-flip", "--attackers", "1"],
    "attackers negative": ["--attack", "sign-flip", "--attackers", "-0.2"],
    "attackers NaN": ["--attack", "sign-flip", "--attackers", "nan"],
    "attackers without attack": ["--attackers", "0.3"],
    "attack-scale 0": ["--attack", "scale", "--attackers", "0.4", "--attack-scale", "0"],
    "attack-scale inf": ["--attack", "gaussian", "--attackers", "0.4", "--attack-scale", "inf"],
    "attack-scale with label-flip": ["--attack", "label-flip", "--attackers", "0.4", "--attack-scale", "3"],
    "backdoor-target negative": ["--attack", "backdoor", "--attackers", "0.4", "--backdoor-target", "-1"],
    "backdoor-target ≥ classes": ["--attack", "backdoor", "--attackers", "0.4", "--backdoor-target", "10"],
    "backdoor-frac 0": ["--attack", "backdoor", "--attackers", "0.4", "--backdoor-frac", "0"],
    "backdoor-frac 1.5": ["--attack", "backdoor", "--attackers", "0.4", "--backdoor-frac", "1.5"],
    "backdoor-frac without backdoor": ["--attack", "sign-flip", "--attackers", "0.4", "--backdoor-frac", "0.2"],
    "robust-agg unknown": ["--robust-agg", "mean"],
    "trim-frac 0.5": ["--robust-agg", "trimmed-mean", "--trim-frac", "0.5"],
    "trim-frac negative": ["--robust-agg", "trimmed-mean", "--trim-frac", "-0.1"],
    "trim-frac without trimmed-mean": ["--robust-agg", "median", "--trim-frac", "0.2"],
    "krum-f negative": ["--robust-agg", "krum", "--krum-f", "-1"],
    "krum-f too many for the clients": ["--robust-agg", "krum", "--krum-f", "5"],
    "krum-select negative": ["--robust-agg", "multi-krum", "--krum-select", "-1"],
    "krum-select more than reports": ["--robust-agg", "multi-krum", "--krum-f", "0", "--krum-select", "10"],
    "krum-select with krum": ["--robust-agg", "krum", "--krum-f", "0", "--krum-select", "2"],
    "norm-bound 0": ["--robust-agg", "norm-bound", "--norm-bound", "0"],
    "norm-bound without norm-bound": ["--norm-bound", "3"],
    "robust-agg with dp client": ["--robust-agg", "median", "--dp", "client"],
    "robust-agg with fedproto": ["--robust-agg", "median", *_algo("fedproto")],
    "robust-agg with local": ["--robust-agg", "median", *_algo("local")],
    "attack sign-flip with local": ["--attack", "sign-flip", "--attackers", "0.4", *_algo("local")],
    "robust-agg with scaffold": ["--robust-agg", "median", *_algo("scaffold")],
    "robust-agg with fedadam": ["--robust-agg", "median", *_algo("fedadam")],
    "robust-agg with pfedhn": ["--robust-agg", "median", *_algo("pfedhn")],
    "robust-agg with fedfomo": ["--robust-agg", "median", *_algo("fedfomo")],
    # new algorithms' options out of range
    "apfl alpha-init 1.5": _algo("apfl", "--alpha-init", "1.5"),
    "apfl alpha-init NaN": _algo("apfl", "--alpha-init", "nan"),
    "apfl alpha-lr negative": _algo("apfl", "--alpha-lr", "-1"),
    "apfl alpha-lr without adaptive": _algo("apfl", "--no-adaptive-alpha", "--alpha-lr", "0.1"),
    "ditto lam negative": _algo("ditto", "--lam", "-1"),
    "ditto personal-epochs negative": _algo("ditto", "--personal-epochs", "-1"),
    "fedadam server-lr 0": _algo("fedadam", "--server-lr", "0"),
    "fedadam server-beta1 1": _algo("fedadam", "--server-beta1", "1"),
    "fedadam server-beta2 1.5": _algo("fedadam", "--server-beta2", "1.5"),
    "fedadam server-tau 0": _algo("fedadam", "--server-tau", "0"),
    "fedyogi server-tau NaN": _algo("fedyogi", "--server-tau", "nan"),
    "fedadagrad server-beta2 (not its option)": _algo("fedadagrad", "--server-beta2", "0.9"),
    "fedadam server-weighting unknown": _algo("fedadam", "--server-weighting", "median"),
    "fedavgm server-momentum 1": _algo("fedavgm", "--server-momentum", "1"),
    "fedavgm server-momentum negative": _algo("fedavgm", "--server-momentum", "-0.1"),
    "fedavgm server-lr inf": _algo("fedavgm", "--server-lr", "inf"),
    "fedala eta 0": _algo("fedala", "--eta", "0"),
    "fedala rand-percent 0": _algo("fedala", "--rand-percent", "0"),
    "fedala rand-percent 101": _algo("fedala", "--rand-percent", "101"),
    "fedala layer-idx 0": _algo("fedala", "--layer-idx", "0"),
    "fedala layer-idx 99": _algo("fedala", "--layer-idx", "99"),
    "fedala threshold negative": _algo("fedala", "--threshold", "-1"),
    "fedala num-pre-loss 0": _algo("fedala", "--num-pre-loss", "0"),
    "fedala ala-max-epochs 0": _algo("fedala", "--ala-max-epochs", "0"),
    "fedamp alpha-k 0": _algo("fedamp", "--alpha-k", "0"),
    "fedamp lamda negative": _algo("fedamp", "--lamda", "-1"),
    "fedamp sigma 0": _algo("fedamp", "--sigma", "0"),
    "fedas align-lr 0": _algo("fedas", "--align-lr", "0"),
    "fedas align-epochs negative": _algo("fedas", "--align-epochs", "-1"),
    "fedbabu ft-epochs negative": _algo("fedbabu", "--ft-epochs", "-1"),
    "fedbabu ft-part unknown": _algo("fedbabu", "--ft-part", "body"),
    "fedcp mmd-weight negative": _algo("fedcp", "--mmd-weight", "-1"),
    "fedcp policy-temperature 0": _algo("fedcp", "--policy-temperature", "0"),
    "feddbe mr-weight negative": _algo("feddbe", "--mr-weight", "-1"),
    "feddbe mean-momentum 0": _algo("feddbe", "--mean-momentum", "0"),
    "feddbe mean-momentum 1.5": _algo("feddbe", "--mean-momentum", "1.5"),
    "feddyn alpha 0": _algo("feddyn", "--feddyn-alpha", "0"),
    "fedfomo downloads 0": _algo("fedfomo", "--downloads", "0"),
    "fedfomo epsilon 1.5": _algo("fedfomo", "--epsilon", "1.5"),
    "fedfomo epsilon-decay negative": _algo("fedfomo", "--epsilon-decay", "-1"),
    "fedgen generative-alpha negative": _algo("fedgen", "--generative-alpha", "-1"),
    "fedgen generative-decay 0": _algo("fedgen", "--generative-decay", "0"),
    "fedgen generative-decay 1.5": _algo("fedgen", "--generative-decay", "1.5"),
    "fedgen gen-batch-size 0": _algo("fedgen", "--gen-batch-size", "0"),
    "fedgen generator-steps negative": _algo("fedgen", "--generator-steps", "-1"),
    "fedgen generator-batch-size 0": _algo("fedgen", "--generator-batch-size", "0"),
    "fedgen generator-lr 0": _algo("fedgen", "--generator-lr", "0"),
    "fedgen generator-weight-decay negative": _algo("fedgen", "--generator-weight-decay", "-1"),
    "fedgen diversity-weight negative": _algo("fedgen", "--diversity-weight", "-1"),
    "fedgen noise-dim 0": _algo("fedgen", "--noise-dim", "0"),
    "fedgen generator-hidden 0": _algo("fedgen", "--generator-hidden", "0"),
    "fedkd energy-start 0": _algo("fedkd", "--energy-start", "0"),
    "fedkd energy-end 1.5": _algo("fedkd", "--energy-end", "1.5"),
    "fedkd energy-end NaN": _algo("fedkd", "--energy-end", "nan"),
    "fedkd hidden-weight negative": _algo("fedkd", "--hidden-weight", "-1"),
    "fedkd energy without svd": _algo("fedkd", "--compression", "none", "--energy-start", "0.9"),
    "fedpac proto-weight negative": _algo("fedpac", "--proto-weight", "-1"),
    "fedpac head-epochs negative": _algo("fedpac", "--head-epochs", "-1"),
    "fedproto proto-inference unknown": _algo("fedproto", "--proto-inference", "knn"),
    "fedproto proto-weight NaN": _algo("fedproto", "--proto-weight", "nan"),
    "fedrep head-epochs negative": _algo("fedrep", "--head-epochs", "-1"),
    "fedprox mu negative": _algo("fedprox", "--mu", "-1"),
    "fedprox mu inf": _algo("fedprox", "--mu", "inf"),
    "fedavg given mu": _algo("fedavg", "--mu", "0.1"),
    "flexlora rank-set with 0": _algo("flexlora", "--rank-set", "0,4"),
    "flexlora rank-set words": _algo("flexlora", "--rank-set", "a,b"),
    "flexlora rank-set empty": _algo("flexlora", "--rank-set", ""),
    "flexlora rank-dist unknown": _algo("flexlora", "--rank-dist", "zipf"),
    "gpfl magnitude-weight negative": _algo("gpfl", "--magnitude-weight", "-1"),
    "gpfl module-decay NaN": _algo("gpfl", "--module-decay", "nan"),
    "ifca clusters 0": _algo("ifca", "--clusters", "0"),
    "ifca clusters 10**20": _algo("ifca", "--clusters", str(10**20)),
    "lgfedavg global-layers unknown": _algo("lgfedavg", "--global-layers", "all"),
    "lgfedavg warmup-rounds negative": _algo("lgfedavg", "--warmup-rounds", "-1"),
    "lgfedavg warmup-rounds ≥ rounds": _algo("lgfedavg", "--warmup-rounds", "5"),
    "moon temperature 0": _algo("moon", "--temperature", "0"),
    "moon mu negative": _algo("moon", "--mu", "-1"),
    "perfedavg inner-lr 0": _algo("perfedavg", "--inner-lr", "0"),
    "perfedavg beta 0": _algo("perfedavg", "--beta", "0"),
    "perfedavg variant unknown": _algo("perfedavg", "--variant", "so"),
    "perfedavg hvp-delta 0": _algo("perfedavg", "--hvp", "finite-difference", "--hvp-delta", "0"),
    "perfedavg hvp with fo": _algo("perfedavg", "--variant", "fo", "--hvp", "finite-difference"),
    "perfedavg hvp-delta with exact": _algo("perfedavg", "--hvp-delta", "0.01"),
    "pfedme lam 0": _algo("pfedme", "--lam", "0"),
    "pfedme inner-steps 0": _algo("pfedme", "--inner-steps", "0"),
    "pfedme personal-lr 0": _algo("pfedme", "--personal-lr", "0"),
    "pfedme beta 0": _algo("pfedme", "--beta", "0"),
    "pfedme beta NaN": _algo("pfedme", "--beta", "nan"),
    "pfedme inner-mu negative": _algo("pfedme", "--inner-mu", "-1"),
    "scaffold server-lr 0": _algo("scaffold", "--server-lr", "0"),
    "pfedhn embed-dim 0": _algo("pfedhn", "--embed-dim", "0"),
    "pfedhn embed-dim -2": _algo("pfedhn", "--embed-dim", "-2"),
    "pfedhn hn-hidden 0": _algo("pfedhn", "--hn-hidden", "0"),
    "pfedhn hn-lr 0": _algo("pfedhn", "--hn-lr", "0"),
    "pfedhn hn-momentum 1.5": _algo("pfedhn", "--hn-momentum", "1.5"),
    "pfedhn hn-max-grad-norm negative": _algo("pfedhn", "--hn-max-grad-norm", "-1"),
    "fedmtl lam negative": _algo("fedmtl", "--lam", "-1"),
    "pflmoe gate-fraction 1": _algo("pflmoe", "--gate-fraction", "1"),
    "pflmoe gate-epochs negative": _algo("pflmoe", "--gate-epochs", "-1"),
}

PARTITION_NEW = ["partition", "--dataset", "digits", "--num-clients", "3"]
SWEEP_NEW = ["sweep", "--datasets", "digits", "--model", "mlp", "--num-clients", "3", "--rounds", "1", "--quiet"]
# the same options through ``partition`` and ``sweep`` (sweep: --out is added)
NEW_COMMAND_CASES: dict[str, list[str]] = {
    "partition: sizes with shards": [*PARTITION_NEW, "--partition", "shards", "--sizes", "powerlaw"],
    "partition: feature-shift only commas": [*PARTITION_NEW, "--feature-shift", ",,"],
    "partition: size-param NaN": [*PARTITION_NEW, "--partition", "iid", "--sizes", "powerlaw", "--size-param", "nan"],
    "partition: holdout-domain on digits": [*PARTITION_NEW, "--holdout-domain", "sketch"],
    "partition: domain without domains": [*PARTITION_NEW, "--partition", "domain"],
    "partition: shift-groups more than clients": [*PARTITION_NEW, "--feature-shift", "rotate", "--shift-groups", "9"],
    "sweep: dropout 1": [*SWEEP_NEW, "--algos", "fedavg", "--dropout", "1"],
    "sweep: set dp_clip=-1": [*SWEEP_NEW, "--algos", "fedavg", "--dp", "client", "--set", "dp_clip=-1"],
    "sweep: set clusters=100": [*SWEEP_NEW, "--algos", "ifca", "--set", "clusters=100"],
    "sweep: set straggler_sigma=1e308": [
        *SWEEP_NEW,
        "--algos",
        "fedavg",
        "--straggler-model",
        "lognormal",
        "--set",
        "straggler_sigma=1e308",
    ],
    "sweep: set momentum with adam": [
        *SWEEP_NEW,
        "--algos",
        "fedavg",
        "--set",
        "optimizer=adam",
        "--set",
        "momentum=0.9",
    ],
    "sweep: set hvp with fo": [
        *SWEEP_NEW,
        "--algos",
        "perfedavg",
        "--set",
        "variant=fo",
        "--set",
        "hvp=finite-difference",
    ],
    "sweep: robust-agg with local": [*SWEEP_NEW, "--algos", "fedavg,local", "--robust-agg", "median"],
}

# the same kind of values in a --config file (wrong types, out of range, ignored, invalid combinations)
NEW_CONFIG_CASES: dict[str, tuple[str, str]] = {
    "toml dropout = '0.1'": (".toml", 'dropout = "0.1"'),
    "toml dropout = true": (".toml", "dropout = true"),
    "toml dropout = 1.0": (".toml", "dropout = 1.0"),
    "toml dropout = nan": (".toml", "dropout = nan"),
    "toml availability = 5": (".toml", "availability = 5"),
    "toml availability_rate = 2": (".toml", 'availability = "bernoulli"\navailability_rate = 2'),
    "toml availability_period = 2.5": (".toml", 'availability = "cyclic"\navailability_period = 2.5'),
    "toml deadline = '10'": (".toml", 'deadline = "10"'),
    "toml deadline = -1": (".toml", "deadline = -1"),
    "toml deadline = inf": (".toml", "deadline = inf"),
    "toml deadline_policy = 'partial' alone": (".toml", 'deadline_policy = "partial"'),
    "toml straggler_sigma = [1]": (".toml", 'straggler_model = "lognormal"\nstraggler_sigma = [1]'),
    "toml straggler_sigma without model": (".toml", "straggler_sigma = 2.0"),
    "toml over_select = nan": (".toml", "over_select = nan"),
    "toml dp = true": (".toml", "dp = true"),
    "toml dp_clip = '1'": (".toml", 'dp = "client"\ndp_clip = "1"'),
    "toml dp_delta = 0": (".toml", 'dp = "client"\ndp_delta = 0'),
    "toml dp_noise without dp": (".toml", "dp_noise = 2.0"),
    "toml dp client with local": (".toml", 'dp = "client"\nalgo = "local"'),
    "toml sizes = 3": (".toml", "sizes = 3"),
    "toml sizes with shards": (".toml", 'partition = "shards"\nsizes = "powerlaw"'),
    "toml size_param = -1": (".toml", 'partition = "iid"\nsizes = "powerlaw"\nsize_param = -1'),
    "toml feature_shift = ['rotate']": (".toml", 'feature_shift = ["rotate"]'),
    "toml feature_shift = 'sepia'": (".toml", 'feature_shift = "sepia"'),
    "toml shift_groups = 2.5": (".toml", 'feature_shift = "rotate"\nshift_groups = 2.5'),
    "toml shift_groups without shift": (".toml", "shift_groups = 2"),
    "toml holdout_domain = 5": (".toml", "holdout_domain = 5"),
    "toml holdout_domain on digits": (".toml", 'holdout_domain = "sketch"'),
    "toml partition = 'domain' on digits": (".toml", 'partition = "domain"'),
    "toml attackers = '0.2'": (".toml", 'attack = "sign-flip"\nattackers = "0.2"'),
    "toml attack = false": (".toml", "attack = false"),
    "toml attackers = 1.0": (".toml", 'attack = "sign-flip"\nattackers = 1.0'),
    "toml robust_agg = 1": (".toml", "robust_agg = 1"),
    "toml krum_f = 1.5": (".toml", 'robust_agg = "krum"\nkrum_f = 1.5'),
    "toml trim_frac without trimmed-mean": (".toml", "trim_frac = 0.2"),
    "toml robust_agg with fedproto": (".toml", 'robust_agg = "median"\nalgo = "fedproto"'),
    "toml ditto lam = -1": (".toml", 'algo = "ditto"\nlam = -1.0'),
    "toml ditto lam = 'big'": (".toml", 'algo = "ditto"\nlam = "big"'),
    "toml fedala rand_percent = 500": (".toml", 'algo = "fedala"\nrand_percent = 500.0'),
    "toml fedala layer_idx = 1.5": (".toml", 'algo = "fedala"\nlayer_idx = 1.5'),
    "toml fedavgm server_momentum = true": (".toml", 'algo = "fedavgm"\nserver_momentum = true'),
    "toml apfl adaptive_alpha = 'no'": (".toml", 'algo = "apfl"\nadaptive_alpha = "no"'),
    "toml ifca clusters = 0": (".toml", 'algo = "ifca"\nclusters = 0'),
    "toml fedavg mu = 0.1 (not its option)": (".toml", 'algo = "fedavg"\nmu = 0.1'),
    "toml fedgen generative_decay = 2": (".toml", 'algo = "fedgen"\ngenerative_decay = 2.0'),
    "yaml dropout: .nan": (".yaml", "dropout: .nan"),
    "yaml deadline: .inf": (".yaml", "deadline: .inf"),
    "yaml dp_delta: 1": (".yaml", "dp: client\ndp_delta: 1"),
    "yaml sizes: [powerlaw]": (".yaml", "sizes: [powerlaw]"),
    "yaml attackers: yes": (".yaml", "attack: sign-flip\nattackers: yes"),
    "yaml availability_period: 0": (".yaml", "availability: cyclic\navailability_period: 0"),
}


def judge(result: Any, changed: bool) -> list[str]:
    """What is unclean about one answer ([] = clean)."""
    problems = []
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    if result.exit_code != 2:
        problems.append(f"exit {result.exit_code}")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        problems.append(f"traceback {type(result.exception).__name__}: {str(result.exception)[:80]}")
    elif len(lines) != 1 or not lines[0].startswith("Error: "):
        problems.append(f"{len(lines)} stderr lines")
    if changed:
        problems.append("wrote files")
    return problems


def snapshot(root: Path) -> dict[str, float]:
    return {str(p.relative_to(root)): p.stat().st_mtime for p in root.rglob("*")}


RUN = ["run", "--dataset", "digits", "--model", "mlp", "--num-clients", "3", "--rounds", "1", "--quiet"]


def probe_files(runner: CliRunner, root: Path, probe: Any, work: Path) -> None:
    """The malformed-file cases: partition files, a received run's config.json and summary.json."""
    # a finished FedSDG run: its config.json and summary.json are the valid files varied below
    base = root / "base"
    setup = runner.invoke(
        cli,
        [*RUN, "--algo", "fedsdg", "--lora-targets", "fc1", "--out", str(base)],
    )
    assert setup.exit_code == 0, setup.output
    run_dir = next((base / "runs").iterdir())
    config = json.loads((run_dir / "config.json").read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    for name, text in partition_cases().items():
        for command in ("run", "partition"):
            path = work / "part.json"
            path.write_text(text)
            argv = [*RUN, "--out", str(work / "out")] if command == "run" else ["partition", "--dataset", "digits"]
            probe(f"partition file ({command})", name, [*argv, "--partition-file", str(path)])
    for name, text in rerun_cases(config).items():
        folder = work / "received"
        shutil.copytree(run_dir, folder)
        (folder / "config.json").write_text(text)
        probe("rerun config.json", name, ["rerun", str(folder), "--quiet", "--out", str(work / "rerun")])
    for name, text in gates_cases(summary).items():
        folder = work / "received"
        shutil.copytree(run_dir, folder)
        if text == "@MISSING@":
            (folder / "summary.json").unlink()
        else:
            (folder / "summary.json").write_text(text)
        probe("gates summary.json", name, ["gates", str(folder), "--plot", str(work / "gates.png")])
    rerun = ["rerun", str(run_dir), "--quiet", "--out", str(work / "rerun"), "--mlflow-uri", "sqlite:///x.db"]
    probe("ignored option", "rerun --mlflow-uri without --log mlflow", rerun)


# a damaged ``pflbench tune`` study journal (issue 34): refused before any trial runs (a torn
# last line is not here: it is cut off with a warning and the study goes on)
TUNE = ["tune", "--algos", "fedavg", "--datasets", "digits", "--model", "mlp", "--num-clients", "3", "--rounds", "1"]
JOURNAL_HEAD = b'{"op_code":0,"worker_id":"w","study_name":"s","directions":[1]}\n'
JOURNAL_CASES = {
    "garbage line": JOURNAL_HEAD + b"garbage line\n",
    "random bytes": bytes((i * 7919 + 13) % 251 for i in range(2000)),
    "non-UTF-8 line": JOURNAL_HEAD + b'{"op_code":4,"note":"\xe9t\xe9"}\n',
    "binary after the last line": JOURNAL_HEAD + b"\x8f\x00\xfe\x13\x9c",
    "a JSON list line": JOURNAL_HEAD + b"[1, 2]\n",
    "a record Optuna cannot replay": b'{"op_code":0}\n',
    "deep nesting": DEEP.encode() + b"\n",
}


def probe_journals(runner: CliRunner, probe: Any, work: Path) -> None:
    try:
        import optuna  # noqa: F401
    except ModuleNotFoundError:
        return
    argv = [*TUNE, "--space", "lr=0.05,0.2", "--sampler", "grid", "--quiet", "--out", str(work / "out")]
    for name, data in JOURNAL_CASES.items():
        dry = runner.invoke(cli, [*argv, "--dry-run"])  # its last word on the line: OUT/tune/STUDY.json
        journal = Path(dry.output.split("→ ")[1].split()[0]).with_suffix(".journal")
        journal.parent.mkdir(parents=True)
        journal.write_bytes(data)
        probe("tune study journal", name, argv)


# ---- issue 34 (trust and faults): ``--only trust``. A received run folder contacts no host it
# names (rerun of a run recording a Ray cluster), a damaged or hostile ``models/`` folder is one
# ConfigError naming the file (``pflbench.load_model``, the API: no command reads it), a full disk
# while checkpointing is one ``Error:`` line and while caching a warning (nothing half written),
# and the bad files and options of item 8 (images, a config file not UTF-8, leaderboard, sweep).
def _png_claiming(width: int, height: int) -> bytes:
    import io
    import struct
    import zlib

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (1, 1)).save(buffer, "PNG")
    data = bytearray(buffer.getvalue())
    ihdr = data.index(b"IHDR")
    data[ihdr + 4 : ihdr + 12] = struct.pack(">II", width, height)
    data[ihdr + 17 : ihdr + 21] = struct.pack(">I", zlib.crc32(bytes(data[ihdr : ihdr + 17])))
    return bytes(data)


def _jpeg(size: int = 64) -> bytes:
    import io

    import numpy as np
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (size, size, 3), dtype=np.uint8)).save(buffer, "JPEG")
    return buffer.getvalue()


IMAGE_CASES: dict[str, tuple[str, Any]] = {  # a file among good images of imagefolder_domains
    "png claiming 100000x100000": ("bomb.png", lambda: _png_claiming(100_000, 100_000)),
    "png claiming 20000x20000": ("big.png", lambda: _png_claiming(20_000, 20_000)),
    "truncated jpeg": ("cut.jpg", lambda: _jpeg()[:600]),
    "empty png": ("empty.png", lambda: b""),
    "garbage jpeg": ("garbage.jpg", lambda: bytes(range(256)) * 4),
}
ENCODED_CONFIG_CASES: dict[str, tuple[str, bytes]] = {  # --config files that are not UTF-8
    "toml latin-1 comment": (".toml", "# réglages d'été\nrounds = 1\n".encode("latin-1")),
    "yaml latin-1 comment": (".yaml", "# réglages d'été\nrounds: 1\n".encode("latin-1")),
    "toml UTF-16": (".toml", "rounds = 1\n".encode("utf-16")),
}
LEADERBOARD_OPTION_CASES = {
    "--metric ''": ["--metric", ""],
    "--metric ' '": ["--metric", " "],
    "--metrics ''": ["--metrics", ""],
    "--metrics ','": ["--metrics", ","],
}
LEADERBOARD_CONFIG_CASES: dict[str, dict[str, Any]] = {  # config.json of the only run folder
    "alpha 'abc'": {"alpha": "abc"},
    "rounds 2.7": {"rounds": 2.7},
    "lr '0.1'": {"lr": "0.1"},
    "num_clients '3'": {"num_clients": "3"},
    "save_model 'yes'": {"save_model": "yes"},
}
SWEEP_RESOURCE_CASES = {
    "--cpus-per-run 2 without --ray": ["--cpus-per-run", "2"],
    "--gpus-per-run 1 without --ray": ["--gpus-per-run", "1"],
    "--cpus-per-run 0.5 without --ray": ["--cpus-per-run", "0.5"],
}


def _edit(path: str, value: Any) -> Any:
    """A damage of ``models/``: meta.json's value at ``path`` (dotted) replaced (``DELETE``: removed)."""

    def apply(models: Path) -> None:
        record = json.loads((models / "meta.json").read_text())
        *parents, last = path.split(".")
        target = record
        for key in parents:
            target = target[key]
        if value is DELETE:
            del target[last]
        else:
            target[last] = value
        (models / "meta.json").write_text(json.dumps(record))

    return apply


def _bytes(name: str, make: Any) -> Any:
    def apply(models: Path) -> None:
        target = models / name
        target.write_bytes(make(target.read_bytes() if target.is_file() else b""))

    return apply


def _folder_named(name: str) -> Any:
    def apply(models: Path) -> None:
        (models / name).unlink()
        (models / name).mkdir()

    return apply


class _Runs:
    """If unpickled by plain pickle, creates its marker: a weights file must never run it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def _pickled(models: Path) -> None:
    import pickle

    (models / "clients" / "0.pt").write_bytes(pickle.dumps({"w": _Runs(models.parent / "pickle-ran")}))
    _edit("meta.personal.0", "clients/0.pt")(models)


def _outside(models: Path) -> None:
    shutil.copy(models / "clients" / "0.safetensors", models.parent.parent / "outside.safetensors")
    _edit("meta.personal.0", "../../outside.safetensors")(models)


def _linked_outside(models: Path) -> None:
    shutil.copy(models / "clients" / "0.safetensors", models.parent.parent / "linked.safetensors")
    (models / "clients" / "0.safetensors").unlink()
    (models / "clients" / "0.safetensors").symlink_to(models.parent.parent / "linked.safetensors")


def _other_tensors() -> bytes:
    import torch
    from safetensors.torch import save

    return save({"x": torch.zeros(2)})


# damages of a FedPer run's models/ folder; load_model(RUN, client=0) reads shared + clients/0
SAVED_MODEL_CASES: dict[str, Any] = {
    "meta.json not JSON": _bytes("meta.json", lambda _: b"{not json"),
    "meta.json empty": _bytes("meta.json", lambda _: b""),
    "meta.json a list": _bytes("meta.json", lambda _: b"[1]"),
    "meta.json null": _bytes("meta.json", lambda _: b"null"),
    "meta.json not UTF-8": _bytes("meta.json", lambda _: b'{"meta": "\xff"}'),
    "meta.json deep nesting": _bytes("meta.json", lambda _: DEEP.encode()),
    "meta a list": _edit("meta", [1]),
    "files missing": _edit("files", DELETE),
    "build without config": _edit("meta.build.config", DELETE),
    "build.config a list": _edit("meta.build.config", [1]),
    "build.config.model a number": _edit("meta.build.config.model", 5),
    "build.config.algo unknown": _edit("meta.build.config.algo", "nope"),
    "algo_hparams a list": _edit("meta.build.algo_hparams", [1]),
    "input_shape strings": _edit("meta.input_shape", ["a"]),
    "num_classes 0": _edit("meta.num_classes", 0),
    "inputs a string": _edit("meta.inputs", "x"),
    "inputs.mean wrong length": _edit("meta.inputs.mean", [0.1, 0.2, 0.3]),
    "inputs.std [0]": _edit("meta.inputs.std", [0]),
    "inputs.std negative": _edit("meta.inputs.std", [-1.0]),
    "inputs.std NaN": _edit("meta.inputs.std", [float("nan")]),
    "inputs.kind unknown": _edit("meta.inputs.kind", "audio"),
    "inputs.stats_shape not broadcasting": _edit("meta.inputs.stats_shape", [1, 1, 3, 1]),
    "inputs.input_dtype 'save'": _edit("meta.inputs.input_dtype", "save"),
    "personal a list": _edit("meta.personal", ["clients/0.safetensors"]),
    "personal a number": _edit("meta.personal.0", 5),
    "personal ../../../../etc/passwd": _edit("meta.personal.0", "../../../../etc/passwd"),
    "personal /etc/passwd": _edit("meta.personal.0", "/etc/passwd"),
    "personal a valid file outside": _outside,
    "personal a link outside": _linked_outside,
    "personal_base escaping": _edit("meta.personal_base", "../shared.safetensors"),
    "personal file missing": _edit("meta.personal.0", "clients/9.safetensors"),
    "truncated safetensors": _bytes("clients/0.safetensors", lambda data: data[: len(data) // 2]),
    "garbage safetensors": _bytes("clients/0.safetensors", lambda _: b"\x00" * 64),
    "safetensors header claiming 2**62 bytes": _bytes("clients/0.safetensors", lambda _: (2**62).to_bytes(8, "little")),
    "a folder named 0.safetensors": _folder_named("clients/0.safetensors"),
    "a pickle of code": _pickled,
    "tensors of other names": _bytes("clients/0.safetensors", lambda _: _other_tensors()),
}


class _FullFile:
    """A file on a full disk: writes fail with ENOSPC once ``room`` bytes were written."""

    def __init__(self, file: Any, room: int) -> None:
        self.file, self.room = file, room

    def write(self, data: Any) -> int:
        import errno
        import os

        size = len(memoryview(data).cast("B"))
        if size > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= size
        return int(self.file.write(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.file, name)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.file.close()


def _full_disk(name: str, room: int) -> Any:
    """A context in which files whose temporary's name contains ``name`` are written on a full disk."""
    import contextlib
    import os

    @contextlib.contextmanager
    def context() -> Any:
        real = os.fdopen

        def fdopen(fd: int, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            file = real(fd, mode, *args, **kwargs)
            return _FullFile(file, room) if "w" in mode and name in os.readlink(f"/proc/self/fd/{fd}") else file

        os.fdopen = fdopen  # type: ignore[assignment]
        try:
            yield
        finally:
            os.fdopen = real

    return context()


def probe_trust(runner: CliRunner, root: Path, probe: Any, record: Any, work: Path) -> None:
    """The issue-34 cases (see above); ``record(kind, name, problems, first_line)`` for the
    cases judged otherwise than ``probe`` judges a refused command."""
    import os

    from pflbench.errors import ConfigError

    base = root / "trust"
    setup = runner.invoke(cli, [*RUN, "--algo", "fedper", "--save-model", "--out", str(base)])
    assert setup.exit_code == 0, setup.output
    run_dir = next((base / "runs").iterdir())

    # rerun: the recorded Ray cluster is never joined (the executor's connect is watched, and stops it)
    try:
        from pflbench.engine import ray_executor
    except ImportError:
        ray_executor = None
    if ray_executor is not None:
        joined: list[Any] = []
        real_connect = ray_executor.connect

        def connect(address: Any = None, num_cpus: Any = None) -> Any:
            joined.append(address)
            raise ConfigError("probe: stopped before Ray starts")

        ray_executor.connect = connect
        try:
            folder = work / "received" / run_dir.name
            shutil.copytree(run_dir, folder)
            config = json.loads((folder / "config.json").read_text())
            (folder / "config.json").write_text(
                json.dumps({**config, "executor": "ray", "ray_address": "192.0.2.1:6379"})
            )
            result = runner.invoke(cli, ["rerun", str(folder), "--quiet", "--out", str(work / "again")])
            problems = [] if joined == [None] else [f"joined {joined}"]
            record("rerun contacts", "recorded ray_address 192.0.2.1:6379", problems, f"connect({joined})")
        finally:
            ray_executor.connect = real_connect
            shutil.rmtree(work)
            work.mkdir()
    probe(
        "rerun option",
        "--ray-address for a run without Ray",
        ["rerun", str(run_dir), "--out", str(work / "x"), "--ray-address", "auto"],
    )

    # load_model on a damaged models/ folder: one ConfigError line naming the file, nothing run
    import pflbench

    for name, damage in SAVED_MODEL_CASES.items():
        models = work / "run" / "models"
        shutil.copytree(run_dir / "models", models)
        damage(models)
        try:
            pflbench.load_model(models.parent, client=0)
            problems, first = ["loaded"], ""
        except ConfigError as error:
            first = str(error)
            problems = [] if "\n" not in first and str(models) in first else ["message does not name the file"]
        except Exception as error:  # noqa: BLE001 - what the probe counts
            problems, first = [f"raw {type(error).__name__}"], str(error).splitlines()[0] if str(error) else ""
        if (models.parent / "pickle-ran").exists():
            problems.append("ran a pickle")
        record("load_model (API)", name, problems, first)
        shutil.rmtree(work)
        work.mkdir()

    # a full disk: checkpoint → one Error: line naming the file and the cause, nothing half written
    if Path("/proc/self/fd").is_dir():
        for name, room in (("checkpoint, nothing written", 0), ("checkpoint, full halfway", 700)):
            with _full_disk("checkpoint.pt", room):
                argv = [*RUN[:-3], "--rounds", "2", "--checkpoint-every", "1", "--quiet", "--out", str(work / "out")]
                result = runner.invoke(cli, argv)
            problems = judge(result, changed=False)
            first = next((line for line in result.stderr.splitlines() if line.strip()), "")
            if "checkpoint.pt" not in first or "No space left" not in first:
                problems.append("does not name the file and the cause")
            if list(work.rglob("*.tmp")) or list((work / "out" / "runs").glob("[!.]*")):
                problems.append("left a temporary or published the run")
            record("full disk", name, problems, first)
            shutil.rmtree(work)
            work.mkdir()
        # a cache entry → a warning, the run goes on, no entry and no temporary in the cache
        previous = os.environ.get("PFLBENCH_CACHE")
        os.environ["PFLBENCH_CACHE"] = str(work / "cache")
        try:
            with _full_disk("digits-", 700):
                result = runner.invoke(cli, [*RUN, "--out", str(work / "out")])
        finally:
            if previous is None:
                del os.environ["PFLBENCH_CACHE"]
            else:
                os.environ["PFLBENCH_CACHE"] = previous
        warning = next((line for line in result.stderr.splitlines() if "could not write cache file" in line), "")
        problems = [] if result.exit_code == 0 else [f"exit {result.exit_code}"]
        if "No space left" not in warning:
            problems.append("no warning naming the cause")
        if (work / "cache").is_dir() and list((work / "cache").iterdir()):
            problems.append("left a file in the cache")
        record("full disk", "dataset cache entry", problems, warning)
        shutil.rmtree(work)
        work.mkdir()

    # item 8: undecodable images, config files not UTF-8, leaderboard and sweep options
    for name, (file_name, make) in IMAGE_CASES.items():
        images = work / "images"
        for domain in ("art", "photo"):
            for label in ("cat", "dog"):
                (images / domain / label).mkdir(parents=True)
                for i in range(3):
                    (images / domain / label / f"{i}.jpg").write_bytes(_jpeg(8))
        (images / "photo" / "dog" / file_name).write_bytes(make())
        argv = ["run", "--dataset", "imagefolder_domains", "--data-dir", str(images), "--partition", "domain"]
        probe(
            "imagefolder_domains image",
            name,
            [*argv, "--model", "mlp", "--num-clients", "2", "--rounds", "1", "--quiet", "--out", str(work / "out")],
        )
    for name, (suffix, data) in ENCODED_CONFIG_CASES.items():
        (work / f"config{suffix}").write_bytes(data)
        argv = [a for i, a in enumerate(RUN) if a != "--rounds" and RUN[i - 1] != "--rounds"]
        probe(
            "config file encoding", name, [*argv, "--out", str(work / "out"), "--config", str(work / f"config{suffix}")]
        )
    for name, extra in LEADERBOARD_OPTION_CASES.items():
        probe("leaderboard option", name, ["leaderboard", str(base), *extra])
    for name, change in LEADERBOARD_CONFIG_CASES.items():
        folder = work / "received" / "runs" / run_dir.name
        shutil.copytree(run_dir, folder)
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, **change}))
        probe("leaderboard config.json", name, ["leaderboard", str(work / "received")])
    for name, extra in SWEEP_RESOURCE_CASES.items():
        probe("sweep option", name, [*SWEEP_NEW, "--algos", "fedavg", *extra, "--out", str(work / "out")])
    (work / "sweep.toml").write_text("cpus_per_run = 2\n")
    probe(
        "sweep option",
        "cpus_per_run in --config without ray",
        [*SWEEP_NEW, "--algos", "fedavg", "--config", str(work / "sweep.toml"), "--out", str(work / "out")],
    )


# ---- issue 34 (the first hour): a bad value on the command line is refused before torch is
# imported (each in a fresh interpreter: clean also needs torch not loaded; the wall time is
# shown), data that cannot be had is one line without "preparing dataset" before it, and
# ``tune`` without Optuna says so at once (Optuna hidden from the lookup).
EARLY_PROBE = """
import json, sys
from pflbench.cli import cli
code = cli.main(sys.argv[1:], prog_name="pflbench", standalone_mode=False)
print("@@" + json.dumps({"code": code, "torch": "torch" in sys.modules}))
"""
EARLY_CASES = {
    "run --alpha 0": ["run", "--alpha", "0"],
    "run --frac 1.5": ["run", "--frac", "1.5"],
    "run --lr -1": ["run", "--lr", "-1"],
    "run --algo fedavgg (a typo)": ["run", "--algo", "fedavgg"],
}


def probe_first_hour(runner: CliRunner, probe: Any, record: Any, work: Path) -> None:
    import importlib.util
    import subprocess
    import time

    for name, argv in EARLY_CASES.items():
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-c", EARLY_PROBE, *argv, "--out", str(work / "out")],
            capture_output=True,
            text=True,
            check=False,
        )
        seconds = time.monotonic() - started
        found = json.loads(result.stdout.rpartition("@@")[2] or "{}")
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        problems = [] if found.get("code") == 2 else [f"exit {found.get('code')}"]
        problems += [] if len(lines) == 1 and lines[0].startswith("Error: ") else [f"{len(lines)} stderr lines"]
        problems += ["torch imported first"] if found.get("torch", True) else []
        problems += ["wrote files"] if (work / "out").exists() else []
        record("before torch (fresh process)", name, problems, f"[{seconds:.1f} s] {lines[0] if lines else ''}")
    for dataset in ("cifar10", "kmnist", "svhn"):
        argv = [*RUN, "--dataset", dataset, "--data-dir", str(work / "missing"), "--out", str(work / "out")]
        probe("data that cannot be had", f"{dataset} --data-dir MISSING", argv)
    found = importlib.util.find_spec
    importlib.util.find_spec = lambda name, package=None: None if name == "optuna" else found(name, package)  # type: ignore[assignment]
    try:
        probe("tune without Optuna", "tune (no [tune] extra)", [*TUNE, "--out", str(work / "out")])
    finally:
        importlib.util.find_spec = found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verbose", action="store_true", help="Also print the clean cases' error lines.")
    parser.add_argument(
        "--only",
        choices=("files", "options", "new", "trust"),
        help="Probe only one part: files (partition, rerun, gates, config files), options (the options "
        "the run ignores), new (the options and algorithms added since: command line and --config) or "
        "trust (issue 34: rerun's Ray address, damaged saved models, a full disk, images, encodings).",
    )
    args = parser.parse_args()
    runner = CliRunner()
    root = Path(tempfile.mkdtemp(prefix="pflbench-probe-"))
    work = root / "work"
    work.mkdir()
    outcomes: list[tuple[str, str, list[str], str]] = []

    def probe(kind: str, name: str, argv: list[str]) -> None:
        before = snapshot(work)
        result = runner.invoke(cli, argv)
        problems = judge(result, snapshot(work) != before)
        first = next((line for line in result.stderr.splitlines() if line.strip()), "")
        outcomes.append((kind, name, problems, first))
        if problems or args.verbose:
            status = "; ".join(problems) if problems else "clean"
            print(f"{kind:28} {name:40} {status:40} {first[:150]}", flush=True)
        shutil.rmtree(work)
        work.mkdir()

    def record(kind: str, name: str, problems: list[str], first: str) -> None:
        """A case judged by its own rule (``probe_trust``), counted and printed as ``probe``'s."""
        outcomes.append((kind, name, problems, first))
        if problems or args.verbose:
            status = "; ".join(problems) if problems else "clean"
            print(f"{kind:28} {name:40} {status:40} {first[:150]}", flush=True)

    def probe_config_files(kind: str, cases: dict[str, tuple[str, str]]) -> None:
        for name, (suffix, text) in cases.items():
            path = work / f"config{suffix}"
            path.write_text(text + "\n")
            argv = [*RUN, "--out", str(work / "out"), "--config", str(path)]
            if "rounds" in text:
                argv = [a for i, a in enumerate(argv) if a != "--rounds" and argv[i - 1] != "--rounds"]
            probe(kind, name, argv)

    if args.only in (None, "files"):
        probe_files(runner, root, probe, work)
        probe_config_files("config file", CONFIG_CASES)
        probe_journals(runner, probe, work)
    if args.only in (None, "options"):
        for name, extra in IGNORED_ON_THE_COMMAND_LINE.items():
            probe("ignored option", name, [*RUN, "--out", str(work / "out"), *extra])
    if args.only in (None, "new"):
        for name, extra in NEW_OPTION_CASES.items():
            probe("new option", name, [*RUN, "--out", str(work / "out"), *extra])
        probe_config_files("new option (config file)", NEW_CONFIG_CASES)
        for name, argv in NEW_COMMAND_CASES.items():
            probe(
                "new option (partition, sweep)",
                name,
                [*argv, "--out", str(work / "out")] if argv[0] == "sweep" else argv,
            )

    if args.only in (None, "trust"):
        probe_trust(runner, root, probe, record, work)
        probe_first_hour(runner, probe, record, work)

    unclean = [o for o in outcomes if o[2]]
    shutil.rmtree(root)
    per_kind = Counter(o[0] for o in unclean)
    print(json.dumps({"cases": len(outcomes), "unclean": len(unclean), "unclean_by_kind": dict(per_kind)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
