# `make quick-test`: set up .venv and run a real GRPO run on the embedded model.
# `make test`: set up .venv and run the test suite (what CI runs).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install bytecode llama-cpp quick-test test test-fast lint bench gpu-bundle gpu-check-dry clean

install: $(STAMP) bytecode

# Byte-compile our own modules: where PYTHONDONTWRITEBYTECODE is set (CI, many containers) Python would otherwise
# recompile them on every start, ~40 ms of `--help`. Up to date files are skipped.
# And the checkout on the venv's import path (a .pth file): the Python API (`from grpo_trainer import GRPOTrainer`)
# imports from any directory with .venv/bin/python, not only from inside the checkout.
bytecode: $(STAMP)
	$(PY) -m compileall -q config rewards grpokit *.py > /dev/null
	$(PY) -c "import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()['purelib'], 'grpo-cli.pth').write_text('$(CURDIR)\n')"

# The pinned set installs with uv (`uv pip install`: parallel downloads and unpacking), bootstrapped into the venv
# with pip (UV_VERSION); .venv/bin/pip stays for users, and pip still builds the llama.cpp engine (below). uv does not
# read pip's configuration, so tools/uv_pip_args.py says pip's package sources to it at install time (a local wheel
# directory with the CPU build of torch, mirrors, a CA: whatever the machine configured for pip) and pip's rule of the
# best version over all of them. --compile-bytecode: pip byte-compiles what it installs, uv only when asked.
UV_VERSION := 0.13.8
UV := $(VENV)/bin/uv
UV_PIP_INSTALL = env $$($(PY) tools/uv_pip_args.py $(UV) pip install) --python $(PY) --quiet

# The llama_cpp generation engine is part of the default install: llama-cpp-python compiled from source (no wheel on
# PyPI for it), built in the background while the rest installs (the compile is CPU-bound, the other installs are
# mostly downloads and unpacking), then installed from the built wheel. pip caches that wheel, so a second venv
# installs it in seconds (BENCHMARKS.md "The default install has the fast engine"). Where it cannot be built (no
# C++ compiler, a failed compile) the install still completes, says so in one line, and runs generate with
# transformers ('auto' falls back, with its reason in the run header); `make llama-cpp` retries and fails loudly.
# - portable: AVX2/FMA/F16C baseline instead of -march=native, so the wheel pip caches runs on every x86-64 machine
#   seen here (GGML_NATIVE=OFF);
# - GGML_OPENMP=OFF: llama.cpp then uses its own thread pool, whose threads sleep between calls; OpenMP's worker
#   threads spin-wait after each parallel region and would fight torch's own threads for the cores during the
#   trainer's forward/backward;
# - only the library the Python binding loads: no tests, examples, server, tools, curl or llava, and no "common"
#   library (llama-cpp.cmake: llama-cpp-python forces it on, nothing here links it): 74 compile units instead of 127
#   (BENCHMARKS.md). Checked and left: GGML_BACKEND_DL is already off (one CPU backend linked in), and
#   GGML_CPU_REPACK=OFF only drops a define (repack.cpp is compiled either way).
# llama.cpp's model converter (convert_hf_to_gguf.py + conversion/ + gguf-py/) ships only in the sdist: it is
# unpacked into $(VENV)/share/llama-cpp-convert, where grpokit/gguf_export.py looks for it.
LLAMA_STAMP := $(VENV)/.llama-cpp
LLAMA_CONVERT := $(VENV)/share/llama-cpp-convert
LLAMA_LOG := $(VENV)/llama-cpp-build.log
LLAMA_WHEELS := $(VENV)/.llama-wheels
LLAMA_VERSION := 0.3.36
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_OPENMP=OFF \
	-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF \
	-DLLAVA_BUILD=OFF -DLLAMA_CURL=OFF \
	-DCMAKE_PROJECT_llama.cpp_INCLUDE=$(CURDIR)/llama-cpp.cmake
LLAMA_BUILD_ENV := CMAKE_BUILD_PARALLEL_LEVEL=$(shell nproc 2>/dev/null || echo 2) CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)"

# The converter out of the sdist, then the engine's stamp (after llama-cpp-python is installed).
define llama_converter
rm -rf $(LLAMA_CONVERT) $(VENV)/.llama-sdist && mkdir -p $(LLAMA_CONVERT) && \
$(PY) -m pip download --quiet --no-binary :all: --no-deps llama-cpp-python==$(LLAMA_VERSION) -d $(VENV)/.llama-sdist && \
tar -xzf $(VENV)/.llama-sdist/llama_cpp_python-$(LLAMA_VERSION).tar.gz -C $(LLAMA_CONVERT) --strip-components=3 \
	llama_cpp_python-$(LLAMA_VERSION)/vendor/llama.cpp/convert_hf_to_gguf.py \
	llama_cpp_python-$(LLAMA_VERSION)/vendor/llama.cpp/conversion \
	llama_cpp_python-$(LLAMA_VERSION)/vendor/llama.cpp/gguf-py && \
