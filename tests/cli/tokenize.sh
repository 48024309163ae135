#!/bin/sh
# cb-run --tokenize / --detokenize through real pipes: round trips, the
# contract's output format, and exit statuses for bad input.
. "$(dirname "$0")/lib.sh"
RUN=$BINDIR_B/cb-run
TINY=$CB_TEST_TMP/tiny-vocab.gguf

expect_exit "--help" 0 "$RUN" --help
grep -q -- "--tokenize" "$T/out" && ok "--help names --tokenize" || not_ok "--help names --tokenize"
expect_exit "--version" 0 "$RUN" --version
expect_exit "generation needs a full model" 65 "$RUN" -m "$TINY" -p hi
expect_exit "unknown option" 64 "$RUN" --tokenize --bogus
expect_exit "missing model" 66 "$RUN" --tokenize -m "$T/none.gguf" -p hi
grep -q "$T/none.gguf" "$T/err" && ok "missing model is named" || not_ok "missing model is named"
printf 'GGUF\003\000\000\000garbage' > "$T/bad.gguf"
expect_exit "malformed model" 65 "$RUN" --tokenize -m "$T/bad.gguf" -p hi
grep -q "bad.gguf" "$T/err" && ok "malformed model is named" || not_ok "malformed model is named"
expect_exit "missing input file" 66 "$RUN" --tokenize -m "$TINY" -f "$T/none.txt"

printf 'The capital of France is Paris.\n\nint main(void) { return 0; }  \t x' > "$T/in.txt"
expect_exit "tokenize a file" 0 "$RUN" --tokenize -m "$TINY" -f "$T/in.txt"
cp "$T/out" "$T/ids"
grep -qE '^[0-9]+( [0-9]+)*$' "$T/ids" && ok "output is one line of space-separated ids" || not_ok "output format"
"$RUN" --tokenize -m "$TINY" < "$T/in.txt" > "$T/ids2" && cmp -s "$T/ids" "$T/ids2" \
    && ok "stdin gives the same ids as -f" || not_ok "stdin gives the same ids as -f"
"$RUN" --detokenize -m "$TINY" -f "$T/ids" > "$T/back" && cmp -s "$T/in.txt" "$T/back" \
    && ok "detokenize(tokenize(file)) is the file, byte for byte" || not_ok "round trip through pipes"
"$RUN" --tokenize -m "$TINY" -p 'Paris' | "$RUN" --detokenize -m "$TINY" > "$T/p" && [ "$(cat "$T/p")" = "Paris" ] \
    && ok "pipe tokenize | detokenize" || not_ok "pipe tokenize | detokenize"
expect_exit "id out of range" 65 "$RUN" --detokenize -m "$TINY" -p '1 2 999999'
grep -q "999999" "$T/err" && ok "bad id is named" || not_ok "bad id is named"
expect_exit "not a number" 65 "$RUN" --detokenize -m "$TINY" -p '1 x2'
a=$("$RUN" --tokenize -m "$TINY" -p '<|im_start|>')
b=$("$RUN" --tokenize --special -m "$TINY" -p '<|im_start|>')
[ "$b" = "1" ] && [ "$a" != "1" ] && ok "--special matches control tokens, default does not" \
    || not_ok "--special ($a / $b)"
[ "$("$RUN" --detokenize --special -m "$TINY" -p 1)" = "<|im_start|>" ] && ok "--detokenize --special renders control tokens" \
    || not_ok "--detokenize --special"
if [ -w /dev/full ]; then
    expect_exit "write error on stdout" 74 sh -c "'$RUN' --tokenize -m '$TINY' -p hi > /dev/full"
fi

if M=$(smol_model); then
    [ "$("$RUN" --tokenize -m "$M" -p 'Hello world')" = "19556 905" ] && ok "SmolLM2: 'Hello world' is 19556 905" \
        || not_ok "SmolLM2: Hello world"
    "$RUN" --tokenize -f "$T/in.txt" | "$RUN" --detokenize | cmp -s - "$T/in.txt" \
        && ok "SmolLM2 (default model via the cache path): round trip" || not_ok "SmolLM2 round trip"
else
    skip "SmolLM2 tokenize" "default model not fetched"
    skip "SmolLM2 round trip" "default model not fetched"
fi
done_testing
