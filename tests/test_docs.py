"""The README and docs/results.md against what they describe: the README's package map names
every folder of ballast/ and only those, its command quickstarts are the subcommands the CLI
registers, and docs/results.md and the README's headline table are what bench/results_doc.py
renders from the records in bench/results/ (so no number drifts from its JSON)."""
from __future__ import annotations

import argparse
import importlib
import re
from pathlib import Path

from ballast.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def section(text: str, title: str) -> str:
    """The body of the README's `## title` section."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"README.md has no '## {title}' section"
    return match.group(1)


def test_package_map_names_every_folder_of_the_package_and_only_those():
    block = re.search(r"```\n(.*?)```", section(README.read_text(), "Package map"), re.S).group(1)
    named = re.findall(r"^ +(\w+)/", block, re.M)
    folders = {p.name for p in (ROOT / "ballast").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert len(named) == len(set(named)), f"a folder named twice: {sorted(named)}"
    assert set(named) == folders, (f"missing from the map: {sorted(folders - set(named))}; "
                                   f"not in the package: {sorted(set(named) - folders)}")


def test_readme_has_a_quickstart_for_each_subcommand_and_no_other():
    [subcommands] = [a for a in build_parser()[0]._actions if isinstance(a, argparse._SubParsersAction)]
    listed = re.findall(r"^### `ballast (\w+)`$", section(README.read_text(), "Commands"), re.M)
    assert sorted(listed) == sorted(subcommands.choices)


def test_results_doc_and_readme_headline_are_rendered_from_the_records(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    results_doc = importlib.import_module("results_doc")
    stale = "is stale: run `python bench/results_doc.py`"
    assert results_doc.RESULTS_DOC.read_text() == results_doc.render_results(), f"docs/results.md {stale}"
    readme = README.read_text()
    assert readme == results_doc.render_readme(readme), f"README.md's headline table {stale}"
