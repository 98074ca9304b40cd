# The README's two commands: `make run` (install, then a small federated run on
# Fashion-MNIST that writes results and plots) and `make test` (install, then
# the test suite). Both set up everything they need: the .venv with pinned
# dependencies and, where apt-get is available as root, the offline dataset.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
RUN_CONFIG ?=
NUM_SUPERNODES ?= 10
# Two pytest-xdist workers: one runs the deployment tests, which mostly wait, beside the other's CPU-bound tests
# (tests/conftest.py schedules them); PYTEST_WORKERS=0 runs the suite in one process.
PYTEST_WORKERS ?= 2
export FLWR_TELEMETRY_ENABLED := 0
export FLWR_DISABLE_UPDATE_CHECK := 1
export RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO := 0

.PHONY: install run test dataset clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

install: $(STAMP) dataset

# Fashion-MNIST ships as a Debian package; the app finds its files on its own.
dataset:
	@if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then \
	  if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null; then \
	    (apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1 || \
	     (apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist)) ; \
	  else \
	    echo "Fashion-MNIST not found: run 'sudo apt-get install dataset-fashion-mnist' or set data-dir"; \
	  fi; \
	fi

run: install
	$(VENV)/bin/fedsynth run --num-supernodes $(NUM_SUPERNODES) --run-config "$(RUN_CONFIG)"

test: install
	$(PY) -m pytest -q -ra --durations=25 -n $(PYTEST_WORKERS) --dist loadscope --no-loadscope-reorder $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) results .pytest_cache
