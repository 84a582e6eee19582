/* HPACK decoder (RFC 7541): integers, string literals (Huffman-coded or not), the static table and the peer's
 * dynamic table with its size updates. Every length is checked against the block before it is read, so a malformed
 * or hostile block is an error, never a read past its end. */
#include "hpack.h"

#include <stdlib.h>
#include <string.h>

#include "hpack_tables.h"

/* The Huffman code as a binary tree, built once: node i has children tree[i][0..1]; a leaf is -(symbol + 1). */
static int16_t huff_tree[512][2];
static int huff_nodes = 0;

static void huff_build(void) {
    huff_nodes = 1;
    memset(huff_tree, 0, sizeof huff_tree);
    for (int sym = 0; sym < 257; sym++) {
        uint32_t code = hp_huff_code[sym];
        int len = hp_huff_len[sym], node = 0;
        for (int bit = len - 1; bit >= 0; bit--) {
            int b = (code >> bit) & 1;
            if (bit == 0) {
                huff_tree[node][b] = (int16_t)(-(sym + 1));
            } else {
                if (huff_tree[node][b] == 0) huff_tree[node][b] = (int16_t)huff_nodes++;
                node = huff_tree[node][b];
            }
        }
    }
}

long hp_huffman_decode(const uint8_t *p, size_t len, uint8_t *out) {
    if (huff_nodes == 0) huff_build();
    long n = 0;
    int node = 0, depth = 0, ones = 1; /* bits read since the last symbol, and whether all were 1 */
    for (size_t i = 0; i < len; i++) {
        for (int bit = 7; bit >= 0; bit--) {
            int b = (p[i] >> bit) & 1;
            int next = huff_tree[node][b];
            if (next < 0) {
                int sym = -next - 1;
                if (sym == 256) return -1; /* EOS in a string is an error (5.2) */
                out[n++] = (uint8_t)sym;
                node = 0, depth = 0, ones = 1;
            } else {
                if (next == 0) return -1;
                node = next, depth++, ones &= b;
            }
        }
    }
    if (depth > 7 || !ones) return -1; /* padding: fewer than 8 bits, the EOS prefix (all ones) */
    return n;
}

size_t hp_encode_int(uint8_t *out, uint8_t first, int prefix_bits, uint32_t value) {
    uint32_t max = (1u << prefix_bits) - 1;
    if (value < max) {
        out[0] = (uint8_t)(first | value);
        return 1;
    }
    size_t n = 0;
    out[n++] = (uint8_t)(first | max);
    value -= max;
    while (value >= 128) {
        out[n++] = (uint8_t)(0x80 | (value & 0x7f));
        value >>= 7;
    }
    out[n++] = (uint8_t)value;
    return n;
}

void hp_init(hp_decoder *d, size_t settings_max) {
    memset(d, 0, sizeof *d);
    d->settings_max = d->max_size = settings_max;
}

void hp_free(hp_decoder *d) {
    for (uint32_t i = 0; i < d->count; i++) free(d->ring[(d->head + d->cap - 1 - i) % d->cap].data);
    free(d->ring);
    free(d->scratch);
    memset(d, 0, sizeof *d);
}

/* Oldest entries out until the table fits `limit`. */
static void evict_to(hp_decoder *d, size_t limit) {
    while (d->count > 0 && d->size > limit) {
        uint32_t oldest = (d->head + d->cap - d->count) % d->cap;
        hp_entry *e = &d->ring[oldest];
        d->size -= (size_t)e->nlen + e->vlen + 32;
        free(e->data);
        e->data = NULL;
        d->count--;
    }
}

static int table_add(hp_decoder *d, const uint8_t *name, size_t nlen, const uint8_t *value, size_t vlen) {
    size_t esize = nlen + vlen + 32;
    if (esize > d->max_size) { /* 4.4: an entry larger than the table empties it and is not added */
        evict_to(d, 0);
        return 0;
    }
    evict_to(d, d->max_size - esize);
    if (d->count == d->cap) { /* grow the ring, oldest first at index 0 */
        uint32_t ncap = d->cap ? d->cap * 2 : 16;
        hp_entry *nr = calloc(ncap, sizeof *nr);
        if (!nr) return -1;
        for (uint32_t i = 0; i < d->count; i++) nr[i] = d->ring[(d->head + d->cap - d->count + i) % d->cap];
        free(d->ring);
        d->ring = nr, d->cap = ncap, d->head = d->count;
    }
    uint8_t *data = malloc(nlen + vlen + 1);
    if (!data) return -1;
    memcpy(data, name, nlen);
    memcpy(data + nlen, value, vlen);
    d->ring[d->head] = (hp_entry){data, (uint32_t)nlen, (uint32_t)vlen};
    d->head = (d->head + 1) % d->cap;
    d->count++;
    d->size += esize;
    return 0;
}

