#!/bin/sh
# cb-chunk through the real binary: the record format, the same documents as
# files, a directory, archives (tar.gz, tar.xz, tar.zst, zip, nested) and
# stdin giving the same chunks, invalid UTF-8, model selection, exit
# statuses, byte-identical output; piped into cb-run --tokenize to check
# n_tokens.
. "$(dirname "$0")/lib.sh"
CHUNK=$(cd "$BINDIR_B" && pwd)/cb-chunk
RUN=$(cd "$BINDIR_B" && pwd)/cb-run
TINY=$CB_TEST_TMP/tiny-vocab.gguf

# chunks FILE: the records of FILE without doc, one per line (what must agree
# whatever the container); FILE may be /dev/stdin.
cat > "$T/chunks.py" <<'PY'
import json, sys
for line in open(sys.argv[1], encoding="utf-8"):
    r = json.loads(line)
    del r["doc"]
    print(json.dumps(r, ensure_ascii=False))
PY
chunks() { python3 "$T/chunks.py" "$1"; }
# valid FILE BASE WANT_TOKENS: keys in contract order, id is 32 hex, text is
# the document's bytes [start, end) (relative docs are read from BASE), seq
# counts from 0 in each document, no whitespace at the edges.
cat > "$T/valid.py" <<'PY'
import json, re, sys, os
path, base, want_tokens = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
seq = {}
keys = ["id", "doc", "seq", "start", "end"] + (["n_tokens"] if want_tokens else []) + ["text"]
for line in open(path, "rb"):
    assert line.endswith(b"\n") and line.count(b"\n") == 1, "one record per line"
    r = json.loads(line)
    assert list(r) == keys, list(r)
    assert re.fullmatch(r"[0-9a-f]{32}", r["id"]), r["id"]
    assert r["seq"] == seq.get(r["doc"], 0), (r["doc"], r["seq"])
    seq[r["doc"]] = r["seq"] + 1
    doc = r["doc"] if os.path.isabs(r["doc"]) else os.path.join(base, r["doc"])
    if os.path.isfile(doc):
        data = open(doc, "rb").read()
        assert data[r["start"]:r["end"]] == r["text"].encode(), (r["doc"], r["seq"])
    assert r["text"] == r["text"].strip() and r["text"], "no whitespace at the edges"
assert seq, "no records"
PY
valid() { python3 "$T/valid.py" "$@"; }

expect_exit "--help" 0 "$CHUNK" --help
for w in --tokens --chars --overlap --separator --repair-utf8 CB_MODEL "Exit status"; do
    grep -q -- "$w" "$T/out" || { not_ok "--help mentions $w"; continue; }
done
ok "--help names the options, the model rule and the exit statuses"
expect_exit "--version" 0 "$CHUNK" --version
grep -q "cb-chunk (cacheblend)" "$T/out" && ok "--version line" || not_ok "--version line"
expect_exit "unknown option" 64 "$CHUNK" --bogus
expect_exit "--tokens and --chars together" 64 "$CHUNK" -m "$TINY" --tokens 10 --chars 10 /dev/null
expect_exit "overlap not below the size" 64 "$CHUNK" --chars 10 --overlap 10 /dev/null
expect_exit "not a number" 64 "$CHUNK" --chars ten /dev/null
expect_exit "bad separator" 64 "$CHUNK" --chars 10 --separator 'a(b' /dev/null
grep -q "offset" "$T/err" && ok "bad separator: PCRE2's reason and offset" || not_ok "bad separator message"
expect_exit "missing input" 66 "$CHUNK" --chars 10 "$T/none.txt"
grep -q "none.txt" "$T/err" && ok "missing input is named" || not_ok "missing input is named"
expect_exit "accepts --store, -t, -q" 0 "$CHUNK" --chars 10 --store "$T/st" -t 3 -q /dev/null

# ---------------------------------------------------------------- a corpus
D=$T/docs
mkdir -p "$D/sub/deeper" "$D/.git"
cat > "$D/a.txt" <<'EOF'
The Harbour Ledger Company was founded in Ostrava in 1931. It keeps the accounts of
forty-two ferry lines.

