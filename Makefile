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

quickstart: build
	@tools/quickstart.sh

clean:
	rm -rf $(BUILD_DIR)
