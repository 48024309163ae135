#!/bin/sh
# A model file truncated under a running program: the next read of its
# mapping faults (SIGBUS), and the program ends with a message and exit 74
# instead of a crash.  cb-run --batch reading a FIFO holds the model
# loaded while the file is truncated in place, then gets a question.
. "$(dirname "$0")/lib.sh"
M=$CB_TEST_TMP/tiny-q8_0.gguf
need_fixture "$M" "a model truncated under cb-run"
cp "$M" "$T/m.gguf" && mkfifo "$T/fifo" || { skip "a model truncated under cb-run" "no FIFO"; done_testing; exit; }
timeout 60 "$BINDIR_B/cb-run" -m "$T/m.gguf" -t 1 -n 4 -v --batch "$T/fifo" > "$T/out" 2> "$T/err" &
pid=$!
exec 3<> "$T/fifo" # read-write: opens without waiting for the reader
i=0
while ! grep -q '^cb-run: batch:' "$T/err" 2>/dev/null && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
: > "$T/m.gguf" # truncated in place: the same file, now empty
echo '{"question":"one two"}' >&3
exec 3>&-
wait $pid; rc=$?
[ $rc -eq 74 ] && grep -q 'cb-run: a mapped file (the model or a KV file) was truncated' "$T/err" \
    && ok "the model truncated under cb-run --batch: exit 74 with a message, not SIGBUS" \
    || { not_ok "truncated model (exit $rc; 135 is SIGBUS)"; sed 's/^/#   /' "$T/err" | head -4; }
done_testing
