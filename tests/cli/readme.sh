#!/bin/sh
# tests/cli/readme.sh - the README's examples, run.  Every ```sh block of
# README.md runs in order, each under `sh -e`, in one working directory of
# the test's own (examples/ linked into it, so that later blocks find the
# files earlier ones wrote), with the programs of $BINDIR_B first on PATH,
# a store of the test's own as $CB_STORE, and SmolLM2 as $CB_MODEL (the
# tiny fixture when SmolLM2 is not fetched).  An HTML comment on the line
# right above a block changes that:
#   <!-- test: model=default -->  the programs' default model, no $CB_MODEL
#                                 (skipped when it is not fetched)
#   <!-- test: redis -->          a redis-server of the test's own on a free
#                                 port; "127.0.0.1:6379" and "/dev/shm/cb" in
#                                 the block become that port and a directory
#                                 of the test's (skipped without redis-server)
#   <!-- test: skip REASON -->    not run; REASON is printed
# A command line ending in "# -> TEXT" is checked: its stdout must be TEXT.
# Besides: the README's length, no hand-written test totals, the newcomer's
# path (the first blended answer within the README's first 150 lines), every
# option the README names known to a program's --help, its relative links,
# and what `make demo` runs (examples/demo.sh, one question).
. "$(dirname "$0")/lib.sh"
top=$(cd "$(dirname "$0")/../.." && pwd)
README=$top/README.md
case $BINDIR_B in /*) BIN=$BINDIR_B ;; *) BIN=$top/$BINDIR_B ;; esac
W=$T/work
mkdir -p "$W" "$T/blocks"
ln -s "$top/examples" "$W/examples"

# -- the text itself
nl=$(wc -l < "$README")
[ "$nl" -le 350 ] && ok "README.md is at most 350 lines ($nl)" || not_ok "README.md has $nl lines, more than 350"
if grep -nE '[0-9][0-9,]* (passed|failed|skipped)' "$README" > "$T/totals"; then
    not_ok "README.md writes test totals by hand"; sed 's/^/#   /' "$T/totals"
else
    ok "README.md writes no test totals by hand"
fi

# The blocks, split out by a small parser: $T/blocks/N.sh each, and a
# manifest line per block: N, README line, marker, first command.
python3 - "$README" "$T/blocks" "$BIN" > "$T/parse.out" 2>&1 <<'PY'
import os, re, shlex, subprocess, sys
readme, out, bindir = sys.argv[1:4]
lines = open(readme, encoding="utf-8").read().split("\n")
blocks, i = [], 0
while i < len(lines):
    if lines[i].strip() == "```sh":
        m = re.match(r"<!-- test: (.*?) -->$", lines[i - 1].strip()) if i else None
        start, body = i + 1, []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append((i + 1, lines[i]))
            i += 1
        blocks.append((start, m.group(1) if m else "run", body))
    i += 1

def logical(body):  # join continuation lines: (first line number, text)
    res, cur, first = [], "", None
    for n, l in body:
        if first is None:
            first = n
        if l.endswith("\\"):
            cur += l[:-1] + " "
            continue
        res.append((first, cur + l))
        cur, first = "", None
    return res

def commands(text):  # each program call of a line: (program, its words)
    text = re.sub(r"\s#.*$", "", text)
    for seg in re.split(r"\|\||&&|\||;", text):
        try:
            words = shlex.split(seg)
        except ValueError:
            words = seg.split()
        if words and re.fullmatch(r"cb-[a-z]+", words[0]):
            yield words[0], words[1:]

helps = {}
def help_of(prog):
    if prog not in helps:
        p = subprocess.run([os.path.join(bindir, prog), "--help"], capture_output=True, text=True)
        helps[prog] = p.stdout + p.stderr
    return helps[prog]

manifest, bad_opts, first_blend = [], [], None
for k, (start, marker, body) in enumerate(blocks):
    script = ["set -e"]
    title = ""
    for n, text in logical(body):
        if not title and text.strip() and not text.lstrip().startswith("#"):
            title = re.sub(r"\s+#.*$", "", text.strip()).replace("\\", "")
        for prog, words in commands(text):
            for w in words:
                if w.startswith("--"):
                    opt = w.split("=")[0]
                    if not re.search(r"(^|[\s,\[])" + re.escape(opt) + r"\b", help_of(prog)):
                        bad_opts.append(f"line {n}: {prog} {opt}")
            if (first_blend is None and prog == "cb-run" and "--chunks" in words
                    and "--mode" not in words and marker == "run"):
                first_blend = n
        m = re.match(r"(.*?)\s+# -> (.*)$", text)
        if m:
            cmd, want = m.group(1), m.group(2).strip()
            what = shlex.quote(f"README line {n}: {cmd.strip()} prints {want}")
            script.append(f"_got=$({cmd})")
            script.append(f'if [ "$_got" = {shlex.quote(want)} ]; then echo "ok "{what} >> "$CHECKS"; '
                          f'else echo "not ok "{what}" (it printed: $_got)" >> "$CHECKS"; exit 1; fi')
        else:
            script.append(text)
    with open(os.path.join(out, f"{k}.sh"), "w", encoding="utf-8") as f:
        f.write("\n".join(script) + "\n")
    manifest.append(f"{k}\t{start}\t{marker}\t{title[:70]}")
with open(os.path.join(out, "manifest"), "w", encoding="utf-8") as f:
    f.write("\n".join(manifest) + "\n")
with open(os.path.join(out, "bad-options"), "w", encoding="utf-8") as f:
    f.write("".join(x + "\n" for x in bad_opts))
# every --option the prose names, known to one of the programs
every = "".join(help_of(p) for p in ("cb-chunk", "cb-precompute", "cb-run", "cb-store", "cb-profile"))
# (a make target's VAR_ARGS="..." holds a script's options, not a program's)
unknown = sorted({(n + 1, o) for n, l in enumerate(lines)
                  for o in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", re.sub(r'[A-Z_]+ARGS="[^"]*"', "", l))
                  if not re.search(r"(^|[\s,\[])" + re.escape(o) + r"\b", every)})
with open(os.path.join(out, "unknown-options"), "w", encoding="utf-8") as f:
    f.write("".join(f"line {n}: {o}\n" for n, o in unknown))
with open(os.path.join(out, "first-blend"), "w") as f:
    f.write(f"{first_blend or 0}\n")
# relative links that point nowhere
base = os.path.dirname(readme)
with open(os.path.join(out, "dead-links"), "w", encoding="utf-8") as f:
    for n, l in enumerate(lines):
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", l):
            if not os.path.exists(os.path.join(base, target)):
                f.write(f"line {n + 1}: {target}\n")
PY
if [ ! -f "$T/blocks/manifest" ]; then
    not_ok "the README's blocks could not be read"; sed 's/^/#   /' "$T/parse.out"; done_testing; exit 1
fi
nb=$(wc -l < "$T/blocks/manifest")
[ "$nb" -ge 5 ] && ok "the README has $nb shell blocks" || not_ok "the README has only $nb shell blocks"
check_list() {   # FILE WHAT
    if [ -s "$1" ]; then not_ok "$2"; sed 's/^/#   /' "$1" | head -20; else ok "$2"; fi
}
check_list "$T/blocks/bad-options" "every option in the README's examples is in its program's --help"
check_list "$T/blocks/unknown-options" "every option the README names is in some program's --help"
check_list "$T/blocks/dead-links" "every relative link of the README points at a file"
fb=$(cat "$T/blocks/first-blend")
if [ "$fb" -gt 0 ] && [ "$fb" -le 150 ]; then ok "the first blended answer is on line $fb, within the first 150"
else not_ok "the first blended answer (line $fb) is not within the README's first 150 lines"; fi
grep -q "cb-run --tokenize -p 'Hello world' *# -> " "$README" \
    && ok "the README's tokenize line is checked against its model" || not_ok "the README's tokenize line has no '# ->' check"

# -- the blocks, run
SMOL=$(smol_model) || SMOL=""
if [ -n "$SMOL" ]; then MODEL=$SMOL; else MODEL=$CB_TEST_TMP/tiny-q8_0.gguf; fi
DEFAULT_M=${XDG_CACHE_HOME:-$HOME/.cache}/cacheblend/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
RS=$(command -v redis-server || true); RC=$(command -v redis-cli || true)
PORT=""
start_redis() { PORT=$(free_port) && redis_start || { PORT=""; return 1; }; }
export CHECKS="$T/checks"
: > "$CHECKS"
tab=$(printf '\t')
while IFS="$tab" read -r k line marker title; do
    name="README line $line: $title"
    script=$T/blocks/$k.sh
    case $marker in
    skip*) skip "$name" "${marker#skip }"; continue ;;
    model=default)
        if [ ! -f "$DEFAULT_M" ]; then skip "$name" "the default model is not fetched (make model)"; continue; fi
        set -- env -u CB_MODEL ;;
    redis)
        if [ ! -f "$MODEL" ]; then skip "$name" "no model: neither SmolLM2 nor $MODEL"; continue; fi
        if [ -z "$RS" ] || [ -z "$RC" ]; then skip "$name" "no redis-server (make deps)"; continue; fi
        if [ -z "$PORT" ] && ! start_redis; then skip "$name" "redis-server does not start here"; continue; fi
        sed -i -e "s|127\.0\.0\.1:6379|127.0.0.1:$PORT|g" -e "s|/dev/shm/cb|$W/shm-cb|g" "$script"
        set -- env CB_MODEL="$MODEL" ;;
    run)
        if [ ! -f "$MODEL" ]; then skip "$name" "no model: neither SmolLM2 nor $MODEL"; continue; fi
        set -- env CB_MODEL="$MODEL" ;;
    *) not_ok "$name: unknown marker '$marker'"; continue ;;
    esac
    : > "$CHECKS"
    if (cd "$W" && PATH="$BIN:$PATH" CB_STORE="$W/default-store" "$@" sh -e "$script") < /dev/null > "$T/block.out" 2>&1; then
        ok "$name"
    else
        not_ok "$name"; tail -n 8 "$T/block.out" | sed 's/^/#   /'
    fi
    while IFS= read -r c; do
        case $c in "not ok "*) not_ok "${c#not ok }" ;; "ok "*) ok "${c#ok }" ;; esac
    done < "$CHECKS"
done < "$T/blocks/manifest"

# -- what make demo runs, on the small model and one question, in a store of the test's
if [ ! -f "$MODEL" ]; then
    skip "examples/demo.sh (make demo)" "no model: neither SmolLM2 nor $MODEL"
elif (cd "$top" && CB_MODEL="$MODEL" CB_DEMO_QUESTIONS=1 CB_DEMO_STORE="$W/demo-store" CB_STORE="$W/demo-default-store" \
    sh examples/demo.sh) > "$T/demo.out" 2>&1 && grep -q '^   blend ' "$T/demo.out" && [ ! -e "$W/demo-default-store" ]; then
    ok "examples/demo.sh (make demo) answers a question three ways, in its own store only"
else
    not_ok "examples/demo.sh (make demo)$([ -e "$W/demo-default-store" ] && echo ': it wrote into the default store')"
    tail -n 8 "$T/demo.out" | sed 's/^/#   /'
fi
done_testing
