#!/usr/bin/env python3
"""tests/bench/throughput.py - questions per second: N questions, each with
K stored chunks and A-token answers, answered by N separate cb-run calls
and by one cb-run --batch, on one model; the separate calls and the batch
alternate, ROUNDS rounds, medians.  Also checks that both give the same
answers, and the batch's peak RSS against the model file and its KV.

usage: throughput.py BINDIR MODEL THREADS [--questions N] [--chunks K]
           [--tokens T] [--answer A] [--rounds R] [--musique FILE]
Chunks: with --musique (MuSiQue's questions and passages), question i with
its first K passages, each cut to its first T tokens; else K chunks of T
tokens of built-in prose a question, with generic questions.  The chunks
are precomputed into a store of its own first (not timed).  Prints one
table row (markdown) and a few facts, and key value lines for run.sh."""
import argparse, json, os, statistics, subprocess, sys, tempfile, time

PROSE = ("The river rises in the hills north of the town and runs south through farmland for about forty miles "
         "before it reaches the sea. In the nineteenth century it carried timber and grain to the port, and the "
         "mills along its banks employed most of the people who lived in the valley. When the railway came, the "
         "river trade declined, and many of the old mills were turned into houses, shops and, in one case, a "
         "small museum that tells the story of the valley's industry. ")
QUESTIONS = ["What did the river carry?", "Where does the river rise?", "What happened when the railway came?",
             "What is the museum about?", "How long is the river?", "Who worked in the mills?",
             "What were the mills turned into?", "Where does the river reach the sea?"]


