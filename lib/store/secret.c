/* secret.c - the shared tier's secrets and the sealing of its entries
 * (OpenSSL's libcrypto): the Redis password and the tier key are read from
 * files that only their owner may read (checked like ssh's keys), and never
 * put into a message; every part of an entry a keyed host writes is
 * encrypted and authenticated with AES-256-GCM under a key of its upload's
 * own, the tag binding it to its tier, its key, its upload, its place and
 * its entry's size (cb-store(5), SHARED TIER; mac_alg "aes-256-gcm-v3"):
 *
 *   K_u   = HKDF-SHA256-Expand(K, "cacheblend-entry-key-v3\0" || SID (32)
 *                                 || KEY (65) || NONCE (16), 32)
 *   IV_i  = u64le i || 0 (4 bytes)
 *   AAD_i = "cacheblend-part-v3\0" || SID || KEY || NONCE || u64le i
 *           || u64le N || u64le TOTAL || u64le len_i
 *   C_i, tag_i = AES-256-GCM-Encrypt(K_u, IV_i, AAD_i, part_i)
 *
 * K: the tier key (32 random bytes); SID: the shared tier's id; KEY: the
 * entry's key; NONCE: random, one per upload; N: the entry's parts; TOTAL:
 * its bytes.  Every field of AAD_i has a fixed length, so no two read the
 * same.  GCM must never see one (key, IV) pair twice: it would give away
 * the XOR of two plaintexts and the hash key, and with it forgeries.  K_u
 * is an upload's own: two uploads share it only when SID, KEY and a fresh
 * 128-bit random NONCE all repeat (a chance below q^2/2^129 after q
 * uploads) or HKDF collides; within an upload the IV is the part's index,
 * which never repeats (at most ST_MAX_PARTS parts, each sealed once); and
 * the labels "-v3" differ from the GMAC-only construction's "-v2", so a v3
 * upload never shares K_u with a v2 one even under one NONCE.  A reader
 * decrypts each part when it arrives and uses none of its bytes unless its
 * tag verifies.
 *
 * The previous construction, "aes-256-gmac-v2" (the same K_u, IV_i and
 * input with labels "-v2", GMAC over the part in clear), is still checked
 * when read (st_mac_upload, st_mac_check), so that entries written before
 * are read and then rewritten sealed; nothing here writes it but tests.
 * GCM runs at a few GB/s here (AES-NI and GHASH on PCLMUL). */
#include "store_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_SECRET_MAX 4096 /* bytes of a secret file */

/* ------------------------------------------------------------- files */

/* n less a final newline (and \r), which buf then ends before. */
static size_t strip_eol(char *buf, size_t n)
{
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
        buf[--n] = 0;
    return n;
}

/* Read a secret file into buf (NUL-terminated, at most cap - 1 bytes, a
 * final newline dropped):
 * a regular file that its owner (this user, or root) alone may read or
 * write.  A FIFO, a device or a socket is refused without waiting on it:
 * the file is checked before it is opened, opened without blocking, and
 * checked again as opened (it may have been swapped meanwhile).  Messages
 * name the file and `what`, never what it holds. */
