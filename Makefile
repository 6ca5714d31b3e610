# `make quick-test`: set up .venv and run a real GRPO run on the embedded model.
# `make test`: set up .venv and run the test suite (what CI runs).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install bytecode llama-cpp llama-isa quick-test test test-fast lint bench gpu-bundle gpu-check-dry clean

install: $(STAMP) bytecode

# Byte-compile our own modules: where PYTHONDONTWRITEBYTECODE is set (CI, many containers) Python would otherwise
# recompile them on every start, ~40 ms of `--help`. Up to date files are skipped.
# And the checkout on the venv's import path (a .pth file): the Python API (`from grpo_trainer import GRPOTrainer`)
# imports from any directory with .venv/bin/python, not only from inside the checkout.
bytecode: $(STAMP)
	$(PY) -m compileall -q config rewards grpokit *.py > /dev/null
	$(PY) -c "import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()['purelib'], 'grpo-cli.pth').write_text('$(CURDIR)\n')"

# The pinned set installs with uv (`uv pip install`: parallel downloads and unpacking), bootstrapped into the venv
# with pip (UV_VERSION, `bootstrap` below); .venv/bin/pip stays for users, and is the fallback wherever uv fails. uv
# does not read pip's configuration, so tools/uv_pip_args.py says pip's package sources to it at install time (a local
# wheel directory with the CPU build of torch, mirrors, a CA: whatever the machine configured for pip) and pip's rule
# of the best version over all of them. Byte-compiled while the engine compiles: what a run imports, as
# tools/run_imports.txt records it (tools/compile_run_imports.py: ~4,500 of the set's ~16,000 files, 22 CPU-seconds on
# 2 AVX2 cores; importing them to compile them took 38), not everything (51 CPU-seconds taken from that compile: a
# cold `make quick-test` 238 / 234 -> 212 / 200 s); `make test` compiles the rest (BYTECODE_ALL) before its many
# processes start. Where nothing compiles beside it (the engine's wheel was cached), the install compiles everything
# at once, on both cores.
BYTECODE_ALL := $(VENV)/.bytecode-all
compile_all = { $(PY) -m compileall -q -j 0 $$($(PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") \
	> /dev/null; touch $(BYTECODE_ALL); }
UV_VERSION := 0.13.8
UV := $(VENV)/bin/uv
UV_PIP_INSTALL = env $$($(PY) tools/uv_pip_args.py $(UV) pip install) --python $(PY) --quiet

# pip and uv into the venv. The venv is made without pip (`python -m venv` spends 6 s in ensurepip, byte-compiling its
# own old pip, before anything else of a cold install can start): today's pip and uv come from the pip of the Python
# that made it, installing into the venv (`pip --python`, pip >= 22.3): 6 s instead of 9.5 s on 2 cores. Where that
# Python has no such pip, or the venv already has its own: the venv's pip (ensurepip's first where it has none).
define bootstrap
if ! $(PY) -m pip --version > /dev/null 2>&1 && \
	$(PYTHON) -m pip --python $(PY) install --quiet pip uv==$(UV_VERSION) 2> /dev/null; then :; \
else { $(PY) -m pip --version > /dev/null 2>&1 || $(PY) -m ensurepip --upgrade --default-pip > /dev/null; } && \
	$(PY) -m pip install --quiet uv==$(UV_VERSION) || echo "uv could not be installed (above): pip installs instead"; fi
endef

# The llama_cpp generation engine is part of the default install: llama-cpp-python compiled from source (no wheel on
# PyPI for it), built in the background while the rest installs (the compile is CPU-bound, the other installs are
# mostly downloads and unpacking), then installed from the built wheel. The sdist is downloaded once, first thing in
# that background job, into LLAMA_CACHE: the compile and llama.cpp's model converter both come out of that one file.
# Where it cannot be built (no C++ compiler, a failed compile) the install still completes, says so in one line, and
# runs generate with transformers ('auto' falls back, with its reason in the run header); `make llama-cpp` retries
# and fails loudly.
# - built for this machine's instruction class (LLAMA_ISA, from /proc/cpuinfo's flags; `make llama-isa` prints it):
#   avx512bf16 (AVX512 F/CD/VL/DQ/BW + VBMI + VNNI + BF16: Intel Sapphire Rapids and later, AMD Zen 4 and later),
#   avx512 (AVX512 F/CD/VL/DQ/BW), avx2 (AVX2/FMA/F16C/BMI2, the previous portable build), base (none of those).
#   Not -march=native: the same class gives the same wheel on any CPU of that class. On an AMX CPU the avx512bf16
#   build generates 12-21 % faster than the avx2 one from an f16 GGUF, 6-10 % from a bf16 one (a prompt's prefill:
#   26-37 %, 17-18 %) (BENCHMARKS.md "The engine built for the CPU's instructions"). The
#   built wheel is cached in LLAMA_CACHE under the class and a key of the build's options (pip's own wheel cache is
#   keyed by the sdist only: an AVX-512 wheel cached there would die with SIGILL on an AVX2 machine sharing it), so a
#   second venv on any machine of the class installs it in seconds. A library built for instructions the CPU lacks
#   (a venv copied to an older machine) is refused by the run's engine choice (engines.llama_cpp_build_problem).
#   AMX is left off: llama.cpp's AMX kernels, like its "repack" buffers, take quantized weights only (Q4_0, Q8_0,
#   Q4_K, ...), not the f16/bf16 GGUFs the engine runs;
# - libllama (loader, vocabulary, graph builders) at -O1, ggml (the arithmetic) at the release -O3 (llama-cpp.cmake):
#   the compile 196 -> 148 s on 2 cores, generation unchanged; libllama's load-time files in unity batches: its
#   compile 141 -> 118 CPU-seconds; those batches (the graph builders of 157 architectures, load-time code) at -O0
#   and ggml's files for quantized weights and other devices at -O1: the compile 136 -> 124 s on 2 cores (AVX2);
# - GGML_OPENMP=OFF: llama.cpp then uses its own thread pool, whose threads sleep between calls; OpenMP's worker
#   threads spin-wait after each parallel region and would fight torch's own threads for the cores during the
#   trainer's forward/backward;
# - only the library the Python binding loads: no tests, examples, server, tools, curl or llava, and no "common"
#   library (llama-cpp.cmake: llama-cpp-python forces it on, nothing here links it): 74 compile units instead of 127
#   (BENCHMARKS.md). Checked and left: GGML_BACKEND_DL is already off (one CPU backend linked in), and
#   GGML_CPU_REPACK=OFF only drops a define (repack.cpp is compiled either way).
# llama.cpp's model converter (convert_hf_to_gguf.py + conversion/ + gguf-py/) ships only in the sdist: it is
# unpacked into $(VENV)/share/llama-cpp-convert, where grpokit/gguf_export.py looks for it.
CPU_FLAGS ?= $(shell sed -n 's/^flags[[:space:]]*://p' /proc/cpuinfo 2>/dev/null | head -n 1)
has_flags = $(if $(strip $(filter-out $(CPU_FLAGS),$(1))),,yes)
AVX512_FLAGS := avx512f avx512cd avx512vl avx512dq avx512bw
LLAMA_ISA ?= $(if $(call has_flags,$(AVX512_FLAGS) avx512vbmi avx512_vnni avx512_bf16),avx512bf16,$(if \
	$(call has_flags,$(AVX512_FLAGS)),avx512,$(if $(call has_flags,avx avx2 fma f16c bmi2),avx2,base)))
LLAMA_ISA_ARGS_base := -DGGML_AVX=OFF -DGGML_AVX2=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF -DGGML_BMI2=OFF
LLAMA_ISA_ARGS_avx2 := -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
LLAMA_ISA_ARGS_avx512 := $(LLAMA_ISA_ARGS_avx2) -DGGML_AVX512=ON
LLAMA_ISA_ARGS_avx512bf16 := $(LLAMA_ISA_ARGS_avx512) -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON
LLAMA_STAMP := $(VENV)/.llama-cpp
LLAMA_CONVERT := $(VENV)/share/llama-cpp-convert
LLAMA_LOG := $(VENV)/llama-cpp-build.log
LLAMA_VERSION := 0.3.36
LLAMA_OPTIONS := -DGGML_NATIVE=OFF $(LLAMA_ISA_ARGS_$(LLAMA_ISA)) -DGGML_OPENMP=OFF \
	-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF \
	-DLLAVA_BUILD=OFF -DLLAMA_CURL=OFF
LLAMA_CMAKE_ARGS := $(LLAMA_OPTIONS) -DCMAKE_PROJECT_llama.cpp_INCLUDE=$(CURDIR)/llama-cpp.cmake
LLAMA_BUILD_ENV := CMAKE_BUILD_PARALLEL_LEVEL=$(shell nproc 2>/dev/null || echo 2) CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)"
LLAMA_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/grpo-cli/llama-cpp-python-$(LLAMA_VERSION)
LLAMA_SDIST := $(LLAMA_CACHE)/llama_cpp_python-$(LLAMA_VERSION).tar.gz
LLAMA_KEY := $(shell { echo '$(LLAMA_OPTIONS)'; cat llama-cpp.cmake; } | cksum | cut -d' ' -f1)
LLAMA_WHEELS := $(LLAMA_CACHE)/$(LLAMA_ISA)-$(LLAMA_KEY)
LLAMA_WHEEL := $(LLAMA_WHEELS)/llama_cpp_python-$(LLAMA_VERSION)-*.whl

# The sdist (downloaded once), then the wheel for this class out of it unless cached: built into a private directory
# and moved in whole, so a concurrent install never sees half a wheel. Both with uv where the install bootstrapped it,
# else with pip: tools/fetch_sdist.py takes the sdist's URL and sha256 from `uv pip compile` (1.4 s against `pip
# download`'s 10.3 s, which builds the package's metadata in a throwaway environment first), and `uv build` sets up
# the build environment in 4 s where `pip wheel` takes 12 s before the compile starts (AVX2 machine, cold caches).
# pip's fallbacks: --no-cache-dir: not into pip's wheel cache; --no-binary names the package alone: ':all:' would also
# build the sdist's build requirements (scikit-build-core, hatchling, ...) from source for pip's metadata step, 86 s
# of a 96 s download.
define llama_wheel
mkdir -p $(LLAMA_CACHE) && { test -f $(LLAMA_SDIST) || $(PY) tools/fetch_sdist.py $(UV) llama-cpp-python==$(LLAMA_VERSION) \
	$(LLAMA_SDIST) || { \
	$(PY) -m pip download --quiet --no-binary llama-cpp-python --no-deps llama-cpp-python==$(LLAMA_VERSION) -d $(LLAMA_SDIST).d$$$$ && \
	mv $(LLAMA_SDIST).d$$$$/llama_cpp_python-$(LLAMA_VERSION).tar.gz $(LLAMA_SDIST) && rm -rf $(LLAMA_SDIST).d$$$$; }; } && \
{ $(llama_converter) & } && converter=$$! && \
{ test -n "$$(ls $(LLAMA_WHEELS)/*.whl 2> /dev/null)" || { \
	{ { test -x $(UV) && $(LLAMA_BUILD_ENV) env $$($(PY) tools/uv_pip_args.py $(UV) build) --quiet --wheel \
		--python $(PY) -o $(LLAMA_WHEELS).d$$$$ $(LLAMA_SDIST); } || { rm -rf $(LLAMA_WHEELS).d$$$$ && \
	$(LLAMA_BUILD_ENV) $(PY) -m pip wheel --quiet --no-deps --no-cache-dir $(LLAMA_SDIST) -w $(LLAMA_WHEELS).d$$$$; }; } && \
	mkdir -p $(LLAMA_WHEELS) && mv $(LLAMA_WHEELS).d$$$$/*.whl $(LLAMA_WHEELS)/ && rm -rf $(LLAMA_WHEELS).d$$$$; }; } && \
wait $$converter
endef

# llama.cpp's model converter out of the sdist, unpacked beside the compile (1.5 s of gzip, which used to sit between
# the compile and the run) into a private directory moved in whole.
define llama_converter
rm -rf $(LLAMA_CONVERT).d$$$$ && mkdir -p $(LLAMA_CONVERT).d$$$$ && \
tar -xzf $(LLAMA_SDIST) -C $(LLAMA_CONVERT).d$$$$ --strip-components=3 \
	llama_cpp_python-$(LLAMA_VERSION)/vendor/llama.cpp/convert_hf_to_gguf.py \
	llama_cpp_python-$(LLAMA_VERSION)/vendor/llama.cpp/conversion \
	llama_cpp_python-$(LLAMA_VERSION)/vendor/llama.cpp/gguf-py && \
rm -rf $(LLAMA_CONVERT) && mv $(LLAMA_CONVERT).d$$$$ $(LLAMA_CONVERT)
endef

# The engine from the cached wheel (replacing any other build of the same version) with its requirements, then the
# engine's stamp. With uv where the install bootstrapped it (one call, ~1 s after the compile), else with pip.
define llama_install
{ { test -x $(UV) && $(UV_PIP_INSTALL) --reinstall-package llama-cpp-python $(LLAMA_WHEEL) -r requirements-llama.txt; } || \
	{ $(PY) -m pip install --quiet --no-deps --force-reinstall $(LLAMA_WHEEL) && \
	$(PY) -m pip install --quiet -r requirements-llama.txt; }; } && \
echo $(LLAMA_ISA)-$(LLAMA_KEY) > $(LLAMA_STAMP)
endef

$(STAMP): requirements.txt requirements-nodeps.txt requirements-llama.txt llama-cpp.cmake tools/uv_pip_args.py \
	tools/fetch_sdist.py
	test -x $(PY) || $(PYTHON) -m venv --without-pip $(VENV)
	rm -f $(VENV)/.llama-wheel.rc $(LLAMA_STAMP) $(BYTECODE_ALL)
	@# uv before the engine's background job: it fetches the engine's sdist and builds its wheel (llama_wheel)
	@echo "pip and uv into $(VENV)"; $(bootstrap)
	@if command -v $${CXX:-c++} > /dev/null; then \
		echo "llama.cpp engine ($(LLAMA_ISA) build): building alongside the installs ($(LLAMA_LOG))"; \
		( { $(llama_wheel); } > $(LLAMA_LOG) 2>&1; echo $$? > $(VENV)/.llama-wheel.rc ) & \
	else echo "no C++ compiler" > $(VENV)/.llama-wheel.rc; fi; \
	{ test -x $(UV) && $(UV_PIP_INSTALL) -r requirements.txt && \
	$(UV_PIP_INSTALL) --no-deps -r requirements-nodeps.txt; } || { \
	echo "uv could not install the pinned set (above): installing it with pip"; \
	$(PY) -m pip install --quiet -r requirements.txt && \
	$(PY) -m pip install --quiet --no-deps -r requirements-nodeps.txt; }; status=$$?; \
	if [ $$status = 0 ]; then if [ -f $(VENV)/.llama-wheel.rc ]; then $(compile_all); \
		else $(PY) tools/compile_run_imports.py > /dev/null 2>&1; fi; \
		test -x $(UV) && $(UV_PIP_INSTALL) --upgrade pip; fi; wait; exit $$status
	@# pip upgraded by pip last, not first: where uv is missing the engine's sdist and wheel come from the venv's own
	@# pip, which must not change under the build; uv upgrades it (where the bootstrap did not bring today's) beside it
	@test -x $(UV) || $(PY) -m pip install --quiet --upgrade pip
	@rc=$$(cat $(VENV)/.llama-wheel.rc); \
	if [ "$$rc" = 0 ] && { $(llama_install); } >> $(LLAMA_LOG) 2>&1; then :; \
	elif [ "$$rc" = "no C++ compiler" ]; then \
		echo "llama.cpp engine not built: no C++ compiler; retry: make llama-cpp"; \
	else echo "llama.cpp engine build failed ($(LLAMA_LOG)); retry: make llama-cpp"; fi
	rm -f $(VENV)/.llama-wheel.rc
	touch $(STAMP)

# The engine alone (a retry after a failed build, or a venv moved to a CPU of another class): fails loudly. Reuses
# the cached wheel when there is one. The stamp holds the class and build key it was installed for: another one here
# (this Makefile's options changed, another CPU) rebuilds it.
llama-cpp: | $(STAMP)
	@test "$$(cat $(LLAMA_STAMP) 2> /dev/null)" = "$(LLAMA_ISA)-$(LLAMA_KEY)" || { \
		echo "llama.cpp engine: $(LLAMA_ISA) build ($(LLAMA_WHEELS))"; $(llama_wheel) && $(llama_install); }

# What `make` builds the engine for on this machine (CPU_FLAGS="..." to ask for another CPU's flags).
llama-isa:
	@echo "$(LLAMA_ISA) $(LLAMA_ISA_ARGS_$(LLAMA_ISA))"

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
$(BYTECODE_ALL): | $(STAMP)
	$(compile_all)

test: install llama-cpp $(TRITON_CPU)/.installed $(BYTECODE_ALL)
	$(PY) -m ruff check .
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not alone"
	$(PY) -m pytest -q -m alone

test-fast: install $(BYTECODE_ALL)
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
