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

demo: $(STAMP)
	$(VENV)/bin/ballast simulate --lengths wikipedia --cluster a100-64 --model gpt-7b \
	    --max-len 393216 --batch 512 --steps 3 --planners all --time-limit 2 --gantt demo-gantt.png

test: $(STAMP)
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) .pytest_cache
