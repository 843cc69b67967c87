"""Help that fits on a screen: ``run``/``sweep``/``tune --help`` list the shared options in titled
sections, one line each (the first sentence of its help, cut to the terminal, and its default);
an algorithm's own options appear only for ``--algo NAME`` (``--algos A,B``), in their own
section; ``--help-all`` prints every option in full, every algorithm's options too.

Click has no option groups: ``format_sections`` replaces ``click.Command.format_options`` for
``cli.options.RunCommand``. A run setting's section is its setting group's (``SECTIONS``, derived
from ``config.settings.GROUPS``: a group's ``section``, else its title; in the groups' order, each
group's options in its declared order), a command's own option's its ``CommandOption.section``
(an option of neither lands in ``OTHER``, which tests keep empty).
"""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import click

from pflbench.cli.controls import CONTROL, FULL_HELP, CommandOption
from pflbench.config.settings import GROUPS


def group_sections() -> dict[str, tuple[str, ...]]:
    """Section title → the run settings it shows (``RunConfig`` field names), in the order shown:
    each setting group's options under its ``section`` (else its title), groups in ``GROUPS`` order."""
    sections: dict[str, tuple[str, ...]] = {}
    for group in GROUPS:
        title = group.section or group.title
        names = tuple(f.name for f in dataclasses.fields(group))  # type: ignore[arg-type]
        sections[title] = sections.get(title, ()) + names
    return sections


SECTIONS = group_sections()
OTHER = "Other settings"
SECTION_OF = {name: title for title, names in SECTIONS.items() for name in names}
HELP_ALGOS = "pflbench.help_algos"  # ctx.meta key: the algorithms named before --help
ABBREVIATIONS = ("e.g.", "i.e.", "cf.", "etc.", "vs.")


def summary(text: str) -> str:
    """The first sentence of a help text (a period outside brackets, not an abbreviation's)."""
    text = " ".join(text.split())
    depth = 0
    for i, char in enumerate(text):
        depth += (char in "([{") - (char in ")]}")
        if char == "." and depth == 0 and (i + 1 == len(text) or text[i + 1] == " "):
            if not any(text[: i + 1].endswith(a) for a in ABBREVIATIONS):
                return text[: i + 1]
    return text


def _extra(record: str, help_text: str) -> str:
    """What click appends to an option's help (``[default: 0.5]``, ``[required]``)."""
    plain = " ".join(help_text.split())
    record = " ".join(record.split())
    return record[len(plain) :].strip() if record.startswith(plain) else ""


def one_line(term: str, text: str, extra: str, width: int, indent: int, column: int) -> str:
    """``term`` and ``text`` + ``extra`` on one line of at most ``width`` characters: the text is cut
    (``…``) to fit, the extra (the default) kept whole where it fits; below a term too long for
    any text beside it."""
    start = indent + max(column, len(term) + 2)
    room = width - start
    if room < 16:  # a long term (many choices) on a narrow screen: the text goes below it
        below = one_line("", text, extra, width, indent, column)
        return " " * indent + term + "\n" + below
    line = " " * indent + term.ljust(start - indent)
    shown = f"{text}  {extra}" if extra else text
    if len(shown) <= room:
        return (line + shown).rstrip()
    if extra and len(extra) + 4 <= room:
        return line + _cut(text, room - len(extra) - 3) + "…  " + extra
    return line + _cut(shown, room - 1) + "…" if room > 1 else line.rstrip()


