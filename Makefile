# Two commands on a fresh machine:  make demo   and   make test
# Each installs what it needs first: the system Gloo, a virtual environment
# .venv, the project and its extras. make test-fast: the tests not marked slow
# (measured: tests/durations.json; a few multi-process ones per layer among
# them), for day-to-day work. make durations: the whole suite, measuring again.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check
DEPS   := $(VENV)/.deps-installed
BUILT  := $(VENV)/.bagua-built
GLOO   := /usr/share/cmake/Gloo/GlooConfig.cmake
# ccache (installed by make system as root; optional) makes a fresh clone's build of csrc/ a cache hit
CCACHE := $(shell command -v ccache 2>/dev/null)
# torch is pinned exactly: a range lets pip pull a multi-GB CUDA build.
TORCH  ?= torch==2.13.0
NPROC  ?= 2

LINT   := $(VENV)/.lint-installed
# C++/CUDA sources clang-format owns (the .inc files are C++ fragments included by .cc files).
CSRC    = $(shell find csrc -type f \( -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' -o -name '*.inc' \) | sort)

.PHONY: demo test test-fast durations build deps system clean bench bench-seed lint format lint-deps

demo: build
	$(VENV)/bin/bagua-run --nproc-per-node $(NPROC) examples/train_demo.py --algorithm all
	$(VENV)/bin/bagua-run --nproc-per-node $(NPROC) examples/train_demo_jax.py --algorithm all

test: build
	$(PY) -m pytest -q -ra

test-fast: build
	$(PY) -m pytest -q -ra -m "not slow"

durations: build
	BAGUA_RECORD_DURATIONS=1 $(PY) -m pytest -q -ra

bench: build
	$(PY) benchmarks/collectives.py
	$(PY) benchmarks/train_throughput.py
	@if [ "$$(id -u)" = 0 ]; then \
	  $(PY) benchmarks/bandwidth.py --out-dir bandwidth_results; \
	  $(PY) benchmarks/time_to_accuracy.py --quick --out-dir tta_results; \
	else \
	  echo "benchmarks/bandwidth.py and time_to_accuracy.py skipped: they create network namespaces and tc qdiscs, which needs root: sudo make bench"; \
	fi

# The seed's benchmark at the seed's scale (benchmarks/seed_scale.py; root: it makes network
# namespaces). Horovod 0.28.1 is built from its sdist with a patch (torch >= 2.1 needs C++17).
# QUICK=1: the --quick preset (tiny stand-ins); SEED_ARGS: more flags.
HOROVOD := $(VENV)/.horovod-built
HOROVOD_SRC := build/horovod/horovod-0.28.1

bench-seed: build $(HOROVOD)
	$(PY) benchmarks/seed_scale.py $(if $(QUICK),--quick) --out-dir seed_scale_results $(SEED_ARGS)

$(HOROVOD): benchmarks/horovod-0.28.1-torch2.13.patch | $(DEPS)
	rm -rf build/horovod && mkdir -p build/horovod
	$(PIP) download -q --no-deps --no-binary :all: -d build/horovod horovod==0.28.1
	tar xzf build/horovod/horovod-0.28.1.tar.gz -C build/horovod
	cd $(HOROVOD_SRC) && patch -p1 < ../../../benchmarks/horovod-0.28.1-torch2.13.patch
	$(PIP) install -q --no-deps cloudpickle psutil pyyaml packaging
	HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
	  HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j$(NPROC) $(PIP) install -q --no-build-isolation --no-deps ./$(HOROVOD_SRC)
	touch $@

build: $(BUILT)

$(BUILT): $(DEPS) pyproject.toml CMakeLists.txt $(shell find csrc -type f 2>/dev/null)
	rm -f bagua_core/_C*.so
	$(if $(CCACHE),CCACHE_BASEDIR=$(CURDIR) CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_CUDA_COMPILER_LAUNCHER=ccache) \
	  $(PIP) install -q --no-build-isolation --no-deps -e .
	touch $@

deps: $(DEPS)

$(DEPS): pyproject.toml | system
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "scikit-build-core>=0.10" "pybind11>=2.12" ninja numpy
	$(PIP) install -q "$(TORCH)"
	$(PIP) install -q "jax>=0.6" "optax>=0.2" "flax>=0.10" "matplotlib>=3.7" "pytest>=7" "pytest-timeout>=2"
	$(PIP) install -q "lmdb>=1.4" "redis>=5" "optuna>=3.4"
	$(PIP) install -q "lightning>=2.1,<3" "$(TORCH)"  # torch named too: pip must keep the pinned one
	$(PIP) install -q "transformers>=4.40" "tqdm>=4.60" "$(TORCH)"  # the bench extra (seed_scale's models)
	$(PIP) install -q "torchft==0.2.0" "$(TORCH)"  # the ft extra (live jobs' Lighthouse), bench's torchft peers
	touch $@

# lint checks and changes nothing; format rewrites the tree so that lint passes.
lint: $(LINT)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m mypy  # the public API's modules: [tool.mypy] in pyproject.toml
	@echo "clang-format --dry-run -Werror: $(words $(CSRC)) files under csrc/"
	@$(VENV)/bin/clang-format --dry-run -Werror $(CSRC)

format: $(LINT)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .
	@echo "clang-format -i: $(words $(CSRC)) files under csrc/"
	@$(VENV)/bin/clang-format -i $(CSRC)

lint-deps: $(LINT)

# Only the pinned linters and mypy: make lint needs no build, Gloo or torch.
$(LINT): requirements-lint.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -r requirements-lint.txt
	touch $@

system:
	@if [ ! -f $(GLOO) ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing libgloo-dev"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libgloo-dev; \
	  else \
	    echo "Gloo is missing. Run:  sudo apt-get update && sudo apt-get install -y libgloo-dev"; exit 1; \
	  fi; \
	fi
	@if ! command -v ccache >/dev/null && [ "$$(id -u)" = 0 ]; then \
	  echo "installing ccache (rebuilds of csrc/, and tests/gpu/run.sh --dry-run's, hit its cache)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ccache; \
	fi
	@if ! command -v redis-server >/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing redis-server (the Redis cache tests start it)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; \
	  else \
	    echo "redis-server is missing: its tests skip. Run:  sudo apt-get install -y redis-server"; \
	  fi; \
	fi
	@if [ ! -x /usr/sbin/sshd ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing openssh-server (the baguarun tests start sshd)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server; \
	  else \
	    echo "sshd is missing: the baguarun tests skip. Run:  sudo apt-get install -y openssh-server"; \
	  fi; \
	fi

clean:
	rm -rf build bagua_core/_C*.so $(BUILT)

# The documentation (docs/): Sphinx, warnings as errors, without compiling
# the extension. The pinned doc packages go into .venv once.
DOCS_DEPS := $(VENV)/.docs-installed

.PHONY: docs

docs: $(DOCS_DEPS)
	$(PY) -m sphinx -W --keep-going -q -b html docs docs/_build/html
	@echo "docs/_build/html/index.html"

$(DOCS_DEPS): docs/requirements.txt | $(DEPS)
	$(PIP) install -q -r docs/requirements.txt
	touch $@
