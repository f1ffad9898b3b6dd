# Thin wrapper over CMake. The README's quick start is two commands:
#   make serve   install dependencies, build, serve <build>/models on 8001 (gRPC),
#                8000 (HTTP) and 8002 (metrics)
#   make test    install dependencies, build, run the whole test suite (ctest)
# Sanitizers and fuzzing, each in its own build tree (CMakePresets.json):
#   make test-asan   ASan+UBSan build (build/asan), the C++ unit tests under it
#   make test-asan-ci  the part of test-asan that CI runs
#   make test-tsan   TSan build (build/tsan), the server's threaded unit tests
#   make fuzz        libFuzzer targets with clang (build/fuzz), FUZZ_SECONDS each
# Benchmarks (not part of make test):
#   make bench   the benchmark tables on stdout (benchmarks/run.sh, then
#                Triton's perf_analyzer: benchmarks/e2e/triton_tools_bench.sh)
#   make bench-zoo  the model zoo's full-size models vs ONNX Runtime
#                (benchmarks/models/zoo.py --bench)
#   make venv-peers  ONNX Runtime from PyPI, pinned, in build/release/venv/peers
#   make report  the same machine's speed of light in one Markdown report with
#                PNG plots: benchmarks/report/ (make_report.py, ~10 min)
# numaserve in QEMU guests with several NUMA nodes (tests/numa, TCG, ~15 min):
#   make test-numa   every topology, every check; a summary per topology
#                    (make test runs the short one: ctest numa.guest_short)
# Soak and faults against a real server (benchmarks/e2e/reliability.py):
#   make reliability  10 min soak at 80% capacity, 2x overload, kill -9, corrupt
#                     models under poll, disk full at a checkpoint (~17 min)
BUILD_DIR ?= build/release
JOBS ?= 2
GRPC_PORT ?= 8001
METRICS_PORT ?= 8002
HTTP_PORT ?= 8000
SERVE_ARGS ?=

.PHONY: all deps configure build serve test bench bench-zoo report format format-check tidy function-sizes \
  docs clean test-asan test-asan-ci test-tsan fuzz install reliability test-numa

all: build

deps:
	@bash deploy/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

serve: build
	$(BUILD_DIR)/bin/numaserve serve --model-repository $(BUILD_DIR)/models \
	  --grpc-port $(GRPC_PORT) --metrics-port $(METRICS_PORT) --http-port $(HTTP_PORT) $(SERVE_ARGS)

# The ctest integration.tritonclient runs Triton's tritonclient from
# $(BUILD_DIR)/venv/triton (requirements/triton.txt, from PyPI): made here,
# once (tools/python/venv.sh reuses it while the file is unchanged). Where
# PyPI cannot be reached the test shows as skipped; under CI=true, as
# failed. The same for models.zoo and $(BUILD_DIR)/venv/zoo
# (requirements/zoo.txt: transformers and ONNX Runtime over Debian's
# PyTorch; ~11 s and ~240 MB the first time).
test: build
	@bash tools/python/venv.sh $(BUILD_DIR) triton >/dev/null || \
	  echo "make test: no $(BUILD_DIR)/venv/triton; integration.tritonclient will not run"
	@bash tools/python/venv.sh $(BUILD_DIR) zoo >/dev/null || \
	  echo "make test: no $(BUILD_DIR)/venv/zoo; models.zoo will not run"
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

# tests/numa/run_guests.py: boots a QEMU guest (TCG) per topology of
# tests/numa/topologies.py, this system's root shared read-only, and runs
# tests/numa/guest_checks.py in it against $(BUILD_DIR)'s numaserve: plan,
# binding, page placement, every worker answering, a worker killed, training
# ranks, taskset, --max-workers. NUMA_ARGS: e.g. --topologies four-nodes,
# --short (what ctest's numa.guest_short runs).
NUMA_ARGS ?=
test-numa: build
	@/usr/bin/python3 tests/numa/run_guests.py --build-dir $(BUILD_DIR) $(NUMA_ARGS)

