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
# 2 gloo ranks, the ballast planner. The 42 MB memory budget stands in for a GPU's capacity:
# a 2048-token chunk fits one rank only with recomputation and two ranks without. Steps of
# four such chunks run best at degree 1 with checkpointing; steps with a short document in
# them get degree 2, or two waves mixing degrees 1 and 2, and less recomputation.
demo: $(STAMP)
	rm -rf runs/demo
	$(VENV)/bin/ballast train --model tiny --data stdlib --planner ballast --world 2 --steps 80 \
	    --max-len 2048 --tokens-per-step 8192 --device-memory-gb 0.042 --out-dir runs/demo

test: $(STAMP)
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) .pytest_cache
