#!/bin/sh
# cb-store through the real binary: init with tiers, put/ls/stat/get/rm/pin,
# gc, verify (and --repair after damage), export/import round trips through
# files and pipes, hostile archives, and the exit statuses of the contract.
. "$(dirname "$0")/lib.sh"
STORE=$BINDIR_B/cb-store
GEN=${BUILD:-build/rel}/tests/test_store
TINY=$CB_TEST_TMP/tiny-f32.gguf
S="$STORE --store $T/st"

if [ ! -x "$GEN" ] || [ ! -f "$TINY" ]; then
    skip "cb-store" "no $GEN or $TINY (make check-tools; tests/run.sh)"
    done_testing; exit 0
fi
mkdir -p "$T/kv"
"$GEN" --make-kv "$TINY" "$T/kv" 6 > "$T/made" || { not_ok "make KV fixtures"; done_testing; exit 1; }
key() { sed -n "$(($1 + 1))p" "$T/made" | cut -d' ' -f2; }
KV0=$T/kv/kv-0.kv; K0=$(key 0); K1=$(key 1); K5=$(key 5)
FP=$(echo "$K0" | cut -c1-32)
KX=$FP-00000000000000000000000000000000   # well formed, never stored
if [ -w /dev/shm ]; then RAM=/dev/shm/cb-cli-store.$$; else RAM=$T/ram; fi
trap 'rm -rf "$T" "$RAM"' EXIT
SZ=$(wc -c < "$KV0" | tr -d ' ')

# -- usage
expect_exit "--help" 0 $STORE --help
grep -q "verify \[--repair\]" "$T/out" && grep -q "export ARCHIVE" "$T/out" && ok "--help lists the commands" \
    || not_ok "--help lists the commands"
grep -q "^  place" "$T/out" && ok "--help lists place" || not_ok "--help lists place"
expect_exit "--version" 0 $STORE --version
expect_exit "no command" 64 $STORE
expect_exit "unknown command" 64 $S frobnicate
expect_exit "an option the command does not take" 64 $S ls --repair
expect_exit "unknown option" 64 $S ls --bogus
expect_exit "ls of a missing store" 66 $S ls
grep -q "no store" "$T/err" && ok "the missing store is named" || not_ok "the missing store is named"

# -- init
expect_exit "init with a bad capacity" 64 $S init --tier "ram=$RAM:lots"
expect_exit "init with a bad tier" 64 $S init --tier "noequals"
expect_exit "init with two tiers" 0 $S init --tier "ram=$RAM:$((SZ * 2 / 1024))K" --tier "disk=$T/disk:1M" --promote 1
expect_exit "init again" 73 $S init
# an init that fails midway (its index cannot be made) leaves no half store
mkdir -p "$T/st5/index.db/x"
expect_exit "init that cannot make its index" 73 $STORE --store "$T/st5" init
rm -rf "$T/st5/index.db"
expect_exit "the next init starts afresh" 0 $STORE --store "$T/st5" init
grep -q '"capacity": 1048576' "$T/st/store.json" && ok "capacities with suffixes" || not_ok "capacities with suffixes"

# -- put, ls, stat
expect_exit "put six KV files" 0 $S put "$T"/kv/kv-*.kv
[ "$(wc -l < "$T/out")" -eq 6 ] && grep -qx "$K5" "$T/out" && ok "put prints each key" || not_ok "put prints each key"
expect_exit "put the same file again" 0 $S put "$KV0"
printf 'not a kv file at all' > "$T/junk.kv"
expect_exit "put a file that is not a KV file" 65 $S put "$T/junk.kv"
expect_exit "put a missing file" 66 $S put "$T/none.kv"
expect_exit "ls" 0 $S ls
[ "$(wc -l < "$T/out")" -eq 6 ] && ok "ls lists six entries" || not_ok "ls lists six entries"
[ "$($S ls --tier ram | wc -l)" -eq 2 ] && [ "$($S ls --tier disk | wc -l)" -eq 4 ] \
    && ok "ls --tier: the two newest in ram, the rest in disk" || not_ok "ls --tier"
