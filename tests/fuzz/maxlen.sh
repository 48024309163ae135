# tests/fuzz/maxlen.sh - sourced by run.sh and cov.sh: max_len NAME prints
# the largest input (-max_len) harness NAME is run with.
# Largest input per harness: what its seeds need, small enough to stay fast.
# The tokenizers work word by word (pre-tokenizer splits, then merges inside
# a split), so 1 KB holds dozens of words and longer words than any piece;
# a document for cb-chunk gets 8 KB, room for a tar of small members or a
# compressed one and for many 48-token chunks, as every document costs
# several tokenizer passes.
max_len() {
    case $1 in
    gguf|model) echo 32768 ;;
    kvfile|import) echo 24576 ;;
    chunk_input) echo 8192 ;;
    tok_bpe|tok_spm) echo 1024 ;;
    *) echo 4096 ;;
    esac
}
