#!/bin/sh
# Bounded prompts: a prompt (or a --batch line) past the context the model
# was trained for, or past -c, is refused with exit 65 and a message naming
# both lengths, before its cache is allocated; -c past the trained context
# is a usage error (64); a huge prompt is refused from its bytes alone,
# untokenized; and a context more than the memory available is refused
# before it is taken.  On the tiny llama fixture: no merges of "a", so a
# raw prompt of N "a" is N tokens; a context of 512 tokens as trained.
. "$(dirname "$0")/lib.sh"
M=$CB_TEST_TMP/tiny-q8_0.gguf
need_fixture "$M" "bounded prompts"
RUN="$BINDIR_B/cb-run"
BUILD=${BUILD:-build/rel}
a() { python3 -c "import sys; sys.stdout.write('a' * int(sys.argv[1]))" "$1"; }
a 511 > "$T/a511"
a 512 > "$T/a512"

expect_exit "a raw prompt of 511 tokens fits the trained context of 512" 0 \
    "$RUN" -m "$M" -t 1 --raw -n 4 -f "$T/a511"
expect_exit "one of 512 tokens does not" 65 "$RUN" -m "$M" -t 1 --raw -n 1 -f "$T/a512"
grep -q 'the prompt has 512 tokens; the model.s context holds 512' "$T/err" \
    && ok "the message names both lengths: $(head -c 120 "$T/err")" \
    || not_ok "message: $(head -c 200 "$T/err")"
python3 -c "print(' '.join(['one two three four'] * 200))" > "$T/long"
start=$(date +%s)
expect_exit "a templated prompt of about 2,800 tokens" 65 "$RUN" -m "$M" -t 1 -n 1 -f "$T/long"
[ $(($(date +%s) - start)) -le 5 ] && grep -q 'the prompt has [0-9]* tokens; the model.s context holds 512' "$T/err" \
    && ok "refused at once, its length named" || not_ok "slow or unnamed: $(head -c 200 "$T/err")"

# -c
expect_exit "-c past the trained context" 64 "$RUN" -m "$M" -t 1 -c 513 -n 1 -p "one"
grep -q -- '-c 513: more than the model.s context (512 tokens' "$T/err" \
    && ok "it says the trained context" || not_ok "message: $(head -c 200 "$T/err")"
expect_exit "-c 512 is the trained context" 0 "$RUN" -m "$M" -t 1 -c 512 -n 1 -p "one"
expect_exit "a prompt past -c" 65 "$RUN" -m "$M" -t 1 --raw -c 100 -n 1 -f "$T/a511"
grep -q 'the prompt has 511 tokens; the context holds 100' "$T/err" \
    && ok "it names the prompt and -c" || not_ok "message: $(head -c 200 "$T/err")"
L=$CB_TEST_TMP/tiny-llama-linear.gguf
if [ -f "$L" ]; then
    # the GGUF's context_length is the context as trained, RoPE scaling included
    expect_exit "linear RoPE scaling (factor 4) does not extend a context_length of 512" 64 \
        "$RUN" -m "$L" -t 1 -c 2048 -n 1 -p "one"
else
    skip "-c on a RoPE-scaled model" "no fixture $L"
fi
expect_exit "--batch: -c past the trained context" 64 \
    sh -c 'echo "{\"question\":\"one\"}" | "$1" -m "$2" -t 1 -c 100000 --batch' sh "$RUN" "$M"

# a --batch line past the context: its error, the others answered
{
    echo '{"id":"short","question":"one two"}'
    python3 -c "import json; print(json.dumps({'id': 'long', 'question': 'a' * 600}))"
    echo '{"id":"after","question":"three four"}'
} > "$T/q.jsonl"
"$RUN" -m "$M" -t 1 --raw -n 2 --batch "$T/q.jsonl" > "$T/b.out" 2> "$T/b.err"; rc=$?
python3 - "$T/b.out" <<'PY' && [ $rc -eq 65 ] && ok "--batch: the long line gets its error, the others their answers (exit 65)" \
    || { not_ok "--batch with a long line (exit $rc)"; sed 's/^/#   /' "$T/b.out" "$T/b.err" | head -6; }
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
assert [x["id"] for x in a] == ["short", "long", "after"], a
assert "answer" in a[0] and "answer" in a[2] and "error" not in a[0], a
assert "600 tokens" in a[1]["error"] and "512" in a[1]["error"] and a[1]["line"] == 2, a[1]
PY

# huge inputs: refused from their bytes, in bounded memory (ulimit -v, in KiB)
python3 -c "import sys; sys.stdout.write(('one two three four five six seven eight nine ten ' * 220000)[:10485760])" > "$T/big"
start=$(date +%s)
(ulimit -v 300000 && exec "$RUN" -m "$M" -t 1 -n 1 -f "$T/big") > /dev/null 2> "$T/err"; rc=$?
[ $rc -eq 65 ] && [ $(($(date +%s) - start)) -le 5 ] && grep -q 'the prompt has 10485[0-9]* bytes' "$T/err" \
    && ok "a 10 MB prompt: exit 65 at once within 300 MB of address space ($(head -c 100 "$T/err"))" \
    || { not_ok "10 MB prompt (exit $rc)"; sed 's/^/#   /' "$T/err" | head -3; }
python3 - "$T/big" > "$T/bq.jsonl" <<'PY'
import json, sys
print(json.dumps({"id": "small", "question": "one two"}))
print(json.dumps({"id": "big", "question": open(sys.argv[1]).read()}))
PY
(ulimit -v 400000 && exec "$RUN" -m "$M" -t 1 -n 2 --batch "$T/bq.jsonl") > "$T/b.out" 2> "$T/b.err"; rc=$?
python3 - "$T/b.out" <<'PY' && [ $rc -eq 65 ] && ok "--batch: a 10 MB line is refused (exit 65), not out of memory" \
    || { not_ok "--batch with a 10 MB line (exit $rc)"; sed 's/^/#   /' "$T/b.err" | head -3; }
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
assert "answer" in a[0] and "bytes" in a[1]["error"], a
PY

# the memory a context takes, checked before it is taken: a model trained
# for 2^24 positions, its f32 cache at -c 16777215 is about a terabyte
H=$T/huge-ctx.gguf
if "$BUILD/tests/cb-gen-fixture" --layers 4 --heads 16 --kv-heads 16 --head-dim 128 --ctx 16777216 \
        --type q8_0 "$H" 2> "$T/err"; then
    start=$(date +%s)
    expect_exit "a context larger than the memory available" 70 \
        "$RUN" -m "$H" -t 1 --kv-type f32 -c 16777215 -n 1 -p "one" --device cpu
    [ $(($(date +%s) - start)) -le 10 ] && grep -q 'KV cache [0-9]* MiB.*MiB of memory are available' "$T/err" \
        && ok "refused at once, the sizes named: $(head -c 140 "$T/err")" \
        || not_ok "memory message: $(head -c 200 "$T/err")"
    expect_exit "--batch: -c larger than the memory available" 70 \
        sh -c 'echo "{\"question\":\"one\"}" | "$1" -m "$2" -t 1 --kv-type f32 -c 16777215 --device cpu --batch' sh "$RUN" "$H"
else
    skip "the memory check" "cb-gen-fixture failed: $(head -c 100 "$T/err")"
fi
done_testing