/* Entry `index` (1-based, static then dynamic); -1 when out of range. */
static int lookup(hp_decoder *d, uint32_t index, const uint8_t **name, size_t *nlen, const uint8_t **value,
                  size_t *vlen) {
    if (index == 0) return -1;
    if (index <= 61) {
        const hp_static_entry *e = &hp_static[index - 1];
        *name = (const uint8_t *)e->name, *nlen = strlen(e->name);
        *value = (const uint8_t *)e->value, *vlen = strlen(e->value);
        return 0;
    }
    uint32_t k = index - 62; /* 0 = newest */
    if (k >= d->count) return -1;
    hp_entry *e = &d->ring[(d->head + d->cap - 1 - k) % d->cap];
    *name = e->data, *nlen = e->nlen, *value = e->data + e->nlen, *vlen = e->vlen;
    return 0;
}

static int read_int(const uint8_t **p, const uint8_t *end, int prefix_bits, uint32_t *out) {
    uint32_t max = (1u << prefix_bits) - 1;
    uint32_t v = **p & max;
    (*p)++;
    if (v < max) {
        *out = v;
        return 0;
    }
    for (int shift = 0; shift <= 28; shift += 7) {
        if (*p >= end) return -1;
        uint8_t b = **p;
        (*p)++;
        uint64_t add = (uint64_t)(b & 0x7f) << shift;
        if (v + add > 0xffffffffu) return -1;
        v += (uint32_t)add;
        if (!(b & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return -1; /* more than 5 continuation bytes: no header needs an integer that large */
}

/* A string literal into the scratch buffer at *used; its bytes returned through out/olen. */
static int read_string(hp_decoder *d, const uint8_t **p, const uint8_t *end, size_t *used, size_t *off,
                       size_t *olen) {
    if (*p >= end) return -1;
    int huff = **p & 0x80;
    uint32_t len;
    if (read_int(p, end, 7, &len) < 0 || (size_t)(end - *p) < len) return -1;
    size_t need = *used + (huff ? (size_t)len * 8 / 5 + 1 : len);
    if (need > d->scratch_cap) {
        size_t ncap = d->scratch_cap ? d->scratch_cap : 1024;
        while (ncap < need) ncap *= 2;
        uint8_t *ns = realloc(d->scratch, ncap);
        if (!ns) return -1;
        d->scratch = ns, d->scratch_cap = ncap;
    }
    *off = *used;
    if (huff) {
        long n = hp_huffman_decode(*p, len, d->scratch + *used);
        if (n < 0) return -1;
        *olen = (size_t)n;
    } else {
        if (len) memcpy(d->scratch + *used, *p, len);
        *olen = len;
    }
    *used += *olen;
    *p += len;
    return 0;
}

int hp_decode(hp_decoder *d, const uint8_t *p, size_t len, hp_field_cb cb, void *ctx) {
    const uint8_t *end = p + len;
    int fields = 0;
    while (p < end) {
        uint8_t b = *p;
        const uint8_t *name, *value;
        size_t nlen, vlen, used = 0;
        if (b & 0x80) { /* indexed field (6.1) */
            uint32_t index;
            if (read_int(&p, end, 7, &index) < 0 || lookup(d, index, &name, &nlen, &value, &vlen) < 0) return -1;
            if (cb(ctx, name, nlen, value, vlen)) return -1;
            fields++;
            continue;
        }
        if ((b & 0xe0) == 0x20) { /* dynamic table size update (6.3): only before the first field */
            uint32_t size;
            if (fields > 0 || read_int(&p, end, 5, &size) < 0 || size > d->settings_max) return -1;
            d->max_size = size;
            evict_to(d, size);
            continue;
        }
        int incremental = (b & 0xc0) == 0x40;
        int prefix = incremental ? 6 : 4; /* 6.2.1 with indexing; 6.2.2 without; 6.2.3 never indexed */
        uint32_t index;
        if (read_int(&p, end, prefix, &index) < 0) return -1;
        size_t noff = 0, voff;
        int literal_name = index == 0;
        if (literal_name) {
            if (read_string(d, &p, end, &used, &noff, &nlen) < 0) return -1;
        } else if (lookup(d, index, &name, &nlen, &value, &vlen) < 0) {
            return -1;
        }
        if (read_string(d, &p, end, &used, &voff, &vlen) < 0) return -1;
        if (literal_name) name = d->scratch + noff; /* the scratch buffer may have moved while reading the value */
        value = d->scratch + voff;
        if (incremental) {
            /* the name may live in the dynamic table, which adding can evict: copy it to scratch first */
            if (!literal_name) {
                if (used + nlen > d->scratch_cap) {
                    size_t ncap = d->scratch_cap * 2 + nlen;
                    uint8_t *ns = realloc(d->scratch, ncap);
                    if (!ns) return -1;
                    d->scratch = ns, d->scratch_cap = ncap;
                    value = d->scratch + voff;
                }
                if (nlen) memcpy(d->scratch + used, name, nlen);
                name = d->scratch + used;
            }
            if (table_add(d, name, nlen, value, vlen) < 0) return -1;
        }
        if (cb(ctx, name, nlen, value, vlen)) return -1;
        fields++;
    }
    return 0;
}