# ASan+UBSan (build/asan): every C++ test except those that start servers
# from Python (label integration) and the ONNX Runtime comparison of the
# benchmark models (label models), and except the tests of the BLIS and
# OpenBLAS GEMM backends: kernels/gemm dlopens those libraries with
# RTLD_DEEPBIND, which the ASan runtime refuses (it aborts the process), and
# "auto" tries them too (and so do process_options_test's two BLAS cases,
# which load BLIS). ShapeCacheTest.ModelStaysBounded* bounds the
# process's RSS growth, which ASan's shadow memory and quarantine inflate.
# Leak checking is on; tests/sanitizers/lsan.supp lists what system
# libraries keep. The replay tests (label fuzz) run the fuzz regressions
# here with UBSan, where reports of undefined behaviour show.
ASAN_DIR ?= build/asan
ASAN_TARGETS ?= all
ASAN_EXCLUDE = blis|openblas|/auto|GemmBackendLibraryTest|GemmBackendCreateTest|GemmAutotuneTest|AutoRemembersItsChoices|ShapeCacheTest.ModelStaysBounded|BlasKernelsAreChosenFromTheCpu|TheBlisArchIsTheOptions
ASAN_CTEST_ARGS ?= -LE 'integration|models|threads16' -E '$(ASAN_EXCLUDE)'
# allow_user_poisoning=0: absl's headers poison a hash table's empty slots
# under ASan, and Debian's libabsl_raw_hash_set.so, built without it, does
# not unpoison what it hands back for an insert: every insert would be a
# use-after-poison report that is not one.
ASAN_ENV = ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:allow_user_poisoning=0 \
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/sanitizers/lsan.supp:print_suppressions=0
test-asan: deps
	@cmake --preset asan -B $(ASAN_DIR) >/dev/null
	@cmake --build $(ASAN_DIR) -j $(JOBS) --target $(ASAN_TARGETS)
	cd $(ASAN_DIR) && $(ASAN_ENV) ctest --output-on-failure -j $(JOBS) $(ASAN_CTEST_ARGS)

# The part of test-asan that CI runs (.ci/run), sized to fit its time: the
# code that reads untrusted bytes and the server's threads. Builds only the
# server, training and fuzz-replay tests and the engine's import tests
# (~15 min of the full build's ~25 on 2 cores) and runs them once, not again
# on the AVX2 tier. Tests of targets not built show up as <target>_NOT_BUILT.
ASAN_CI_TARGETS = tests/serving/all tests/base/all tests/training/all tests/fuzz/all \
  engine_onnx_import_test engine_hostile_model_test engine_model_info_test \
  engine_external_data_test engine_sequence_rewrite_test
test-asan-ci:
	@$(MAKE) --no-print-directory test-asan ASAN_TARGETS='$(ASAN_CI_TARGETS)' \
	  ASAN_CTEST_ARGS="-LE 'integration|models|avx2|threads16|docs|lint' -E '_NOT_BUILT|$(ASAN_EXCLUDE)'"

# TSan (build/tsan): the unit tests of the server's threaded parts
# (batcher, scheduler, model manager, worker supervisor, shared arena,
# framing, statistics, repository), whose threads are plain std::threads.
# Not the kernel, engine or training tests: Debian's libgomp (OpenMP, used by
# the kernels, oneDNN, BLIS and OpenBLAS) is not built with TSan, so its
# barriers are invisible to it and every parallel region reports races that
# are not there. Only these targets are built; tests of the others show up
# as <target>_NOT_BUILT and are left out, as are the Python and replay
# tests. tests/sanitizers/tsan.supp holds reports from uninstrumented
# system libraries. setarch -R (no ASLR, where allowed) keeps GCC 12's TSan
# working on kernels with 32 bits of mmap randomness.
TSAN_DIR ?= build/tsan
TSAN_TARGETS ?= dynamic_batcher_test model_scheduler_test model_manager_test \
  worker_supervisor_test shared_arena_test framing_test model_statistics_test \
  model_repository_test numaserve_fake_worker mutex_test periodic_task_test input_copier_test
