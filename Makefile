# Mercury's front door. `make demo` and `make test` work on a fresh Debian 12
# machine: each installs what is missing (.ci/setup), builds, and runs.
BUILD      ?= build
FUZZ_BUILD ?= build-fuzz
FUZZ_RUNS  ?= 2000000
FUZZ_SECONDS ?= 90
FUZZ_LONG_RUNS ?= 1000000

.PHONY: all deps build demo ps-demo stack-demo test bench eval eval-quick fuzz fuzz-long format clean

all: build

deps:
	@bash .ci/setup

build: deps
	@[ -f $(BUILD)/build.ninja ] || meson setup $(BUILD) >/dev/null
	@ninja -C $(BUILD)

# The main job: a real model trained through Mercury. A small CNN learns the digits
# set in 4 PyTorch worker processes (mercury.torch) and a ps-server over net_memif;
# per epoch the loss, the test accuracy, the time and the images per second.
demo: build
	@/usr/bin/python3 apps/train-digits/train_digits.py --job config/digits.yaml --build $(BUILD)

# The synthetic job: a ps-server with 2 shards and 4 ps-worker processes over
# net_memif, rounds of push_pull over ResNet-50's tensors, every aggregate checked.
ps-demo: build
	@$(BUILD)/apps/ps-demo --rounds 10

# The network stack alone: two endpoints over a ring link, the rate each second.
stack-demo: build
	@$(BUILD)/apps/stack-demo --seconds 5

# Every unit, PMD, style and fuzz test; ends with "N passed, N failed".
test: build fuzz
	@meson test -C $(BUILD) --no-rebuild --print-errorlogs --num-processes 2 \
	  >$(BUILD)/test-output.txt 2>&1; tail -n 30 $(BUILD)/test-output.txt
	@meson test -C $(FUZZ_BUILD) --no-rebuild --suite fuzz --print-errorlogs \
	  --test-args="-runs=$(FUZZ_RUNS) -max_total_time=$(FUZZ_SECONDS)" >$(FUZZ_BUILD)/test-output.txt 2>&1; \
	  tail -n 5 $(FUZZ_BUILD)/test-output.txt
	@/usr/bin/python3 .ci/summary.py $(BUILD) $(FUZZ_BUILD) >$(BUILD)/test-summary.txt; \
	  status=$$?; cat $(BUILD)/test-summary.txt; exit $$status

# libFuzzer targets, built with clang in their own build directory.
fuzz: deps
	@[ -f $(FUZZ_BUILD)/build.ninja ] || CXX=clang++-14 CC=clang-14 meson setup $(FUZZ_BUILD) \
	  -Dfuzz=true -Dtests=disabled -Dbenchmarks=disabled -Db_sanitize=address,undefined -Db_lundef=false >/dev/null
	@ninja -C $(FUZZ_BUILD) $$(cd $(FUZZ_BUILD) && meson introspect --targets | \
	  /usr/bin/python3 -c 'import json,sys; print(" ".join(t["filename"][0].replace("$(CURDIR)/$(FUZZ_BUILD)/","") for t in json.load(sys.stdin) if t["name"].startswith("fuzz_")))')

# Every fuzz target for FUZZ_LONG_RUNS inputs each (10^6 by default, no time cap; over
# an hour here, most of it fuzz_endpoint): a line per target with the inputs run, the time
# and the corpus size.
fuzz-long: fuzz
	@/usr/bin/python3 .ci/fuzz_long.py $(FUZZ_BUILD) $(FUZZ_LONG_RUNS)

# Both papers' experiments and ResNet-18 against DDP (docs/evaluation.md, about 45 minutes
# here before ResNet-18 was added, plus the build on a fresh clone; the page's setting line
# has the time of its runs): regenerates the page, its plots and its data; resumes an
# interrupted run (records in $(BUILD)/eval).
eval: build
	@/usr/bin/python3 benchmarks/eval/eval.py --build $(BUILD)

# One small point of every experiment, into $(BUILD)/eval-quick (the test eval_quick).
eval-quick: build
	@/usr/bin/python3 benchmarks/eval/eval.py --build $(BUILD) --quick --fresh

bench: build
	@bash benchmarks/run-all

format:
	@git ls-files '*.cpp' '*.h' | xargs clang-format -i

clean:
	rm -rf $(BUILD) $(FUZZ_BUILD)