static cb_status secret_read(const char *path, const char *what, char *buf, size_t cap, size_t *len,
                             cb_error *err)
{
    struct stat sb;
    cb_status st = CB_OK;
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
        return cb_error_set(err, CB_ERR_FORMAT, "%s %s: not a regular file", what, path);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        return cb_error_set(err, e == ENOENT || e == EACCES ? CB_ERR_NOT_FOUND : CB_ERR_IO,
                            "%s %s: %s", what, path, strerror(e));
    }
    if (fstat(fd, &sb) != 0) {
        st = cb_error_set(err, CB_ERR_IO, "%s %s: %s", what, path, strerror(errno));
        goto done;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = cb_error_set(err, CB_ERR_FORMAT, "%s %s: not a regular file", what, path);
        goto done;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    if (sb.st_mode & 077) {
        st = cb_error_set(err, CB_ERR_FORMAT,
                          "%s %s: permissions %04o are too open: others may read it (chmod 600 %s)",
                          what, path, (unsigned)(sb.st_mode & 07777), path);
        goto done;
    }
    if (sb.st_uid != geteuid() && sb.st_uid != 0) {
        st = cb_error_set(err, CB_ERR_FORMAT, "%s %s: owned by user %u, not by this user or root",
                          what, path, (unsigned)sb.st_uid);
        goto done;
    }
    size_t n = 0;
    while (n < cap - 1) {
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            st = cb_error_set(err, CB_ERR_IO, "%s %s: %s", what, path, strerror(errno));
            goto done;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    if (n == cap - 1) {
        st = cb_error_set(err, CB_ERR_FORMAT, "%s %s: longer than %zu bytes", what, path, cap - 2);
        goto done;
    }
    buf[n] = 0;
    *len = strip_eol(buf, n);
done:
    close(fd);
    if (st != CB_OK)
        OPENSSL_cleanse(buf, cap);
    return st;
}

cb_status st_auth_load(const char *path, char *user, size_t user_n, char *pass, size_t pass_n,
                       cb_error *err)
{
    char buf[ST_SECRET_MAX];
    size_t n;
    cb_status st = secret_read(path, "Redis password file", buf, sizeof buf, &n, err);
    if (st != CB_OK)
        return st;
    /* one line: PASSWORD, or USER PASSWORD */
    const char *sp = strchr(buf, ' ');
    const char *u = sp ? buf : "", *p = sp ? sp + 1 : buf;
    size_t ul = sp ? (size_t)(sp - buf) : 0;
    if (!*p || strchr(buf, '\n') || memchr(buf, 0, n) || (sp && ul == 0)) {
        st = cb_error_set(err, CB_ERR_FORMAT,
                          "Redis password file %s: want one line, PASSWORD or USER PASSWORD", path);
    } else if (ul >= user_n || strlen(p) >= pass_n) {
        st = cb_error_set(err, CB_ERR_FORMAT,
                          "Redis password file %s: the user or the password is too long", path);
    } else {
        snprintf(user, user_n, "%.*s", (int)ul, u);
        snprintf(pass, pass_n, "%s", p);
    }
    OPENSSL_cleanse(buf, sizeof buf);
    return st;
}

/* ---------------------------------------------------------------- MAC */

static const char KEY_ID_LABEL[] = "cacheblend-key-id-v1";
static const char ENTRY_LABEL[] = "cacheblend-entry-key-v2"; /* and its NUL */
static const char PART_LABEL[] = "cacheblend-part-v2";       /* and its NUL */
static const char SEAL_ENTRY_LABEL[] = "cacheblend-entry-key-v3";
static const char SEAL_PART_LABEL[] = "cacheblend-part-v3";

void st_mac_free(st_mac *m)
{
    EVP_KDF_CTX_free(m->kdf);
    m->kdf = NULL;
    m->id[0] = 0;
}

cb_status st_mac_from_key(st_mac *m, const uint8_t key[ST_KEY_BYTES], cb_error *err)
{
    uint8_t t[32];
    size_t tl = 0;
    static const char hx[] = "0123456789abcdef";
    st_mac_free(m);
    /* The key's id, as v1 made it: HMAC-SHA256(K, "cacheblend-key-id-v1"). */
    if (!EVP_Q_mac(NULL, "HMAC", NULL, "SHA256", NULL, key, ST_KEY_BYTES,
                   (const uint8_t *)KEY_ID_LABEL, sizeof KEY_ID_LABEL - 1, t, sizeof t, &tl) ||
        tl != sizeof t)
        return cb_error_set(err, CB_ERR_INTERNAL, "HMAC-SHA256 is not available in libcrypto");
    for (int i = 0; i < 8; i++) {
        m->id[2 * i] = hx[t[i] >> 4];
        m->id[2 * i + 1] = hx[t[i] & 15];
    }
    m->id[16] = 0;
    /* HKDF's expand step alone: K is already a uniformly random key (RFC
     * 5869, 3.3).  The context keeps its own copy of K. */
    EVP_KDF *kdf = EVP_KDF_fetch(NULL, "HKDF", NULL);
    int mode = EVP_KDF_HKDF_MODE_EXPAND_ONLY;
    OSSL_PARAM prm[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, (char *)"SHA256", 0),
        OSSL_PARAM_construct_int(OSSL_KDF_PARAM_MODE, &mode),
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, (void *)key, ST_KEY_BYTES),
        OSSL_PARAM_construct_end()};
    m->kdf = kdf ? EVP_KDF_CTX_new(kdf) : NULL;
    EVP_KDF_free(kdf); /* the context keeps its own reference */
    if (!m->kdf || EVP_KDF_CTX_set_params(m->kdf, prm) != 1) {
        st_mac_free(m);
        return cb_error_set(err, CB_ERR_INTERNAL, "HKDF-SHA256 is not available in libcrypto");
    }
    return CB_OK;
}

