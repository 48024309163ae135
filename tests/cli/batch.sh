#!/bin/sh
# cb-run --batch through the real binary: answers identical to lone cb-run
# runs (greedy and sampled, stop strings, lengths, scores, every mode, chunks
# as records, as keys and from --chunks; exact and 8-bit activations), output
# in input order with ids and unread fields passed on, bad lines answered
# with their line number while the rest go on (exit 65), the in-flight limit
# and the KV budget, usage errors; then, with the default model, greedy
# answers identical to lone runs and the example pipeline
# (examples/batch.sh: retrieve, precompute, batch-answer).
. "$(dirname "$0")/lib.sh"
RUN=$BINDIR_B/cb-run PRE=$BINDIR_B/cb-precompute CHUNK=$BINDIR_B/cb-chunk
M=$CB_TEST_TMP/tiny-q8_0.gguf
S=$T/store

# compare BATCH_OUT LONE_DIR: answer i of the batch (in order) equals the
# file LONE_DIR/i (a lone run's stdout; score lines are the NLL cb-run prints)
compare() {
    python3 - "$1" "$2" <<'PY'
import json, os, sys
out = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
bad = []
for i, o in enumerate(out):
    p = os.path.join(sys.argv[2], str(i))
    if not os.path.exists(p):
        continue
    # as cb-run --batch writes text into JSON: each byte of an invalid
    # UTF-8 sequence becomes U+FFFD; a lone run ends its answer with one
    # newline, which is not the answer's
    want = "".join("\ufffd" if 0xDC80 <= ord(c) <= 0xDCFF else c
                   for c in open(p, "rb").read()[:-1].decode("utf-8", "surrogateescape"))
    got = o.get("answer")
    if got is None and "score" in o:
        got, want = "%.6f" % o["score"]["nll"], want.strip()
    if got != want:
        bad.append((i, o.get("id"), want, got))
for b in bad:
    print("#   question %d (id %s): lone %r, batch %r" % b)
sys.exit(1 if bad else 0)
PY
}

# --- tiny model: every parameter a line can set, against lone runs
"$CHUNK" -m "$M" --tokens 20 - > "$T/chunks.jsonl" <<'EOF'
The river Vale runs past the town of Kelby. Its bridge was built in 1920 by the Norden company.

Kelby has a market on Tuesdays. The market sells fish from the coast and cheese from the hills.

The Norden company also built the railway station at Kelby in 1931, to a design by Ada Whitlock.
EOF
"$PRE" -m "$M" --store "$S" -q "$T/chunks.jsonl" > "$T/pre.jsonl" && [ -s "$T/pre.jsonl" ] \
    && ok "the chunks are precomputed" || not_ok "precompute"
python3 - "$T/pre.jsonl" "$T" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
t = sys.argv[2]
keys = [r["kv"] for r in recs]
qs = [
    {"id": 0, "question": "Who built the bridge?", "gold": "Norden", "n_predict": 9},
    {"id": 1, "question": "When is the market?", "chunks": recs[:2], "n_predict": 14},
    {"id": 2, "prompt": "Where is Kelby?", "chunks": keys, "n_predict": 11, "mode": "reuse"},
    {"id": 3, "question": "Who designed the station?", "chunks": [{"kv": k} for k in keys], "strategy": "hkvd",
     "ratio": 0.5, "n_predict": 7},
    {"id": 4, "question": "x y z", "chunks": recs, "mode": "full", "n_predict": 16, "stop": ["a"]},
    {"id": 5, "question": "Name the river.", "chunks": recs[1:], "mode": "prefix", "n_predict": 5},
    {"id": 6, "question": "Score this.", "chunks": recs[:1], "score": "The bridge."},
    {"id": 7, "question": "Tell me more.", "system": "You are terse.", "n_predict": 13, "stop": "e"},
    {"id": 8, "question": "And then?", "chunks": recs, "ratio": 0.0, "n_predict": 10},
    {"id": 9, "question": "Who paid for it?", "chunks": recs, "speedup": 1.5, "n_predict": 6},
]
with open(f"{t}/q.jsonl", "w", encoding="utf-8") as f:
    for q in qs:
        f.write(json.dumps(q) + "\n")
# each question's lone command line, one per file (arguments NUL-separated)
for i, q in enumerate(qs):
    args = []
    ch = q.get("chunks")
    if ch:
        with open(f"{t}/c{i}.jsonl", "w", encoding="utf-8") as f:
            for c in ch:
                r = next(r for r in recs if r["kv"] == (c if isinstance(c, str) else c.get("kv")))
                f.write(json.dumps(r) + "\n")
        args += ["--chunks", f"{t}/c{i}.jsonl"]
    for k, o in (("mode", "--mode"), ("strategy", "--strategy"), ("ratio", "--ratio"), ("speedup", "--speedup"),
                 ("n_predict", "-n"),
                 ("system", "--system"), ("score", "--score")):
        if k in q:
            args += [o, str(q[k])]
    for s in ([q["stop"]] if isinstance(q.get("stop"), str) else q.get("stop", [])):
        args += ["--stop", s]
    args += ["-p", q.get("question", q.get("prompt"))]
    open(f"{t}/a{i}", "w", encoding="utf-8").write("\0".join(args))