expect_exit "ls --tier of an unknown tier" 64 $S ls --tier nvme
[ "$($S ls -m "$FP" | wc -l)" -eq 6 ] && [ "$($S ls -m 00000000000000000000000000000000 | wc -l)" -eq 0 ] \
    && ok "ls -m FINGERPRINT filters by model" || not_ok "ls -m filter"
[ "$($S ls -m "$TINY" | wc -l)" -eq 6 ] && ok "ls -m MODEL.gguf filters by its fingerprint" || not_ok "ls -m MODEL.gguf"
$S ls --json > "$T/ls.json"
python3 - "$T/ls.json" "$K0" <<'PY' && ok "ls --json: one object per line with the index fields" || not_ok "ls --json"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 6, rows
for r in rows:
    for k in ("key", "model", "tier", "bytes", "created", "last_access", "hits", "checksum", "pinned", "path"):
        assert k in r, (k, r)
    assert r["key"].startswith(r["model"] + "-") and len(r["checksum"]) == 32
assert any(r["key"] == sys.argv[2] for r in rows)
PY

# -- get, promotion, stat
expect_exit "get prints the path" 0 $S get "$K0"
P0=$(cat "$T/out")
[ -f "$P0" ] && cmp -s "$P0" "$KV0" && ok "the path holds the entry" || not_ok "the path holds the entry"
case "$P0" in "$RAM"/*) ok "get promotes to the fastest tier (--promote 1)" ;; *) not_ok "promotion: $P0" ;; esac
expect_exit "get -o FILE" 0 $S get "$K1" -o "$T/copy.kv"
cmp -s "$T/copy.kv" "$T/kv/kv-1.kv" && ok "get -o copies the entry" || not_ok "get -o copies the entry"
$S get "$K1" -o - | cmp -s - "$T/kv/kv-1.kv" && ok "get -o - writes it to stdout" || not_ok "get -o -"
expect_exit "get a missing key" 66 $S get "$KX"
expect_exit "get a malformed key" 64 $S get not-a-key
expect_exit "get -o into a missing directory" 73 $S get "$K1" -o "$T/no/such/dir/x.kv"
$S stat --json > "$T/stat.json"
python3 - "$T/stat.json" <<'PY' && ok "stat --json: per tier entries, bytes within capacity, hits, hit rate" || not_ok "stat --json"
import json, sys
s = json.load(open(sys.argv[1]))
assert [t["name"] for t in s["tiers"]] == ["ram", "disk"], s
assert sum(t["entries"] for t in s["tiers"]) == 6, s
for t in s["tiers"]:
    assert t["bytes"] <= t["capacity"], t
    assert 0 <= t["hit_rate"] <= 1
assert s["hits"] >= 3 and s["misses"] >= 1 and s["gets"] == s["hits"] + s["misses"], s
PY
expect_exit "stat" 0 $S stat
grep -q "^ram " "$T/out" && grep -q "hit rate" "$T/out" && ok "stat prints a table" || not_ok "stat prints a table"

# -- pin, rm
expect_exit "pin" 0 $S pin "$K5"
$S ls | grep "$K5" | grep -q pinned && ok "ls shows the pin" || not_ok "ls shows the pin"
expect_exit "unpin" 0 $S unpin "$K5"
expect_exit "pin a missing key" 66 $S pin "$KX"
expect_exit "rm" 0 $S rm "$K5"
expect_exit "rm again" 66 $S rm "$K5"
[ "$($S ls | wc -l)" -eq 5 ] && ok "rm removed one entry" || not_ok "rm removed one entry"

# -- gc, verify, repair
expect_exit "gc" 0 $S gc
expect_exit "verify a sound store" 0 $S verify
F=$($S get "$K1")
python3 -c 'import sys; f = open(sys.argv[1], "r+b"); f.seek(-300, 2); b = f.read(1); f.seek(-300, 2); f.write(bytes([b[0] ^ 1]))' "$F"
expect_exit "verify finds a flipped byte" 65 $S -v verify
grep -q "$K1" "$T/out" && ok "verify names the damaged entry" || not_ok "verify names the damaged entry"
grep -q "; 1 problem, 0 repaired, 1 left$" "$T/err" && ok "verify -v: '1 problem'" || not_ok "verify -v: $(cat "$T/err")"
cp "$T/kv/kv-5.kv" "$T/disk/$K5.kv"
expect_exit "verify finds a file the index does not know" 65 $S verify
# every byte is read once, a damaged file's too: the total is the files'
tot=$(cat "$RAM"/*.kv "$T"/disk/*.kv | wc -c)
expect_exit "verify --repair" 0 $S -v verify --repair
want=$(python3 -c 'import sys; n = int(sys.argv[1]); print("%.1f kB" % (n / 1e3) if n < 1e6 else "%.2f MB" % (n / 1e6))' "$tot")
grep -q " files, $want checked; 2 problems, 2 repaired, 0 left" "$T/err" &&
    ok "verify --repair -v: the bytes of the files ($want), once" || not_ok "verify --repair -v (want $want): $(cat "$T/err")"
grep -q "repaired" "$T/out" && ok "repair says what it fixed" || not_ok "repair says what it fixed"
expect_exit "verify after repair" 0 $S verify
$S ls | grep -q "$K5" && ! $S ls | grep -q "$K1" && ok "repair adopted the valid file and dropped the damaged one" \
    || not_ok "repair adopted and dropped"
rm -f "$T/st/index.db" "$T/st/index.db-wal" "$T/st/index.db-shm"
expect_exit "a lost index: ls says so" 65 $S ls
expect_exit "a lost index: verify without --repair" 65 $S verify
expect_exit "a lost index: verify --repair rebuilds it" 0 $S verify --repair
[ "$($S ls | wc -l)" -eq 5 ] && ok "every entry is back" || not_ok "every entry is back after rebuild"

# -- export, import
expect_exit "export to .tar.zst" 0 $S export "$T/all.tar.zst"
[ "$(od -An -tx1 -N4 "$T/all.tar.zst" | tr -d ' ')" = "28b52ffd" ] && ok "zstd by default" || not_ok "zstd by default"
if command -v zstd >/dev/null 2>&1; then
    cnt=$(zstd -dc "$T/all.tar.zst" | tar tf - | grep -c '^[0-9a-f]\{32\}-[0-9a-f]\{32\}\.kv$')
    [ "$cnt" -eq 5 ] && ok "a tar of <key>.kv files (zstd | tar tf)" || not_ok "archive members: $cnt"
else
    skip "archive members" "no zstd"
fi
S2="$STORE --store $T/st2"
# only init makes a store: import and put into none say so and make nothing
expect_exit "import where there is no store" 66 $S2 import "$T/all.tar.zst"
grep -q "no store there.*cb-store init" "$T/err" && [ ! -e "$T/st2" ] && ok "it says to run init, and makes nothing" \
    || not_ok "import without a store: $(cat "$T/err")"
expect_exit "put where there is no store" 66 $S2 put "$KV0"
[ ! -e "$T/st2" ] && ok "put made nothing" || not_ok "put made a store"
expect_exit "init a new store" 0 $S2 init
expect_exit "import into the new store" 0 $S2 import "$T/all.tar.zst"
[ "$($S ls | cut -c1-65 | sort)" = "$($S2 ls | cut -c1-65 | sort)" ] && ok "same keys after import" || not_ok "same keys"
$S2 get "$K0" -o - | cmp -s - "$KV0" && ok "same bytes after import" || not_ok "same bytes after import"
expect_exit "verify the imported store" 0 $S2 verify
$STORE --store "$T/st3" init && $S export - "$K0" | $STORE --store "$T/st3" import - &&
    [ "$($STORE --store "$T/st3" ls | wc -l)" -eq 1 ] \
    && ok "export - KEY | import -" || not_ok "export - KEY | import -"
$S export - --compress none | tar tf - | grep -q "^$K0.kv$" && ok "export --compress none: plain tar on stdout" \
    || not_ok "export --compress none"
expect_exit "export .tar.gz" 0 $S export "$T/all.tar.gz"
[ "$(od -An -tx1 -N2 "$T/all.tar.gz" | tr -d ' ')" = "1f8b" ] && ok "gzip from the name" || not_ok "gzip from the name"
expect_exit "export an unknown key" 66 $S export "$T/x.tar.zst" "$KX"
[ ! -e "$T/x.tar.zst" ] && ok "nothing written for an unknown key" || not_ok "nothing written for an unknown key"
expect_exit "export a malformed key" 64 $S export "$T/x.tar.zst" nope
expect_exit "import a missing archive" 66 $S2 import "$T/none.tar.zst"
python3 - "$T/evil.tar" "$KV0" "$T/kv/kv-2.kv" <<'PY'
import io, sys, tarfile
good = open(sys.argv[2], "rb").read()
other = open(sys.argv[3], "rb").read()
with tarfile.open(sys.argv[1], "w", format=tarfile.PAX_FORMAT) as t:
    def add(name, data=b"", kind=tarfile.REGTYPE, link=""):
        ti = tarfile.TarInfo(name); ti.type = kind; ti.linkname = link; ti.size = len(data)
        t.addfile(ti, io.BytesIO(data) if data else None)
    add("/tmp/cb-evil-abs.kv", good)
    add("../cb-evil-up.kv", good)
    add("a/../../cb-evil-mid.kv", good)
    add("sym.kv", kind=tarfile.SYMTYPE, link="/etc/passwd")
    add("hard.kv", kind=tarfile.LNKTYPE, link="sym.kv")
    add("junk.kv", b"hello")
    add("ok/kv-2.kv", other)
PY
$STORE --store "$T/st4" init
expect_exit "import a hostile archive" 65 $STORE --store "$T/st4" import "$T/evil.tar"
[ "$(grep -c rejected "$T/err")" -eq 6 ] && ok "six members rejected, each named" || not_ok "rejections: $(cat "$T/err")"
[ "$($STORE --store "$T/st4" ls | wc -l)" -eq 1 ] && ok "the valid member was imported" || not_ok "valid member imported"
[ ! -e /tmp/cb-evil-abs.kv ] && [ ! -e "$T/cb-evil-up.kv" ] && [ ! -e "$T/st4/cb-evil-up.kv" ] \
    && ok "nothing was written outside the store" || not_ok "nothing outside the store"
expect_exit "verify after the hostile import" 0 $STORE --store "$T/st4" verify
# A decompression bomb: a small tar.gz whose member, a valid KV header and
# then zeros, unpacks to 32 MiB.  Nothing of it may be staged (files are
# limited to 8 MiB here: staging it whole would fail with "File too large").
python3 - "$T/bomb.tar.gz" "$KV0" <<'PY'
import io, sys, tarfile
head = open(sys.argv[2], "rb").read()[:4096]
with tarfile.open(sys.argv[1], "w:gz", format=tarfile.PAX_FORMAT) as t:
    ti = tarfile.TarInfo("bomb.kv"); ti.size = 32 << 20
    t.addfile(ti, io.BytesIO(head + bytes(ti.size - len(head))))
PY
before=$($STORE --store "$T/st4" ls | wc -l)
expect_exit "import a decompression bomb" 65 sh -c "ulimit -f 8192; exec $STORE --store $T/st4 import $T/bomb.tar.gz"
grep -q "bomb.kv: rejected: holds 33554432 bytes, but a KV file with its header is $SZ bytes" "$T/err" \
    && ok "the bomb is named, with its size and its header's" || not_ok "bomb message: $(cat "$T/err")"
[ "$($STORE --store "$T/st4" ls | wc -l)" -eq "$before" ] && [ -z "$(ls -A "$T/st4/tmp")" ] \
    && ok "the store is as it was, nothing staged" || not_ok "store after the bomb"
expect_exit "a bomb larger than every tier: import stops" 65 sh -c "ulimit -f 8192; exec $S import $T/bomb.tar.gz"
grep -q "bomb.tar.gz: bomb.kv: 33554432 bytes, more than the largest tier's capacity (1048576 bytes)" "$T/err" \
    && ok "the archive, the member and the bound are named" || not_ok "bomb message: $(cat "$T/err")"
done_testing
