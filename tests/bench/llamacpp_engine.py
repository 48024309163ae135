"""llama.cpp's prefill and decode speed (llama-cpp-python), measured the way
bench_engine measures ours: same GGUF, threads, ids, batches of 512."""
import sys
import time

from llama_cpp import Llama

model, threads = sys.argv[1], int(sys.argv[2])
lens = [int(x) for x in sys.argv[3:]] or [512, 1024, 2048, 4096]
for L in lens:
    llm = Llama(model_path=model, n_ctx=L + 64, n_batch=512, n_ubatch=512, n_threads=threads,
                n_threads_batch=threads, verbose=False)
    nv = llm.n_vocab()
    toks = [(i * 7919 + 13) % nv for i in range(L)]
    t0 = time.perf_counter()
    llm.eval(toks)
    dt = time.perf_counter() - t0
    print(f"prefill_{L}_s {dt:.4f}\nprefill_{L}_tok_s {L / dt:.1f}", flush=True)
    if L == 512:
        g0 = time.perf_counter()
        for i in range(64):
            llm.eval([toks[-1]])
        print(f"decode_tok_s {64 / (time.perf_counter() - g0):.1f}", flush=True)
    del llm
