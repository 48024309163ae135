"""llama.cpp's speed on one scenario (llama-cpp-python) and this process's
peak RSS, measured the way bench_engine measures ours: same GGUF, threads,
ids, batches of 512.  usage: llamacpp_engine.py MODEL THREADS SCENARIO...
(scenarios as in bench_engine.c: prefill:L, decode:L:N, batch:B:C;
CB_BENCH_TURNS as there: decode waits for a line on stdin before the
prefill and before each of its rounds, and prints turn_s after each)."""
import os
import resource
import sys
import time

from llama_cpp import Llama


def wait_turn():
    """CB_BENCH_TURNS: a line from stdin says this engine's turn has come"""
    sys.stdout.flush()
    return sys.stdin.readline() != ""


model, threads = sys.argv[1], int(sys.argv[2])
t_load = time.perf_counter()
llm = None
for sc in sys.argv[3:]:
    kind, *nums = sc.split(":")
    a, b = int(nums[0]), int(nums[1]) if len(nums) > 1 else 0
    B = a if kind == "batch" else 0
    C = b if B else a
    n_tok = C + (B if B else b)
    llm = Llama(model_path=model, n_ctx=n_tok + 8, n_batch=max(512, B), n_ubatch=max(512, B),
                n_threads=threads, n_threads_batch=threads, verbose=False)
    if t_load is not None:
        print(f"load_s {time.perf_counter() - t_load:.2f}")
        t_load = None
    nv = llm.n_vocab()
    toks = [(i * 7919 + 13) % nv for i in range(n_tok + 1)]
    turns = min(int(os.environ.get("CB_BENCH_TURNS") or 0), b) if kind == "decode" else 0
    if turns and not wait_turn():
        sys.exit(70)
    t0 = time.perf_counter()
    llm.eval(toks[:C])
    dt = time.perf_counter() - t0
    if kind == "prefill":
        print(f"prefill_{a}_tok_s {a / dt:.1f}", flush=True)
    elif kind == "decode":
        print(f"prefill_{C}_tok_s {C / dt:.1f}", flush=True)
        spent, done = 0.0, 0
        for r in range(turns or 1):
            if turns and not wait_turn():
                sys.exit(70)
            g0 = time.perf_counter()
            end = b * (r + 1) // (turns or 1)
            for i in range(done, end):
                llm.eval([toks[C + i]])
            done = end
            spent += time.perf_counter() - g0
            if turns:
                print(f"turn_s {time.perf_counter() - g0:.4f}", flush=True)
        print(f"decode_{a}_tok_s {b / spent:.2f}", flush=True)
    elif kind == "batch":
        best = 1e9
        for _ in range(3):
            llm.n_tokens = C  # eval() drops the cache past n_tokens
            g0 = time.perf_counter()
            llm.eval(toks[C:C + B])
            best = min(best, time.perf_counter() - g0)
        print(f"batch_{B}_{C}_ms {best * 1e3:.2f}\nbatch_{B}_{C}_rows_s {B / best:.1f}", flush=True)
    del llm
print(f"rss_kb {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}")