TSAN_CTEST_ARGS ?= -E '_NOT_BUILT$$' -LE 'integration|models|fuzz|threads16|docs|lint'
TSAN_ENV = TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$(CURDIR)/tests/sanitizers/tsan.supp
NO_ASLR = $(shell setarch -R true >/dev/null 2>&1 && echo setarch -R)
test-tsan: deps
	@cmake --preset tsan -B $(TSAN_DIR) >/dev/null
	@cmake --build $(TSAN_DIR) -j $(JOBS) --target $(TSAN_TARGETS)
	cd $(TSAN_DIR) && $(TSAN_ENV) $(NO_ASLR) ctest --output-on-failure -j $(JOBS) $(TSAN_CTEST_ARGS)

# libFuzzer: builds the targets of tests/fuzz with clang and runs each for
# FUZZ_SECONDS; fails if any finds a crash (kept in tests/fuzz/regressions/).
FUZZ_DIR ?= build/fuzz
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?=
fuzz: deps
	@cmake --preset fuzz -B $(FUZZ_DIR) >/dev/null
	@cmake --build $(FUZZ_DIR) -j $(JOBS) --target fuzz_targets
	@bash tests/fuzz/run_fuzzers.sh $(FUZZ_DIR) $(FUZZ_SECONDS) $(FUZZ_TARGETS)

# cmake --install: the binary, the systemd unit, the default repository and
# examples in FHS places under PREFIX (default /usr/local); DESTDIR stages.
PREFIX ?=
install: build
	cmake --install $(BUILD_DIR) $(if $(PREFIX),--prefix $(PREFIX))

bench: build
	@bash benchmarks/run.sh $(BUILD_DIR)
	@echo "== Triton's perf_analyzer over gRPC, HTTP binary and HTTP JSON vs grpc_loadgen"
	@bash benchmarks/e2e/triton_tools_bench.sh $(BUILD_DIR)

# The model zoo's full-size models (benchmarks/models/zoo.py --bench):
# numaserve bench against ONNX Runtime at batch 1 and 8, the transformers
# at sequence lengths 16, 128 and 512; one JSON line per model, shape and
# engine. Not part of make bench (tens of minutes for the whole zoo on 2
# cores); ZOO_ARGS narrows it: make bench-zoo ZOO_ARGS='--models resnet50'.
ZOO_ARGS ?=
bench-zoo: build
	@bash tools/python/venv.sh $(BUILD_DIR) zoo >/dev/null
	@$(BUILD_DIR)/venv/zoo/bin/python benchmarks/models/zoo.py --bench \
	  --numaserve $(BUILD_DIR)/bin/numaserve $(ZOO_ARGS)

# The pinned PyPI packages (requirements/NAME.txt, exact versions and
# hashes) in $(BUILD_DIR)/venv/NAME, made from Debian's python3 by
# tools/python/venv.sh; e.g. venv-peers: ONNX Runtime.
venv-%: deps
	@bash tools/python/venv.sh $(BUILD_DIR) $*

# benchmarks/report/README.md, its PNG plots and data.json: throughput per
# batch and per thread (numaserve and ONNX Runtime), served latency CDF,
# throughput per layout (scaleout_bench.sh), roofline (numaserve profile).
# REPORT_ARGS: e.g. --seconds 3, --models mlp,resnet50, --out DIR, --quick.
REPORT_ARGS ?=
report: build
	@/usr/bin/python3 benchmarks/report/make_report.py --build $(BUILD_DIR) $(REPORT_ARGS)

# RELIABILITY_ARGS: e.g. --scenario soak --soak-seconds 3600 --json soak.json
RELIABILITY_ARGS ?=
reliability: build
	@/usr/bin/python3 benchmarks/e2e/reliability.py --binary $(BUILD_DIR)/bin/numaserve \
	  $(RELIABILITY_ARGS)

# The C++ sources: .cc, .h and the kernels' .inc (included once per ISA).
LIST_CXX_SOURCES = git ls-files '*.cc' '*.h' '*.inc'
format:
	@$(LIST_CXX_SOURCES) | xargs clang-format -i

