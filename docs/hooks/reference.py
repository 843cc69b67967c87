"""MkDocs hook: the reference pages, generated at build time from pflbench itself (never hand-kept).

- ``reference/algorithms/``: one page per registered algorithm (family, paper, update rule and
  what travels from its docstrings, hyperparameters with defaults, new-client rule, capabilities
  read from the class and from the engine's own refusal predicates), and an index.
- ``reference/{datasets,partitioners,models,trackers}.md``: every registered plugin's docstring.
- ``reference/cli.md``: every ``pflbench`` command and option, walked from the click objects.
- ``plugins/*.md``: the sections of CONTRIBUTING.md (the contributor guide stays the one source).
- ``guides/reference-results.md``: results/reference/README.md (the reference leaderboards).

Links to repository files that are not pages of the site become code paths, so that
``mkdocs build --strict`` checks every link it keeps.
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path
from typing import Any

import click
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]

# CONTRIBUTING.md's sections (by their "## " heading) → the page they make, in order
PLUGIN_PAGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "plugins/architecture.md": ("Module map and hooks", ("Setting up", "The module map", "How a round runs")),
    "plugins/algorithms.md": ("Algorithms", ("Adding an algorithm", "Run settings, defaults and identity")),
    "plugins/datasets-models.md": ("Datasets, partitioners and models", ("Adding a dataset or a model",)),
    "plugins/trackers.md": ("Observers and trackers", ("Observers",)),
    "plugins/testing.md": ("Test helpers", ("Tests",)),
}
ALGORITHM_NAV = "reference/algorithms/index.md"


# ---- Markdown helpers ------------------------------------------------------------------------------
def cell(text: Any) -> str:
    """One table cell: one line, pipes and tags escaped."""
    return escape_tags(" ".join(str(text).split()).replace("|", "\\|"))


def code(text: Any) -> str:
    return f"`{text}`" if "`" not in str(text) else f"`` {text} ``"


def repo_links_as_paths(markdown: str, source: Path) -> str:
    """``[text](target)`` to a repository file (not a page of the site, not a web address) becomes
    the text followed by the file's path, so no link of the site points outside it."""

    def replace(match: re.Match[str]) -> str:
        text, target = match.group(1), match.group(2)
        if re.match(r"[a-z]+://|#|mailto:", target):
            return match.group(0)
        path = (source.parent / target.split("#")[0]).resolve()
        try:
            relative = path.relative_to(ROOT).as_posix() + ("/" if path.is_dir() else "")
        except ValueError:
            relative = target
        shown = text.strip("`")
        return text if shown.rstrip("/") == relative.rstrip("/") else f"{text} ({code(relative)})"

    return re.sub(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)", replace, markdown)


def escape_tags(text: str) -> str:
    """``<`` outside code spans and indented code as ``&lt;``: a docstring's ``emnist-<split>`` is
    text, not an HTML tag that the page would swallow."""
    lines = []
    for line in text.split("\n"):
        if line.startswith("    "):  # an indented code block (equations in docstrings)
            lines.append(line)
            continue
        pieces = re.split(r"(`[^`]*`)", line)
        lines.append("".join(p if p.startswith("`") else p.replace("<", "&lt;") for p in pieces))
    return "\n".join(lines)


def docstring_markdown(doc: str | None) -> str:
    """A docstring as Markdown: dedented; RST double backticks become code spans; ``<`` escaped."""
    text = inspect.cleandoc(doc or "")
    return escape_tags(re.sub(r"``(.+?)``", r"`\1`", text, flags=re.S))


def paragraphs(text: str) -> list[str]:
    return [p for p in re.split(r"\n\s*\n", text) if p.strip()]


# ---- algorithms --------------------------------------------------------------------------------------
def _yes_no(refusal: str | None) -> str:
    return "yes" if refusal is None else f"no — {refusal}"