Its archive holds 3,400 ledgers. Each ledger is bound in green cloth! Why green? Nobody
remembers, but the binder, Ilse Marek, said it hid the ink stains.

The company moved to Brno in 1962.
EOF
printf '# Café menu\n\nCrème brûlée costs 4 €. 東京の本店は一九九〇年に開店しました。\n\n- espresso\n- naïve tea\n' > "$D/sub/b.md"
python3 -c "
import random
r = random.Random(4)
w = 'river ledger quarter north invoice Zürich résumé data of and the a'.split()
out = []
for p in range(40):
    out.append(' '.join(' '.join(r.choice(w) for _ in range(r.randint(4, 14))).capitalize() + '.' for _ in range(r.randint(1, 6))))
open('$D/sub/deeper/c.txt', 'w').write('\n\n'.join(out) + '\n')
"
: > "$D/empty.txt"
printf ' \n\n\t \n' > "$D/ws.txt"
echo "secret" > "$D/.hidden.txt"
echo "ref: refs/heads/main" > "$D/.git/HEAD"
# in walk order: sorted byte-wise, hidden entries skipped
FILES="a.txt empty.txt sub/b.md sub/deeper/c.txt ws.txt"

for mode in "--chars 300" "-m $TINY --tokens 40"; do
    tok=0; label="characters"; case $mode in -m*) tok=1; label="tokens (tiny vocab)" ;; esac
    # shellcheck disable=SC2086
    (cd "$D" && "$CHUNK" $mode $FILES) > "$T/files.jsonl"
    # shellcheck disable=SC2086
    "$CHUNK" $mode "$D" > "$T/dir.jsonl"
    valid "$T/files.jsonl" "$D" $tok && ok "$label: records follow the contract" || not_ok "$label: records follow the contract"
    valid "$T/dir.jsonl" "$D" $tok && ok "$label: directory records follow the contract" || not_ok "$label: directory records"
    chunks "$T/files.jsonl" > "$T/files.c"
    chunks "$T/dir.jsonl" > "$T/dir.c"
    cmp -s "$T/files.c" "$T/dir.c" && ok "$label: files and the directory give the same chunks" \
        || not_ok "$label: files vs directory"
    grep -q '"doc":"'"$D"'/sub/deeper/c.txt"' "$T/dir.jsonl" && ok "$label: directory doc names are walked paths" \
        || not_ok "$label: directory doc names"
    grep -q 'secret\|refs/heads' "$T/dir.jsonl" && not_ok "$label: hidden entries skipped" || ok "$label: hidden entries skipped"
    grep -q '"doc":"[^"]*\(empty\|ws\).txt"' "$T/dir.jsonl" && not_ok "$label: blank documents give no records" \
        || ok "$label: blank documents give no records"

    (cd "$D" && tar czf "$T/docs.tar.gz" $FILES)
    # shellcheck disable=SC2086
    "$CHUNK" $mode "$T/docs.tar.gz" > "$T/tgz.jsonl"
    chunks "$T/tgz.jsonl" > "$T/tgz.c"
    cmp -s "$T/files.c" "$T/tgz.c" && ok "$label: a tar.gz of the files gives the same chunks" || not_ok "$label: tar.gz"
    grep -q '"doc":"'"$T"'/docs.tar.gz!sub/b.md"' "$T/tgz.jsonl" && ok "$label: members are named archive!member" \
        || not_ok "$label: member names"
    # the same archive under a name that says nothing: detection is by content
    cp "$T/docs.tar.gz" "$T/docs.dat"
    # shellcheck disable=SC2086
    "$CHUNK" $mode "$T/docs.dat" | chunks /dev/stdin > "$T/dat.c"
    cmp -s "$T/files.c" "$T/dat.c" && ok "$label: archives are recognised by content" || not_ok "$label: detection by content"
    (cd "$D" && python3 -c "
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1], 'w', zipfile.ZIP_DEFLATED)
for f in sys.argv[2:]:
    z.write(f)
