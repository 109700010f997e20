"""ballast/command_line/provenance.py: the commit and dirty flag of a checkout, read from git."""
from __future__ import annotations

import subprocess

from ballast.command_line.provenance import git_state, provenance


def git(folder, *args):
    return subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, check=True).stdout.strip()


def checkout(tmp_path):
    """A one-commit repository with a source file and a record under bench/results."""
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "bench" / "results" / "record.json").write_text("{}\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "results.md").write_text("| table |\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", ".")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    return tmp_path


def test_clean_checkout_names_its_head(tmp_path):
    repo = checkout(tmp_path)
    assert git_state(repo) == (git(repo, "rev-parse", "HEAD"), False)


def test_changed_code_is_dirty_a_changed_record_is_not(tmp_path):
    repo = checkout(tmp_path)
    (repo / "bench" / "results" / "record.json").write_text('{"rerun": 1}\n')
    (repo / "docs" / "results.md").write_text("| rendered again |\n")  # what results_doc.py writes
    (repo / "untracked.py").write_text("")
    assert git_state(repo)[1] is False
    (repo / "code.py").write_text("x = 2\n")
    assert git_state(repo)[1] is True


def test_outside_a_checkout_or_below_its_top_is_unknown(tmp_path):
    assert git_state(tmp_path) == ("unknown", None)
    repo = checkout(tmp_path / "repo")
    assert git_state(repo / "bench") == ("unknown", None)


def test_record_fields():
    record = provenance()
    assert set(record) == {"commit", "dirty", "torch", "ballast", "date", "machine", "load_average"}
    assert record["machine"]["cores"] >= 1 and record["machine"]["cpu"]
    assert len(record["load_average"]) == 3 and record["date"].endswith("+00:00")
