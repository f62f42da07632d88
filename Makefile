# kvd — top-level commands. `make test` and `make serve` work on a fresh Debian 12 machine:
# they install missing packages first (scripts/install-deps), then configure and build.

BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=

.PHONY: all deps configure build test test-sanitize bench clean format

all: build

deps:
	@scripts/install-deps

configure: deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS) > /dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# CPU parts only, with AddressSanitizer and UndefinedBehaviorSanitizer; any report fails.
test-sanitize: deps
	@cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVD_SANITIZE=ON \
	  -DKVD_CUDA=OFF $(CMAKE_ARGS) > /dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)
	@cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ctest --output-on-failure -j $(JOBS)

bench: build
	@$(BUILD)/bench/kvd_cpu_bench

format:
	@git ls-files '*.cc' '*.h' '*.cu' '*.cuh' | xargs clang-format -i

clean:
	@rm -rf $(BUILD) $(ASAN_BUILD)
