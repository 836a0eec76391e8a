# strata's two README commands, from a fresh clone on a fresh Debian 12 machine:
#   make demo   install what is needed, build, record a workload and print what it found
#   make test   install what is needed, build, run every test (unit + root-only BPF tests)
# Both install Debian packages (idempotent, quick when present) and build into build/.

BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo
CTEST_FLAGS ?= --output-on-failure --timeout 900

.PHONY: all deps build install demo test test-unit test-bpf test-asan bench format clean

all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

# PREFIX/bin/strata, PREFIX/share/strata/web (the web UI), PREFIX/lib/systemd/system/strata-*.service.
PREFIX ?= /usr/local
install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

demo: build
	@bash scripts/demo.sh $(BUILD)

test: build
	cd $(BUILD) && ctest $(CTEST_FLAGS)

test-unit: build
	cd $(BUILD) && ctest $(CTEST_FLAGS) -L unit

test-bpf: build
	cd $(BUILD) && ctest $(CTEST_FLAGS) -L bpf

# The unit tests under AddressSanitizer + UndefinedBehaviorSanitizer, in their own build folder.
# Any finding fails the test: UBSan does not recover, ASan halts on the first error and checks leaks.
ASAN_BUILD ?= build-asan
ASAN_OPTIONS_TEST ?= halt_on_error=1:detect_leaks=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=1
UBSAN_OPTIONS_TEST ?= halt_on_error=1:print_stacktrace=1

test-asan: deps
	@test -f $(ASAN_BUILD)/CMakeCache.txt || cmake -S . -B $(ASAN_BUILD) $(CMAKE_FLAGS) -DSTRATA_SANITIZE=address,undefined
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=$(ASAN_OPTIONS_TEST) UBSAN_OPTIONS=$(UBSAN_OPTIONS_TEST) \
	  ctest $(CTEST_FLAGS) -L unit

bench: build
	@bash bench/run-all.sh $(BUILD)

format:
	find bpf abi common agent symbolize store report cli testbed tests bench \
	  \( -name '*.cpp' -o -name '*.h' -o -name '*.c' \) | xargs clang-format -i

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