# CI's format check: fails, naming the file and line, where `make format`
# would change anything; then tools/source_checks.py fails on a tracked
# source file over 800 lines (CONTRIBUTING.md, "Sizes") and on a header
# that .clang-tidy's header filters leave out of make tidy.
format-check: deps
	@$(LIST_CXX_SOURCES) | xargs clang-format --dry-run --Werror
	@/usr/bin/python3 tools/source_checks.py
	@echo "format-check: clean"

# clang-tidy (.clang-tidy: bugprone, concurrency, performance, clang's
# thread-safety analysis under -Wthread-safety) on every
# source file outside tests/ and benchmarks/ and the project headers they
# include (.clang-tidy's HeaderFilterRegex), on the release build's
# compile_commands.json (the build first generates the protobuf headers).
# Findings are errors. TIDY_FILES narrows it: make tidy TIDY_FILES=base/log.cc
# A file found clean is not checked again while nothing that decides its
# result changed (tools/tidy_cached.py: clang-tidy's version, .clang-tidy,
# the compile command, the preprocessed file; TIDY_CACHE, default
# ~/.cache/numaserve/tidy).
TIDY_FILES ?= $(shell git ls-files '*.cc' | grep -v '^tests/\|^benchmarks/')
TIDY_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/numaserve/tidy
tidy: build
	@/usr/bin/python3 tools/tidy_cached.py -p $(BUILD_DIR) -j $(JOBS) --cache $(TIDY_CACHE) \
	  --extra-arg=-Wno-unknown-warning-option --extra-arg=-Wthread-safety \
	  $(addprefix $(CURDIR)/,$(TIDY_FILES)) > $(BUILD_DIR)/tidy.log 2>&1 || \
	  { grep -B1 -A3 'error:' $(BUILD_DIR)/tidy.log | head -200; tail -1 $(BUILD_DIR)/tidy.log; \
	  echo "tidy: findings above (full log: $(BUILD_DIR)/tidy.log)"; exit 1; }
	@tail -1 $(BUILD_DIR)/tidy.log

# Functions over 80 lines (clang-tidy's readability-function-size) that do
# not say why. A longer function carries its reason in a comment at its top
# and NOLINTNEXTLINE(readability-function-size) on the line before it.
# `make tidy` enforces it with the other checks (.clang-tidy); this runs the
# one check alone and lists what it finds. TIDY_FILES narrows it.
FUNCTION_SIZE_CONFIG = {Checks: '-*,readability-function-size', CheckOptions: \
  [{key: readability-function-size.LineThreshold, value: 80}]}
function-sizes: build
	@run-clang-tidy -quiet -p $(BUILD_DIR) -j $(JOBS) -config="$(FUNCTION_SIZE_CONFIG)" \
	  -extra-arg=-Wno-unknown-warning-option $(addprefix $(CURDIR)/,$(TIDY_FILES)) \
	  > $(BUILD_DIR)/function-sizes.log 2>&1 || true
	@sed 's/\x1b\[[0-9;]*m//g' $(BUILD_DIR)/function-sizes.log | \
	  grep -A3 'readability-function-size' | grep 'readability-function-size\|note: [0-9]* lines' | \
	  sed -n 's|^$(CURDIR)/||; s/: warning: function \(.*\) exceeds.*/ \1/p; s/.*note: \([0-9]*\) lines.*/  \1 lines/p' | \
	  paste - - | sort -u > $(BUILD_DIR)/function-sizes.txt
	@if [ -s $(BUILD_DIR)/function-sizes.txt ]; then cat $(BUILD_DIR)/function-sizes.txt; \
	  echo "function-sizes: $$(wc -l < $(BUILD_DIR)/function-sizes.txt) function(s) over 80 lines without a reason"; exit 1; \
	else echo "function-sizes: none over 80 lines without a reason ($(words $(TIDY_FILES)) files)"; fi

# The generated parts of docs/ (the operator list in docs/engine.md).
docs: build
	@$(BUILD_DIR)/bin/numaserve_op_docs --update docs/engine.md

clean:
	rm -rf $(BUILD_DIR)
