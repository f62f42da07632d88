# kvd — top-level commands. `make test` and `make serve` work on a fresh Debian 12 machine:
# they install missing packages first (scripts/install-deps; the tests add `--test`: Python's
# grpcio and Prometheus, which only they run), then configure and build.

BUILD      ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?=
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=

.PHONY: all deps test-deps configure build test test-sanitize fuzz bench serve clean format

all: build

deps:
	@scripts/install-deps

# After deps, so a fresh machine never runs two apt-gets at once under make -j.
test-deps: deps
	@scripts/install-deps --test

configure: deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS) > /dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

test: test-deps build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# CPU parts only, with AddressSanitizer and UndefinedBehaviorSanitizer; any report fails.
test-sanitize: test-deps
	@cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVD_SANITIZE=ON \
	  -DKVD_CUDA=OFF $(CMAKE_ARGS) > /dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)
	@cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ctest --output-on-failure -j $(JOBS)

# libFuzzer over tests/fuzz/'s targets (scripts/fuzz), built with clang, ASan and UBSan in
# build-fuzz/: FUZZ_SECONDS each (default 60), all targets or those in FUZZ_TARGETS. Not part
# of `make test`, which replays their corpus (tests/fuzz/corpus/) on every run instead.
fuzz:
	@scripts/install-deps --fuzz
	@CC=clang CXX=clang++ cmake -S . -B $(FUZZ_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DKVD_FUZZ=ON -DKVD_CUDA=OFF $(CMAKE_ARGS) > /dev/null
	@cmake --build $(FUZZ_BUILD) --target kvd_fuzz_targets -j $(JOBS)
	@scripts/fuzz $(FUZZ_BUILD) $(FUZZ_SECONDS) $(FUZZ_TARGETS)

# The CPU engine benchmark on stories260K, found or downloaded as `make serve` does.
bench: build
	@model="$$(scripts/fetch-model)" && $(BUILD)/bench/kvd_cpu_bench --model "$$model"

# Runs the daemon on stories260K with the CPU backend (config/serve.yaml): installs missing
# packages, builds kvd, finds or downloads the model (scripts/fetch-model), then serves in the
# foreground until Ctrl-C: kvd drains and exits 0, but make, interrupted by the same Ctrl-C,
# then exits 130. It listens where SERVE_CONFIG says
# (config/serve.yaml: gRPC 127.0.0.1:50051, metrics 127.0.0.1:50052); GRPC_ADDRESS or
# METRICS_ADDRESS, given on the make command line or in the environment, override that
# (METRICS_ADDRESS= turns metrics off). The model is passed with --model, which wins over
# SERVE_CONFIG's model.path: stories260K, or SERVE_MODEL (a checkpoint path or synthetic:<preset>).
SERVE_CONFIG ?= config/serve.yaml
# $(call given,VAR): non-empty when VAR came from the command line or the environment, even
# when empty; a default would hide the config file's address.
given = $(filter command line environment,$(origin $(1)))
SERVE_ADDRESS_FLAGS = $(strip \
  $(if $(call given,GRPC_ADDRESS),--grpc-address "$(GRPC_ADDRESS)") \
  $(if $(call given,METRICS_ADDRESS),--metrics-address "$(METRICS_ADDRESS)"))

serve: configure
	@cmake --build $(BUILD) --target kvd -j $(JOBS)
	@model="$(or $(SERVE_MODEL),$$(scripts/fetch-model))" && \
	  echo "make serve: from another terminal, try: $(BUILD)/server/kvd client" \
	    "--address <the address after 'serving gRPC on' below> --prompt 'Once upon a time'" \
	    "(a synthetic model has no tokenizer: --prompt-token-ids 1,50,60)" && \
	  exec $(BUILD)/server/kvd serve --config "$(SERVE_CONFIG)" --model "$$model" $(SERVE_ADDRESS_FLAGS)

format:
	@scripts/install-deps --format
	@git ls-files '*.cc' '*.h' '*.cu' '*.cuh' | xargs clang-format -i

clean:
	@rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