def algorithm_facts(name: str, cls: type) -> list[tuple[str, str]]:
    from pflbench.engine.algorithm import Algorithm, ClientProgram
    from pflbench.engine.privacy import client_level_refusal, sample_level_refusal
    from pflbench.report.families import family_of, family_title

    family = getattr(cls, "method_family", "")
    custom_loop = cls.program_class.local_update is not ClientProgram.local_update
    lora = cls.lora_rank.__func__ is not Algorithm.lora_rank.__func__  # type: ignore[attr-defined]
    facts = [
        ("registered name", code(name)),
        ("family", f"{family_title(family_of(family))} ({code(family or 'none')})"),
        ("paper", cls.paper or "—"),
        ("class", code(f"{cls.__module__}.{cls.__qualname__}")),
        (
            "global model",
            "yes (`global_acc` reported)" if cls.has_global_model else "no (`global_acc` is null)",
        ),
        ("uploads", "nothing (clients never communicate)" if cls.uploads_nothing else "see the update rule below"),
        ("reads `--head-layers`", "yes" if cls.uses_head_layers else "no"),
        ("LoRA", "its own LoRA layers (a LoRA algorithm)" if lora else "with `--lora-rank r`, like every algorithm"),
        ("`--dp client`, model-poisoning `--attack`, `--robust-agg`", _yes_no(client_level_refusal(cls))),
        ("`--dp sample` (DP-SGD)", _yes_no(sample_level_refusal(cls))),
        (
            "`--executor vmap`",
            "no — its client program has its own local training loop"
            if custom_loop
            else "yes, on models without BatchNorm running statistics, dropout or recurrent layers",
        ),
    ]
    if cls.defaults_by_family:
        shown = "; ".join(
            f"{family_name}: " + ", ".join(f"{k} = {v}" for k, v in values.items())
            for family_name, values in cls.defaults_by_family.items()
        )
        facts.append(("defaults by model family", shown))
    if cls.checkpoint_attributes:
        facts.append(("checkpointed state", ", ".join(code(a) for a in cls.checkpoint_attributes)))
    return facts


def hyperparameter_table(cls: type) -> str:
    from pflbench.plugin_sources import dataclass_hyperparameters

    rows = dataclass_hyperparameters(cls.hyperparameters)
    if not rows:
        return "No hyperparameters of its own: the run's settings apply (`pflbench run --help`).\n"
    lines = ["| option | type | default | meaning |", "| --- | --- | --- | --- |"]
    for row in rows:
        annotation = getattr(row.annotation, "__name__", None) or str(row.annotation).replace("typing.", "")
        choices = row.metadata.get("choices")
        meaning = row.metadata.get("help", "") + (f" Choices: {', '.join(choices)}." if choices else "")
        flag = "--" + row.name.replace("_", "-")
        lines.append(f"| {code(flag)} | {cell(annotation)} | {code(repr(row.default))} | {cell(meaning)} |")
    return "\n".join(lines) + "\n"


def algorithm_page(name: str, cls: type) -> str:
    display = getattr(cls, "display_name", None) or name
    module_doc = docstring_markdown(sys.modules[cls.__module__].__doc__)
    rule, defaults, new_clients = [], [], []
    for paragraph in paragraphs(module_doc):
        head = paragraph.lstrip()
        if head.startswith(("New clients", "New client")):
            new_clients.append(paragraph)
        elif head.startswith(("Defaults", "Default ")):
            defaults.append(paragraph)
        else:
            rule.append(paragraph)
    parts = [f"# {display} (`{name}`)\n", docstring_markdown(cls.__doc__) + "\n", "| property | value |\n| --- | --- |"]
    parts += [f"| {key} | {cell(value)} |" for key, value in algorithm_facts(name, cls)]
    parts += ["\n## Update rule, what travels, what stays private\n", "\n\n".join(rule) or "—"]
    parts += ["\n## Hyperparameters\n", hyperparameter_table(cls)]
    if defaults:
        parts += ["**Defaults and their sources**\n", "\n\n".join(defaults)]
    parts += ["\n## New clients\n"]
    parts += ["\n\n".join(new_clients) if new_clients else "Served by `Algorithm`'s default rule: see the guide."]
    parts += [
        "\n*Generated from the registry and the module's docstring (`docs/hooks/reference.py`).*"
        " Run it: `pflbench run --algo " + name + "`.\n"
    ]
    return "\n".join(parts)


