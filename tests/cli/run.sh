#!/bin/sh
# cb-run generation through the real binary: output, limits, stop strings,
# the --stats object, exit statuses; and, with the default model and with
# Gemma-3-270M, a few factual answers that a working engine gets right.
. "$(dirname "$0")/lib.sh"
RUN=$BINDIR_B/cb-run
TINY=$CB_TEST_TMP/tiny-q8_0.gguf

expect_exit "generate on the tiny model" 0 "$RUN" -m "$TINY" -p "The capital" -n 8 -t 2 --stats "$T/stats.json"
[ -s "$T/out" ] && ok "it prints an answer" || not_ok "it prints an answer"
python3 - "$T/stats.json" <<'PY' && ok "--stats has the contract's fields" || not_ok "--stats fields"
import json, sys
s = json.load(open(sys.argv[1]))
need = ["mode", "n_prompt_tokens", "n_cached_tokens", "n_recomputed_tokens", "ratio", "ttft_ms",
        "prefill_ms", "load_ms", "n_gen_tokens", "gen_ms", "prefill_tok_s", "gen_tok_s"]
missing = [k for k in need if k not in s]
assert not missing, missing
assert s["mode"] == "full" and s["n_cached_tokens"] == 0 and 0 < s["n_gen_tokens"] <= 8, s
assert s["n_prompt_tokens"] > 2 and s["ttft_ms"] > 0, s
PY
"$RUN" -m "$TINY" -p "abc" -n 5 --raw --stats - 2>"$T/err" >/dev/null
grep -q '"n_gen_tokens"' "$T/err" && ok "--stats - writes to stderr" || not_ok "--stats - writes to stderr"
a=$("$RUN" -m "$TINY" -p "x y z" -n 12 --temp 0)
b=$("$RUN" -m "$TINY" -p "x y z" -n 12 --temp 0)
[ "$a" = "$b" ] && ok "greedy is deterministic" || not_ok "greedy is deterministic"
a=$("$RUN" -m "$TINY" -p "x y z" -n 12 --temp 1 -s 7)
b=$("$RUN" -m "$TINY" -p "x y z" -n 12 --temp 1 -s 7)
[ "$a" = "$b" ] && ok "a seed repeats" || not_ok "a seed repeats"
full=$("$RUN" -m "$TINY" -p "q" -n 20 --raw)
if [ ${#full} -gt 4 ]; then
    stop=$(printf %s "$full" | cut -c3-4)
    cut=$("$RUN" -m "$TINY" -p "q" -n 20 --raw --stop "$stop")
    case "$full" in "$cut$stop"*) ok "--stop ends the answer before the stop string" ;;
    *) not_ok "--stop (full '$full', stop '$stop', got '$cut')" ;; esac
else
    skip "--stop" "tiny model answered too briefly"
fi
echo "prompt from stdin" | "$RUN" -m "$TINY" -n 3 > "$T/o" && [ -s "$T/o" ] && ok "prompt from stdin" || not_ok "prompt from stdin"
# the answer is a line into a file or pipe too: its bytes (those --batch
# puts in "answer", with U+FFFD for each byte of invalid UTF-8), then one
# newline; a score is one number on its line
"$RUN" -m "$TINY" -p "x y z" -n 12 --temp 0 > "$T/ans" &&
    printf '{"question": "x y z", "n_predict": 12}\n' | "$RUN" -m "$TINY" --temp 0 --batch > "$T/ans.jsonl" &&
    python3 -c 'import json, sys
d = open(sys.argv[1], "rb").read()
a = json.loads(open(sys.argv[2]).read())["answer"]
t = "".join("\ufffd" if 0xDC80 <= ord(c) <= 0xDCFF else c for c in d[:-1].decode("utf-8", "surrogateescape"))
sys.exit(not (len(d) > 1 and d.endswith(b"\n") and t == a))' "$T/ans" "$T/ans.jsonl" &&
    ok "the answer ends with one newline, not its own" || not_ok "the answer's final newline"
"$RUN" -m "$TINY" -p "x y z" --score " a b" > "$T/sc" && [ "$(wc -l < "$T/sc")" -eq 1 ] &&
    grep -qx '[0-9][0-9.]*' "$T/sc" && ok "--score prints one number and a newline" || not_ok "--score output: $(cat "$T/sc")"
expect_exit "unknown mode" 64 "$RUN" -m "$TINY" -p hi --mode warp
expect_exit "bad number" 64 "$RUN" -m "$TINY" -p hi -n lots
expect_exit "prompt longer than the context" 65 "$RUN" -m "$TINY" -p "one two three four five six" -c 4
python3 -c '
import struct, sys
k, v = b"general.architecture", b"mamba"
sys.stdout.buffer.write(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(k)) + k
                        + struct.pack("<IQ", 8, len(v)) + v)' > "$T/mamba.gguf"