def run(cmd):
    """stdout, wall seconds, peak RSS (KiB) and CPU seconds of one program run"""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = code = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        if code != 0:
            sys.exit(f"throughput.py: {' '.join(cmd[:3])} ... exited {code}: {err.read().decode()[-300:]}")
        return out.read(), wall, ru.ru_maxrss, ru.ru_utime + ru.ru_stime


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("model")
    ap.add_argument("threads")
    ap.add_argument("--questions", type=int, default=16)
    ap.add_argument("--chunks", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--answer", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--musique")
    a = ap.parse_args()
    b, m, t = a.bin, a.model, a.threads
    tmp = tempfile.mkdtemp(prefix="cb-throughput.")
    store = f"{tmp}/store"
    # the chunks: texts cut to their first T tokens by cb-chunk (one record each)
    texts, questions = [], []
    if a.musique and os.path.exists(a.musique):
        data = json.load(open(a.musique, encoding="utf-8"))[:a.questions]
        for q in data:
            questions.append(q["question"])
            texts.append([c["title"] + "\n" + c["text"] for c in q["ctxs"][:a.chunks]])
        shape = "MuSiQue passages"
    else:
        for i in range(a.questions):
            questions.append(QUESTIONS[i % len(QUESTIONS)])
            texts.append([f"Part {i}.{k}. " + PROSE * 4 for k in range(a.chunks)])
        shape = "built-in prose"
    recs = []
    for i, ts in enumerate(texts):
        for k, text in enumerate(ts):
            path = f"{tmp}/t{i}_{k}.txt"
            open(path, "w", encoding="utf-8").write(text)
            out = run([f"{b}/cb-chunk", "-m", m, "--tokens", str(a.tokens), path])[0]
            recs.append((i, json.loads(out.decode().splitlines()[0])))
    with open(f"{tmp}/chunks.jsonl", "w", encoding="utf-8") as f:
        for _, r in recs:
            f.write(json.dumps(r) + "\n")
    out = run([f"{b}/cb-precompute", "-q", "-m", m, "-t", t, "--store", store, f"{tmp}/chunks.jsonl"])[0]
    pre = [json.loads(l) for l in out.decode().splitlines()]
    per_q = [[] for _ in questions]
    for (i, _), r in zip(recs, pre):
        per_q[i].append(r)
    n_tok = sum(r["n_tokens"] for r in pre) / len(pre)
    common = ["-m", m, "-t", t, "--device", "cpu", "--store", store, "-n", str(a.answer), "--temp", "0"]
    with open(f"{tmp}/batch.jsonl", "w", encoding="utf-8") as f:
        for i, q in enumerate(questions):
            with open(f"{tmp}/q{i}.jsonl", "w", encoding="utf-8") as g:
                g.write("".join(json.dumps(r) + "\n" for r in per_q[i]))
            f.write(json.dumps({"id": i, "question": q, "chunks": [r["kv"] for r in per_q[i]]}) + "\n")
    sep_s, bat_s, sep_cpu, bat_cpu, rss, same, tokens = [], [], [], [], 0, 0, 0
    lone_prefill, bat_prefill = [], []
    for _ in range(a.rounds):
        lone, t0, cpu = [], time.perf_counter(), 0.0
        for i, q in enumerate(questions):
            out, _, _, c = run([f"{b}/cb-run"] + common + ["--stats", f"{tmp}/s{i}.json", "--chunks",
                                                           f"{tmp}/q{i}.jsonl", "-p", q])
            lone.append(out[:-1].decode("utf-8", "replace"))  # the answer, less the newline after it
            cpu += c
            lone_prefill.append(json.load(open(f"{tmp}/s{i}.json"))["prefill_ms"] / 1000)
        sep_s.append(time.perf_counter() - t0)
        sep_cpu.append(cpu)
        out, wall, rss_kb, c = run([f"{b}/cb-run"] + common + ["--stats", f"{tmp}/bstats.json", "--batch",
                                                               f"{tmp}/batch.jsonl"])
        bat_s.append(wall)
        bat_cpu.append(c)
        rss = max(rss, rss_kb)
        ans = [json.loads(l) for l in out.decode().splitlines()]
        same = sum(o["answer"] == lone[o["id"]] for o in ans)
        tokens = sum(o["stats"]["n_gen_tokens"] for o in ans)
        bat_prefill.append(sum(o["stats"]["prefill_ms"] for o in ans) / 1000)
    st = json.load(open(f"{tmp}/bstats.json"))
    s, bt = statistics.median(sep_s), statistics.median(bat_s)
    n = len(questions)
    name = os.path.basename(m)
    print(f"| {name[:30]:30s} | {n} x {a.chunks} chunks of ~{n_tok:.0f} tokens ({shape}), {a.answer}-token answers "
          f"| {s:6.1f} s ({n / s:.2f} q/s) | {bt:6.1f} s ({n / bt:.2f} q/s, {tokens / bt:.1f} tok/s) "
          f"| {s / bt:4.2f}x |")
    sc, bc = statistics.median(sep_cpu), statistics.median(bat_cpu)
    print(f"   identical answers, batch vs separate: {same}/{n}; rounds: separate "
          + " ".join(f"{x:.1f}" for x in sep_s) + " s, batch " + " ".join(f"{x:.1f}" for x in bat_s) + " s; "
          f"CPU time (less disturbed on a shared machine): separate {sc:.1f} s, batch {bc:.1f} s = {sc / bc:.2f}x")
    fsize = os.path.getsize(m) / 2**20
    print(f"   --batch peak RSS {rss / 1024:.0f} MB: model file {fsize:.0f} MB + KV in flight at most "
          f"{st['kv_peak'] / 2**20:.0f} MB ({st['in_flight_peak']} questions; budget {st['kv_budget'] / 2**20:.0f} MB)")
    # What bounds the ratio: the prefills (blends), one a question, are
    # the same work in both; batching shares only the decoding.
    lp, bp = sum(lone_prefill) / a.rounds, statistics.median(bat_prefill)
    print(f"   prefills (blends) of the {n} questions: {lp:.1f} s in the separate calls, {bp:.1f} s of the batch's "
          f"{bt:.1f} s; decoding and the rest: {s - lp:.1f} s separate, {bt - bp:.1f} s batched "
          f"({(s - lp) / max(bt - bp, 1e-9):.2f}x); with decoding free, the ratio could reach {s / bp:.2f}x")
    print(f"throughput_ratio {s / bt:.3f}\nthroughput_same {same}\nthroughput_n {n}")
    subprocess.run(["rm", "-rf", tmp])


if __name__ == "__main__":
    main()