rm -rf $(VENV)/.llama-sdist && touch $(LLAMA_STAMP)
endef

$(STAMP): requirements.txt requirements-nodeps.txt requirements-llama.txt llama-cpp.cmake tools/uv_pip_args.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	rm -rf $(LLAMA_WHEELS) $(LLAMA_WHEELS).rc $(LLAMA_STAMP)
	@if command -v $${CXX:-c++} > /dev/null; then \
		echo "llama.cpp engine: building alongside the installs ($(LLAMA_LOG))"; \
		( $(LLAMA_BUILD_ENV) $(PY) -m pip wheel --quiet --no-deps -r requirements-llama.txt -w $(LLAMA_WHEELS) \
			> $(LLAMA_LOG) 2>&1; echo $$? > $(LLAMA_WHEELS).rc ) & \
	else echo "no C++ compiler" > $(LLAMA_WHEELS).rc; fi; \
	{ $(PY) -m pip install --quiet uv==$(UV_VERSION) && \
	$(UV_PIP_INSTALL) --compile-bytecode -r requirements.txt && \
	$(UV_PIP_INSTALL) --compile-bytecode --no-deps -r requirements-nodeps.txt; } || { \
	echo "uv could not install the pinned set (above): installing it with pip"; \
	$(PY) -m pip install --quiet -r requirements.txt && \
	$(PY) -m pip install --quiet --no-deps -r requirements-nodeps.txt; }; status=$$?; wait; exit $$status
	@rc=$$(cat $(LLAMA_WHEELS).rc); \
	if [ "$$rc" = 0 ] && { $(PY) -m pip install --quiet --find-links $(LLAMA_WHEELS) -r requirements-llama.txt && \
		$(llama_converter); } >> $(LLAMA_LOG) 2>&1; then :; \
	elif [ "$$rc" = "no C++ compiler" ]; then \
		echo "llama.cpp engine not built: no C++ compiler; retry: make llama-cpp"; \
	else echo "llama.cpp engine build failed ($(LLAMA_LOG)); retry: make llama-cpp"; fi
	rm -rf $(LLAMA_WHEELS) $(LLAMA_WHEELS).rc
	touch $(STAMP)

# The engine alone (a retry after a failed build): fails loudly. Reuses pip's cached wheel when there is one.
llama-cpp: $(LLAMA_STAMP)

$(LLAMA_STAMP): requirements-llama.txt llama-cpp.cmake | $(STAMP)
	$(LLAMA_BUILD_ENV) $(PY) -m pip install --quiet -r requirements-llama.txt
	$(llama_converter)

quick-test: install
	$(PY) train_grpo.py --quick-test

# The real `triton` package, only for tests/test_unsloth_generated.py: with it `unsloth.models.rl` imports on a CPU and
# generates the GPU trainer classes, which that test runs our training through. Kept out of the venv's site-packages
# (a separate --target put on PYTHONPATH by the test): installed there, TRL's fused LM head would find a Triton with
# no GPU driver and fail (../shared/NOTES.md). ~290 MB download, ~1 GB unpacked.
TRITON_CPU := $(VENV)/triton-cpu
TRITON_VERSION := 3.9.0

$(TRITON_CPU)/.installed: | $(STAMP)
	rm -rf $(TRITON_CPU)
	$(UV_PIP_INSTALL) --compile-bytecode --no-deps --target $(TRITON_CPU) triton==$(TRITON_VERSION) || \
		$(PY) -m pip install --quiet --no-deps --target $(TRITON_CPU) triton==$(TRITON_VERSION)
	touch $@

# The suite in TEST_WORKERS pytest-xdist workers (one thread each: tests/conftest.py), each test file a unit of work,
# handed out in collection order (--no-loadscope-reorder: conftest puts the longest files first; xdist would start
# the files with the most tests), then the few tests that read the machine's load or a sub-second clock, alone.
# `pytest` alone runs everything in one process.
TEST_WORKERS ?= 2
test: install $(LLAMA_STAMP) $(TRITON_CPU)/.installed
	$(PY) -m ruff check .
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not alone"
	$(PY) -m pytest -q -m alone

test-fast: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not slow and not alone"
	$(PY) -m pytest -q -m "alone and not slow"

lint: install
	$(PY) -m ruff check .

bench: install
	$(PY) bench/bench_startup.py

# The GPU check (docs/gpu.md "The GPU check"): the wheels a GPU machine without network lacks, into gpu_bundle/ (ignored), and
# the check's script with its GPU stages replaced by fixtures.
gpu-bundle: install
	$(PY) tools/gpu_bundle.py build

gpu-check-dry: install
	GPU_CHECK_DRY=1 GPU_CHECK_PYTHON=$(PY) OUT=/tmp/gpu_check_dry bash tools/gpu_check.sh

clean:
	rm -rf $(VENV) grpo_outputs