cb_status st_key_load(const char *path, st_mac *m, cb_error *err)
{
    char buf[256];
    uint8_t key[ST_KEY_BYTES];
    size_t n;
    cb_status st = secret_read(path, "tier key", buf, sizeof buf, &n, err);
    if (st != CB_OK)
        return st;
    if (n != 2 * ST_KEY_BYTES || !st_is_hex(buf, n)) {
        OPENSSL_cleanse(buf, sizeof buf);
        return cb_error_set(err, CB_ERR_FORMAT,
                            "tier key %s: not a tier key (%d hexadecimal digits; cb-store keygen "
                            "makes one)",
                            path, 2 * ST_KEY_BYTES);
    }
    for (size_t i = 0; i < ST_KEY_BYTES; i++) {
        char c0 = buf[2 * i], c1 = buf[2 * i + 1];
        key[i] = (uint8_t)(((c0 <= '9' ? c0 - '0' : c0 - 'a' + 10) << 4) |
                           (c1 <= '9' ? c1 - '0' : c1 - 'a' + 10));
    }
    OPENSSL_cleanse(buf, sizeof buf);
    st = st_mac_from_key(m, key, err);
    OPENSSL_cleanse(key, sizeof key);
    return st;
}

/* K_u of the upload id names, under label (with its NUL): 0, or -1. */
static int upload_key(const st_mac *m, const char *label, size_t label_n, const st_part_id *id,
                      uint8_t ku[32])
{
    if (!m->kdf)
        return -1;
    /* info: the label and its NUL, SID, KEY, NONCE (fixed lengths), given
     * in pieces, which HKDF concatenates */
    OSSL_PARAM info[] = {
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, (void *)label, label_n),
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, (void *)id->sid, 32),
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, (void *)id->key, 65),
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, (void *)id->nonce, ST_NONCE_BYTES),
        OSSL_PARAM_construct_end()};
    return EVP_KDF_derive(m->kdf, ku, 32, info) == 1 ? 0 : -1;
}

st_mac_ctx *st_mac_upload(const st_mac *m, const st_part_id *id)
{
    uint8_t ku[32];
    EVP_MAC_CTX *c = NULL;
    if (upload_key(m, ENTRY_LABEL, sizeof ENTRY_LABEL, id, ku) == 0) {
        EVP_MAC *alg = EVP_MAC_fetch(NULL, "GMAC", NULL);
        OSSL_PARAM prm[] = {
            OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_CIPHER, (char *)"AES-256-GCM", 0),
            OSSL_PARAM_construct_end()};
        c = alg ? EVP_MAC_CTX_new(alg) : NULL;
        EVP_MAC_free(alg); /* the context keeps its own reference */
        if (c && EVP_MAC_init(c, ku, sizeof ku, prm) != 1) {
            EVP_MAC_CTX_free(c);
            c = NULL;
        }
    }
    OPENSSL_cleanse(ku, sizeof ku);
    return c;
}

void st_mac_ctx_free(st_mac_ctx *c) { EVP_MAC_CTX_free(c); }

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* What a part's tag binds (its label, with the NUL, then the tier, entry,
 * upload nonce, part index, part count, total and length) into out, and
 * its IV: the part's index, unique within the upload, whose key is its own.
 * The two labels have the same length, so both formats bind
 * PART_BOUND_BYTES. */
