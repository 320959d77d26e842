# kwatch: the two commands of the README contract, plus helpers.
#   make demo   install dependencies, build, watch the bundled workload
#   make test   install dependencies, build, run every test (ctest)
#   make fuzz   build the libFuzzer targets (clang) and run each for FUZZ_SECONDS (fuzz/)
#   make install   build, then install under PREFIX (default /usr/local; DESTDIR stages)
#   make package   build, then the .deb (CPack) in $(BUILD)
PRESET ?= default
BUILD  := build/$(PRESET)
JOBS   ?= $(shell nproc)
FUZZ_SECONDS ?= 60
PREFIX ?= /usr/local

.PHONY: all deps configure build demo test test-asan bench lint format format-check shellcheck clean fuzz install package

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

# bin/kwatch, bin/kwatch-gui, lib/kwatch/libkwatch-agent.so, man pages, completions and the
# desktop entry (packaging/CMakeLists.txt). DESTDIR, when set, is honoured by cmake --install.
install: build
	@cmake --install $(BUILD) --prefix $(PREFIX)

# kwatch_VERSION_amd64.deb in $(BUILD), its Depends from dpkg-shlibdeps.
package: build
	@cd $(BUILD) && cpack -G DEB

# The libraries' tests under ASan + UBSan (core, drmgr, watch, agent: the asan presets). The
# command tests (tests/cli) start kwatch hundreds of times: under ASan each start costs seconds
# and their deadlines fail for that alone; they run in `make test`.
ASAN_TESTS = kwatch_core_test kwatch_drmgr_test kwatch_watch_test kwatch_agent_test
test-asan: deps
	@cmake --preset asan >/dev/null
	@cmake --build build/asan -j $(JOBS) --target $(ASAN_TESTS)
	@ctest --preset asan -j $(JOBS)

bench: build
	@mkdir -p bench/results
	@for b in $(BUILD)/bench/*_bench; do $$b --benchmark_out=bench/results/$$(basename $$b).json --benchmark_out_format=json || exit 1; done
	@./bench/compare/compare.sh $(BUILD) bench/results
	@./scripts/readme-overhead.sh bench/results/compare.md README.md

fuzz: deps
	@cmake --preset fuzz >/dev/null
	@cmake --build --preset fuzz -j $(JOBS)
	@./fuzz/run.sh build/fuzz $(FUZZ_SECONDS)

# clang-tidy (.clang-tidy, every warning an error) over agent/ core/ drmgr/ watch/ cli/ gui/ and
# their headers, $(JOBS) at a time; fails on any finding. Units found clean are remembered by
# content in scripts/lint-clean.txt (commit it: CI checks only what changed since).
lint: configure
	@./scripts/lint.py $(BUILD) -j $(JOBS)

SOURCES = $(shell find agent core drmgr watch cli gui version tests bench fuzz \( -name '*.h' -o -name '*.cc' \) -not -path '*/build/*')
SCRIPTS = $(wildcard scripts/*.sh bench/compare/*.sh fuzz/*.sh tests/packaging/*.sh) .ci/run

format:
	@clang-format -i $(SOURCES)

# Every C++ file as .clang-format says (STYLE 6); fails listing the files that are not.
format-check: deps
	@bad=0; for f in $(SOURCES); do clang-format --dry-run --Werror "$$f" >/dev/null 2>&1 || { echo "format-check: $$f (make format)"; bad=1; }; done; \
	  [ $$bad -eq 0 ] && echo "format-check: $(words $(SOURCES)) files ok"

shellcheck: deps
	@shellcheck $(SCRIPTS) && echo "shellcheck: $(words $(SCRIPTS)) scripts ok"

clean:
	@rm -rf build
