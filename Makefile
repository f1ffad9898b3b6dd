# Thin wrapper over CMake. The README's quick start is two commands:
#   make serve   install dependencies, build, serve models/ on 8001 (gRPC) / 8002 (metrics)
#   make test    install dependencies, build, run the whole test suite (ctest)
BUILD_DIR ?= build/release
JOBS ?= 2
GRPC_PORT ?= 8001
METRICS_PORT ?= 8002
SERVE_ARGS ?=

.PHONY: all deps configure build serve test bench format clean

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

bench: build
	@bash benchmarks/run.sh $(BUILD_DIR)

format:
	@git ls-files '*.cc' '*.h' | xargs clang-format -i

clean:
	rm -rf $(BUILD_DIR)
