# tests/fuzz/fuzz.mk - libFuzzer harnesses with AddressSanitizer and UBSan
# (included by the Makefile).  clang and its libFuzzer runtime come from
# Debian (clang-N, libclang-rt-N-dev, N >= 15); `make deps` installs them.
#   make fuzz FUZZ_S=N      run every harness N seconds (default 60)
#   make fuzz FUZZ=gguf     only some harnesses
#   make fuzz FUZZ_RUNS=N   stop each harness after N executions (or FUZZ_S)
#   make fuzz-build         harnesses, fixtures and seed corpora in build/fuzz
# Objects are built with -fsanitize=fuzzer-no-link so the library's code is
# instrumented for coverage; the CUDA backend is not part of these builds.

# clang 15 or later: the CPU backend uses _Float16, which clang 14 lacks on x86.
FUZZ_CC   ?= $(firstword $(foreach v,19 18 17 16 15,$(shell command -v clang-$(v) 2>/dev/null)))
FUZZ_B    := build/fuzz
FUZZ_SAN  := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_CFLAGS = $(CSTD) $(WARN) -Wno-unknown-attributes -O1 -g -march=native $(FUZZ_SAN) -fsanitize=fuzzer-no-link -MMD -MP \
              -Ilib/include -Isrc $(shell pkg-config --cflags $(PKGS) 2>/dev/null) -DCB_LIBDIR='"$(LIBDIR)"'
FUZZ_LIBOBJ := $(LIB_SRC:%.c=$(FUZZ_B)/%.o) $(FUZZ_B)/src/cli.o
# one harness per fuzz_*.c; records_*.c are parts of fuzz_records
FUZZ_NAMES := $(patsubst tests/fuzz/fuzz_%.c,%,$(sort $(wildcard tests/fuzz/fuzz_*.c)))
FUZZ_BINS  := $(FUZZ_NAMES:%=$(FUZZ_B)/fuzz_%)
FUZZ_SEEDS := $(FUZZ_B)/seeds/.stamp
FUZZ_S     ?= 60
FUZZ_RUNS  ?=
FUZZ       ?= $(FUZZ_NAMES)

.PHONY: fuzz fuzz-build fuzz-cc

fuzz-cc:
	@[ -n "$(FUZZ_CC)" ] || { echo "make fuzz: no clang 15 or later (make deps installs clang-16 and libclang-rt-16-dev)" >&2; exit 69; }

# the CPU's kernel files, each with its ISA's flags (the Makefile's ISA_FLAGS_*)
$(foreach f,$(ISA_FILES),$(eval $(FUZZ_B)/lib/backend/$(f).o: FUZZ_CFLAGS += $(ISA_FLAGS_$(f))))

$(FUZZ_B)/%.o: %.c | fuzz-cc
	@mkdir -p $(dir $@)
	@[ "$(Q)" = "" ] || echo "  FUZZCC  $<"
	$(Q)$(FUZZ_CC) $(FUZZ_CFLAGS) -c -o $@ $<

$(FUZZ_B)/fuzz_records: $(FUZZ_B)/tests/fuzz/records_run.o $(FUZZ_B)/tests/fuzz/records_pre.o \
    $(FUZZ_B)/tests/fuzz/records_batch.o
$(FUZZ_B)/fuzz_%: $(FUZZ_B)/tests/fuzz/fuzz_%.o $(FUZZ_LIBOBJ)
	@mkdir -p $(dir $@)
	@[ "$(Q)" = "" ] || echo "  FUZZLD  $@"
	$(Q)$(FUZZ_CC) $(FUZZ_SAN) -fsanitize=fuzzer -o $@ $(filter %.o,$^) $(LDLIBS)

# Fixtures and seed corpora, from our own generator and programs.
$(FUZZ_SEEDS): tests/fuzz/seeds.sh $(GEN_BIN) $(PROG_BIN)
	@rm -rf $(FUZZ_B)/data $(FUZZ_B)/seeds
	$(Q)sh tests/fuzz/seeds.sh $(FUZZ_B) $(BINDIR_B) $(GEN_BIN)
	@touch $@

fuzz-build: $(FUZZ_BINS) $(FUZZ_SEEDS) ## build the libFuzzer harnesses and their seed corpora (needs clang)

fuzz: ## run each libFuzzer harness FUZZ_S seconds (default 60; FUZZ="gguf kvfile" picks some)
	@sh scripts/deps.sh
	@$(MAKE) --no-print-directory all $(GEN_BIN)
	@$(MAKE) --no-print-directory fuzz-build
	@FUZZ_RUNS=$(FUZZ_RUNS) sh tests/fuzz/run.sh $(FUZZ_B) $(FUZZ_S) $(FUZZ)

# Line coverage of the code each harness targets: the harnesses built again
# with clang's source-based coverage (no sanitizers) into build/fuzz-cov,
# each replaying its corpus once (-runs=0), then llvm-profdata/llvm-cov of
# the same version as clang report per source file (tests/fuzz/cov.sh).
#   make fuzz-cov                         corpus: build/fuzz/corpus + seeds
#   make fuzz-cov FUZZ_CORPUS=DIR         DIR/NAME per harness, + seeds
FUZZ_COVB   := build/fuzz-cov
FUZZ_COVFL   = $(filter-out $(FUZZ_SAN) -fsanitize=fuzzer-no-link,$(FUZZ_CFLAGS)) -fprofile-instr-generate -fcoverage-mapping
FUZZ_COVOBJ := $(LIB_SRC:%.c=$(FUZZ_COVB)/%.o) $(FUZZ_COVB)/src/cli.o
FUZZ_COVBIN := $(FUZZ_NAMES:%=$(FUZZ_COVB)/fuzz_%)
FUZZ_CORPUS ?= $(FUZZ_B)/corpus

.PHONY: fuzz-cov

$(foreach f,$(ISA_FILES),$(eval $(FUZZ_COVB)/lib/backend/$(f).o: FUZZ_CFLAGS += $(ISA_FLAGS_$(f))))

$(FUZZ_COVB)/%.o: %.c | fuzz-cc
	@mkdir -p $(dir $@)
	@[ "$(Q)" = "" ] || echo "  COVCC   $<"
	$(Q)$(FUZZ_CC) $(FUZZ_COVFL) -c -o $@ $<

$(FUZZ_COVB)/fuzz_records: $(FUZZ_COVB)/tests/fuzz/records_run.o $(FUZZ_COVB)/tests/fuzz/records_pre.o
$(FUZZ_COVB)/fuzz_%: $(FUZZ_COVB)/tests/fuzz/fuzz_%.o $(FUZZ_COVOBJ)
	@[ "$(Q)" = "" ] || echo "  COVLD   $@"
	$(Q)$(FUZZ_CC) -fsanitize=fuzzer -fprofile-instr-generate -o $@ $(filter %.o,$^) $(LDLIBS)

fuzz-cov: $(FUZZ_COVBIN) $(FUZZ_SEEDS) ## line coverage per harness of the code it targets, from its corpus (needs clang, llvm)
	@FUZZ_CC=$(FUZZ_CC) sh tests/fuzz/cov.sh $(FUZZ_COVB) $(FUZZ_B) $(FUZZ_CORPUS) $(FUZZ)
