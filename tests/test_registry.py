"""Registered names are safe, duplicates name both sources, broken plugins are errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from pflbench.cli import cli
from pflbench.errors import ConfigError
from pflbench.models.zoo import build_model
from pflbench.registry import ALGORITHMS, MODELS, REGISTRIES, Registry, check_name, load_plugin_file

TINY = ["--dataset", "digits", "--model", "mlp", "--num-clients", "3", "--rounds", "1", "--quiet"]


@pytest.fixture(autouse=True)
def restore_registries():
    """What a test's plugins register is gone afterwards (other tests list every algorithm)."""
    before = [dict(registry.items) for registry in REGISTRIES]  # entry points loaded first
    yield
    for registry, items in zip(REGISTRIES, before):
        registry._items.clear()
        registry._items.update(items)


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def one_error_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), output
    assert "Traceback" not in output
    return lines[0]


def plugin_file(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("from pflbench.registry import register_algorithm, register_model\n" + body)
    return path


@pytest.mark.parametrize(
    "name",
    [
        "",
        "FedAvg",
        "has space",
        "../escape",
        "a/b",
        "x" * 65,
        "<script>alert(1)</script>",
        "-dash",
        ".hidden",
        "_under",
        "naïve",
        "tab\there",
        "new\nline",
        "a|b",
        "`cmd`",
        7,
        None,
    ],
)
def test_unsafe_names_cannot_be_registered(name) -> None:
    registry = Registry("algorithm", "pflbench.no_such_group")
    with pytest.raises(ConfigError, match="is not allowed"):
        registry.register(name)
    assert dict(registry.items) == {}


@pytest.mark.parametrize(
    "name",
    [
        "fedavg",
        "fedrep",
        "vit_tiny_patch16_224",
        "resnet18",
        "vit_tiny_patch16_224.augreg_in21k",
        "my-algo.v2",
        "0x",
        "x" * 64,
    ],
)
def test_safe_names_including_timm_style_ones_are_accepted(name) -> None:
    assert check_name("model", name) == name


def test_every_builtin_name_is_safe() -> None:
    for registry in REGISTRIES:
        assert registry.names(), registry.kind
        for name in registry.names():
            check_name(registry.kind, name)


def test_timm_model_names_still_build_outside_the_registry() -> None:
    assert "vit_tiny_patch16_224" not in MODELS.items
    model = build_model("vit_tiny_patch16_224", (3, 16, 16), 4, depth=1, embed_dim=16, num_heads=2)
    assert model.head.out_features == 4


def test_two_plugin_files_registering_one_name_name_both_files(tmp_path: Path) -> None:
    body = "@register_algorithm('dup_probe')\nclass Server:\n    pass\n"
    first = plugin_file(tmp_path / "one", "mine.py", body)
    second = plugin_file(tmp_path / "two", "mine.py", body)  # same stem, other folder
    load_plugin_file(first)
    load_plugin_file(first)  # the same file again replaces its own entry
    with pytest.raises(ConfigError) as caught:
        load_plugin_file(second)
    message = str(caught.value)
    assert "registered twice" in message and str(first) in message and str(second) in message
    kept = ALGORITHMS.get("dup_probe")  # the first one stays registered
    assert Path(sys.modules[kept.__module__].__file__) == first


def test_a_plugin_reusing_a_builtin_name_is_one_error_naming_both(tmp_path: Path) -> None:
    plugin = plugin_file(tmp_path, "clash.py", "@register_algorithm('fedavg')\nclass Server:\n    pass\n")
    code, output = invoke("list", "--plugin", str(plugin))
    line = one_error_line(output)
    assert code == 2 and "'fedavg' is registered twice" in line
    assert "fedavg.py" in line and str(plugin) in line
    assert ALGORITHMS.get("fedavg").__module__.startswith("pflbench.algorithms")


def test_a_plugin_with_an_unsafe_name_is_one_error(tmp_path: Path) -> None:
    plugin = plugin_file(tmp_path, "bad_name.py", "@register_model('Evil Name')\ndef f():\n    pass\n")
    code, output = invoke("list", "--plugin", str(plugin))
    line = one_error_line(output)
    assert code == 2 and "'Evil Name' is not allowed" in line and str(plugin) in line


@pytest.mark.parametrize(
    "body, expected",
    [
        ("import sys\nsys.exit(3)\n", "called sys.exit(3)"),
        ("import sys\nsys.exit(0)\n", "called sys.exit(0)"),
        ("exit()\n", "called sys.exit(None)"),
        ("raise SystemExit('bye')\n", "called sys.exit('bye')"),
        ("raise RuntimeError('boom\\nsecond line')\n", "failed to import: RuntimeError: boom second line"),
        ("import no_such_module_xyz\n", "failed to import: ModuleNotFoundError"),
        (
            "@register_algorithm('half_probe')\nclass S:\n    pass\nraise ValueError('late')\n",
            "failed to import: ValueError: late",
        ),
    ],
)
@pytest.mark.parametrize("command", ["list", "run"])
def test_a_plugin_that_exits_or_raises_on_import_is_one_error(
    tmp_path: Path, body: str, expected: str, command: str
) -> None:
    plugin = plugin_file(tmp_path, "broken_probe.py", body)
    extra = [*TINY, "--out", str(tmp_path / "out")] if command == "run" else []
    code, output = invoke(command, "--plugin", str(plugin), *extra)
    line = one_error_line(output)
    assert code == 2 and expected in line and str(plugin) in line
    assert not (tmp_path / "out").exists()
    assert "half_probe" not in ALGORITHMS.items  # nothing half-registered stays behind
