# Both targets do the whole set-up on a fresh machine. torch is pinned and installed
# first, on its own: a looser requirement would pull a multi-GB CUDA build.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# A few minutes of real training of the tiny model on this machine's Python standard library,
# 2 gloo ranks, the ballast planner, in the setting of demo.toml: chunks of at most 2048 tokens,
# 8192 a step, 30 MB per rank standing in for a GPU's capacity. Steps of four full chunks run
# as two degree-1 groups (1x1+1x1), every layer recomputed; a step with a short chunk
# runs in two waves, two full chunks at degree 1 and then the rest as one group of both ranks
# with context parallelism (1x2), half of every chunk on each rank and three of four layers
# recomputed. The log names each step's layout; the summary counts the steps of each.
demo: $(STAMP)
	rm -rf runs/demo
	$(VENV)/bin/ballast train --config demo.toml --out-dir runs/demo

test: $(STAMP)
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) .pytest_cache