PY
for act8 in --exact ""; do  # the exact path, then the default (8-bit activations)
    for temp in 0 0.8; do
        rm -rf "$T/lone"; mkdir "$T/lone"
        for i in 0 1 2 3 4 5 6 7 8 9; do
            # shellcheck disable=SC2046
            xargs -0 "$RUN" -m "$M" -t 2 --store "$S" --no-store-write $act8 --temp $temp -s 5 -n 20 < "$T/a$i" \
                > "$T/lone/$i" 2>/dev/null
        done
        "$RUN" -m "$M" -t 2 --store "$S" --no-store-write $act8 --temp $temp -s 5 -n 20 --batch "$T/q.jsonl" \
            > "$T/b.jsonl" 2>"$T/err"; rc=$?
        if [ $rc -eq 0 ] && compare "$T/b.jsonl" "$T/lone"; then
            ok "tiny${act8:+ $act8}, temp $temp: 10 batched answers = lone runs (modes, chunks by record and key, scores, stops, speedup)"
        else
            not_ok "tiny${act8:+ $act8}, temp $temp: batched answers (exit $rc)"; sed 's/^/#   /' "$T/err" | head -3
        fi
    done
done
python3 - "$T/b.jsonl" <<'PY' && ok "answers in input order, ids and unread fields passed on, --stats fields" || not_ok "answer lines"
import json, sys
out = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
assert [o["id"] for o in out] == list(range(10)), [o.get("id") for o in out]
assert out[0]["gold"] == "Norden" and "question" not in out[0] and "chunks" not in out[1], out[0]
need = ["mode", "n_prompt_tokens", "n_cached_tokens", "n_recomputed_tokens", "ratio", "submit_ms", "first_token_ms",
        "prefill_ms", "load_ms", "n_gen_tokens", "gen_ms", "stop"]
for o in out:
    assert all(k in o["stats"] for k in need) and "ttft_ms" not in o["stats"], o
# from the batch's start: submitted in input order, the first token after the
# submission and its own prefill
sub = [o["stats"]["submit_ms"] for o in out]
assert sub == sorted(sub) and sub[0] >= 0, sub
for o in out:
    s = o["stats"]
    assert s["first_token_ms"] >= s["submit_ms"] + s["prefill_ms"], s
modes = [o["stats"]["mode"] for o in out]
assert modes == ["full", "blend", "reuse", "blend", "full", "prefix", "blend", "full", "blend", "blend"], modes
assert out[2]["stats"]["n_cached_tokens"] > 0 and out[1]["stats"]["n_cached_tokens"] > 0, out[2]
assert out[3]["stats"]["strategy"] == "hkvd" and out[3]["stats"]["ratio"] == 0.5, out[3]["stats"]
assert "speedup" not in out[3]["stats"] and out[1]["stats"]["speedup"]["target"] == 4, out[1]["stats"]
assert out[9]["stats"]["speedup"]["target"] == 1.5, out[9]["stats"]
assert "score" in out[6] and "answer" not in out[6] and out[6]["score"]["n_tokens"] > 0, out[6]
assert out[0]["stats"]["n_gen_tokens"] <= 9 and out[1]["stats"]["n_gen_tokens"] <= 14, out[0]
PY