z.close()" "$T/docs.zip" $FILES)
    # shellcheck disable=SC2086
    "$CHUNK" $mode "$T/docs.zip" | chunks /dev/stdin > "$T/zip.c"
    cmp -s "$T/files.c" "$T/zip.c" && ok "$label: a zip (python3 zipfile) gives the same chunks" || not_ok "$label: zip"
    for z in xz zstd bzip2; do
        if command -v $z >/dev/null 2>&1; then
            (cd "$D" && tar cf - $FILES | $z -c > "$T/docs.tar.$z")
            # shellcheck disable=SC2086
            "$CHUNK" $mode "$T/docs.tar.$z" | chunks /dev/stdin > "$T/$z.c"
            cmp -s "$T/files.c" "$T/$z.c" && ok "$label: tar + $z gives the same chunks" || not_ok "$label: tar + $z"
        else
            skip "$label: tar + $z" "$z not installed"
        fi
    done
    # shellcheck disable=SC2086
    cat "$D/a.txt" | "$CHUNK" $mode - > "$T/stdin.jsonl"
    # shellcheck disable=SC2086
    "$CHUNK" $mode "$D/a.txt" | chunks /dev/stdin > "$T/a.c"
    chunks "$T/stdin.jsonl" > "$T/stdin.c"
    cmp -s "$T/a.c" "$T/stdin.c" && grep -q '"doc":"-"' "$T/stdin.jsonl" && ok "$label: stdin (-) gives the same chunks, doc \"-\"" \
        || not_ok "$label: stdin"
    # shellcheck disable=SC2086
    "$CHUNK" $mode "$D" > "$T/dir2.jsonl"
    cmp -s "$T/dir.jsonl" "$T/dir2.jsonl" && ok "$label: a second run is byte-identical" || not_ok "$label: byte-identical"
done

# no PATH: stdin
"$CHUNK" --chars 300 < "$D/a.txt" | chunks /dev/stdin > "$T/nopath.c"
"$CHUNK" --chars 300 "$D/a.txt" | chunks /dev/stdin > "$T/a.c"
cmp -s "$T/a.c" "$T/nopath.c" && ok "no PATH reads stdin" || not_ok "no PATH reads stdin"

# piped into cb-run --tokenize: each record's n_tokens is the count of its text alone
"$CHUNK" -m "$TINY" --tokens 40 "$D/sub/deeper/c.txt" > "$T/c.jsonl"
python3 - "$T/c.jsonl" "$RUN" "$TINY" <<'PY' && ok "n_tokens matches cb-run --tokenize of each text, all <= 40" || not_ok "n_tokens vs cb-run --tokenize"
import json, subprocess, sys
recs = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
assert len(recs) > 3
for r in recs:
    ids = subprocess.run([sys.argv[2], "--tokenize", "-m", sys.argv[3]], input=r["text"].encode(),
                         capture_output=True, check=True).stdout.split()
    assert len(ids) == r["n_tokens"] <= 40, (len(ids), r["n_tokens"])
PY
"$CHUNK" -m "$TINY" --tokens 40 --overlap 8 "$D/sub/deeper/c.txt" > "$T/ov.jsonl"
python3 - "$T/ov.jsonl" <<'PY' && ok "--overlap: each chunk starts inside the previous one" || not_ok "--overlap"
import json, sys
r = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
assert len(r) > 3
assert all(r[i-1]["start"] < r[i]["start"] < r[i-1]["end"] for i in range(1, len(r)) if r[i]["seq"] > 0)
PY
printf 'one\n---\ntwo three\n---\nfour\n' | "$CHUNK" --chars 100 --separator '^---$' > "$T/sep.jsonl"
python3 -c "
import json, sys
t = [json.loads(l)['text'] for l in open(sys.argv[1])]
assert t == ['one', 'two three', 'four'], t" "$T/sep.jsonl" && ok "--separator cuts at every match" || not_ok "--separator"

# -v's lines: --chars 0 means no limit, and says so; a small input's size
# and time in units that show them, one document in the singular
printf 'one two\n\nthree four\n' | "$CHUNK" -v --chars 0 > "$T/z.jsonl" 2> "$T/z.err"
[ "$(wc -l < "$T/z.jsonl")" -eq 1 ] && grep -q "no size limit" "$T/z.err" && ! grep -q "at most 0" "$T/z.err" &&
    grep -q ": 1 document, 1 chunk, 20 bytes in [0-9]* ms$" "$T/z.err" &&
    ok "-v --chars 0: no size limit, one chunk; '1 document, 1 chunk, 20 bytes in N ms'" ||
    not_ok "-v lines: $(cat "$T/z.err")"