expect_exit "unsupported architecture" 65 "$RUN" -m "$T/mamba.gguf" -p hi
grep -q mamba "$T/err" && ok "the architecture is named" || not_ok "the architecture is named"
expect_exit "unsupported RoPE scaling type" 65 "$RUN" -m "$CB_TEST_TMP/tiny-yarn.gguf" -p hi
grep -q "'yarn'" "$T/err" && ok "the RoPE scaling type is named" || not_ok "the RoPE scaling type is named"
for a in qwen3 gemma3 llama3; do
    expect_exit "generate on the tiny $a model" 0 "$RUN" -m "$CB_TEST_TMP/tiny-$a.gguf" -p "The capital" -n 4
done
expect_exit "missing model" 66 "$RUN" -m "$T/nope.gguf" -p hi
expect_exit "stats file in a missing directory" 73 "$RUN" -m "$TINY" -p hi -n 2 --stats "$T/no/such/dir/s.json"
# a FIFO (as /dev/null or /dev/stdout would be) is written where it is, not replaced by a file
mkfifo "$T/fifo" && { cat "$T/fifo" > "$T/fifo.got" & rd=$!; } &&
    "$RUN" -m "$TINY" -p hi -n 2 --stats "$T/fifo" --logits-out "$T/fifo.lg" > /dev/null 2>&1; rc=$?
kill $rd 2>/dev/null; wait $rd 2>/dev/null
[ $rc -eq 0 ] && [ -p "$T/fifo" ] && grep -q '"n_gen_tokens"' "$T/fifo.got" \
    && ok "--stats into a FIFO: written through it, the FIFO left a FIFO" \
    || not_ok "--stats into a FIFO (exit $rc; $(ls -l "$T/fifo"); got $(wc -c < "$T/fifo.got") bytes)"
"$RUN" --help | grep -q -- "--device DEV" && ok "--help lists --device" || not_ok "--help lists --device"
"$RUN" --help > "$T/help"
[ "$(wc -l < "$T/help")" -le 70 ] && tail -n 1 "$T/help" | grep -q -- "--tune help" && tail -n 1 "$T/help" | grep -q TUNING \
    && ok "--help fits 70 lines and ends pointing to --tune help and TUNING" || not_ok "--help: $(wc -l < "$T/help") lines"
# the research knobs: --tune KEY=VALUE only, each listed by --tune help and in cb-run(1)'s TUNING
man_keys=$(sed -n '/^\.Sh TUNING/,/^\.Sh /p' man/man1/cb-run.1 | sed -n 's/^\.It Cm \([a-z-]*\) .*/\1/p' | sort)
"$RUN" --tune help > "$T/keys" && tune_keys=$(awk '{sub(/=.*/, "", $1); print $1}' "$T/keys" | sort) \
    && [ -n "$tune_keys" ] && [ "$tune_keys" = "$man_keys" ] \
    && ok "--tune help lists the keys of cb-run(1)'s TUNING, one line each ($(echo $tune_keys | wc -w))" \
    || not_ok "--tune help keys '$(echo $tune_keys)' against TUNING's '$(echo $man_keys)'"
moved=""
for k in $tune_keys; do grep -q -- "--$k\b" "$T/help" && moved="$moved $k"; done
[ -z "$moved" ] && ok "--help leaves the knobs to --tune" || not_ok "--help still lists:$moved"
expect_exit "--tune with an unknown key" 64 "$RUN" -m "$TINY" -p hi --tune warp=9
grep -q "warp" "$T/err" && ok "the unknown key is named" || not_ok "the unknown key is named"
expect_exit "--tune mass out of range" 64 "$RUN" -m "$TINY" -p hi --tune mass=1.5
grep -q -- "--tune mass: '1.5' is not a number in \[0, 1\]" "$T/err" && ok "the bad value names its key and range" || not_ok "the bad value's message"
expect_exit "--tune key-temp without a value" 64 "$RUN" -m "$TINY" -p hi --tune key-temp
expect_exit "--tune deviation not k or v" 64 "$RUN" -m "$TINY" -p hi --tune deviation=q
expect_exit "a knob as an option of its own (--mass)" 64 "$RUN" -m "$TINY" -p hi --mass 0.5
expect_exit "--tune no-context alone" 0 "$RUN" -m "$TINY" -p hi -n 1 --tune no-context --tune check-layer=1

if M=$(smol_model); then
    # Without --system, SmolLM2's own template writes its default system turn ("You are a
    # helpful AI assistant named SmolLM, ..."); these questions were chosen without one (as
    # llama.cpp's built-in chatml renders), and the 135M model's recall shifts with it.
    "$RUN" -m "$M" -t 2 -n 1 -p hi --stats "$T/sys.json" > /dev/null &&
        "$RUN" -m "$M" -t 2 -n 1 -p hi --system '' --stats "$T/nosys.json" > /dev/null &&
        python3 -c 'import json, sys