def algorithm_index(algorithms: dict[str, type]) -> str:
    from pflbench.plugin_sources import doc_summary
    from pflbench.report.families import METHOD_FAMILIES, family_of, family_title

    order = [*METHOD_FAMILIES, "other"]
    grouped: dict[str, list[str]] = {}
    for name, cls in algorithms.items():
        grouped.setdefault(family_of(getattr(cls, "method_family", "")), []).append(name)
    parts = [
        "# Algorithms\n",
        f"Every registered algorithm ({len(algorithms)}), grouped by the survey's method families as "
        "`pflbench list` groups them. Each page is generated from the registry and the algorithm's "
        "docstrings when the site is built.\n",
    ]
    for family in sorted(grouped, key=order.index):
        parts += [f"## {family_title(family)}\n", "| algorithm | paper | summary |", "| --- | --- | --- |"]
        for name in grouped[family]:
            cls = algorithms[name]
            display = getattr(cls, "display_name", None) or name
            summary = doc_summary(sys.modules[cls.__module__].__doc__ or cls.__doc__ or "")
            parts.append(f"| [{cell(display)}]({name}.md) (`{name}`) | {cell(cls.paper)} | {cell(summary)} |")
        parts.append("")
    return "\n".join(parts)


# ---- other registries --------------------------------------------------------------------------------
def registry_page(title: str, intro: str, registry: Any, run_option: str) -> str:
    parts = [f"# {title}\n", intro + "\n"]
    for name in registry.names():
        item = registry.get(name)
        parts += [f"## `{name}`\n", f"`{run_option} {name}` — `{item.__module__}.{item.__qualname__}`\n"]
        parts.append(docstring_markdown(item.__doc__) or "(no docstring)")
        signature = _options_of(item)
        if signature:
            parts.append("\nOptions: " + signature)
        parts.append("")
    return "\n".join(parts)


def _options_of(item: Any) -> str:
    """Options a dataset or model takes (``--dataset-option`` / ``--model-option KEY=VALUE``)."""
    try:
        parameters = inspect.signature(item).parameters.values()
    except (TypeError, ValueError):
        return ""
    given_by_the_run = {"data_dir", "input_shape", "num_classes", "pretrained", "self"}
    shown = [
        f"`{p.name}={p.default!r}`"
        for p in parameters
        if p.default is not p.empty and p.name not in given_by_the_run and not p.name.startswith("_")
    ]
    return ", ".join(shown)


# ---- the command line --------------------------------------------------------------------------------
def cli_page() -> str:
    from pflbench.cli import cli

    parts = [
        "# Command line\n",
        "Every `pflbench` command with every option, default and help text, walked from the click "
        "commands when the site is built (`pflbench COMMAND --help` prints the same; for `run`, `sweep` "
        "and `tune` it lists the shared options by topic, one line each, and `--help-all` prints them all).\n",
    ]
    root = click.Context(cli, info_name="pflbench")
    for name in sorted(cli.list_commands(root)):
        command = cli.get_command(root, name)
        if command is None:
            continue
        ctx = click.Context(command, info_name=name, parent=root)
        usage = " ".join(command.collect_usage_pieces(ctx))
        parts += [f"## `pflbench {name}`\n", f"```\npflbench {name} {usage}\n```\n"]
        parts.append(docstring_markdown(command.help or "").replace("\b\n", "") + "\n")
        rows = []
        for param in command.get_params(ctx):
            if isinstance(param, click.Argument):
                rows.append((code(param.human_readable_name), "argument", "", ""))
                continue
            if not isinstance(param, click.Option) or param.hidden:
                continue
            flags = ", ".join(code(o) for o in [*param.opts, *param.secondary_opts])
            default = "" if param.default is None or param.is_flag and not param.default else code(param.default)
            if callable(param.default):
                default = ""
            rows.append((flags, cell(param.type.name), default, cell(param.help or "")))
        if rows:
            parts += ["| option | type | default | meaning |", "| --- | --- | --- | --- |"]
            parts += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
        parts.append("")
    return "\n".join(parts)