# -------------------------------------------------------------- bad input
printf 'good text\n' > "$T/good.txt"
printf 'caf\351 au lait\n' > "$T/latin1.txt"
expect_exit "invalid UTF-8" 65 "$CHUNK" --chars 100 "$T/latin1.txt" "$T/good.txt"
grep -q "latin1.txt: invalid UTF-8 at byte 3" "$T/err" && ok "invalid UTF-8: file and byte offset named" \
    || not_ok "invalid UTF-8 message: $(cat "$T/err")"
grep -q '"text":"good text"' "$T/out" && ok "the other inputs are still chunked" || not_ok "the other inputs are still chunked"
expect_exit "--repair-utf8" 0 "$CHUNK" --chars 100 --repair-utf8 "$T/latin1.txt"
grep -q '"text":"caf� au lait"' "$T/out" && ok "--repair-utf8 puts U+FFFD in place of the bad byte" || not_ok "--repair-utf8"
(cd "$T" && tar czf bad.tar.gz latin1.txt good.txt)
expect_exit "invalid UTF-8 inside an archive" 65 "$CHUNK" --chars 100 "$T/bad.tar.gz"
grep -q 'bad.tar.gz!latin1.txt: invalid UTF-8' "$T/err" && ok "the member is named" || not_ok "member named"
head -c 200 "$T/docs.tar.gz" > "$T/trunc.tar.gz"
expect_exit "truncated archive" 65 "$CHUNK" --chars 100 "$T/trunc.tar.gz"
# fuzz_chunk_input's malloc limit on a crafted tar: a member claiming 8 GiB made
# cb-chunk allocate the claimed size before reading a byte (out of memory
# under a memory limit, instead of "truncated").
python3 - "$T/claims8g.tar" <<'PY'
import io, sys, tarfile
b = io.BytesIO()
with tarfile.open(fileobj=b, mode="w", format=tarfile.GNU_FORMAT) as t:
    ti = tarfile.TarInfo("a.txt"); ti.size = 5; t.addfile(ti, io.BytesIO(b"hello"))
d = bytearray(b.getvalue()[:2048])
d[124:136] = b"100000000000"  # size: 8 GiB, in octal
d[148:156] = b" " * 8
d[148:156] = ("%06o\0 " % sum(d[:512])).encode()
open(sys.argv[1], "wb").write(d)
PY
expect_exit "a member claiming 8 GiB in a 2 KB archive, under a 1 GiB memory limit" 65 \
    sh -c 'ulimit -v 1048576 && exec "$0" --chars 100 "$1"' "$CHUNK" "$T/claims8g.tar"
grep -qi "truncated" "$T/err" && ! grep -qi "allocate\|out of memory" "$T/err" \
    && ok "it is reported as truncated, not as out of memory" || not_ok "claimed size: $(cat "$T/err")"

# ------------------------------------------------------ archives, links
mkdir -p "$T/nest"
cp "$T/docs.zip" "$T/nest/inner.zip"
printf 'notes about ferries\n' | gzip -c > "$T/nest/notes.txt.gz"
(cd "$T/nest" && tar czf "$T/outer.tar.gz" inner.zip notes.txt.gz)
expect_exit "nested archive" 0 "$CHUNK" --chars 300 "$T/outer.tar.gz"
grep -q '"doc":"'"$T"'/outer.tar.gz!inner.zip!sub/b.md"' "$T/out" && ok "an archive inside an archive: outer!inner!member" \
    || not_ok "nested names"
grep -q '"doc":"'"$T"'/outer.tar.gz!notes.txt.gz","seq":0,"start":0,"end":19,"text":"notes about ferries"' "$T/out" \
    && ok "a single compressed file is the document it holds" || not_ok "compressed single file"
