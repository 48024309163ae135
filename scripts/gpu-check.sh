#!/bin/sh
# gpu-check.sh [STEP...] - what a session with a GPU runs first (issue 34):
#   build     nvidia-smi, then the CUDA module and every test program (CUDA=1)
#   ops       test_backend_ops: every CUDA operation against the CPU (the
#             few-row product kernel, the staging memo and the fused
#             operations and the key bias, CB_CUDA_KBIAS=1, and the
#             loader's page-locked reads, CB_CUDA_PIN=1, on; the
#             tensor-core attention, CB_CUDA_FA=1, on a
#             second backend beside the scalar kernel's, the weights kept in
#             their blocks, CB_CUDA_QW=1, on a third; `ops-cublas`: again with all three off,
#             CB_CUDA_GEMV=0 CB_CUDA_MEMO=0 CB_CUDA_FUSE=0, cuBLAS for every
#             row count and every index array sent)
#   memcheck racecheck synccheck initcheck
#             test_backend_ops under compute-sanitizer's four tools
#             (racecheck without the model-sized attention cases)
#   device    tests/cli/device.sh: CPU vs CUDA end to end, on fixtures
#   suites    every unit and CLI suite (tests/run.sh, no apt-get, no fuzzing)
#   blend     blend TTFT against full prefill on CUDA (6 x 512-token chunks,
#             cb-precompute on the GPU, cb-run --stats ttft_ms, best of 2
#             processes, and warm: best of the last 4 of 5 in one cb-run --batch,
#             probe, hkvd, and probe with CB_CUDA_MASS=0; full and probe again
#             with the paths not yet default, CB_CUDA_GEMV=1 CB_CUDA_MEMO=1
#             CB_CUDA_FUSE=1 CB_CUDA_FA=1 CB_CUDA_KBIAS=1 CB_CUDA_PIN=1: on the qwen2 one,
#             probe's stale scale), then full and probe once more each
#             way under CB_BACKEND_PROFILE=1 (each operation's calls and
#             host time); the loader alone by its reader threads
#             (bench_load, with and without CB_CUDA_PIN=1), on random-weight
#             models of SmolLM2's and Qwen2.5-1.5B's shape (their logits are
#             too chaotic to compare devices on: device does that, on SmolLM2)
#   bench     bench_engine on CUDA and on the CPU, warm, on a random-weight
#             model of SmolLM2-135M's shape and of Qwen2.5-1.5B's (the
#             engine's time does not depend on the weights' values; the
#             device machine cannot be sent the models: 64 MB at most):
#             prefill 512/2048/4096, decode after 512/4096, 16..512-row
#             batches, and 1 and 8 sequences decoded together after 512
#             tokens (cb-run --batch's decoding, issue 33); on CUDA, decoding
#             again with the few-row product kernel (CB_CUDA_GEMV=1), and
#             with it, the staging memo and the fused operations
#             (CB_CUDA_MEMO=1 CB_CUDA_FUSE=1); prefill and 512-row batches
#             again with the tensor-core attention (CB_CUDA_FA=1); and all
#             of these again with the weights kept in their blocks
#             (CB_CUDA_QW=1 beside the three)
#   racecheck-big  racecheck over the model-sized attention cases alone
#             (slow: a minute or more a case)
#   quick     the issue's figures alone, in a few minutes (a session's device
#             time is short): on both shapes, CUDA only, prefill of 4,096 and
#             decode after 512 as they are and with every path not yet
#             default ($NEXT; and the 1.5B's decode with CB_CUDA_QW=1 too),
#             an answer's decoding (cb_fwd_decode, one sequence and four)
#             likewise and with graphs (CB_CUDA_GRAPH=1 beside $NEXT),
#             and the blend's warm TTFT (full, probe, hkvd; five questions in
#             one cb-run --batch: the first is the cold figure, the best of
#             the other four the warm one) both ways, with the loader alone
#             (bench_load, default readers, page-locked)
# No STEP: all of them but quick, in that order (ops-cublas after ops).  Environment: BUILD (default
# build/rel; a NATIVE=0 build is build/rel-generic, for a device machine
# whose CPU differs from the one that built it), STEP_TIMEOUT (seconds a
# step may take, default none), GPU_BENCH_DEVICES (default "cuda cpu").  Each step's output goes to
# $GPU_LOG (default gpu-check-logs/STEP.log) and a line "STEP: ok|FAILED
# (N s)" to standard output; the exit status is 1 when a step failed.  The
# device machine has no network and a 10-minute limit a command: run the
# steps one or two at a time there (sh scripts/gpu-check.sh build ops).
set -u
SELF=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
cd "$(dirname "$0")/.." || exit 70
LOG=${GPU_LOG:-gpu-check-logs}
mkdir -p "$LOG"
S=${COMPUTE_SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}
J=$(nproc 2>/dev/null || echo 2)
BUILD=${BUILD:-build/rel}
if [ "$BUILD" = build/rel ]; then BINDIR_B=bin; CB_CUDA_MODULE=$PWD/lib/libcbcore-cuda.so
else BINDIR_B=$BUILD/bin; CB_CUDA_MODULE=$PWD/$BUILD/lib/libcbcore-cuda.so; fi
export CB_CUDA_MODULE
OPS=$BUILD/tests/test_backend_ops
# the paths built but not yet default (issue 34), as the quick step turns them on
NEXT="CB_CUDA_GEMV=1 CB_CUDA_MEMO=1 CB_CUDA_FUSE=1 CB_CUDA_FA=1 CB_CUDA_KBIAS=1 CB_CUDA_PIN=1"
TO=${STEP_TIMEOUT:+timeout $STEP_TIMEOUT}
SAN_ARGS="--target-processes application-only"
failed=0

