# `make quick-test`: set up .venv and run a real GRPO run on the embedded model.
# `make test`: set up .venv and run the test suite (what CI runs).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install bytecode llama-cpp quick-test test test-fast lint bench clean

install: $(STAMP) bytecode

# Byte-compile our own modules: where PYTHONDONTWRITEBYTECODE is set (CI, many containers) Python would otherwise
# recompile them on every start, ~40 ms of `--help`. Up to date files are skipped.
bytecode: $(STAMP)
	$(PY) -m compileall -q config rewards grpokit *.py > /dev/null

$(STAMP): requirements.txt requirements-nodeps.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -r requirements-nodeps.txt
	touch $(STAMP)

# The llama_cpp generation engine: llama-cpp-python compiled from source (~3.5 min on 2 quiet cores, ~15 min on busy
# ones), so `install` / `quick-test` leave it out and generate with transformers; `generation_engine: auto` picks
# llama_cpp once this has run. `make test` builds it: CI tests that engine.
# - portable: AVX2/FMA/F16C baseline instead of -march=native, so the wheel pip caches runs on every x86-64 machine
#   seen here (GGML_NATIVE=OFF);
# - GGML_OPENMP=OFF: llama.cpp then uses its own thread pool, whose threads sleep between calls; OpenMP's worker
#   threads spin-wait after each parallel region and would fight torch's own threads for the 2 cores during the
#   trainer's forward/backward;
# - no tests, examples, server, tools or curl: only the library the Python binding loads.
# llama.cpp's model converter (convert_hf_to_gguf.py + conversion/ + gguf-py/) ships only in the sdist: it is
# unpacked into $(VENV)/share/llama-cpp-convert, where grpokit/gguf_export.py looks for it.
LLAMA_STAMP := $(VENV)/.llama-cpp
LLAMA_CONVERT := $(VENV)/share/llama-cpp-convert
LLAMA_VERSION := 0.3.36
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_OPENMP=OFF \
	-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF \
	-DLLAVA_BUILD=OFF -DLLAMA_CURL=OFF

llama-cpp: $(LLAMA_STAMP)

$(LLAMA_STAMP): $(STAMP) requirements-llama.txt
	CMAKE_BUILD_PARALLEL_LEVEL=2 CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PY) -m pip install --quiet -r requirements-llama.txt
	rm -rf $(LLAMA_CONVERT) $(VENV)/.llama-sdist && mkdir -p $(LLAMA_CONVERT)
	$(PY) -m pip download --quiet --no-binary :all: --no-deps llama-cpp-python==$(LLAMA_VERSION) -d $(VENV)/.llama-sdist
	tar -xzf $(VENV)/.llama-sdist/llama_cpp_python-$(LLAMA_VERSION).tar.gz -C $(LLAMA_CONVERT) --strip-components=3 \
		llama_cpp_python-$(LLAMA_VERSION)/vendor/llama.cpp/convert_hf_to_gguf.py \
		llama_cpp_python-$(LLAMA_VERSION)/vendor/llama.cpp/conversion \
		llama_cpp_python-$(LLAMA_VERSION)/vendor/llama.cpp/gguf-py
	rm -rf $(VENV)/.llama-sdist
	touch $(LLAMA_STAMP)

quick-test: install
	$(PY) train_grpo.py --quick-test

test: install $(LLAMA_STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -q

test-fast: install
	$(PY) -m pytest -q -m "not slow"

lint: install
	$(PY) -m ruff check .

bench: install
	$(PY) bench/bench_startup.py

clean:
	rm -rf $(VENV) grpo_outputs