a, b = (json.load(open(f))["n_prompt_tokens"] for f in sys.argv[1:])
sys.exit(not a - b > 10)' "$T/sys.json" "$T/nosys.json" &&
        ok "SmolLM2: no --system is the template's own system turn, --system '' none" ||
        not_ok "SmolLM2: no --system is the template's own system turn, --system '' none"
    ask() { "$RUN" -m "$M" -t 2 -n 48 --system '' -p "$1"; }
    for qa in "What is the capital of France?|Paris" \
              "How many days are in a week?|7\|seven" \
              "What is the boiling point of water in Celsius?|100" \
              "Who painted the Mona Lisa?|Leonardo"; do
        q=${qa%%|*}; a=${qa#*|}
        got=$(ask "$q")
        if printf %s "$got" | grep -qi "$a"; then ok "SmolLM2: $q"; else not_ok "SmolLM2: $q -> $got"; fi
    done
    # the demo keeps to its own store: the user's default one is not made or touched
    mkdir -p "$T/xdg"
    XDG_CACHE_HOME=$T/xdg CB_STORE='' CB_MODEL=$M CB_DEMO_QUESTIONS=1 sh examples/demo.sh > "$T/demo.out" 2>&1; rc=$?
    if [ $rc = 0 ] && [ ! -e "$T/xdg/cacheblend/store" ] && [ -f "$T/xdg/cacheblend/demo-store/store.json" ] &&
        grep -q "demo-store" "$T/demo.out"; then
        ok "examples/demo.sh stores only into its own store, and names it"
    else
        not_ok "examples/demo.sh's store (exit $rc; $(ls "$T/xdg/cacheblend" 2>&1 | tr '\n' ' '))"; tail -3 "$T/demo.out" | sed 's/^/#   /'
    fi
else
    skip "SmolLM2 factual answers" "SmolLM2 not fetched (make model MODEL=smollm2)"
fi

# The default model (Qwen2.5-Coder-1.5B), end to end: the program's own
# default (no -m), the demo's first two-hop question from its two chunks
# in full prefill, then blended from their stored caches, on the default
# path; one full prefill on the exact path.
if D=$(default_model); then
    Q="In which town was the founder of Heliograph Audio born? Answer in a few words."
    for f in companies/heliograph-audio.md people/emeric-strand-halvorsen.md; do
        python3 -c 'import json, sys; print(json.dumps({"text": open(sys.argv[1], encoding="utf-8").read()}))' \
            "examples/corpus/$f"
    done > "$T/q.jsonl"
    for spec in full blend blend exact; do  # the first blend stores the chunks, the second reuses them
        mode=${spec%exact}; mode=${mode:-full}; x=""; [ "$spec" = exact ] && x=--exact
        got=$(CB_MODEL="$D" "$RUN" -t 2 -n 8 $x --store "$T/dstore" --chunks "$T/q.jsonl" --mode "$mode" \
            --stats "$T/ds.json" -p "$Q")
        if printf %s "$got" | grep -q "Kelby Strand"; then ok "default model, $spec: $got"
        else not_ok "default model, $spec -> $got"; fi
    done
    python3 - "$T/ds.json" <<'PY' && ok "the --exact run said so" || not_ok "the --exact run's stats"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["mode"] == "full" and "8-bit" not in s["device"], s
PY
else
    skip "default model end to end" "the default model is not fetched (make model)"
fi

# Gemma-3-270M (the base model, no chat template: completion-style prompts);
# then one answer that needs a chunk, blended from its cache.
if G=$(gemma_model); then
    for qa in "What is the capital of Japan?|Tokyo" \
              "What is the largest planet in the solar system?|Jupiter" \
              "Who wrote Romeo and Juliet?|Shakespeare" \
              "What is the boiling point of water in Celsius?|100"; do
        q=${qa%%|*}; a=${qa#*|}
        got=$("$RUN" -m "$G" -t 2 -n 12 -p "Question: $q
Answer:")
        if printf %s "$got" | grep -qi "$a"; then ok "Gemma-3-270M: $q"; else not_ok "Gemma-3-270M: $q -> $got"; fi
    done
    printf '%s\n' '{"text":"The Norden Bridge was designed by the engineer Alice Brown, who studied in Delft."}' \
        '{"text":"The Norden Bridge spans the river Vale and is 1,240 metres long."}' > "$T/g.jsonl"
    for mode in full blend blend; do  # the first blend computes and stores the chunks, the second reuses them
        got=$("$RUN" -m "$G" -t 2 -n 8 --store "$T/gstore" --chunks "$T/g.jsonl" --mode $mode --stats "$T/gs.json" \
            -p "Question: Who designed the Norden Bridge?
Answer:")
        if printf %s "$got" | grep -q "Alice Brown"; then ok "Gemma-3-270M $mode answer from chunks"
        else not_ok "Gemma-3-270M $mode answer from chunks -> $got"; fi
    done
    python3 - "$T/gs.json" <<'PY' && ok "Gemma-3-270M blend reused the stored chunks" || not_ok "Gemma-3-270M blend stats"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["mode"] == "blend" and s["n_cached_tokens"] > 20 and 0 < s["n_recomputed_tokens"] < s["n_cached_tokens"], s
PY
else
    skip "Gemma-3-270M factual answers" "Gemma-3-270M not fetched (make model MODEL=gemma)"
fi
done_testing
