#!/bin/sh
# tests/fuzz/cov.sh COVDIR FUZZDIR CORPUS [NAME...] - line coverage of the
# code each harness targets.  COVDIR/fuzz_NAME is the harness built with
# clang's source-based coverage (make fuzz-cov); it replays CORPUS/NAME and
# FUZZDIR/seeds/NAME once (-runs=0, with run.sh's -max_len), and
# llvm-profdata/llvm-cov (the version of clang's, else unversioned) report
# the lines of each target file reached, then the harness's total over its
# files.  Profiles and the full reports: COVDIR/report/.
covdir=$1 fdir=$2 corpus=$3
shift 3 || { echo "usage: cov.sh COVDIR FUZZDIR CORPUS [NAME...]" >&2; exit 64; }
[ -n "$*" ] || set -- $(cd "$covdir" && ls fuzz_* | sed 's/^fuzz_//')
. "$(dirname "$0")/maxlen.sh"
ver=${FUZZ_CC##*clang-}
prof=$(command -v llvm-profdata-$ver || command -v llvm-profdata)
cov=$(command -v llvm-cov-$ver || command -v llvm-cov)
if [ -z "$prof" ] || [ -z "$cov" ]; then
    echo "fuzz-cov: llvm-profdata and llvm-cov are missing (apt-get install llvm-$ver)" >&2; exit 69
fi
# What each harness is for: source files whose executable lines count, as
# FILE (all of it) or FILE:NAMES (only its functions NAMES, an alternation
# of regular expressions: the parts of a program, or of a file that also
# holds a writer, that the harness drives).
targets() {
    case $1 in
    gguf) echo lib/infer/gguf.c lib/infer/vocab_load.c lib/infer/vocab_special.c lib/infer/vocab_pretok.c lib/infer/vocab_bpe.c lib/infer/vocab_spm.c lib/infer/chat.c lib/infer/fingerprint.c ;;
    model) echo lib/infer/model.c lib/infer/forward.c ;;
    kvfile) echo "lib/kv/kvfile.c:kv_open|cb_kvfile_open|cb_kvfile_free|cb_kvfile_meta|cb_kvfile_size|cb_kvfile_read_layer|cb_kvfile_verify|load_layer|read_at|read_fd|release_input|parse_fixed|check_magic|cb_kv_header_size|cb_kv_tokens_hash|bad|kv_type_ok|get32|get64" ;;
    tok_bpe|tok_spm) echo lib/infer/vocab_load.c lib/infer/vocab_special.c lib/infer/vocab_pretok.c lib/infer/vocab_bpe.c lib/infer/vocab_spm.c lib/infer/vocab_encode.c lib/infer/vocab_decode.c ;;
    records) echo "src/cb-precompute.c:emit" \
        "src/cli.c:cli_read_records|cli_read_input|cli_question_parse|cli_question_free|q_chunks|q_stops|q_enum|q_params" \
        "lib/prompt/prompt.c:add_seg|push_all|add_head|add_chunk|add_chunk_key|add_tail|build|cb_prompt_build|cb_prompt_build_from|cb_prompt_free|cb_prompt_segments|cb_prompt_n_tokens|cb_prompt_n_chunks" ;;
    profile) echo lib/kv/profile.c ;;
    store_conf) echo "lib/store/store.c:read_config|check_tiers|tier_name_valid|abs_path|marker_path|marker_check|open_store|cb_store_open|cb_store_close|cb_store_tier_info|open_lock_file|dir_readonly|shared_id_of" ;;
    import) echo "lib/store/archive.c:cb_store_import|bad_name|base_name|import_room|read_upto|write_all|stage_member" lib/store/entry.c ;;
    chunk_input) echo "src/cb-chunk.c:chunk_doc|archive_open|read_entry|member_name|do_buffer|write_record|json_name" lib/infer/chunk.c ;;
    esac
}
# Executable lines and lines run, of llvm-cov show's listing ("N|count|text").
count_lines() {
    awk -F'|' 'NF >= 3 && $1 ~ /^ *[0-9]+ *$/ { c = $2; gsub(/ /, "", c); if (c != "") { n++; if (c != "0") r++ } }
               END { printf "%d %d\n", n, r }'
}
out=$covdir/report
mkdir -p "$out"
export CB_FUZZ_TMP="${CB_FUZZ_TMP:-$(mktemp -d)}"
export CB_FUZZ_DATA="$(cd "$fdir" && pwd)/data"
printf '%-12s %-24s %8s %8s %7s\n' harness file lines covered percent
for h in "$@"; do
    bin=$covdir/fuzz_$h
    [ -x "$bin" ] || { echo "fuzz-cov: $bin not built" >&2; exit 70; }
    dirs=$fdir/seeds/$h
    [ -d "$corpus/$h" ] && dirs="$corpus/$h $dirs"
    rm -f "$out/$h".*.profraw
    # one profile per process (%p): harnesses may fork
    LLVM_PROFILE_FILE="$out/$h.%p.profraw" "$bin" -runs=0 -max_len="$(max_len "$h")" -close_fd_mask=1 \
        $dirs >"$out/$h.log" 2>&1 || { echo "fuzz-cov: $h: replay failed, see $out/$h.log" >&2; exit 70; }
    "$prof" merge -sparse -o "$out/$h.profdata" "$out/$h".*.profraw || exit 70
    rm -f "$out/$h".*.profraw
    tn=0 tr=0
    for t in $(targets "$h"); do
        file=${t%%:*} re=
        [ "$file" = "$t" ] || re=${t#*:}
        set -- $("$cov" show "$bin" -instr-profile="$out/$h.profdata" ${re:+"-name-regex=(^|:)($re)\$"} "$file" | count_lines)
        tn=$((tn + $1)) tr=$((tr + $2))
        printf '%-12s %-24s %8d %8d %6.1f%%\n' "$h" "$(basename "$file")${re:+ (part)}" "$1" "$2" \
            "$(echo "$1 $2" | awk '{ print $1 ? 100 * $2 / $1 : 0 }')"
    done
    printf '%-12s %-24s %8d %8d %6.1f%%\n' "$h" TOTAL "$tn" "$tr" "$(echo "$tn $tr" | awk '{ print $1 ? 100 * $2 / $1 : 0 }')"
    inputs=$(sed -n 's/^#\([0-9]*\).*INITED.*/\1/p' "$out/$h.log" | tail -1)
    echo "# $h: ${inputs:-?} corpus inputs replayed ($dirs)"
done
