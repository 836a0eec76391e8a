# strata's two README commands, from a fresh clone on a fresh Debian 12 machine:
#   make demo   install what is needed, build, record a workload and print what it found
#   make test   install what is needed, build, run every test (unit + root-only BPF tests)
# Both install Debian packages (idempotent, quick when present) and build into build/.

BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo
CTEST_FLAGS ?= --output-on-failure --timeout 900

.PHONY: all deps build demo test test-unit test-bpf bench format clean

all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	@bash scripts/demo.sh $(BUILD)

test: build
	cd $(BUILD) && ctest $(CTEST_FLAGS)

test-unit: build
	cd $(BUILD) && ctest $(CTEST_FLAGS) -L unit

test-bpf: build
	cd $(BUILD) && ctest $(CTEST_FLAGS) -L bpf

bench: build
	@bash bench/run-all.sh $(BUILD)

format:
	find bpf abi common agent symbolize store report cli testbed tests bench \
	  \( -name '*.cpp' -o -name '*.h' -o -name '*.c' \) | xargs clang-format -i

clean:
	rm -rf $(BUILD)
