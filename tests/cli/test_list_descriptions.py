"""``pflbench list`` shows each plugin's first sentence whole (issue 34, item 13: the ``iid``
line stopped at the source's line break, mid-sentence)."""

from __future__ import annotations

from click.testing import CliRunner

from pflbench.cli import cli
from pflbench.plugin_sources import doc_summary


def test_doc_summary_joins_the_first_paragraph_up_to_its_first_sentence() -> None:
    assert doc_summary("One line.") == "One line."
    assert doc_summary("Split over\n    two lines; the end.\n\n    Details.") == "Split over two lines; the end."
    assert doc_summary("First (e.g. this. Not here) one. Second sentence.") == "First (e.g. this. Not here) one."
    assert doc_summary("Uses e.g. FEMNIST ids; K groups.\nMore.") == "Uses e.g. FEMNIST ids; K groups."
    assert doc_summary("No period at the end") == "No period at the end"
    assert doc_summary("") == ""


def test_list_shows_whole_sentences() -> None:
    result = CliRunner().invoke(cli, ["list"])
    assert result.exit_code == 0, result.output
    described = [line.strip() for line in result.output.splitlines() if line.startswith("  ") and line.strip()]
    iid = next(line for line in described if line.startswith("iid "))
    assert iid.endswith("(``sizes`` not ``none``, ``data.quantity``) into parts of n_k samples, the sizes drawn first.")
    cut = [
        line
        for line in described
        if not line.endswith(":") and not line.startswith("<timm name>") and line[-1] not in ".)]"
    ]
    assert cut == [], cut