def _cut(text: str, size: int) -> str:
    """``text`` cut to ``size`` characters, at a word's end where one is not too far back."""
    cut = text[: max(size, 0)]
    if len(text) > len(cut) and text[len(cut)] != " " and " " in cut[len(cut) // 2 :]:
        cut = cut.rsplit(" ", 1)[0]
    return cut.rstrip(" ,;:(")


class Row(NamedTuple):
    """One option as help shows it: its term, help and what click appends (its default)."""

    term: str
    help: str
    extra: str


def option_row(ctx: click.Context, option: click.Option, full: bool) -> Row | None:
    record = option.get_help_record(ctx)
    if record is None:
        return None
    return Row(
        record[0] if full else short_term(option, record[0]), option.help or "", _extra(record[1], option.help or "")
    )


def short_term(option: click.Option, term: str) -> str:
    """The compact help's term: the flags, and the choices of a choice (a type name, TEXT or
    FLOAT, says little that the default does not; ``--help-all`` shows it)."""
    if isinstance(option.type, click.Choice) or option.is_flag or option.count:
        return term
    return ", ".join(option.opts)


def algorithm_rows(ctx: click.Context, algo: str, by_name: dict[str, click.Option], full: bool) -> list[Row]:
    """The options of ``algo`` (read from its source, as parsing does), with its own defaults."""
    from pflbench.plugin_sources import algorithm_hyperparameters

    rows = []
    for field in algorithm_hyperparameters().get(algo, ()):
        option = by_name.get(field.name)
        record = option.get_help_record(ctx) if option is not None else None
        if option is None or record is None:
            continue
        default = field.default
        if isinstance(default, bool) and option.secondary_opts:  # as click shows a flag's default
            default = (option.opts if default else option.secondary_opts)[0].lstrip("-")
        shown = "" if default is None else f"[default: {default}]"
        rows.append(Row(record[0] if full else short_term(option, record[0]), field.metadata.get("help", ""), shown))
    return rows


def format_sections(command: click.Command, ctx: click.Context, formatter: click.HelpFormatter) -> None:
    """The options of ``command`` (a ``RunCommand``) in titled sections: compact, unless
    ``--help-all`` asked for every option in full."""
    from pflbench.plugin_sources import algorithm_hyperparameters

    full = bool(ctx.meta.get(FULL_HELP))
    params = [p for p in command.get_params(ctx) if isinstance(p, click.Option)]
    by_name = {p.name: p for p in params if p.name}
    owned = {f.name for fields in algorithm_hyperparameters().values() for f in fields}
    sections: dict[str, list[Row]] = {}
    for option in params:
        if option.name in owned and not isinstance(option, CommandOption):
            continue  # an algorithm's option: shown in its algorithm's section
        row = option_row(ctx, option, full)
        if row is None:
            continue
        if isinstance(option, CommandOption):
            title = option.section
        elif option.name in SECTION_OF:
            title = SECTION_OF[option.name]
        elif option is command.get_help_option(ctx):
            title = CONTROL
        else:
            title = OTHER
        sections.setdefault(title, []).append(row)
    known = algorithm_hyperparameters()
    asked = ctx.meta.get(HELP_ALGOS) or (tuple(known) if full else ())
    algorithm_sections = {}
    for algo in asked:
        rows = algorithm_rows(ctx, algo, by_name, full)
        if algo not in known:
            rows = [Row("", f"None: {algo!r} is not a registered algorithm (pflbench list algorithms).", "")]
        elif not rows:
            rows = [Row("", f"None: {algo} reads only the shared options.", "")]
        algorithm_sections[f"Options of {algo}"] = rows
    # the command's own sections (a sweep's grid, tuning) first, then the algorithms', the run's
    ordered = [t for t in sections if t not in SECTIONS and t not in (CONTROL, OTHER)]
    ordered += [*algorithm_sections, *(t for t in SECTIONS if t in sections)]
    ordered += [t for t in (OTHER, CONTROL) if t in sections]
    everything = {**sections, **algorithm_sections}
    column = min(max((len(r.term) for rows in everything.values() for r in rows), default=0), 24) + 2
    for title in ordered:
        rows = everything[title]
        with formatter.section(title):
            if not rows[0].term:  # a note instead of options
                formatter.write_text(rows[0].help)
                continue
            if full:
                formatter.write_dl([(r.term, f"{r.help}  {r.extra}".strip()) for r in rows])
                continue
            for row in rows:
                text = summary(row.help)
                formatter.write(one_line(row.term, text, row.extra, formatter.width, formatter.current_indent, column))
                formatter.write("\n")
    if not full:
        name = ctx.command_path
        flag = "--algos NAME,..." if "algos" in by_name else "--algo NAME"
        own, every = (f"{name} {flag} --help".replace(" ", "\0"), f"{name} --help-all".replace(" ", "\0"))
        formatter.write_paragraph()  # a command is never cut, nor a flag at its hyphen
        for line in (f"An algorithm's options (e.g. fedprox's --mu): {own}", f"Everything in full: {every}"):
            wrapped = textwrap.fill(line, formatter.width, break_on_hyphens=False, break_long_words=False)
            formatter.write(wrapped.replace("\0", " ") + "\n")


@contextmanager
def shortened_help(command: click.Command, ctx: click.Context) -> Iterator[None]:
    """``command.help`` cut, for the compact help, to its first paragraph and its examples (the
    paragraphs marked ``\\b``); ``--help-all`` shows it whole."""
    whole = command.help
    if whole and not ctx.meta.get(FULL_HELP):
        parts = whole.split("\n\n")
        command.help = "\n\n".join(p for i, p in enumerate(parts) if i == 0 or p.startswith("\b"))
    try:
        yield
    finally:
        command.help = whole


def algos_from(args: list[str], table: dict[str, Any] | None = None) -> tuple[str, ...]:
    """The algorithms named by ``--algo``/``--algos`` in raw arguments (else in the ``--config``
    table): the ones whose options help shows."""
    found: str | list[Any] | None = None
    for i, arg in enumerate(args):
        if arg == "--":
            break
        for flag in ("--algo", "--algos"):
            if arg == flag and i + 1 < len(args):
                found = args[i + 1]
            elif arg.startswith(flag + "="):
                found = arg.split("=", 1)[1]
    if found is None and table:
        found = table.get("algos", table.get("algo"))
    if found is None:
        return ()
    items = found if isinstance(found, (list, tuple)) else str(found).split(",")
    return tuple(dict.fromkeys(str(a).strip() for a in items if str(a).strip()))
