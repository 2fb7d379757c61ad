# The two commands: `make run` (the main job) and `make test` (every test).
# Both install what is missing, configure and build first.

BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
CMAKE_ARGS ?=

# Debian 12 packages the build needs. `make deps` installs only the missing ones.
DEB_PACKAGES := build-essential cmake ninja-build pkg-config ccache \
  protobuf-compiler protobuf-compiler-grpc libprotobuf-dev libgrpc++-dev libabsl-dev \
  libgoogle-glog-dev libgflags-dev libgtest-dev libgmock-dev libbenchmark-dev \
  libopenblas-dev libgloo-dev nlohmann-json3-dev libpcre2-dev libxxhash-dev

# tests/deploy/check_manifests.py (the deployment manifests checked against the binaries).
DEB_PACKAGES += python3-yaml

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all deps configure build test run bench format clean

all: build

deps:
	@missing=$$(for p in $(DEB_PACKAGES); do \
	    dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; \
	  done); \
	if [ -n "$$missing" ]; then \
	  echo "deps: installing" $$missing; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	else \
	  echo "deps: all $(words $(DEB_PACKAGES)) packages present"; \
	fi

$(BUILD_DIR)/build.ninja:
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_ARGS)

configure: deps $(BUILD_DIR)/build.ninja

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

# The main job: the whole engine in one process (tokenizer, scheduler, CPU worker) streams
# text from the demo model; then the block manager's walk-through and its benchmark. (The
# distributed cluster replaces the first part when it exists.)
run: build
	$(BUILD_DIR)/tools/llm-generate --model=models/fortune-llama \
	  --prompt="Once upon a time" --max-tokens=96
	$(BUILD_DIR)/tools/llm-generate --model=models/fortune-llama \
	  --prompt="The best programmers" --max-tokens=48 --n=3 --seed=7
	$(BUILD_DIR)/tools/llm-block-demo
	$(BUILD_DIR)/bench/bench_block_manager --benchmark_min_time=0.2

bench: build
	@for b in $(BUILD_DIR)/bench/bench_*; do echo "== $$b"; $$b; done

format:
	@git ls-files '*.h' '*.cc' '*.cu' '*.cuh' | xargs clang-format -i

clean:
	rm -rf $(BUILD_DIR)
