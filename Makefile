# Thin wrapper over CMake. The README's quick start is two commands:
#   make serve   install dependencies, build, serve models/ on 8001 (gRPC) / 8002 (metrics)
#   make test    install dependencies, build, run the whole test suite (ctest)
# Sanitizers and fuzzing, each in its own build tree (CMakePresets.json):
#   make test-asan   ASan+UBSan build (build/asan), the C++ unit tests under it
#   make test-tsan   TSan build (build/tsan), the server's threaded unit tests
#   make fuzz        libFuzzer targets with clang (build/fuzz), FUZZ_SECONDS each
BUILD_DIR ?= build/release
JOBS ?= 2
GRPC_PORT ?= 8001
METRICS_PORT ?= 8002
SERVE_ARGS ?=

.PHONY: all deps configure build serve test bench format clean test-asan test-tsan fuzz install

all: build

deps:
	@bash deploy/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

serve: build
	$(BUILD_DIR)/bin/numaserve serve --model-repository models \
	  --grpc-port $(GRPC_PORT) --metrics-port $(METRICS_PORT) $(SERVE_ARGS)

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

# ASan+UBSan: every C++ test except those that start servers from Python
# (label integration: minutes of start-up under ASan, and their own
# process checks) and the ONNX Runtime comparison of the benchmark models
# (label models). The kernel and engine tests also run their AVX2-tier copy
# where the CPU has AVX-512 (other kernels, other code). Leak checking is
# on; tests/sanitizers/lsan.supp lists what the system libraries keep.
ASAN_CTEST_ARGS ?= -LE 'integration|models'
test-asan: deps
	@cmake --preset asan >/dev/null
	@cmake --build --preset asan
	ctest --preset asan -j $(JOBS) $(ASAN_CTEST_ARGS)

# TSan: the unit tests of the server's threaded parts (batcher, scheduler,
# model manager, worker supervisor, shared arena, framing, statistics,
# repository), whose threads are plain std::threads. Not the kernel, engine or training tests:
# Debian's libgomp (OpenMP, used by the kernels, oneDNN, BLIS and OpenBLAS)
# is not built with TSan, so its barriers are invisible to it and every
# parallel region reports races that are not there. Only these targets are
# built. tests/sanitizers/tsan.supp holds the remaining reports from
# uninstrumented system libraries.
TSAN_TARGETS ?= dynamic_batcher_test model_scheduler_test model_manager_test \
  worker_supervisor_test shared_arena_test framing_test model_statistics_test \
  model_repository_test numaserve_fake_worker
# Tests of targets not built show up as <target>_NOT_BUILT: left out, as are
# the Python and replay tests.
TSAN_CTEST_ARGS ?= -E '_NOT_BUILT$$' -LE 'integration|models|fuzz'
test-tsan: deps
	@cmake --preset tsan >/dev/null
	@cmake --build --preset tsan --target $(TSAN_TARGETS)
	setarch -R ctest --preset tsan -j $(JOBS) $(TSAN_CTEST_ARGS)

# libFuzzer: builds the targets of tests/fuzz with clang and runs each for
# FUZZ_SECONDS; fails if any finds a crash (kept in tests/fuzz/regressions/).
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?=
fuzz: deps
	@cmake --preset fuzz >/dev/null
	@cmake --build --preset fuzz --target fuzz_targets
	@bash tests/fuzz/run_fuzzers.sh build/fuzz $(FUZZ_SECONDS) $(FUZZ_TARGETS)

# cmake --install: the binary, the systemd unit, the default repository and
# examples in FHS places under PREFIX (default /usr/local); DESTDIR stages.
PREFIX ?=
install: build
	cmake --install $(BUILD_DIR) $(if $(PREFIX),--prefix $(PREFIX))

bench: build
	@bash benchmarks/run.sh $(BUILD_DIR)

format:
	@git ls-files '*.cc' '*.h' | xargs clang-format -i

clean:
	rm -rf $(BUILD_DIR)
