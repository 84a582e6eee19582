/* google.protobuf.Struct as wire bytes, written by hand: the framing epp/extproc/_metadata.c (the `envoy.lb`
 * metadata of an answer) and epp/scheduling/_receipt.c (a route receipt's entries of it, written by the receipt's
 * own call) share, so the two write the same bytes for the same fields. A writer sizes first (`delimited`,
 * `entry_body`), then writes (`put_header`, `put_string_entry`, `put_number_entry`). */
#ifndef EPP_STRUCT_WIRE_H
#define EPP_STRUCT_WIRE_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

#define TAG_FIELDS 0x0A      /* Struct.fields (1), and a map entry's key (1) */
#define TAG_ENTRY_VALUE 0x12 /* a map entry's value (2) */
#define TAG_NUMBER 0x11      /* Value.number_value (2, fixed64) */
#define TAG_STRING 0x1A      /* Value.string_value (3) */
#define TAG_STRUCT 0x2A      /* Value.struct_value (5) */

static inline Py_ssize_t
varint_size(uint64_t v)
{
    Py_ssize_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static inline char *
put_varint(char *w, uint64_t v)
{
    while (v >= 0x80) {
        *w++ = (char)(v | 0x80);
        v >>= 7;
    }
    *w++ = (char)v;
    return w;
}

/* a length-delimited field: tag, length, then the caller writes `len` bytes */
static inline char *
put_header(char *w, unsigned char tag, Py_ssize_t len)
{
    *w++ = (char)tag;
    return put_varint(w, (uint64_t)len);
}

static inline Py_ssize_t
delimited(Py_ssize_t len) /* a length-delimited field's size, tag and length included */
{
    return 1 + varint_size((uint64_t)len) + len;
}

/* Struct.fields entry: key (1), value (2: a Value) */
static inline Py_ssize_t
entry_body(Py_ssize_t key, Py_ssize_t value)
{
    return delimited(key) + delimited(value);
}

/* an entry's framing up to its Value's own bytes: `key` → Value (`value` bytes, its tag and length included) */
static inline char *
put_entry_key(char *w, const char *key, Py_ssize_t klen, Py_ssize_t value)
{
    w = put_header(w, TAG_FIELDS, entry_body(klen, value));
    w = put_header(w, TAG_FIELDS, klen);
    memcpy(w, key, klen);
    w += klen;
    return put_header(w, TAG_ENTRY_VALUE, value);
}

/* an entry `key` → Value{struct_value: Struct of `struct_len` bytes}, up to the Struct's fields (the caller's) */
static inline char *
put_struct_entry_head(char *w, const char *key, Py_ssize_t klen, Py_ssize_t struct_len)
{
    w = put_entry_key(w, key, klen, delimited(struct_len));
    return put_header(w, TAG_STRUCT, struct_len);
}

/* the whole entry `key` → Value{string_value: s} */
static inline char *
put_string_entry(char *w, const char *key, Py_ssize_t klen, const char *s, Py_ssize_t slen)
{
    w = put_entry_key(w, key, klen, delimited(slen));
    w = put_header(w, TAG_STRING, slen);
    memcpy(w, s, slen);
    return w + slen;
}

/* the size of an entry `key` → Value{number_value} (its key `klen` bytes), tag and length included */
static inline Py_ssize_t
number_entry_size(Py_ssize_t klen)
{
    return delimited(entry_body(klen, 9));
}

/* the whole entry `key` → Value{number_value: x} */
static inline char *
put_number_entry(char *w, const char *key, Py_ssize_t klen, double x)
{
    if (klen < 115) { /* the entry's body (klen + 13) under 128 bytes: every length one byte (an address always) */
        *w++ = (char)TAG_FIELDS;
        *w++ = (char)(klen + 13);
        *w++ = (char)TAG_FIELDS;
        *w++ = (char)klen;
    } else {
        w = put_header(w, TAG_FIELDS, entry_body(klen, 9));
        w = put_header(w, TAG_FIELDS, klen);
    }
    memcpy(w, key, klen);
    w += klen;
    *w++ = (char)TAG_ENTRY_VALUE;
    *w++ = 9;
    *w++ = (char)TAG_NUMBER;
    uint64_t bits;
    memcpy(&bits, &x, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(w, &bits, 8); /* fixed64: little-endian, the host's order */
    return w + 8;
#else
    for (int b = 0; b < 8; b++) /* fixed64: little-endian */
        *w++ = (char)(bits >> (8 * b));
    return w;
#endif
}

#endif
