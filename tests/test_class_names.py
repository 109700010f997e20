"""One name, one class: no two classes of the ballast package share a name, read from the
source (nothing is imported), so a reader who meets a name knows which thing it is."""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def class_definitions(package: Path) -> dict[str, list[str]]:
    """Class name -> every `path:line` defining a class of that name, nested ones included."""
    found = defaultdict(list)
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                found[node.name].append(f"{path.relative_to(package.parent)}:{node.lineno}")
    return found


def test_the_scan_finds_a_shared_name(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "a.py").write_text("class Batch:\n    class Inner:\n        pass\n")
    (pkg / "sub" / "b.py").write_text("class Batch:\n    pass\nclass Other:\n    pass\n")
    found = class_definitions(pkg)
    assert found["Batch"] == ["pkg/a.py:1", "pkg/sub/b.py:1"] and found["Inner"] == ["pkg/a.py:2"]


def test_no_two_classes_share_a_name():
    found = class_definitions(ROOT / "ballast")
    assert len(found) > 100 and "Plan" in found
    shared = [f"{name}: {', '.join(places)}" for name, places in sorted(found.items()) if len(places) > 1]
    assert not shared, "classes sharing a name (give each a name that says what it is):\n" + "\n".join(shared)
