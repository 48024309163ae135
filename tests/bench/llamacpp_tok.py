"""Tokenize a file with llama.cpp (through llama-cpp-python) the way
bench_core does with ours, and print the same figures."""
import statistics
import sys
import time

from llama_cpp import Llama

model, path = sys.argv[1], sys.argv[2]
t = []
for _ in range(9):
    t0 = time.perf_counter()
    llm = Llama(model_path=model, vocab_only=True, verbose=False)
    t.append(time.perf_counter() - t0)
    if _ < 8:
        del llm
print(f"open_vocab_ms {statistics.median(t) * 1e3:.2f}")
data = open(path, "rb").read()
t = []
for _ in range(5):
    t0 = time.perf_counter()
    ids = llm.tokenize(data, add_bos=False, special=False)
    t.append(time.perf_counter() - t0)
s = statistics.median(t)
print(f"tok_bytes {len(data)}\ntok_tokens {len(ids)}\ntok_s {s:.4f}\ntok_mb_s {len(data) / s / 1e6:.2f}")
