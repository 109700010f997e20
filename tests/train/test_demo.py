"""`make demo` shows ballast's idea: the ballast planner lays different steps out differently.

The demo's setting is demo.toml, which the Makefile's demo target trains; here its steps are
drawn and planned as `ballast train` does on rank 0 (same stream, planner and cost model),
without ranks or training, so the layouts the demo's summary counts are these.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from ballast.train.config_sources import load_toml
from ballast.train.setup import Setup, make_planner, open_data
from ballast.train.metrics import layout_of

ROOT = Path(__file__).resolve().parents[2]
SHARE = 0.1
"""The least share of the steps a layout must run to count as one the demo shows."""


def test_the_demo_trains_demo_toml():
    assert "--config demo.toml" in (ROOT / "Makefile").read_text()


def test_the_demo_steps_run_more_than_one_layout():
    config = load_toml(ROOT / "demo.toml")
    setup = Setup.of(config, config.run.world)
    stream, _ = open_data(config, setup.shape, setup.tokenizer, progress=False)
    planner = make_planner(config, setup)
    steps = config.run.steps
    layouts = Counter(layout_of(planner.plan(stream.next_batch().planned)) for _ in range(steps))
    shown = [layout for layout, count in layouts.items() if count >= SHARE * steps]
    assert len(shown) >= 2, f"layouts of the demo's {steps} steps: {dict(layouts)}"
