"""Render docs/results.md whole from the recorded JSON in bench/results/, and the README's
headline table between its `<!-- results:headline -->` markers.

The prose lives in bench/results_template.md; each of its `<!-- table:NAME -->` lines becomes
NAME's table, rendered from its record (TABLES), so the numbers in the docs are always the
records'. Run it after any benchmark (the bench/*.sh scripts do): `python bench/results_doc.py`.
tests/test_docs.py renders both in memory and fails when the committed files differ.
"""
from __future__ import annotations

import re
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling table modules, when imported

from memory_tables import memory_table  # noqa: E402
from pipeline_tables import pipeline_table  # noqa: E402
from measured_tables import convergence_text, hf_table, measured_table, peers_table, video_measured_table  # noqa: E402
from profile_tables import mesh_check_table, profile_text  # noqa: E402
from strategy_tables import STRATEGY_SETTINGS, strategy_table  # noqa: E402
from simulated_tables import (CONTEXT_PARALLEL, PIPELINES, ROUTING, SETTINGS, VIDEO, context_parallel_table,  # noqa: E402
                              headline_table, latency_table, optimum_gap_text, routing_table, simulated_table,
                              sweep_text, video_table)

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "bench" / "results_template.md"
RESULTS_DOC = ROOT / "docs" / "results.md"
README = ROOT / "README.md"
HEADLINE = re.compile(r"(<!-- results:headline -->\n).*?(<!-- /results:headline -->)", re.S)
TABLE = re.compile(r"^<!-- table:(\S+) -->$", re.M)

TABLES: dict[str, Callable[[], str]] = {
    **{f"simulate-{n}": partial(simulated_table, n) for n in SETTINGS},
    **{f"simulate-{n}": partial(video_table, n) for n in VIDEO},
    **{f"simulate-{n}": partial(context_parallel_table, n) for n in CONTEXT_PARALLEL},
    **{f"simulate-{n}": partial(routing_table, n) for n in ROUTING},
    **{f"simulate-{n}": partial(pipeline_table, n) for n in PIPELINES},
    **{f"strategies-{n}": partial(strategy_table, n) for n in STRATEGY_SETTINGS},
    "headline": headline_table, "sweep": sweep_text, "optimum-gap": optimum_gap_text, "latency": latency_table,
    "measured": measured_table, "hf": hf_table, "peers": peers_table, "video-measured": video_measured_table,
    "convergence": convergence_text, "memory": memory_table, "profile-mesh": mesh_check_table,
    **{f"profile-{n}": partial(profile_text, n) for n in ("tiny", "hf-llama", "dit-tiny", "stdit-tiny", "wan-tiny")},
}
"""Every table the template may place, by name."""


def table(name: str) -> str:
    if name not in TABLES:
        raise SystemExit(f"{TEMPLATE.name} places <!-- table:{name} -->, which results_doc.TABLES does not know")
    try:
        return TABLES[name]()
    except FileNotFoundError as missing:
        return f"*Not recorded: {Path(missing.filename).relative_to(ROOT)} is missing.*"


def render_results() -> str:
    """docs/results.md as the template and the records make it."""
    return TABLE.sub(lambda m: table(m.group(1)), TEMPLATE.read_text())


def render_readme(readme: str) -> str:
    """The README with its headline table rendered from the records."""
    if not HEADLINE.search(readme):
        raise SystemExit("README.md has no <!-- results:headline --> markers")
    return HEADLINE.sub(lambda m: m.group(1) + headline_table() + "\n" + m.group(2), readme)


def main() -> None:
    RESULTS_DOC.write_text(render_results())
    README.write_text(render_readme(README.read_text()))
    print(f"{RESULTS_DOC.relative_to(ROOT)} and README.md's headline table rendered from bench/results/")


if __name__ == "__main__":
    main()
