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

# A few minutes of real training: the tiny model on this machine's Python standard library,
# 2 gloo ranks, the ballast planner. The 12 MB memory budget stands in for a GPU's capacity:
# a 512-token sequence does not fit one rank without recomputation, so the planner chooses
# between SP degree 2, checkpointing and more micro-batches every step.
demo: $(STAMP)
	rm -rf runs/demo
	$(VENV)/bin/ballast train --model tiny --data stdlib --planner ballast --world 2 --steps 100 \
	    --max-len 512 --tokens-per-step 4096 --device-memory-gb 0.012 --out-dir runs/demo

test: $(STAMP)
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) .pytest_cache
