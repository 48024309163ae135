/* remote_mac.c - the tags of the shared tier's entries (remote.c) as
 * their metadata holds them (AES-256-GCM over sealed parts, or the older
 * AES-256-GMAC over parts in clear): read, and judged usable or not with
 * this host's tier key (the tags themselves: secret.c); older entries
 * rewritten sealed. */
#include "remote_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int unhex(const char *h, size_t n_bytes, uint8_t *out)
{
    if (!st_is_hex(h, 2 * n_bytes))
        return -1;
    for (size_t i = 0; i < n_bytes; i++) {
        char a = h[2 * i], b = h[2 * i + 1];
        out[i] = (uint8_t)(((a <= '9' ? a - '0' : a - 'a' + 10) << 4) |
                           (b <= '9' ? b - '0' : b - 'a' + 10));
    }
    return 0;
}

void st_tohex(const uint8_t *p, size_t n, char *out)
{
    static const char hx[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hx[p[i] >> 4];
        out[2 * i + 1] = hx[p[i] & 15];
    }
    out[2 * n] = 0;
}

/* An algorithm's name as stored (anyone who may write Redis chose it), or
 * "?" when it is no short name: fit for a message. */
static void alg_name(const redisReply *a, char *out, size_t n)
{
    out[0] = 0;
    if (a->type != REDIS_REPLY_STRING)
        return;
    int ok = a->len > 0 && a->len < n;
    for (size_t i = 0; ok && i < a->len; i++)
        ok = (a->str[i] >= 'a' && a->str[i] <= 'z') || (a->str[i] >= '0' && a->str[i] <= '9') ||
             a->str[i] == '-';
    snprintf(out, n, "%s", ok ? a->str : "?");
}

/* The mac fields of a reply (elements 7, 8, 9, 10 of the metadata's HMGET). */
void st_remote_meta_macs(rmeta *m, const redisReply *rep)
{
    m->mac_key[0] = 0;
    m->mac_alg[0] = 0;
    m->has_mac = 0;
    m->sealed = 0;
    m->tags = NULL;
    if (rep->elements < 11)
        return;
    const redisReply *k = rep->element[7], *n = rep->element[8], *t = rep->element[9];
    alg_name(rep->element[10], m->mac_alg, sizeof m->mac_alg);
    if (k->type == REDIS_REPLY_STRING && k->len == 16 && st_is_hex(k->str, 16))
        memcpy(m->mac_key, k->str, 17);
    m->sealed = strcmp(m->mac_alg, ST_MAC_ALG) == 0;
    if (!m->mac_key[0] || (!m->sealed && strcmp(m->mac_alg, ST_MAC_ALG_V2) != 0) ||
        n->type != REDIS_REPLY_STRING || t->type != REDIS_REPLY_STRING ||
        n->len != 2 * ST_NONCE_BYTES || unhex(n->str, ST_NONCE_BYTES, m->nonce) != 0 ||
        m->parts <= 0 || m->parts > ST_MAX_PARTS || t->len != (size_t)m->parts * 2 * ST_TAG_BYTES ||
        !(m->tags = malloc((size_t)m->parts * ST_TAG_BYTES)))
        return;
    if (unhex(t->str, (size_t)m->parts * ST_TAG_BYTES, m->tags) != 0) {
        free(m->tags);
        m->tags = NULL;
        return;
    }
    m->has_mac = 1;
}

/* With a tier key: 0 when the metadata carries tags made with it by the
 * algorithm this host knows, else -1 with why (an entry a host without the
 * key wrote, an older host's, or planted).  Without a key: 0. */
int st_remote_mac_usable(const cb_store *s, const rmeta *m, char *why, size_t why_n)
{
    const st_remote *r = &s->remote;
    if (!r->mac.kdf && strcmp(m->mac_alg, ST_MAC_ALG) == 0) {
        snprintf(why, why_n, "it is sealed (%s) and this host has no tier key", ST_MAC_ALG);
        return 1;
    }
    if (!r->mac.kdf)
        return 0;
    if (!m->mac_key[0])
        snprintf(why, why_n, "it carries no MAC (written without the tier key, or planted)");
    else if (strcmp(m->mac_key, r->mac.id) != 0)
        snprintf(why, why_n, "its MAC was made with another tier key (id %s; ours is %s)",
                 m->mac_key, r->mac.id);
    else if (!m->mac_alg[0])
        snprintf(
            why, why_n,
            "its MAC names no algorithm (an older host's HMAC-SHA256 tags, which are not read any "
            "more, or planted)");
    else if (strcmp(m->mac_alg, ST_MAC_ALG) != 0 && strcmp(m->mac_alg, ST_MAC_ALG_V2) != 0)
        snprintf(why, why_n, "its MAC algorithm %s is unknown here (this host reads %s and %s)",
                 m->mac_alg, ST_MAC_ALG, ST_MAC_ALG_V2);
    else if (!m->has_mac)
        snprintf(why, why_n, "its MAC is malformed");
    else
        return 0;
    return -1;
}

void st_remote_part_id(const cb_store *s, const char *key, const rmeta *m, st_part_id *id)
{
    id->sid = s->remote.id;
    id->key = key;
    memcpy(id->nonce, m->nonce, ST_NONCE_BYTES);
    id->n_parts = (uint64_t)m->parts;
    id->total = (uint64_t)m->bytes;
}

void st_remote_sealed_miss(cb_store *s, const char *key)
{
    st_remote *r = &s->remote;
    if (!r->sealed_warned++)
        st_remote_warn(s,
                       "shared tier %s: %s: sealed (%s) and this host has no tier key: a miss, as "
                       "is every sealed entry (cb-store init --key-file, or $CB_TIER_KEY_FILE)",
                       r->name, key, ST_MAC_ALG);
}

void st_remote_reseal(cb_store *s, const char *key, const void *data, size_t size, int64_t tokens)
{
    st_remote *r = &s->remote;
    /* the put finds the v2 entry not usable as it stands, drops it (unless
     * replaced meanwhile) and writes this one sealed */
    if (!r->mac.kdf || s->readonly || r->ro || s->no_write_through)
        return;
    if (st_remote_put(s, key, data, size, tokens < 0 ? 0 : tokens) == 0)
        r->n_resealed++;
}