#define PART_BOUND_BYTES (sizeof PART_LABEL + 32 + 65 + ST_NONCE_BYTES + 32)
static void part_bound(uint8_t *out, const char *label, const st_part_id *id, uint64_t i,
                       size_t len, uint8_t iv[12])
{
    uint8_t *p = out;
    memcpy(p, label, sizeof PART_LABEL);
    p += sizeof PART_LABEL;
    memcpy(p, id->sid, 32);
    p += 32;
    memcpy(p, id->key, 65);
    p += 65;
    memcpy(p, id->nonce, ST_NONCE_BYTES);
    p += ST_NONCE_BYTES;
    put_u64(p, i);
    put_u64(p + 8, id->n_parts);
    put_u64(p + 16, id->total);
    put_u64(p + 24, (uint64_t)len);
    memset(iv, 0, 12);
    put_u64(iv, i);
}
_Static_assert(sizeof PART_LABEL == sizeof SEAL_PART_LABEL, "part labels of one length");

int st_mac_part(st_mac_ctx *c, const st_part_id *id, uint64_t i, const void *part, size_t len,
                uint8_t tag[ST_TAG_BYTES])
{
    uint8_t pre[PART_BOUND_BYTES], iv[12];
    size_t tl;
    part_bound(pre, PART_LABEL, id, i, len, iv);
    OSSL_PARAM prm[] = {OSSL_PARAM_construct_octet_string(OSSL_MAC_PARAM_IV, iv, sizeof iv),
                        OSSL_PARAM_construct_end()};
    if (!c || EVP_MAC_init(c, NULL, 0, prm) != 1 || EVP_MAC_update(c, pre, sizeof pre) != 1 ||
        (len && EVP_MAC_update(c, part, len) != 1) ||
        EVP_MAC_final(c, tag, &tl, ST_TAG_BYTES) != 1 || tl != ST_TAG_BYTES)
        return -1;
    return 0;
}

int st_mac_check(st_mac_ctx *c, const st_part_id *id, uint64_t i, const void *part, size_t len,
                 const uint8_t want[ST_TAG_BYTES])
{
    uint8_t tag[ST_TAG_BYTES];
    if (st_mac_part(c, id, i, part, len, tag) != 0)
        return 0;
    return CRYPTO_memcmp(tag, want, ST_TAG_BYTES) == 0;
}

/* --------------------------------------------------------------- seal */

st_seal_ctx *st_seal_upload(const st_mac *m, const st_part_id *id)
{
    uint8_t ku[32];
    EVP_CIPHER_CTX *c = NULL;
    if (upload_key(m, SEAL_ENTRY_LABEL, sizeof SEAL_ENTRY_LABEL, id, ku) == 0) {
        EVP_CIPHER *alg = EVP_CIPHER_fetch(NULL, "AES-256-GCM", NULL);
        c = alg ? EVP_CIPHER_CTX_new() : NULL;
        /* the key schedule made once; each part sets its IV and direction */
        if (c && EVP_CipherInit_ex2(c, alg, ku, NULL, 1, NULL) != 1) {
            EVP_CIPHER_CTX_free(c);
            c = NULL;
        }
        EVP_CIPHER_free(alg); /* the context keeps its own reference */
    }
    OPENSSL_cleanse(ku, sizeof ku);
    return c;
}

void st_seal_ctx_free(st_seal_ctx *c) { EVP_CIPHER_CTX_free(c); }

/* Part i of len bytes through c, in (enc 1) or out of (enc 0) GCM, from in
 * to out (which may be in): 0, or -1 when libcrypto fails.  Encrypting,
 * the tag is written to tag; decrypting, tag is checked at the end, -1
 * when it does not verify. */