step() { # NAME CMD...: run CMD, log it, say how it went
    name=$1; shift
    t0=$(date +%s)
    # shellcheck disable=SC2086
    if $TO sh "$SELF" --one "$@" > "$LOG/$name.log" 2>&1; then
        echo "$name: ok ($(($(date +%s) - t0)) s)"
    else
        echo "$name: FAILED ($(($(date +%s) - t0)) s; $LOG/$name.log)"; tail -5 "$LOG/$name.log" | sed 's/^/    /'
        failed=1
    fi
}

build() { nvidia-smi && case $BUILD in *-generic) make -j"$J" CUDA=1 NATIVE=0 check-tools ;; *) make -j"$J" CUDA=1 check-tools ;; esac; }
ops() { "$OPS"; }
ops_cublas() { CB_CUDA_GEMV=0 CB_CUDA_MEMO=0 CB_CUDA_FUSE=0 "$OPS"; }
# memcheck: no API-error reports, as the op tests fail an allocation of 4
# EiB on purpose (the backend checks every API call itself, and the tests
# see what it reports)
memcheck() { "$S" --tool memcheck --leak-check full --report-api-errors no $SAN_ARGS --error-exitcode 1 "$OPS"; }
# racecheck: the model-sized attention cases (2,304 keys) take a minute or
# more each under it, and a step limit cut the cases after them (topk,
# staging, attn_mass, the fault children) in every GPU session: racecheck
# runs every other case, racecheck-big those alone, last.  A hazard fails the
# step when either of its accesses is in a kernel of ours: cuBLAS's own
# Hopper kernels (nvjet_*, split-K) showed WAR hazards on the H200 that
# rewrite the value already there (385 of them in one case, a product made
# on one host thread and used on another), inside code we neither write nor
# launch ourselves; they are counted and shown, not failed
BIG_OPS='2304 keys'
race_run() {
    out=$(mktemp) || return 1
    pl=""; "$S" --help 2>/dev/null | grep -q -- --print-limit && pl="--print-limit 1000000"
    # shellcheck disable=SC2086
    "$S" --tool racecheck --racecheck-report all $pl $SAN_ARGS "$OPS" > "$out" 2>&1
    rc=$?
    cat "$out"
    ours=$(grep -E '^=+ +(Read|Write) Thread' "$out" | grep -c -v -E ' at (nvjet_|sm[0-9]+_xmma|cutlass)')
    theirs=$(grep -E '^=+ +(Read|Write) Thread' "$out" | grep -c -E ' at (nvjet_|sm[0-9]+_xmma|cutlass)')
    rm -f "$out"
    echo "race_run: test_backend_ops exit $rc; accesses in reported hazards: $ours in our kernels, $theirs in cuBLAS's"
    [ "$rc" -eq 0 ] && [ "$ours" -eq 0 ]
}
racecheck() { CB_OPS_SKIP=$BIG_OPS race_run; }
racecheck_big() { CB_OPS_ONLY=$BIG_OPS race_run; }
synccheck() { "$S" --tool synccheck $SAN_ARGS --error-exitcode 1 "$OPS"; }
initcheck() { "$S" --tool initcheck $SAN_ARGS --error-exitcode 1 "$OPS"; }
device() {
    # the fixtures tests/run.sh writes: tiny random-weight models
    mkdir -p tests/tmp && sed -n '/^gen=/,/tiny-yarn/p' tests/run.sh > tests/tmp/fixtures.sh &&
        BUILD=$BUILD CB_TEST_TMP=$PWD/tests/tmp sh tests/tmp/fixtures.sh || return 1
    BUILD=$BUILD BINDIR_B=$BINDIR_B CB_CUDA_MOD=$CB_CUDA_MODULE CB_TEST_TMP=$PWD/tests/tmp sh tests/cli/device.sh; }
