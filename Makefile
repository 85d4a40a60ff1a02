# The README's two commands: `make quickstart` and `make test`.
BUILD_DIR ?= build
export BUILD_DIR

.PHONY: all deps build test quickstart clean

all: build

deps:
	@tools/install-deps.sh

build: deps
	@tools/build.sh

test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j 2

# The quickstart builds only the three programs it runs (not the tests, fuzz
# replays or the CUDA emulator build); `make test` builds the rest.
QUICKSTART_TARGETS = dgca-coordinator dgca-worker dgca

quickstart: deps
	@tools/build.sh $(QUICKSTART_TARGETS)
	@tools/quickstart.sh

clean:
	rm -rf $(BUILD_DIR)
