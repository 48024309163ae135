# cacheblend - one non-recursive GNU Makefile.
#   make            build lib/libcbcore.{a,so} and the programs into bin/
#   make help       list the targets and knobs
# Knobs: DEBUG=1 (no optimisation, -g), SAN=1 (AddressSanitizer + UBSan),
#        NATIVE=0 (no -march=native: binaries for any x86-64, under
#        build/rel-generic/; the CPU backend still picks its AVX2 kernels at
#        run time when the CPU has them),
#        CUDA=0 (skip the CUDA backend) / CUDA=1 (require it; default: built
#        when nvcc is found), PREFIX=/usr/local DESTDIR= for install, V=1,
#        MODEL=qwen1.5b|qwen0.5b|smollm2|gemma (the real model of model, demo,
#        bench, parity, eval; default: the programs' default, qwen1.5b).

.DEFAULT_GOAL := all

PREFIX  ?= /usr/local
BINDIR  ?= $(PREFIX)/bin
LIBDIR  ?= $(PREFIX)/lib
INCDIR  ?= $(PREFIX)/include
MANDIR  ?= $(PREFIX)/share/man
PKGDIR  ?= $(LIBDIR)/pkgconfig

CC      ?= cc
# -ffp-contract=off: a*b + c rounded twice, as C11 asks (gcc's default in
# this mode; clang's is to fuse): the bits every backend and kernel is
# checked against (dequant.h's formulas on the CPU and on the device)
CSTD    := -std=c11 -D_GNU_SOURCE -ffp-contract=off
WARN    := -Wall -Wextra -Wshadow -Wno-unused-parameter -Werror=implicit-function-declaration
ifeq ($(NATIVE),0)
OPT     := -O2
else
OPT     := -O2 -march=native
endif
ifeq ($(DEBUG),1)
OPT     := -O0 -g3
endif
ifeq ($(SAN),1)
OPT     += -g -fsanitize=address,undefined,float-cast-overflow -fno-omit-frame-pointer -fno-sanitize-recover=undefined,float-cast-overflow
LDSAN   := -fsanitize=address,undefined,float-cast-overflow
BUILD   ?= build/san
else
BUILD   ?= build/rel
endif
ifeq ($(DEBUG),1)
BUILD   := $(BUILD)-debug
endif
ifeq ($(NATIVE),0)
BUILD   := $(BUILD)-generic
endif

# MODEL=...: the real-model targets (model, demo, bench, parity, eval) use
# that model, through $CB_MODEL, which every program and script reads;
# default: the programs' default model, Qwen2.5-Coder-1.5B-Instruct.
MODELS := qwen1.5b qwen0.5b smollm2 gemma
ifneq ($(MODEL),)
MODEL_FILE := $(or $(if $(filter qwen1.5b,$(MODEL)),qwen2.5-coder-1.5b-instruct-q4_k_m.gguf),$(if $(filter qwen0.5b,$(MODEL)),qwen2.5-coder-0.5b-instruct-q4_k_m.gguf),$(if $(filter smollm2,$(MODEL)),SmolLM2-135M-Instruct.Q4_1.gguf),$(if $(filter gemma,$(MODEL)),gemma-3-270m-q4_k_m.gguf),$(error MODEL=$(MODEL): one of $(MODELS)))
export CB_MODEL := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/cacheblend/models/$(MODEL_FILE)
endif

# The release, written once: CB_VERSION_STRING in the public header.
VERSION := $(shell sed -n 's/^\#define CB_VERSION_STRING "\(.*\)"$$/\1/p' lib/include/cbcore.h)

PKGS    := libpcre2-8 openblas jansson libxxhash libarchive sqlite3 hiredis libcrypto libzstd
CFLAGS  ?=
CFLAGS  += $(CSTD) $(WARN) $(OPT) -fPIC -MMD -MP -Ilib/include $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
CFLAGS  += -DCB_LIBDIR='"$(LIBDIR)"'
# OpenBLAS is not linked: lib/backend/blas.c loads it when a product first
# needs it (its constructor would start a thread a core in every program).
LDLIBS  := $(shell pkg-config --libs $(filter-out openblas,$(PKGS)) 2>/dev/null || echo -lpcre2-8 -ljansson -lxxhash -larchive -lsqlite3 -lhiredis -lcrypto -lzstd) -lm -lpthread -ldl
BLAS_LIBS := $(shell pkg-config --libs openblas 2>/dev/null || echo -lopenblas)
LDFLAGS += $(LDSAN)

