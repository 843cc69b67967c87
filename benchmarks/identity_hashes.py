"""The run identities of a fixed list of configurations, one per setting group and kind: the
check that a refactor of the configuration layer keeps every run-folder name and identity hash.

For each configuration it prints the run-folder name, the identity hash, the identity (JSON, in
its recorded key order), the settings refused as inert, the stage specs and, for a list of bad
values, the one ``ConfigError`` line. No data is loaded and nothing is trained. Run it with the
code before and after a change and compare the outputs (they must be identical)::

    PYTHONPATH=/tmp/base python benchmarks/identity_hashes.py > before.txt
    python benchmarks/identity_hashes.py > after.txt && diff before.txt after.txt
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from pflbench.config import identity as identity_module
from pflbench.config.run_config import RunConfig, hyperparameters_from, resolve, validate
from pflbench.errors import ConfigError
from pflbench.registry import ALGORITHMS

# ``config.identity.identity_settings``, named ``run_identity`` before issue 36 (to compare with that code)
_NAME_BEFORE = "run_identity"
identity_settings = getattr(identity_module, "identity_settings", None) or getattr(identity_module, _NAME_BEFORE)
BASE: dict[str, Any] = {"dataset": "digits", "num_clients": 20, "rounds": 5}
CONFIGS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("default", {}, {}),
    ("fedavg-defaults-unset", {"num_clients": 10}, {}),
    ("seed-rounds-frac", {"seed": 3, "rounds": 300, "frac": 0.3, "eval_every": 1000}, {}),
    ("eval-every", {"eval_every": 2}, {}),
    ("dataset-options", {"dataset": "synthetic", "dataset_option": ("num_samples=500",), "data_dir": "/x"}, {}),
    ("partition-dirichlet-floor", {"alpha": 0.1, "dirichlet_cut": "floor", "min_size": 5}, {}),
    ("partition-dirichlet-flower", {"alpha": 100.0, "dirichlet_cut": "flower"}, {}),
    ("partition-shards", {"partition": "shards", "shards_per_client": 3}, {}),
    ("partition-iid", {"partition": "iid"}, {}),
    ("partition-natural", {"partition": "natural"}, {}),
    ("partition-domain", {"partition": "domain", "holdout_domain": "sketch", "dataset": "pacs"}, {}),
    ("partition-domain-dirichlet", {"partition": "domain-dirichlet", "alpha": 0.3, "dataset": "pacs"}, {}),
    ("partition-file", {"partition_file": "/data/split.json", "alpha": 0.3}, {}),
    ("partition-file-shift", {"partition_file": "/data/split.json", "feature_shift": "rotate"}, {}),
    ("quantity-powerlaw-iid", {"partition": "iid", "sizes": "powerlaw", "size_param": 1.5}, {}),
    ("quantity-lognormal-client", {"partition": "dirichlet-client", "sizes": "lognormal", "size_param": 0.0}, {}),
    ("quantity-dirichlet-iid", {"partition": "iid", "sizes": "dirichlet", "size_param": 0.5}, {}),
    ("feature-shift", {"feature_shift": "noise, rotate", "shift_groups": 4}, {}),
    ("feature-shift-all", {"feature_shift": "invert,blur,noise,color,contrast,rotate"}, {}),
    ("test-val-split", {"test_frac": 0.3, "val_frac": 0.0}, {}),
    ("val-split", {"val_frac": 0.2}, {}),
    ("new-clients", {"new_clients": 0.2}, {}),
    ("public-frac", {"public_frac": 0.1}, {}),
    ("local-sgd", {"local_epochs": 2, "batch_size": 16, "lr": 0.05, "momentum": 0.9, "weight_decay": 1e-4}, {}),
    ("local-adam", {"optimizer": "adam", "max_grad_norm": 1.0}, {}),
    ("model-options", {"model": "mlp", "model_option": ("hidden=64",)}, {}),
    ("head-layers-fedrep", {"algo": "fedrep", "head_layers": 2}, {}),
    ("fedprox-hparams", {"algo": "fedprox"}, {"mu": 0.1}),
    ("finetune", {"finetune_epochs": 2}, {}),
    ("precision-bf16", {"precision": "bf16"}, {}),
    ("device-cuda", {"device": "cuda:1"}, {}),
    ("executor-vmap", {"executor": "vmap"}, {}),
    ("executor-ray", {"executor": "ray", "ray_workers": 2}, {}),
    ("threads-2", {"threads": 2}, {}),
    ("threads-on-gpu", {"threads": 4, "device": "cuda"}, {}),
    ("output-only", {"out": "elsewhere", "portable": True, "checkpoint_every": 0, "save_model": True}, {}),
    ("dropout", {"dropout": 0.2}, {}),
    ("availability-bernoulli", {"availability": "bernoulli", "availability_rate": 0.7}, {}),
    ("availability-cyclic", {"availability": "cyclic", "availability_rate": 0.25, "availability_period": 8}, {}),
    ("stragglers", {"straggler_model": "lognormal", "straggler_sigma": 0.5, "sample_time": 0.02, "bandwidth": 2.0}, {}),
    ("deadline-drop", {"straggler_model": "lognormal", "deadline": 3.0}, {}),
    ("deadline-partial", {"deadline": 3.0, "deadline_policy": "partial"}, {}),
    ("over-select", {"over_select": 0.3}, {}),
    ("dp-client", {"dp": "client", "dp_clip": 0.5, "dp_noise": 1.2}, {}),
    ("dp-client-adaptive", {"dp": "client", "dp_adaptive_quantile": 0.5, "dp_clip_lr": 0.1, "dp_count_noise": 2.0}, {}),
    ("dp-sample", {"dp": "sample", "dp_delta": 1e-6}, {}),
    ("attack-label-flip", {"attack": "label-flip", "attackers": 0.2}, {}),
    ("attack-sign-flip", {"attack": "sign-flip", "attackers": 0.1}, {}),
    ("attack-scale", {"attack": "scale", "attackers": 0.2, "attack_scale": 5.0}, {}),
    ("attack-gaussian", {"attack": "gaussian", "attackers": 0.2}, {}),
    ("attack-backdoor", {"attack": "backdoor", "attackers": 0.3, "backdoor_target": 2, "backdoor_frac": 0.4}, {}),
    ("robust-median", {"robust_agg": "median"}, {}),
    ("robust-trimmed", {"robust_agg": "trimmed-mean", "trim_frac": 0.2}, {}),
    ("robust-krum", {"robust_agg": "krum", "krum_f": 2}, {}),
    ("robust-multi-krum", {"robust_agg": "multi-krum", "krum_select": 4}, {}),
    ("robust-norm-bound", {"robust_agg": "norm-bound", "norm_bound": 2.0}, {}),
    ("attack-and-robust", {"attack": "scale", "attackers": 0.2, "robust_agg": "trimmed-mean"}, {}),
    ("dp-sample-and-robust", {"dp": "sample", "robust_agg": "median"}, {}),
    ("pretrained", {"pretrained": True, "model": "resnet18"}, {}),
    ("weights", {"weights": "/w.pt"}, {}),
    ("backbone-public", {"backbone": "public", "public_frac": 0.2, "pretrain_epochs": 5, "pretrain_lr": 0.01}, {}),
    ("backbone-random", {"backbone": "random"}, {}),
    ("lora-rank", {"lora_rank": 4, "lora_alpha": 8.0, "lora_targets": "qkv,proj"}, {}),
    ("lora-fedsdg", {"algo": "fedsdg"}, {}),
    ("lora-flexlora", {"algo": "flexlora"}, {}),
    ("lora-backbone-random", {"lora_rank": 4, "backbone": "random"}, {}),
    (
        "everything",
        {
            "algo": "ditto",
            "partition": "dirichlet-client",
            "sizes": "powerlaw",
            "feature_shift": "blur",
            "new_clients": 0.1,
            "val_frac": 0.15,
            "dropout": 0.1,
            "availability": "cyclic",
            "deadline": 9.0,
            "dp": "sample",
            "attack": "label-flip",
            "attackers": 0.1,
            "precision": "bf16",
            "finetune_epochs": 1,
        },
        {},
    ),
]
BAD: list[tuple[str, dict[str, Any]]] = [
    ("alpha", {"alpha": 0.0}),
    ("frac", {"frac": 1.5}),
    ("rounds", {"rounds": 0}),
    ("lr", {"lr": -1.0}),
    ("test-frac", {"test_frac": 1.0}),
    ("val-frac", {"val_frac": 1.0}),
    ("val+test", {"val_frac": 0.5, "test_frac": 0.5}),
    ("shards", {"shards_per_client": 0}),
    ("min-size", {"min_size": 1}),
    ("eval-every", {"eval_every": 0}),
    ("head-layers", {"head_layers": 0}),
    ("max-grad-norm", {"max_grad_norm": -1.0}),
    ("seed", {"seed": -1}),
    ("precision", {"precision": "fp16"}),
    ("threads", {"threads": 5000}),
    ("momentum", {"momentum": -0.1}),
    ("public-frac", {"public_frac": 1.0}),
    ("lora-rank", {"lora_rank": 0}),
    ("lora-alpha", {"lora_alpha": 0.0}),
    ("pretrain", {"pretrain_epochs": 0}),
    ("pretrained+weights", {"pretrained": True, "weights": "/w"}),
    ("backbone-contradiction", {"backbone": "random", "pretrained": True}),
    ("backbone-public", {"backbone": "public"}),
    ("sizes", {"sizes": "zipf"}),
    ("size-param", {"sizes": "dirichlet", "size_param": 0.0}),
    ("feature-shift", {"feature_shift": "warp"}),
    ("feature-shift-empty", {"feature_shift": ",,"}),
    ("feature-shift-twice", {"feature_shift": "blur,blur"}),
    ("shift-groups", {"shift_groups": 1}),
    ("availability", {"availability": "sometimes"}),
    ("dropout", {"dropout": 1.0}),
    ("availability-rate", {"availability_rate": 0.0}),
    ("availability-period", {"availability_period": 0}),
    ("straggler-sigma", {"straggler_sigma": 21.0}),
    ("sample-time", {"sample_time": 0.0}),
    ("bandwidth", {"bandwidth": -1.0}),
    ("deadline", {"deadline": 0.0}),
    ("over-select", {"over_select": 101.0}),
    ("partial-vmap", {"deadline": 1.0, "deadline_policy": "partial", "executor": "vmap"}),
    ("dp", {"dp": "maybe"}),
    ("dp-clip", {"dp": "client", "dp_clip": 0.0}),
    ("dp-noise", {"dp": "client", "dp_noise": -1.0}),
    ("dp-delta", {"dp": "client", "dp_delta": 1.0}),
    ("dp-quantile", {"dp": "client", "dp_adaptive_quantile": 1.0}),
    ("dp-quantile-sample", {"dp": "sample", "dp_adaptive_quantile": 0.5}),
    ("dp-clip-lr", {"dp": "client", "dp_clip_lr": 0.0}),
    ("dp-count-noise", {"dp": "client", "dp_count_noise": -1.0}),
    ("attack", {"attack": "poison"}),
    ("robust", {"robust_agg": "mean"}),
    ("attackers", {"attackers": 1.0}),
    ("attack-needs-attackers", {"attack": "scale"}),
    ("attack-scale", {"attack_scale": 0.0}),
    ("backdoor-target", {"backdoor_target": -1}),
    ("backdoor-frac", {"backdoor_frac": 0.0}),
    ("trim-frac", {"trim_frac": 0.5}),
    ("krum-f", {"krum_f": -1}),
    ("krum-select", {"krum_select": -1}),
    ("norm-bound", {"norm_bound": 0.0}),
    ("robust-dp-client", {"robust_agg": "median", "dp": "client"}),
    ("new-clients", {"new_clients": 1.0}),
    ("new-clients-none-left", {"new_clients": 0.99, "num_clients": 2}),
    ("num-clients", {"num_clients": 0}),
    ("checkpoint-every", {"checkpoint_every": -1}),
    ("finetune", {"finetune_epochs": -1}),
    ("local-epochs", {"local_epochs": -1}),
    ("batch-size", {"batch_size": 0}),
]


def resolved(settings: dict[str, Any], algo_options: dict[str, Any]) -> tuple[RunConfig, Any, Any]:
    config = RunConfig(**{**BASE, **settings})
    algorithm = ALGORITHMS.get(config.algo)
    hparams = hyperparameters_from(algorithm.hyperparameters, algo_options, config.algo)
    config, _ = resolve(config, algorithm, hparams)
    return config, algorithm, hparams


def main() -> None:
    for label, settings, algo_options in CONFIGS:
        config, algorithm, hparams = resolved(settings, algo_options)
        validate(config)
        identity = identity_settings(config, algorithm, hparams)
        print(f"== {label}")
        print("name", identity_module.run_name(config, algorithm, hparams))
        print("hash", identity_module.identity_hash(identity))
        print("identity", json.dumps(identity, default=str))
        print("inert", json.dumps(identity_module.inert_settings(config, algorithm, hparams), sort_keys=True))
        specs = {
            "partition": dataclasses.asdict(config.partition_spec),
            "federation": dataclasses.asdict(config.federation_spec),
            "executor": dataclasses.asdict(config.executor_spec),
            "init": dataclasses.asdict(config.init_spec),
        }
        print("specs", json.dumps(specs, default=str))
    for label, settings in BAD:
        try:
            validate(resolved(settings, {})[0])
            print(f"!! {label}: accepted")
        except ConfigError as error:
            print(f"!! {label}: {error}")
    print(f"{len(CONFIGS)} configurations, {len(BAD)} refusals")


if __name__ == "__main__":
    main()