suites() { BUILD=$BUILD BINDIR_B=$BINDIR_B CB_CUDA_MOD=$CB_CUDA_MODULE sh tests/run.sh; }
fixtures() { # DIR: the two random-weight models of bench and blend
    # shapes: SmolLM2-135M (30 layers, 576 wide, 9/3 heads; q8_0, as 576 is no multiple of 256) and
    # Qwen2.5-1.5B (28 layers, 1536 wide, 12/2 heads, 8960 ff; q4_K)
    $BUILD/tests/cb-gen-fixture --type q8_0 --layers 30 --embd 576 --ff 1536 --heads 9 --kv-heads 3 \
        --vocab 49152 --ctx 8192 "$1/smol.gguf" &&
        $BUILD/tests/cb-gen-fixture --arch qwen2 --type q4_K --layers 28 --embd 1536 --ff 8960 --heads 12 \
            --kv-heads 2 --vocab 151936 --untied --ctx 8192 "$1/qwen15.gguf"
}
# blend's and quick's inputs in DIR: the two models, a text of ours, and
# the question five times (warm.jsonl: cb-run --batch, one at a time)
q="Which of these places is the oldest, and why?"
blend_setup() {
    fixtures "$1" || return 1
    cat README.md man/*/*.[0-9] 2>/dev/null > "$1/text.txt"
    for _ in 1 2 3 4 5; do printf '{"question": "%s"}\n' "$q"; done > "$1/warm.jsonl"
}
# DIR MODEL: six 512-token chunks of DIR's text (DIR/MODEL.jsonl), their KV
# computed on the GPU into the store DIR/MODEL.st
blend_store() {
    "$BINDIR_B/cb-chunk" -m "$1/$2.gguf" --tokens 512 "$1/text.txt" | head -n 6 > "$1/$2.jsonl"
    "$BINDIR_B/cb-precompute" -q -m "$1/$2.gguf" --device cuda --store "$1/$2.st" "$1/$2.jsonl" > /dev/null
}
blend() {
    d=$(mktemp -d) || return 1
    blend_setup "$d" || { rm -rf "$d"; return 1; }
    rc=0
    for m in smol qwen15; do
        M=$d/$m.gguf
        blend_store "$d" "$m" || rc=1
        # probe:host-mass: probe with its score on the host (CB_CUDA_MASS=0,
        # each probed layer's queries and keys copied back), as before 2026-11-27
        # full:next, blend:probe:next: with the paths not yet default
        # (the few-row product kernel, the staging memo, the fused operations,
        # the tensor-core attention, the key bias)
        for spec in full blend:probe blend:hkvd blend:probe:host-mass full:next blend:probe:next; do
            mode=${spec%%:*}; st=${spec#*:}; mass=1; next=0
            case $spec in *:host-mass) st=${st%%:*}; mass=0 ;; *:next) st=${st%%:*}; next=1 ;; esac
            [ "$mode" = full ] && st=
            set --; [ "$mode" = blend ] && set -- --strategy "$st"
            sw="CB_CUDA_GEMV=$next CB_CUDA_MEMO=$next CB_CUDA_FUSE=$next CB_CUDA_FA=$next CB_CUDA_KBIAS=$next CB_CUDA_PIN=$next CB_CUDA_MASS=$mass"
            best=""
            for _ in 1 2; do
                # shellcheck disable=SC2086
                env $sw "$BINDIR_B/cb-run" -q -m "$M" --device cuda --store "$d/$m.st" --chunks "$d/$m.jsonl" --mode "$mode" "$@" \
                    -n 1 --stats "$d/s.json" -p "$q" > /dev/null || { rc=1; break; }
                ms=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["ttft_ms"])' "$d/s.json")
                best=$(awk -v a="$ms" -v b="$best" 'BEGIN { print (b == "" || a < b) ? a : b }')
            done
            # warm: the question five times in one process (cb-run --batch,
            # one at a time), the best of the last four: no kernel of ours or
            # cuBLAS's loaded inside them, as in bench_engine's warm figures
            # shellcheck disable=SC2086
            env $sw "$BINDIR_B/cb-run" -q -m "$M" --device cuda --store "$d/$m.st" --chunks "$d/$m.jsonl" --mode "$mode" "$@" \
                -n 1 --batch-size 1 --batch "$d/warm.jsonl" > "$d/warm.out" || rc=1
            warm=$(python3 -c 'import json, sys; v = [json.loads(l)["stats"] for l in open(sys.argv[1])][1:]; print("warm ttft_ms", min(s["first_token_ms"] - s["submit_ms"] for s in v), "prefill_ms", min(s["prefill_ms"] for s in v))' "$d/warm.out" 2>/dev/null)
            echo "$m $spec ttft_ms $best (best of 2 processes) ${warm:-warm: none} $(python3 -c 'import json, sys; s = json.load(open(sys.argv[1])); print("prompt", s["n_prompt_tokens"], "recomputed", s["n_recomputed_tokens"])' "$d/s.json")"
            echo "  last run's --stats: $(tr -d '\n ' < "$d/s.json" | cut -c1-1500)"
        done
        # the loader alone (bench_load: 6 x 512-token caches loaded with
        # nothing computed beside it), by its reader threads (0: the
        # default), its buffer pageable and page-locked (CB_CUDA_PIN=1)
        for pin in 0 1; do
            CB_CUDA_PIN=$pin CB_BENCH_DEVICE=cuda $BUILD/bench/bench_load "$M" 6 512 5 1,2,4,8,0 |
                awk -v m="$m" -v pin="$pin" '$1 ~ /^load_[0-9]+_(ms|gb_s|threads)$/ { print "  " m " loader, CB_CUDA_PIN=" pin ": " $1 " " $2 }'
        done
        # where the time goes: each backend operation's calls and host time
        # (CB_BACKEND_PROFILE=1; on the device, issuing it and any wait in it),
        # full prefill and probe, as they are and with the paths not yet default
        for next in 0 1; do
            for mode in full blend; do
                echo "$m $mode, CB_CUDA_GEMV/MEMO/FUSE/FA/PIN=$next, CB_BACKEND_PROFILE=1:"
                CB_BACKEND_PROFILE=1 CB_CUDA_GEMV=$next CB_CUDA_MEMO=$next CB_CUDA_FUSE=$next CB_CUDA_FA=$next \
                    CB_CUDA_PIN=$next "$BINDIR_B/cb-run" -q -m "$M" --device cuda --store "$d/$m.st" --chunks "$d/$m.jsonl" \
                    --mode "$mode" -n 1 -p "$q" --stats "$d/p.json" 2>&1 >/dev/null | grep '^#' | head -28
                # the loader's busy time against the computing thread's wait for it
                python3 -c 'import json, sys; s = json.load(open(sys.argv[1])); print("  ttft_ms", s["ttft_ms"], "load_ms", s["load_ms"], "stall_ms", s.get("stall_ms"), "(" + s.get("stall_clock", "host") + " clock)")' "$d/p.json"
            done
        done
    done
    rm -rf "$d"
    return $rc
}
bench() {
    d=$(mktemp -d) || return 1
    fixtures "$d" || { rm -rf "$d"; return 1; }
    # device by device: the CUDA figures of both shapes come first, so that
    # a STEP_TIMEOUT cuts the CPU's (on 16 cores the 1.5B shape's CPU rows
    # alone took over two minutes on the H200's machine)
    for dev in ${GPU_BENCH_DEVICES:-cuda cpu}; do
        for m in smol qwen15; do
            echo "== $m-shaped, random weights, on $dev ($J threads beside it); each scenario twice, the second kept"
            for sc in prefill:512 prefill:2048 prefill:4096 decode:512:64 decode:4096:64 batch:16:2048 \
                batch:64:2048 batch:512:2048 seqs:1:512 seqs:8:512; do
                CB_BENCH_DEVICE=$dev $BUILD/bench/bench_engine "$d/$m.gguf" "$J" "$sc" "$sc" |
                    awk -v sc="$sc" '$1 != "device" && $1 != "load_s" && $1 != "rss_kb" { v[$1] = $2 }
                        END { for (k in v) print "  " sc ": " k " " v[k] }'
            done
            # the few-row product kernel (CB_CUDA_GEMV=1, not yet the default):
            # decoding, and sequences decoded together in shared products
            # and with it the staging memo and the fused operations
            [ "$dev" = cuda ] && for memo in 0 1; do
                for sc in decode:512:64 seqs:1:512 seqs:8:512 batch:16:2048; do
                    CB_CUDA_GEMV=1 CB_CUDA_MEMO=$memo CB_CUDA_FUSE=$memo CB_BENCH_DEVICE=$dev $BUILD/bench/bench_engine "$d/$m.gguf" "$J" "$sc" "$sc" |
                        awk -v sc="$sc" -v memo="$memo" '$1 != "device" && $1 != "load_s" && $1 != "rss_kb" { v[$1] = $2 }
                            END { for (k in v) print "  " sc " (CB_CUDA_GEMV=1 CB_CUDA_MEMO=" memo " CB_CUDA_FUSE=" memo "): " k " " v[k] }'
                done
            done
            # the tensor-core attention (CB_CUDA_FA=1, not yet the default):
            # long prefills and the blend-sized batches, where attention is most
            [ "$dev" = cuda ] && for sc in prefill:512 prefill:2048 prefill:4096 batch:64:2048 batch:512:2048; do
                CB_CUDA_FA=1 CB_BENCH_DEVICE=$dev $BUILD/bench/bench_engine "$d/$m.gguf" "$J" "$sc" "$sc" |
                    awk -v sc="$sc" '$1 != "device" && $1 != "load_s" && $1 != "rss_kb" { v[$1] = $2 }
                        END { for (k in v) print "  " sc " (CB_CUDA_FA=1): " k " " v[k] }'
            done
            # the weights kept in their blocks (CB_CUDA_QW=1, not yet the
            # default), with the three above: decoding reads the blocks, a
            # prompt's products dequantize tiles of rows at each product
            [ "$dev" = cuda ] && for sc in prefill:512 prefill:4096 decode:512:64 seqs:1:512 seqs:8:512 batch:16:2048; do
                CB_CUDA_QW=1 CB_CUDA_GEMV=1 CB_CUDA_MEMO=1 CB_CUDA_FUSE=1 CB_BENCH_DEVICE=$dev $BUILD/bench/bench_engine "$d/$m.gguf" "$J" "$sc" "$sc" |
                    awk -v sc="$sc" '$1 != "device" && $1 != "load_s" && $1 != "rss_kb" { v[$1] = $2 }
                        END { for (k in v) print "  " sc " (CB_CUDA_QW=1 CB_CUDA_GEMV=1 CB_CUDA_MEMO=1 CB_CUDA_FUSE=1): " k " " v[k] }'
            done
        done
    done
    rm -rf "$d"
}

quick() {
    d=$(mktemp -d) || return 1
    blend_setup "$d" || { rm -rf "$d"; return 1; }
    rc=0
    for m in smol qwen15; do
        M=$d/$m.gguf
        # the engine: each scenario twice, the second kept, all of a set of
        # switches in one process (one model load; each scenario's figures
        # have keys of their own) (seqs:S:512: an answer's decoding as
        # cb-run's, cb_fwd_decode; with graphs, CB_CUDA_GRAPH=1, one
        # sequence and four)
        for sw in "" "$NEXT" graph ${m%smol}; do
            case $sw in
            qwen15) sw="CB_CUDA_QW=1 $NEXT"; scs="decode:512:64 seqs:1:512" ;;
            graph) sw="CB_CUDA_GRAPH=1 $NEXT"; scs="seqs:1:512 seqs:4:512" ;;
            *) scs="prefill:4096 decode:512:64 seqs:1:512 seqs:4:512" ;;
            esac
            set --
            for sc in $scs; do set -- "$@" "$sc" "$sc"; done
            # (its status, not a pipe's: a crash under a switch fails the step)
            # shellcheck disable=SC2086
            out=$(env $sw CB_BENCH_DEVICE=cuda $BUILD/bench/bench_engine "$M" "$J" "$@") ||
                { rc=1; echo "$m $scs (${sw:-defaults}): bench_engine failed"; }
            printf '%s\n' "$out" | awk -v m="$m" -v sw="${sw:-defaults}" '$1 ~ /tok_s$/ { v[$1] = $2 }
                END { for (k in v) print m " (" sw "): " k " " v[k] }'
        done
        blend_store "$d" "$m" || rc=1
        # the blend against full prefill, warm (the issue's targets) and cold
        for sw in "" "$NEXT"; do
            for spec in full probe hkvd; do
                set --; [ "$spec" = full ] && set -- --mode full || set -- --mode blend --strategy "$spec"
                # shellcheck disable=SC2086
                env $sw "$BINDIR_B/cb-run" -q -m "$M" --device cuda --store "$d/$m.st" --chunks "$d/$m.jsonl" "$@" \
                    -n 1 --batch-size 1 --batch "$d/warm.jsonl" > "$d/warm.out" || { rc=1; continue; }
                python3 -c 'import json, sys
v = [json.loads(l)["stats"] for l in open(sys.argv[1])]
for s in v:  # one at a time (--batch-size 1): from its submission to its first token
    s["ttft_ms"] = s["first_token_ms"] - s["submit_ms"]
w = min(v[1:], key=lambda s: s["ttft_ms"])
f = lambda k: "-" if w.get(k) is None else "%.1f" % w[k]
print("%s %s (%s): warm ttft_ms %.1f, cold %.1f; prompt %d, recomputed %d, load_ms %s, stall_ms %s (%s clock), recompute_ms %s" % (
    sys.argv[2], sys.argv[3], sys.argv[4], w["ttft_ms"], v[0]["ttft_ms"], w["n_prompt_tokens"], w.get("n_recomputed_tokens", 0),
    f("load_ms"), f("stall_ms"), w.get("stall_clock", "-"), f("recompute_ms")))' \
                    "$d/warm.out" "$m" "$spec" "${sw:-defaults}" || rc=1
            done
        done
        out=$(CB_CUDA_PIN=1 CB_BENCH_DEVICE=cuda $BUILD/bench/bench_load "$M" 6 512 5 0) ||
            { rc=1; echo "$m: bench_load failed"; }
        printf '%s\n' "$out" |
            awk -v m="$m" '$1 ~ /^load_[0-9]+_(ms|gb_s|threads)$/ { print m " loader alone, CB_CUDA_PIN=1: " $1 " " $2 }'
    done
    rm -rf "$d"
    return $rc
}

if [ "${1:-}" = --one ]; then "$2"; exit; fi # one step, in a process of its own (STEP_TIMEOUT)
steps=${*:-build ops ops-cublas memcheck racecheck synccheck initcheck device suites blend bench racecheck-big}
for s in $steps; do
    case $s in
    build | ops | memcheck | racecheck | synccheck | initcheck | device | suites | blend | bench | quick) step "$s" "$s" ;;
    racecheck-big) step "$s" racecheck_big ;;
    ops-cublas) step "$s" ops_cublas ;;
    *) echo "gpu-check: unknown step '$s'" >&2; exit 64 ;;
    esac
done
exit $failed