mkdir -p "$T/links/real"
cp "$D/a.txt" "$T/links/real/"
ln -s .. "$T/links/real/loop"
ln -s "$T/nowhere" "$T/links/dangling"
expect_exit "a symlink loop and a dangling link" 0 "$CHUNK" --chars 300 "$T/links"
[ "$(grep -c '"seq":0' "$T/out")" -eq 1 ] && ok "the loop is walked once" || not_ok "the loop is walked once"
grep -q "loop" "$T/err" && grep -q "dangling" "$T/err" && ok "both are reported" || not_ok "loop/dangling warnings"
expect_exit "--hidden" 0 "$CHUNK" --chars 300 --hidden "$D"
grep -q '"text":"secret"' "$T/out" && ok "--hidden walks hidden entries" || not_ok "--hidden"
if [ -w /dev/full ]; then
    expect_exit "write error on stdout" 74 sh -c "'$CHUNK' --chars 100 '$D' > /dev/full"
fi

# ------------------------------------------------------------ the model rule
NOMODEL="env -u CB_MODEL XDG_CACHE_HOME=$T/nocache"
expect_exit "no model found: characters" 0 $NOMODEL "$CHUNK" "$D/a.txt"
grep -q '"n_tokens"' "$T/out" && not_ok "character mode has no n_tokens" || ok "character mode has no n_tokens"
expect_exit "no model found, --tokens asked" 66 $NOMODEL "$CHUNK" --tokens 100 "$D/a.txt"
expect_exit "\$CB_MODEL names a missing file" 66 env CB_MODEL="$T/none.gguf" "$CHUNK" "$D/a.txt"
expect_exit "\$CB_MODEL selects token mode" 0 env CB_MODEL="$TINY" "$CHUNK" "$D/a.txt"
grep -q '"n_tokens"' "$T/out" && ok "\$CB_MODEL: records carry n_tokens" || not_ok "\$CB_MODEL: n_tokens"
expect_exit "--chars wins over a model" 0 env CB_MODEL="$TINY" "$CHUNK" --chars 100 "$D/a.txt"
grep -q '"n_tokens"' "$T/out" && not_ok "--chars: no n_tokens" || ok "--chars: no n_tokens"
expect_exit "malformed model" 65 "$CHUNK" -m "$D/a.txt" "$D/a.txt"

if M=$(smol_model); then
    expect_exit "SmolLM2 (found by the usual rule: \$CB_MODEL, else the default file)" 0 "$CHUNK" "$D"
    valid "$T/out" "$D" 1 && ok "SmolLM2: records follow the contract" || not_ok "SmolLM2: records"
    python3 - "$T/out" "$RUN" <<'PY' && ok "SmolLM2: n_tokens matches cb-run --tokenize" || not_ok "SmolLM2: n_tokens"
import json, subprocess, sys
for line in open(sys.argv[1], encoding="utf-8"):
    r = json.loads(line)
    ids = subprocess.run([sys.argv[2], "--tokenize"], input=r["text"].encode(), capture_output=True,
                         check=True).stdout.split()
    assert len(ids) == r["n_tokens"] <= 512, (len(ids), r["n_tokens"])
PY
    (cd "$D" && tar cJf "$T/d.tar.xz" $FILES)
    "$CHUNK" -m "$M" --tokens 64 "$D" | chunks /dev/stdin > "$T/s1.c"
    "$CHUNK" -m "$M" --tokens 64 "$T/d.tar.xz" | chunks /dev/stdin > "$T/s2.c"
    cmp -s "$T/s1.c" "$T/s2.c" && [ "$(wc -l < "$T/s1.c")" -gt 3 ] && ok "SmolLM2: directory and tar.xz give the same chunks" \
        || not_ok "SmolLM2: directory vs tar.xz"
else
    skip "SmolLM2 token mode" "default model not fetched"