# ---- pages from the repository's own Markdown ----------------------------------------------------------
def sections(markdown: str) -> dict[str, str]:
    """ "## " heading → its section (heading included), code fences respected."""
    found: dict[str, str] = {}
    current, lines, fenced = None, [], False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("## "):
            if current:
                found[current] = "\n".join(lines)
            current, lines = line[3:].strip(), []
            continue
        lines.append(line)
    if current:
        found[current] = "\n".join(lines)
    return found


def plugin_pages() -> dict[str, str]:
    source = ROOT / "CONTRIBUTING.md"
    found = sections(source.read_text(encoding="utf-8"))
    pages = {}
    for path, (title, headings) in PLUGIN_PAGES.items():
        missing = [h for h in headings if h not in found]
        if missing:
            raise RuntimeError(f"CONTRIBUTING.md has no section {missing[0]!r} (docs/hooks/reference.py)")
        body = "\n\n".join(f"## {h}\n{found[h]}" for h in headings)
        note = "*From CONTRIBUTING.md, the contributor guide (this page is generated from it).*\n"
        pages[path] = f"# {title}\n\n{note}\n{repo_links_as_paths(body, source)}\n"
    return pages


def reference_results_page() -> str:
    source = ROOT / "results" / "reference" / "README.md"
    text = source.read_text(encoding="utf-8")
    note = "*This page is `results/reference/README.md`, included when the site is built.*\n\n"
    title, _, rest = text.partition("\n")
    return f"{title}\n\n{note}{repo_links_as_paths(rest, source)}\n"


# ---- MkDocs events -------------------------------------------------------------------------------------
def _algorithms() -> dict[str, type]:
    from pflbench.registry import ALGORITHMS

    return {name: ALGORITHMS.get(name) for name in ALGORITHMS.names()}


def on_config(config: Any) -> Any:
    """One navigation entry per algorithm under "Algorithms" (the pages come from on_files)."""
    names = sorted(_algorithms())

    def expand(items: list[Any]) -> list[Any]:
        out = []
        for item in items:
            if isinstance(item, dict):
                ((title, value),) = item.items()
                if value == ALGORITHM_NAV:
                    value = [ALGORITHM_NAV, *(f"reference/algorithms/{n}.md" for n in names)]
                elif isinstance(value, list):
                    value = expand(value)
                out.append({title: value})
            else:
                out.append(item)
        return out

    config["nav"] = expand(config["nav"])
    return config


def generated_pages() -> dict[str, str]:
    from pflbench.registry import DATASETS, MODELS, PARTITIONERS, TRACKERS

    algorithms = _algorithms()
    pages = {ALGORITHM_NAV: algorithm_index(algorithms)}
    pages.update({f"reference/algorithms/{n}.md": algorithm_page(n, c) for n, c in algorithms.items()})
    pages["reference/datasets.md"] = registry_page(
        "Datasets",
        "Every registered dataset. Options go to the dataset with `--dataset-option KEY=VALUE`; "
        "see the guide [Datasets](../scenarios/datasets.md).",
        DATASETS,
        "--dataset",
    )
    pages["reference/partitioners.md"] = registry_page(
        "Partitioners",
        "Every registered partitioner; see the guide [Label skew and partitioners](../scenarios/label-skew.md).",
        PARTITIONERS,
        "--partition",
    )
    pages["reference/models.md"] = registry_page(
        "Models",
        "Every registered model (any timm model name works too). Options go to the model with "
        "`--model-option KEY=VALUE`.",
        MODELS,
        "--model",
    )
    pages["reference/trackers.md"] = registry_page(
        "Trackers",
        "Every registered experiment tracker (`--log NAME`, comma-separated or repeatable).",
        TRACKERS,
        "--log",
    )
    pages["reference/cli.md"] = cli_page()
    pages.update(plugin_pages())
    pages["guides/reference-results.md"] = reference_results_page()
    return pages


def on_files(files: Files, config: Any) -> Files:
    for path, content in generated_pages().items():
        files.append(File.generated(config, path, content=content))
    return files
