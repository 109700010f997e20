"""One vocabulary: attention patterns and sharding layouts are values (`patterns.py`,
`layouts.py`), so no other module compares pattern names or re-derives the degree rule.

Read from the package's source with `ast` (nothing imported), so a new string branch fails here
with the file and line to mend.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ballast.vocabulary import patterns
from ballast.pricing.cost import CostModel
from ballast.pricing.cost_sources import analytic_cost
from ballast.vocabulary.layouts import CONTEXT, ULYSSES, VIDEO_2D
from ballast.vocabulary.model_shape import MODEL_PRESETS, get_model_shape
from ballast.vocabulary.patterns import CAUSAL_LM, FULL_DIT, PATTERNS, SPANS, SPATIAL_TEMPORAL, attention_pattern
from ballast.vocabulary.samples import attention_units

PACKAGE = Path(patterns.__file__).parent
VOCABULARY = {PACKAGE / "patterns.py", PACKAGE / "layouts.py"}
NAMES = set(PATTERNS) | set(SPANS)


def package_trees():
    for path in sorted(PACKAGE.rglob("*.py")):
        if path not in VOCABULARY:
            yield path, ast.parse(path.read_text(), str(path))


def _names_a_pattern(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_pattern(e) for e in node.elts)
    return False


def _is_name_field(node: ast.AST) -> bool:
    """`x.attention`: a pattern's name as a shape or cost model stores it (ask `x.pattern`)."""
    return isinstance(node, ast.Attribute) and node.attr == "attention"


def test_no_module_compares_pattern_names():
    found = []
    for path, tree in package_trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                if any(_names_a_pattern(x) or _is_name_field(x) for x in operands):
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {ast.unparse(node)}")
            elif isinstance(node, ast.Dict) and any(k is not None and _names_a_pattern(k) for k in node.keys):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: a table keyed by pattern names")
    assert not found, "compare pattern values, not names (patterns.py):\n" + "\n".join(found)


def test_the_degree_rule_lives_in_the_layouts():
    """No `heads % degree` outside layouts.py (a shape's own checks, hidden % heads and heads %
    kv_heads, are not the degree rule)."""
    found = []
    for path, tree in package_trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
                left, right = ast.unparse(node.left), ast.unparse(node.right)
                if left.endswith("heads") and not right.endswith("kv_heads"):
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "ask layouts.Layout.allows / check:\n" + "\n".join(found)


def test_the_executor_selects_its_shard_by_the_layout():
    from ballast.runtime.attention import StreamShard
    from ballast.runtime.executor import SHARDS
    from ballast.runtime.hybrid import HybridShard
    from ballast.runtime.video_sp import VideoShard

    assert SHARDS == {ULYSSES: StreamShard, VIDEO_2D: VideoShard, CONTEXT: HybridShard}
    assert {p.layout for p in PATTERNS.values()} <= set(SHARDS)


def test_every_preset_resolves_its_pattern_when_built():
    for shape in MODEL_PRESETS.values():
        assert shape.pattern is attention_pattern(shape.attention)
    assert get_model_shape("tiny").pattern is CAUSAL_LM
    assert get_model_shape("wan-1.3b").pattern is FULL_DIT
    assert get_model_shape("stdit-tiny").pattern is SPATIAL_TEMPORAL
    with pytest.raises(ValueError, match="model 'x': attention pattern 'sparse': expected one of causal, full"):
        type(MODEL_PRESETS["tiny"])("x", 2, 8, 2, 2, 8, 8, attention="sparse")
    with pytest.raises(ValueError, match="attention pattern 'sparse'"):
        CostModel.from_dict({**analytic_cost(MODEL_PRESETS["tiny"], _cpu()).to_dict(), "attention": "sparse"})


@pytest.mark.parametrize("heads, allowed", [(8, [1, 2, 4, 8]), (28, [1, 2, 4]), (12, [1, 2, 4]), (3, [1])])
def test_one_degree_rule_for_cost_model_shape_and_plans(heads, allowed):
    """The cost model's degrees, the shape's check and the layout agree (one rule)."""
    shape = type(MODEL_PRESETS["tiny"])("h", 2, 4 * heads, heads, 1, 64, 256)
    cost = analytic_cost(shape, _cpu(16))
    assert cost.degrees == allowed
    for d in (1, 2, 4, 8, 16):
        assert shape.supports_degree(d) == ULYSSES.allows(d, heads) == (d in allowed)
        if d not in allowed:
            with pytest.raises(ValueError, match=f"SP degree {d} does not divide the attention heads \\({heads}\\)"):
                shape.check_degree(d)


def test_block_spans_and_counts_follow_the_pattern():
    assert SPATIAL_TEMPORAL.block_spans(4) == ["spatial", "temporal", "spatial", "temporal"]
    assert SPATIAL_TEMPORAL.block_counts(5) == (3, 2) and FULL_DIT.block_counts(5) == (5,)
    assert [p.depth_step for p in (CAUSAL_LM, FULL_DIT, SPATIAL_TEMPORAL)] == [1, 1, 2]
    # units by value and by name are the same numbers
    clips = [(3, 4, 5), 17]
    for pattern in PATTERNS.values():
        assert list(attention_units(clips, pattern, 0.3)) == list(attention_units(clips, pattern.name, 0.3))


def _cpu(world: int = 2):
    from ballast.vocabulary.cluster import get_cluster
    return get_cluster("cpu", world_size=world, device_memory_gb=1.0)
