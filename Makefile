# kwatch: the two commands of the README contract, plus helpers.
#   make demo   install dependencies, build, watch the bundled workload
#   make test   install dependencies, build, run every test (ctest)
#   make fuzz   build the libFuzzer targets (clang) and run each for FUZZ_SECONDS (fuzz/)
PRESET ?= default
BUILD  := build/$(PRESET)
JOBS   ?= $(shell nproc)
FUZZ_SECONDS ?= 60

.PHONY: all deps configure build demo test test-asan bench lint format clean fuzz

all: build

deps:
	@./scripts/install-deps.sh

configure: deps
	@cmake --preset $(PRESET) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

demo: build
	@./scripts/demo.sh $(BUILD)

test: build
	@ctest --preset $(PRESET) -j $(JOBS)

test-asan:
	@$(MAKE) --no-print-directory test PRESET=asan

bench: build
	@mkdir -p bench/results
	@for b in $(BUILD)/bench/*_bench; do $$b --benchmark_out=bench/results/$$(basename $$b).json --benchmark_out_format=json || exit 1; done
	@./bench/compare/compare.sh $(BUILD) bench/results
	@./scripts/readme-overhead.sh bench/results/compare.md README.md

fuzz: deps
	@cmake --preset fuzz >/dev/null
	@cmake --build --preset fuzz -j $(JOBS)
	@./fuzz/run.sh build/fuzz $(FUZZ_SECONDS)

lint: configure
	@run-clang-tidy -quiet -p $(BUILD) '^$(CURDIR)/(core|drmgr|watch|cli|gui)/' 

format:
	@find core drmgr watch cli gui tests bench -name '*.h' -o -name '*.cc' | xargs clang-format -i

clean:
	@rm -rf build