static int seal_run(st_seal_ctx *c, const st_part_id *id, uint64_t i, const void *in, size_t len,
                    void *out, uint8_t tag[ST_TAG_BYTES], int enc)
{
    uint8_t aad[PART_BOUND_BYTES], iv[12];
    int n;
    if (!c)
        return -1;
    part_bound(aad, SEAL_PART_LABEL, id, i, len, iv);
    if (EVP_CipherInit_ex2(c, NULL, NULL, iv, enc, NULL) != 1 ||
        EVP_CipherUpdate(c, NULL, &n, aad, (int)sizeof aad) != 1)
        return -1;
    const uint8_t *s = in;
    uint8_t *d = out;
    for (size_t off = 0; off < len;) { /* EVP counts in int */
        int step = len - off < (1u << 30) ? (int)(len - off) : 1 << 30;
        if (EVP_CipherUpdate(c, d + off, &n, s + off, step) != 1 || n != step)
            return -1;
        off += (size_t)step;
    }
    if (!enc && EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, ST_TAG_BYTES, tag) != 1)
        return -1;
    if (EVP_CipherFinal_ex(c, d + len, &n) != 1 || n != 0)
        return -1;
    if (enc && EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, ST_TAG_BYTES, tag) != 1)
        return -1;
    return 0;
}

int st_seal_part(st_seal_ctx *c, const st_part_id *id, uint64_t i, const void *part, size_t len,
                 void *out, uint8_t tag[ST_TAG_BYTES])
{
    return seal_run(c, id, i, part, len, out, tag, 1);
}

int st_seal_open(st_seal_ctx *c, const st_part_id *id, uint64_t i, const void *sealed, size_t len,
                 void *out, const uint8_t want[ST_TAG_BYTES])
{
    uint8_t tag[ST_TAG_BYTES];
    memcpy(tag, want, ST_TAG_BYTES);
    if (seal_run(c, id, i, sealed, len, out, tag, 0) == 0)
        return 1;
    OPENSSL_cleanse(out, len); /* nothing of a part that failed is left to use */
    return 0;
}

int st_mac_nonce(uint8_t nonce[ST_NONCE_BYTES])
{
    return RAND_bytes(nonce, ST_NONCE_BYTES) == 1 ? 0 : -1;
}

/* -------------------------------------------------------------- keygen */

cb_status cb_store_keygen(const char *path, cb_error *err)
{
    static const char hx[] = "0123456789abcdef";
    uint8_t key[ST_KEY_BYTES];
    char text[2 * ST_KEY_BYTES + 2];
    cb_status st = CB_OK;
    if (!path || !*path)
        return cb_error_set(err, CB_ERR_INVALID, "keygen: no file");
    if (access(path, F_OK) == 0)
        return cb_error_set(err, CB_ERR_CREATE,
                            "%s: exists; a tier key is never overwritten (remove it first)", path);
    if (RAND_bytes(key, sizeof key) != 1)
        return cb_error_set(err, CB_ERR_INTERNAL, "keygen: no random bytes from libcrypto");
    for (size_t i = 0; i < ST_KEY_BYTES; i++) {
        text[2 * i] = hx[key[i] >> 4];
        text[2 * i + 1] = hx[key[i] & 15];
    }
    text[2 * ST_KEY_BYTES] = '\n';
    text[2 * ST_KEY_BYTES + 1] = 0;
    OPENSSL_cleanse(key, sizeof key);
    /* Made 0600 from the start, complete and synced under a temporary name,
     * then linked to its name, which fails when something got there first. */
    char *tmp = st_asprintf("%s.tmp.%d", path, (int)getpid());
    int fd = tmp ? open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600) : -1;
    if (fd < 0) {
        st = cb_error_set(err, CB_ERR_CREATE, "%s: %s", tmp ? tmp : path,
                          tmp ? strerror(errno) : "out of memory");
        goto done;
    }
    if (fchmod(fd, 0600) != 0 || st_write_all(fd, text, strlen(text)) != 0 || fsync(fd) != 0) {
        st = cb_error_set(err, CB_ERR_IO, "%s: %s", tmp, strerror(errno));
    } else if (link(tmp, path) != 0) {
        st = cb_error_set(err, CB_ERR_CREATE, "%s: %s", path, strerror(errno));
    }
    close(fd);
    unlink(tmp);
    if (st == CB_OK) {
        char *dir = strdup(path), *sl = dir ? strrchr(dir, '/') : NULL;
        if (sl)
            *(sl == dir ? sl + 1 : sl) = 0;
        st_fsync_dir(sl ? dir : ".");
        free(dir);
    }
done:
    OPENSSL_cleanse(text, sizeof text);
    free(tmp);
    return st;
}