ifeq ($(V),1)
Q :=
else
Q := @
endif

LIB_SRC  := $(sort $(wildcard lib/core/*.c lib/infer/*.c lib/kv/*.c lib/store/*.c lib/backend/*.c lib/prompt/*.c))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
CLI_OBJ  := $(BUILD)/src/cli.o
PROGS    := $(patsubst src/%.c,%,$(sort $(wildcard src/cb-*.c)))
PROG_BIN := $(PROGS:%=bin/%)
# Artifacts land in lib/ and bin/ for the plain build; SAN/DEBUG builds keep
# theirs under $(BUILD) so they never mix with the release objects.
ifeq ($(BUILD),build/rel)
LIBA     := lib/libcbcore.a
LIBSO    := lib/libcbcore.so
BINDIR_B := bin
else
LIBA     := $(BUILD)/lib/libcbcore.a
LIBSO    := $(BUILD)/lib/libcbcore.so
BINDIR_B := $(BUILD)/bin
endif
PROG_BIN := $(PROGS:%=$(BINDIR_B)/%)

TEST_SRC := $(sort $(wildcard tests/unit/test_*.c))
TEST_BIN := $(TEST_SRC:tests/unit/%.c=$(BUILD)/tests/%)
GEN_BIN  := $(BUILD)/tests/cb-gen-fixture
BENCH_SRC:= $(sort $(wildcard tests/bench/*.c))
BENCH_BIN:= $(BENCH_SRC:tests/bench/%.c=$(BUILD)/bench/%)

# The CUDA backend: a module of its own (lib/cuda/cuda.mk), built when nvcc
# is on PATH or in /usr/local/cuda, unless CUDA=0.
NVCC ?= $(or $(shell command -v nvcc 2>/dev/null),$(wildcard /usr/local/cuda/bin/nvcc))
ifneq ($(CUDA),0)
ifneq ($(NVCC),)
include lib/cuda/cuda.mk
else ifeq ($(CUDA),1)
$(error CUDA=1 but nvcc was not found (put it on PATH or set NVCC=/path/to/nvcc))
endif
endif

# The CPU's kernel files (lib/backend), each compiled with its ISA's flags
# whatever the build's -march, and called only on a CPU that has them (the
# fuzz build applies the same flags).
ISA_FLAGS_qmm_avx2 := -mavx2 -mfma -mf16c
ISA_FLAGS_qgemm_avx2 := -mavx2 -mfma -mf16c
ISA_FLAGS_qgemm_avxvnni := -mavx2 -mfma -mf16c -mavxvnni
ISA_FLAGS_qgemm_avx512 := -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl
ISA_FLAGS_qgemm_avx512vnni := $(ISA_FLAGS_qgemm_avx512) -mavx512vnni
ISA_FILES := qmm_avx2 qgemm_avx2 qgemm_avxvnni qgemm_avx512 qgemm_avx512vnni

# The libFuzzer harnesses (make fuzz, make fuzz-build).
include tests/fuzz/fuzz.mk

.SECONDARY:
.PHONY: soak memcheck all lib progs cuda help deps model model-gemma test check-tools bench parity eval diag demo install uninstall clean format format-check funclen layers

all: lib progs ## build the library and the programs (default)

lib: $(LIBA) $(LIBSO) ## build lib/libcbcore.a and lib/libcbcore.so

progs: $(PROG_BIN) ## build the programs into bin/

# The kernel files' ISA flags (ISA_FLAGS_*, above); lib/backend/qmm.c and
# qgemm.c check the CPU at run time.
$(foreach f,$(ISA_FILES),$(eval $(BUILD)/lib/backend/$(f).o: CFLAGS += $(ISA_FLAGS_$(f)) -O3))

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	@[ "$(Q)" = "" ] || echo "  CC      $<"
	$(Q)$(CC) $(CFLAGS) -c -o $@ $<

$(LIBA): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	@[ "$(Q)" = "" ] || echo "  AR      $@"
	$(Q)rm -f $@ && ar rcs $@ $^

$(LIBSO): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	@[ "$(Q)" = "" ] || echo "  LD      $@"
	$(Q)$(CC) -shared -Wl,-soname,libcbcore.so.0 $(LDFLAGS) -o $@ $^ $(LDLIBS)

# A program is src/cb-NAME.c, plus its parts where it has them (cb-run:
# src/run-*.c; cb-store: src/store-*.c), plus cli.c.
$(BINDIR_B)/cb-run: $(patsubst %.c,$(BUILD)/%.o,$(wildcard src/run-*.c))
$(BINDIR_B)/cb-store: $(patsubst %.c,$(BUILD)/%.o,$(wildcard src/store-*.c))
$(BINDIR_B)/%: $(BUILD)/src/%.o $(CLI_OBJ) $(LIBA)
	@mkdir -p $(dir $@)
	@[ "$(Q)" = "" ] || echo "  LD      $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $(filter %.o,$^) $(LIBA) $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/tests/unit/%.o $(LIBA)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $< $(LIBA) $(LDLIBS)

# test_qgemm also runs the AVX-VNNI and AVX-512 kernels on SIMDe's portable
# intrinsics (Debian's libsimde-dev, header-only), so that machines without
# them test their logic: each compiled again with QG_EMULATE (x86-64 only:
# SIMDe's 512-bit fused multiply-adds are then the 256-bit FMA's).
SIMDE := $(if $(filter x86_64,$(shell uname -m)),$(wildcard /usr/include/simde/x86/avx512.h))
ifneq ($(SIMDE),)
QG_EMU_OBJ := $(patsubst %,$(BUILD)/tests/emu/qgemm_%.o,avxvnni avx512 avx512vnni)
$(BUILD)/tests/emu/qgemm_%.o: lib/backend/qgemm_%.c
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS) -mavx2 -mfma -mf16c -DQG_EMULATE -O1 -c -o $@ $<
$(BUILD)/tests/unit/test_qgemm.o: CFLAGS += -DQG_HAVE_EMU
endif
$(BUILD)/tests/test_qgemm: $(BUILD)/tests/unit/test_qgemm.o $(QG_EMU_OBJ) $(LIBA)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# test_noalloc counts every allocation libcbcore.a makes during a forward pass.
$(BUILD)/tests/test_noalloc: LDFLAGS += -Wl,--wrap=malloc -Wl,--wrap=calloc -Wl,--wrap=realloc -Wl,--wrap=aligned_alloc

$(GEN_BIN): $(BUILD)/tests/gen/cb-gen-fixture.o $(LIBA)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $< $(LIBA) $(LDLIBS)

# bench_engine times OpenBLAS' sgemm itself
$(BUILD)/bench/%: $(BUILD)/tests/bench/%.o $(LIBA)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $< $(LIBA) $(LDLIBS) $(BLAS_LIBS)

deps: ## install the Debian packages the build and tests need (apt-get; quiet when present)
	@sh scripts/deps.sh

model: ## fetch the default model (Qwen2.5-Coder-1.5B-Instruct Q4_K_M) into the cache; MODEL=qwen0.5b|smollm2|gemma for another
	@sh scripts/fetch-model.sh $(or $(MODEL),qwen1.5b)

model-gemma: ## fetch Gemma-3-270M Q4_K_M into the cache
	@sh scripts/fetch-model.sh gemma

check-tools: all $(TEST_BIN) $(GEN_BIN) $(BENCH_BIN)

# The GGUF fuzz sweep and the tokenizer suites also run under ASan+UBSan.
SAN_TESTS := test_gguf test_tokenizer test_quant test_store test_kv test_kvcoded test_chunk test_prompt test_backend_ops test_batch test_fault

test: deps ## install deps, fetch the models, build everything and run every test suite
	@sh scripts/fetch-model.sh smollm2
	@$(MAKE) --no-print-directory model
	@$(MAKE) --no-print-directory check-tools
	@$(MAKE) --no-print-directory SAN=1 $(SAN_TESTS:%=build/san/tests/%)
	@[ -z "$(FUZZ_CC)" ] || $(MAKE) --no-print-directory fuzz-build
	@BUILD=$(BUILD) BINDIR_B=$(BINDIR_B) SAN_TESTS="$(SAN_TESTS)" CB_CUDA_MOD="$(CUDA_MOD)" \
	    CB_FUZZ_DIR="$(if $(FUZZ_CC),$(FUZZ_B))" sh tests/run.sh

# A long chaos run (tests/cli/chaos.sh, whose short form make test runs): four hosts sharing
# a private redis-server under SIGKILLs, restarts, stalls, tampering and a full disk.
SOAK_MINUTES ?= 10
soak: all $(GEN_BIN) ## chaos run for SOAK_MINUTES (default 10): 0 corrupt reads, hangs, lost entries (needs redis-server)
	@rm -rf tests/tmp/soak; mkdir -p tests/tmp/soak
	@BUILD=$(BUILD) BINDIR_B=$(BINDIR_B) CB_DEVICE=cpu CB_TEST_TMP=$(CURDIR)/tests/tmp/soak \
	    CHAOS_SECONDS=$$(($(SOAK_MINUTES) * 60)) CHAOS_HOSTS=$${CHAOS_HOSTS:-4} sh tests/cli/chaos.sh

memcheck: deps check-tools ## run every unit test under Valgrind memcheck (tests/memcheck.sh)
	@BUILD=$(BUILD) sh tests/memcheck.sh

bench: deps all $(BENCH_BIN) $(GEN_BIN) ## build and run the benchmarks in tests/bench/ (MODEL=gemma: on Gemma-3-270M)
	@$(MAKE) --no-print-directory model
	@BUILD=$(BUILD) BINDIR_B=$(BINDIR_B) sh tests/bench/run.sh

parity: deps all $(BENCH_BIN) ## compare our logits and greedy output with llama.cpp's (MODEL=gemma; CB_DEVICE=cuda: our GPU path)
	@$(MAKE) --no-print-directory model
	@[ -f "$(CUDA_MOD)" ] && export CB_CUDA_MODULE=$(CURDIR)/$(CUDA_MOD); export CB_DEVICE=$${CB_DEVICE:-cpu}; \
	VENV=$$(sh scripts/venv.sh) && $$VENV/bin/python tests/parity/parity.py \
	    "$${CB_MODEL:-$${XDG_CACHE_HOME:-$$HOME/.cache}/cacheblend/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf}" \
	    $(BUILD)/bench/cb-logits $(BINDIR_B)/cb-run --ref $(BUILD)/bench/cb-ref-logits

EVAL_ARGS ?=
eval: deps all ## agreement with full prefill and retention, with intervals and controls, on nq20 (EVAL_ARGS="--split dev -n 300")
	@$(MAKE) --no-print-directory model
	@python3 tests/bench/eval.py --bin $(BINDIR_B) $(EVAL_ARGS)

DIAG_ARGS ?=
diag: deps all $(BUILD)/bench/blend_diag ## where a blend's quality goes, layer by layer (DIAG_ARGS="-n 8 --shape many --modes reuse,probe:0.15")
	@$(MAKE) --no-print-directory model
	@python3 tests/bench/diag.py --bin $(BINDIR_B) --diag $(BUILD)/bench/blend_diag $(DIAG_ARGS)

demo: deps ## fetch the model, build, and answer three two-hop questions on examples/corpus by full prefill, KV reuse and blend, each with its TTFT
	@$(MAKE) --no-print-directory model all
	@sh examples/demo.sh

install: all ## install programs, library, header, man pages and libcbcore.pc under $(DESTDIR)$(PREFIX)
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCDIR) $(DESTDIR)$(PKGDIR)
	install -d $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man3 $(DESTDIR)$(MANDIR)/man5 $(DESTDIR)$(MANDIR)/man7
	install -m 755 $(PROG_BIN) $(DESTDIR)$(BINDIR)/
	install -m 644 $(LIBA) $(DESTDIR)$(LIBDIR)/
	install -m 755 $(LIBSO) $(DESTDIR)$(LIBDIR)/libcbcore.so.0
	[ -z "$(CUDA_MOD)" ] || install -m 755 $(CUDA_MOD) $(DESTDIR)$(LIBDIR)/
	ln -sf libcbcore.so.0 $(DESTDIR)$(LIBDIR)/libcbcore.so
	install -m 644 lib/include/cbcore.h $(DESTDIR)$(INCDIR)/
	@# the man pages' footer (.Os) gets the release
	for f in man/man[1357]/*.[1357]; do \
	    d=$(DESTDIR)$(MANDIR)/$$(basename $$(dirname $$f)); \
	    sed 's|^\.Os cacheblend$$|.Os cacheblend $(VERSION)|' "$$f" > "$$d/$$(basename $$f)" && \
	    chmod 644 "$$d/$$(basename $$f)" || exit 1; \
	done
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(LIBDIR)|' -e 's|@INCDIR@|$(INCDIR)|' \
	    -e 's|@VERSION@|$(VERSION)|' -e 's|@LIBS@|$(LDLIBS)|' lib/libcbcore.pc.in > $(DESTDIR)$(PKGDIR)/libcbcore.pc

uninstall: ## remove what install put under $(DESTDIR)$(PREFIX)
	rm -f $(PROGS:%=$(DESTDIR)$(BINDIR)/%)
	rm -f $(DESTDIR)$(LIBDIR)/libcbcore.a $(DESTDIR)$(LIBDIR)/libcbcore.so $(DESTDIR)$(LIBDIR)/libcbcore.so.0
	rm -f $(DESTDIR)$(LIBDIR)/libcbcore-cuda.so
	rm -f $(DESTDIR)$(INCDIR)/cbcore.h $(DESTDIR)$(PKGDIR)/libcbcore.pc
	for f in man/man[1357]/*.[1357]; do rm -f $(DESTDIR)$(MANDIR)/$$(basename $$(dirname $$f))/$$(basename $$f); done

clean: ## remove build outputs
	rm -rf build bin/* lib/libcbcore.a lib/libcbcore.so lib/libcbcore-cuda.so

# The C sources' format is .clang-format's, as clang-format 14 applies it
# (other versions format differently).  FORMAT_SKIP: files being rewritten
# on another branch, formatted when it lands (none now).
CLANG_FORMAT ?= clang-format-14
FORMAT_SKIP  :=
FORMAT_SRC   := $(filter-out $(FORMAT_SKIP),$(sort $(wildcard lib/*/*.c lib/*/*.h src/*.c src/*.h tests/*/*.c tests/*/*.h)))

format: ## clang-format-14 every C source in place (.clang-format)
	$(CLANG_FORMAT) -i $(FORMAT_SRC)

format-check: ## fail, naming the places, where make format would change a file (make test runs it)
	@$(CLANG_FORMAT) --dry-run --Werror $(FORMAT_SRC)

funclen: ## the longest functions in lib/ and src/ (universal-ctags); fails past 200 lines
	@sh scripts/funclen.sh 15 200

layers: ## check the headers: cbcore.h within its line budget (660), no lib/ file including a layer above its own
	@sh scripts/layers.sh

help: ## this list
	@echo "usage: make [TARGET] [DEBUG=1] [SAN=1] [NATIVE=0] [CUDA=0|1] [PREFIX=dir] [DESTDIR=dir] [V=1] [MODEL=qwen1.5b|qwen0.5b|smollm2|gemma]"
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -e 's/:.*## /\t/' | awk -F'\t' '{printf "  %-12s %s\n", $$1, $$2}'

-include $(shell find build -name '*.d' 2>/dev/null)