fi
# ------------------------------------------------------- examples/corpus
# The example corpus chunks cleanly, and each question's answer lies in a
# chunk of the last document it needs, not in a chunk of the first.
top=$(cd "$(dirname "$0")/../.." && pwd)
if [ -d "$top/examples/corpus" ]; then
    (cd "$top" && "$CHUNK" -m "$TINY" --tokens 128 examples/corpus) > "$T/ex.jsonl" \
        && ok "examples/corpus chunks without error" || not_ok "examples/corpus chunks without error"
    python3 - "$T/ex.jsonl" "$top/examples/questions.jsonl" <<'PY' && ok "examples/questions.jsonl: answers are in the needed documents' chunks" \
        || not_ok "examples/questions.jsonl"
import json, sys
chunks = {}
for line in open(sys.argv[1], encoding="utf-8"):
    r = json.loads(line)
    chunks.setdefault(r["doc"].removeprefix("examples/corpus/"), []).append(" ".join(r["text"].split()))
qs = [json.loads(l) for l in open(sys.argv[2], encoding="utf-8")]
assert len(qs) >= 30
for q in qs:
    assert len(q["needs"]) == 2 and all(d in chunks for d in q["needs"]), q
    if q["question"].startswith(("How many years", "Which was founded first")):
        continue
    assert any(a in c for a in q["answers"] for c in chunks[q["needs"][-1]]), q
    assert not any(a in c for a in q["answers"] for c in chunks[q["needs"][0]]), q
PY
fi
# A decompression bomb: a tar.gz whose member unpacks to 3 MiB of one
# repeated word (a few KiB packed) between two small members.  Under --max-member 1M it is
# refused by name with status 65 (read no further than the limit), the
# others are still chunked; the default limit passes it.
python3 - "$T/bomb.tar.gz" <<'PY'
import io, sys, tarfile
with tarfile.open(sys.argv[1], "w:gz") as t:
    for name, data in [("a.txt", b"First small document.\n"), ("big.txt", b"word " * (3 << 18)),
                       ("z.txt", b"Last small document.\n")]:
        ti = tarfile.TarInfo(name); ti.size = len(data); t.addfile(ti, io.BytesIO(data))
PY
"$CHUNK" --chars 64 --max-member 1M "$T/bomb.tar.gz" > "$T/bomb.jsonl" 2> "$T/bomb.err"; rc=$?
[ "$rc" = 65 ] && grep -q "bomb.tar.gz!big.txt: unpacks to more than 1048576 bytes (--max-member): skipped" "$T/bomb.err" \
    && ok "--max-member: a member unpacking past the limit is refused by name, status 65" \
    || not_ok "--max-member: bomb refused (rc $rc: $(cat "$T/bomb.err"))"
grep -q '"doc":"[^"]*bomb.tar.gz!a.txt"' "$T/bomb.jsonl" && grep -q '"doc":"[^"]*bomb.tar.gz!z.txt"' "$T/bomb.jsonl" \
    && ! grep -q 'big.txt' "$T/bomb.jsonl" \
    && ok "--max-member: the members before and after it are still chunked" || not_ok "--max-member: other members"
python3 -c 'import sys; sys.stdout.write("word " * (3 << 18))' | gzip -c > "$T/words.gz"
"$CHUNK" --chars 64 --max-member 64K "$T/words.gz" > /dev/null 2> "$T/gz.err"; rc=$?
[ "$rc" = 65 ] && grep -q "words.gz: unpacks to more than 65536 bytes" "$T/gz.err" \
    && ok "--max-member: a compressed file's content too" || not_ok "--max-member: .gz (rc $rc: $(cat "$T/gz.err"))"
"$CHUNK" --chars 64 --max-member 1M5 "$T/words.gz" > /dev/null 2> "$T/mm.err"; rc=$?
[ "$rc" = 64 ] && grep -q -- "--max-member: '1M5' is not a size" "$T/mm.err" && ok "--max-member: a bad size is a usage error" \
    || not_ok "--max-member: bad size (rc $rc)"
"$CHUNK" --chars 64 "$T/bomb.tar.gz" 2> "$T/bomb2.err" | grep -c '"doc":"[^"]*big.txt"' > /dev/null; rc=$?
[ ! -s "$T/bomb2.err" ] && [ "$rc" = 0 ] && ok "--max-member: the default (256M) passes a 3 MiB member" \
    || not_ok "--max-member: default limit ($(cat "$T/bomb2.err"))"
done_testing