# --- the in-flight limit and the KV budget change nothing but the schedule
strip() { python3 -c 'import json, sys
for l in open(sys.argv[1]): o = json.loads(l); o.pop("stats", None); print(json.dumps(o))' "$1"; }
"$RUN" -m "$M" -t 2 --store "$S" --no-store-write -n 20 --batch-size 1 --batch "$T/q.jsonl" > "$T/b1.jsonl" 2>/dev/null
"$RUN" -m "$M" -t 2 --store "$S" --no-store-write -n 20 --batch-size 3 --kv-budget 40K --stats "$T/bs.json" \
    --batch "$T/q.jsonl" > "$T/b3.jsonl" 2>/dev/null
"$RUN" -m "$M" -t 2 --store "$S" --no-store-write -n 20 --batch "$T/q.jsonl" > "$T/b9.jsonl" 2>/dev/null
strip "$T/b1.jsonl" > "$T/s1"; strip "$T/b3.jsonl" > "$T/s3"; strip "$T/b9.jsonl" > "$T/s9"
cmp -s "$T/s1" "$T/s9" && cmp -s "$T/s3" "$T/s9" && [ -s "$T/s9" ] \
    && ok "--batch-size 1, 3 with a small --kv-budget, and the default: the same answers" || not_ok "answers by batch size"
python3 - "$T/bs.json" "$T/b3.jsonl" <<'PY' && ok "--stats: the batch's totals; the budget held the caches" || not_ok "batch --stats"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["n_questions"] == 10 and s["n_answered"] == 10 and s["n_failed"] == 0, s
assert s["batch_size"] == 3 and s["kv_budget"] == 40960, s
# one question's cache alone may pass the budget (it then runs alone); two never do together
one = max(json.loads(l)["stats"]["kv_bytes"] for l in open(sys.argv[2]))
assert s["in_flight_peak"] <= 3 and s["kv_peak"] <= max(40960, one), (s, one)
assert 2 * one > 40960 or s["in_flight_peak"] > 1, (s, one)
assert s["n_gen_tokens"] > 0 and s["questions_s"] > 0, s
PY

# --- bad lines: an error line each, with the line number; the rest answered; exit 65
cat > "$T/bad.jsonl" <<'EOF'
{"id": "a", "question": "Who built the bridge?", "n_predict": 4}
not json

[1, 2]
{"id": "b"}
{"id": "c", "question": "q", "prompt": "p"}
{"id": "d", "question": "q", "mode": "warp"}
{"id": "e", "question": "q", "ratio": 2}
{"id": "f", "question": "q", "n_predict": -3}
{"id": "g", "question": "q", "stop": ""}
{"id": "h", "question": "q", "chunks": ["0123-nope"]}
{"id": "i", "question": "q", "chunks": ["00000000000000000000000000000000-11111111111111111111111111111111"]}
{"id": "j", "question": "q", "chunks": [{"seq": 1}]}
{"id": "k", "question": "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen twenty twenty-one twenty-two twenty-three twenty-four twenty-five"}
{"id": "m", "question": "q", "ratio": 0.2, "speedup": 3}
{"id": "n", "question": "q", "speedup": "fast"}
{"id": "l", "question": "And the market?", "n_predict": 4}
EOF
"$RUN" -m "$M" -t 2 --store "$S" -c 64 --batch "$T/bad.jsonl" > "$T/o" 2>"$T/err"; rc=$?
[ $rc -eq 65 ] && ok "bad lines: exit 65" || not_ok "bad lines: exit $rc"
python3 - "$T/o" <<'PY' && ok "every bad line answered with its line number and why; the good ones answered, in order" \
    || not_ok "bad-line output"
import json, sys
out = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
ids = [o.get("id") for o in out]
assert ids == ["a", None, None, "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "m", "n", "l"], ids
assert "answer" in out[0] and "answer" in out[-1] and "error" not in out[0], (out[0], out[-1])
lines = [o.get("line") for o in out[1:-1]]
assert lines == [2, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16], lines
why = {o.get("id"): o["error"] for o in out[1:-1]}
assert "not a JSON object" in out[2]["error"], out[2]
assert "question" in why["b"] and "question" in why["c"], why
assert "warp" not in why["d"] and "blend" in why["d"], why["d"]
assert "ratio" in why["e"] and "n_predict" in why["f"] and "stop" in why["g"], why
assert "not a chunk key" in why["h"] and "not in the store" in why["i"] and "chunk 1" in why["j"], why
assert "context" in why["k"], why["k"]
assert "exclude" in why["m"] and "speedup" in why["n"], why
PY
python3 - "$T/o" "$T/err" "$T/bad.jsonl" <<'PY' && ok "each bad line also on stderr, as it fails: cb-run: FILE:LINE: why" \
    || { not_ok "bad lines on stderr"; sed 's/^/#   /' "$T/err" | head -5; }
import json, sys
out = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
err = [l.rstrip("\n") for l in open(sys.argv[2], encoding="utf-8") if not l.startswith("cb-run: warning")]
want = ["cb-run: %s:%d: %s" % (sys.argv[3], o["line"], o["error"]) for o in out if "error" in o]
assert len(want) == 14 and sorted(err) == sorted(want), (err, want)  # said as they fail
PY

# --- usage errors and missing input
expect_exit "--batch with -p" 64 "$RUN" -m "$M" --batch -p hi "$T/q.jsonl"
expect_exit "--batch with --verify" 64 "$RUN" -m "$M" --batch --verify "$T/q.jsonl"
expect_exit "--batch-size without --batch" 64 "$RUN" -m "$M" --batch-size 4 -p hi
expect_exit "--batch-size 0" 64 "$RUN" -m "$M" --batch --batch-size 0 "$T/q.jsonl"
expect_exit "--kv-budget not a size" 64 "$RUN" -m "$M" --batch --kv-budget lots "$T/q.jsonl"
expect_exit "two input files" 64 "$RUN" -m "$M" --batch "$T/q.jsonl" "$T/q.jsonl"
expect_exit "a missing input file" 66 "$RUN" -m "$M" --batch "$T/none.jsonl"
printf '' | "$RUN" -m "$M" --batch > "$T/o" 2>"$T/err" && [ ! -s "$T/o" ] && ok "an empty batch: nothing out, exit 0" \
    || not_ok "empty batch"
printf '{"question": "from stdin", "n_predict": 3}\n' | "$RUN" -m "$M" --batch - > "$T/o" 2>/dev/null \
    && grep -q '"answer"' "$T/o" && ok "questions from stdin (-)" || not_ok "stdin"
printf '{"question": "q", "n_predict": 3}\n' | "$RUN" -m "$M" --chunks "$T/chunks.jsonl" --store "$S" --batch \
    > "$T/o" 2>/dev/null && grep -q "\"n_chunks\":$(wc -l < "$T/chunks.jsonl")," "$T/o" \
    && ok "--chunks gives a question without \"chunks\" its chunks" \
    || not_ok "--chunks default"
"$RUN" --help | grep -q -- "--batch-size N" && ok "--help lists --batch-size" || not_ok "--help lists --batch-size"
# the progress line: on a terminal only
if command -v script > /dev/null 2>&1; then
    script -qec "$RUN -m $M -n 4 --batch $T/q.jsonl > $T/tty.out" /dev/null > "$T/tty" 2>&1
    grep -q "questions, .* tok/s" "$T/tty" && ok "a progress line on a terminal" || not_ok "progress line on a terminal"
    "$RUN" -m "$M" -n 4 --batch "$T/q.jsonl" > /dev/null 2>"$T/err"
    [ ! -s "$T/err" ] && ok "no progress line when stderr is not a terminal" || not_ok "progress without a terminal"
else
    skip "the progress line" "no script(1)"
fi

# --- the default model: greedy answers identical to lone runs, and the example pipeline
if D=$(default_model); then
    # the documents the first six questions need, in 128-token chunks
    python3 -c 'import json
for l in list(open("examples/questions.jsonl"))[:6]:
    print("\n".join("examples/corpus/" + n for n in json.loads(l)["needs"]))' | sort -u > "$T/docs"
    # shellcheck disable=SC2046
    "$CHUNK" -m "$D" --tokens 128 $(cat "$T/docs") > "$T/ex.jsonl"
    "$PRE" -m "$D" -t 2 --store "$T/ds" -q "$T/ex.jsonl" > "$T/dpre.jsonl"
    python3 - "$T/dpre.jsonl" "$T" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
t = sys.argv[2]
qs = [json.loads(l) for l in open("examples/questions.jsonl", encoding="utf-8")][:6]
with open(f"{t}/dq.jsonl", "w", encoding="utf-8") as f:
    for i, q in enumerate(qs):
        ch = [r for n in q["needs"] for r in recs if r["doc"].endswith("/" + n)]
        with open(f"{t}/dc{i}.jsonl", "w", encoding="utf-8") as g:
            g.write("".join(json.dumps(r) + "\n" for r in ch))
        f.write(json.dumps({"id": i, "question": q["question"], "chunks": [r["kv"] for r in ch]}) + "\n")
        open(f"{t}/dq{i}", "w", encoding="utf-8").write(q["question"])
PY
    rm -rf "$T/lone"; mkdir "$T/lone"
    for i in 0 1 2 3 4 5; do
        "$RUN" -m "$D" -t 2 --store "$T/ds" --chunks "$T/dc$i.jsonl" -n 32 -p "$(cat "$T/dq$i")" > "$T/lone/$i" 2>/dev/null
    done
    "$RUN" -m "$D" -t 2 --store "$T/ds" -n 32 --batch "$T/dq.jsonl" > "$T/db.jsonl" 2>"$T/err"; rc=$?
    if [ $rc -eq 0 ] && compare "$T/db.jsonl" "$T/lone"; then ok "SmolLM2: 6 blended greedy answers batched = lone runs"
    else not_ok "SmolLM2 batched answers (exit $rc)"; fi
    CB_MODEL=$D CB_EXAMPLE_DIR=$T/example sh examples/batch.sh > "$T/ex.out" 2>&1; rc=$?
    if [ $rc -eq 0 ] && grep -q '"answer"' "$T/example/answers.jsonl" && grep -q "answered" "$T/ex.out"; then
        ok "examples/batch.sh: retrieve, precompute, batch-answer"
    else
        not_ok "examples/batch.sh (exit $rc)"; sed 's/^/#   /' "$T/ex.out" | tail -5
    fi
else
    skip "SmolLM2 batched answers and examples/batch.sh" "default model not fetched"
fi
done_testing
