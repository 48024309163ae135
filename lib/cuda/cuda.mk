# lib/cuda/cuda.mk - the CUDA backend module, libcbcore-cuda.so (included by
# the Makefile when nvcc is found, or with CUDA=1), from every lib/cuda/*.cu
# (cuda.cu: contexts, memory, the table; cuda_mm.cu: weights and products;
# cuda_attn.cu: attention; cuda_ops.cu: the small kernels; cuda_graph.cu:
# graphs, no kernels), which share
# cuda_impl.cuh (nvcc -MMD tracks it).  No relocatable device code: each
# file's kernels are its own.
#   CUDA_ARCHS   SASS targets (default 80 86 89 90); PTX for the newest is
#                added so that later GPUs can JIT it
#   CUDA_HOME    the toolkit (default: nvcc's parent directory)
CUDA_HOME  ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_ARCHS ?= 80 86 89 90
CUDA_PTX   := $(lastword $(CUDA_ARCHS))
NVCCFLAGS  ?= -O3
NVCCFLAGS  += -std=c++17 -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra,-Wno-unused-parameter -MMD -MP -Ilib/include \
              -DCU_SASS_NEWEST=$(CUDA_PTX) \
              $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
              -gencode arch=compute_$(CUDA_PTX),code=compute_$(CUDA_PTX)
CUDA_SRC   := $(sort $(wildcard lib/cuda/*.cu))
CUDA_OBJ   := $(CUDA_SRC:%.cu=$(BUILD)/%.o)
ifeq ($(BUILD),build/rel)
CUDA_MOD   := lib/libcbcore-cuda.so
else
CUDA_MOD   := $(BUILD)/lib/libcbcore-cuda.so
endif
CUDA_LIBS  := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart

$(BUILD)/lib/cuda/%.o: lib/cuda/%.cu
	@mkdir -p $(dir $@)
	@[ "$(Q)" = "" ] || echo "  NVCC    $<"
	$(Q)$(NVCC) $(NVCCFLAGS) -c -o $@ $<

# Self-contained: it uses libcbcore's headers only, never its symbols.
$(CUDA_MOD): $(CUDA_OBJ)
	@mkdir -p $(dir $@)
	@[ "$(Q)" = "" ] || echo "  LD      $@"
	$(Q)$(CC) -shared -Wl,--no-undefined -o $@ $^ $(CUDA_LIBS) -lpthread -lstdc++ -lm

all: $(CUDA_MOD)
cuda: $(CUDA_MOD) ## build the CUDA backend module (when nvcc is found)
