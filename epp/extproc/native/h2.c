/* The h2 subset an ext_proc server needs, server side (RFC 9113): the client preface, SETTINGS, PING,
 * WINDOW_UPDATE and flow control both ways, HEADERS + CONTINUATION through the HPACK decoder, DATA carrying gRPC's
 * length-prefixed messages, RST_STREAM and GOAWAY. No I/O: `h2_receive` takes bytes and reports events through a
 * callback; what must go out accumulates in `out`. A peer that breaks the protocol gets GOAWAY (connection errors)
 * or RST_STREAM (stream errors), never undefined behaviour: every length is checked before it is read. */
#include "h2.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* `:status: 200` (static index 8), `content-type: application/grpc` (literal, indexed name 31, not indexed). */
static const uint8_t RESPONSE_BLOCK[] = {0x88, 0x0f, 0x10, 16, 'a', 'p', 'p', 'l', 'i', 'c', 'a', 't', 'i', 'o',
                                         'n', '/', 'g', 'r', 'p', 'c'};

int buf_reserve(h2_buf *b, size_t extra) {
    if (b->len + extra <= b->cap) return 0;
    size_t ncap = b->cap ? b->cap : 256;
    while (ncap < b->len + extra) ncap *= 2;
    uint8_t *np = realloc(b->p, ncap);
    if (!np) return -1;
    b->p = np, b->cap = ncap;
    return 0;
}

int buf_append(h2_buf *b, const void *data, size_t n) {
    if (n == 0) return 0;
    if (buf_reserve(b, n) < 0) return -1;
    memcpy(b->p + b->len, data, n);
    b->len += n;
    return 0;
}

void buf_consume(h2_buf *b, size_t n) {
    if (n >= b->len) {
        b->len = 0;
        if (b->cap > (1u << 20)) { /* a large body passed: give the memory back */
            free(b->p);
            b->p = NULL, b->cap = 0;
        }
        return;
    }
    memmove(b->p, b->p + n, b->len - n);
    b->len -= n;
}

void buf_free(h2_buf *b) {
    free(b->p);
    b->p = NULL, b->len = b->cap = 0;
}

uint32_t h2_rd32(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | p[2] << 8 | p[3]; }

void h2_wr32(uint8_t *p, uint32_t v) { p[0] = v >> 24, p[1] = v >> 16, p[2] = v >> 8, p[3] = (uint8_t)v; }

int h2_frame(h2_conn *c, uint32_t len, uint8_t type, uint8_t flags, uint32_t sid, const void *payload) {
    if (buf_reserve(&c->out, 9 + len) < 0) return -1;
    uint8_t *h = c->out.p + c->out.len;
    h[0] = len >> 16, h[1] = len >> 8, h[2] = (uint8_t)len, h[3] = type, h[4] = flags;
    h2_wr32(h + 5, sid & 0x7fffffff);
    c->out.len += 9;
    return buf_append(&c->out, payload, len);
}

int h2_emit(h2_conn *c, int kind, uint32_t sid, const uint8_t *data, size_t len, uint32_t code) {
    if (c->cb_failed) return -1;
    if (c->cb(c->ctx, kind, sid, data, len, code) < 0) c->cb_failed = 1;
    return c->cb_failed ? -1 : 0;
}

/* ---- streams by id: open addressing, linear probing, backward-shift deletion ---- */

static uint32_t home(h2_conn *c, uint32_t id) { return (id * 2654435761u) & (c->map_cap - 1); }

h2_stream *h2_find(h2_conn *c, uint32_t id) {
    if (!c->map_cap) return NULL;
    for (uint32_t i = home(c, id); c->map[i]; i = (i + 1) & (c->map_cap - 1))
        if (c->map[i]->id == id) return c->map[i];
    return NULL;
}

int h2_insert(h2_conn *c, h2_stream *s) {
    if ((c->nstreams + 1) * 2 > c->map_cap) {
        uint32_t ncap = c->map_cap ? c->map_cap * 2 : 64;
        h2_stream **old = c->map;
        uint32_t ocap = c->map_cap;
        c->map = calloc(ncap, sizeof *c->map);
        if (!c->map) {
            c->map = old;
            return -1;
        }
        c->map_cap = ncap;
        for (uint32_t i = 0; i < ocap; i++) {
            if (!old[i]) continue;
            uint32_t j = home(c, old[i]->id);
            while (c->map[j]) j = (j + 1) & (ncap - 1);
            c->map[j] = old[i];
        }
        free(old);
    }
    uint32_t i = home(c, s->id);
    while (c->map[i]) i = (i + 1) & (c->map_cap - 1);
    c->map[i] = s;
    c->nstreams++;
    return 0;
}

static void stream_free(h2_stream *s) {
    buf_free(&s->msg);
    buf_free(&s->pending);
    buf_free(&s->trailers);
    free(s);
}

void h2_drop(h2_conn *c, h2_stream *s) {
    uint32_t mask = c->map_cap - 1, i = home(c, s->id);
    while (c->map[i] != s) i = (i + 1) & mask;
    c->map[i] = NULL;
    for (uint32_t j = (i + 1) & mask; c->map[j]; j = (j + 1) & mask) {
        uint32_t k = home(c, c->map[j]->id);
        if (((j - k) & mask) >= ((j - i) & mask)) { /* its home is not between the hole and it: move it up */
            c->map[i] = c->map[j];
            c->map[j] = NULL;
            i = j;
        }
    }
    c->nstreams--;
    stream_free(s);
}

/* ---- errors ---- */

int h2_conn_error(h2_conn *c, uint32_t code) {
    if (c->closed) return -1;
    uint8_t p[8];
    h2_wr32(p, c->last_sid);
    h2_wr32(p + 4, code);
    h2_frame(c, 8, H2_GOAWAY, 0, 0, p);
    c->closed = c->goaway_sent = 1;
    h2_emit(c, EV_CLOSE, 0, NULL, 0, code);
    return -1;
}

void h2_rst(h2_conn *c, uint32_t sid, uint32_t code) {
    uint8_t p[4];
    h2_wr32(p, code);
    h2_frame(c, 4, H2_RST_STREAM, 0, sid, p);
}

/* A stream error: H2_RST_STREAM, the stream forgotten, Python told so its task ends. */
void h2_stream_error(h2_conn *c, h2_stream *s, uint32_t code) {
    uint32_t sid = s->id;
    h2_rst(c, sid, code);
    h2_drop(c, s);
    h2_emit(c, EV_RESET, sid, NULL, 0, code);
}

/* ---- sending ---- */

static size_t trailer_block(uint8_t *out, uint32_t status, const char *msg, size_t mlen) {
    static const char S[] = "grpc-status", M[] = "grpc-message";
    size_t n = 0;
    char digits[12];
    int dl = snprintf(digits, sizeof digits, "%u", status);
    out[n++] = 0x00, out[n++] = 11;
    memcpy(out + n, S, 11), n += 11;
    out[n++] = (uint8_t)dl;
    memcpy(out + n, digits, (size_t)dl), n += (size_t)dl;
    if (mlen == 0) return n;
    uint8_t enc[3 * 1024];
    size_t el = 0;
    for (size_t i = 0; i < mlen && el + 3 <= sizeof enc; i++) { /* gRPC's percent-encoding of grpc-message */
        uint8_t ch = (uint8_t)msg[i];
        if (ch >= 0x20 && ch <= 0x7e && ch != '%') {
            enc[el++] = ch;
        } else {
            static const char hex[] = "0123456789ABCDEF";
            enc[el++] = '%', enc[el++] = (uint8_t)hex[ch >> 4], enc[el++] = (uint8_t)hex[ch & 15];
        }
    }
    out[n++] = 0x00, out[n++] = 12;
    memcpy(out + n, M, 12), n += 12;
    n += hp_encode_int(out + n, 0x00, 7, (uint32_t)el);
    memcpy(out + n, enc, el);
    return n + el;
}

/* As much of the stream's pending DATA as the windows allow, then its trailers; 1 when the stream ended. */
int h2_flush_stream(h2_conn *c, h2_stream *s) {
    while (s->pending.len > 0 && s->send_window > 0 && c->conn_send_window > 0) {
        size_t n = s->pending.len;
        if (n > c->peer_max_frame) n = c->peer_max_frame;
        if ((int64_t)n > s->send_window) n = (size_t)s->send_window;
        if ((int64_t)n > c->conn_send_window) n = (size_t)c->conn_send_window;
        if (h2_frame(c, (uint32_t)n, H2_DATA, 0, s->id, s->pending.p) < 0) return 0;
        buf_consume(&s->pending, n);
        s->send_window -= (int64_t)n, c->conn_send_window -= (int64_t)n;
    }
    if (s->pending.len > 0 || !s->trailers_queued) return 0;
    h2_frame(c, (uint32_t)s->trailers.len, H2_HEADERS, H2_END_STREAM | H2_END_HEADERS, s->id, s->trailers.p);
    if (!s->remote_closed) h2_rst(c, s->id, H2_NO_ERROR); /* we are done: the client need not send the rest */
    h2_drop(c, s);
    return 1;
}

void h2_flush_blocked(h2_conn *c) {
    uint32_t n = 0, *ids = malloc(sizeof *ids * (c->nstreams + 1));
    if (!ids) return;
    for (uint32_t i = 0; i < c->map_cap; i++)
        if (c->map[i] && (c->map[i]->pending.len || c->map[i]->trailers_queued)) ids[n++] = c->map[i]->id;
    for (uint32_t i = 0; i < n && c->conn_send_window > 0; i++) {
        h2_stream *s = h2_find(c, ids[i]);
        if (s) h2_flush_stream(c, s);
    }
    free(ids);
}

int h2_send_message(h2_conn *c, uint32_t sid, const uint8_t *msg, size_t len) {
    h2_stream *s = h2_find(c, sid);
    if (!s || s->trailers_queued || c->closed) return 1;
    if (!s->headers_sent) {
        h2_frame(c, sizeof RESPONSE_BLOCK, H2_HEADERS, H2_END_HEADERS, sid, RESPONSE_BLOCK);
        s->headers_sent = 1;
    }
    uint8_t prefix[5] = {0};
    h2_wr32(prefix + 1, (uint32_t)len);
    if (buf_append(&s->pending, prefix, 5) < 0 || buf_append(&s->pending, msg, len) < 0) return -1;
    h2_flush_stream(c, s);
    return 0;
}

int h2_finish(h2_conn *c, uint32_t sid, uint32_t status, const char *message, size_t mlen) {
    h2_stream *s = h2_find(c, sid);
    if (!s || s->trailers_queued || c->closed) return 1;
    uint8_t block[sizeof RESPONSE_BLOCK + 64 + 3 * 1024 + 8];
    size_t n = 0;
    if (!s->headers_sent) { /* trailers-only: one HEADERS with the status */
        memcpy(block, RESPONSE_BLOCK, sizeof RESPONSE_BLOCK);
        n = sizeof RESPONSE_BLOCK;
        s->headers_sent = 1;
    }
    n += trailer_block(block + n, status, message, mlen);
    s->trailers.len = 0;
    if (buf_append(&s->trailers, block, n) < 0) return -1;
    s->trailers_queued = 1;
    h2_flush_stream(c, s);
    return 0;
}

int h2_reset(h2_conn *c, uint32_t sid, uint32_t code) {
    h2_stream *s = h2_find(c, sid);
    if (!s || c->closed) return 1;
    h2_rst(c, sid, code);
    h2_drop(c, s);
    return 0;
}

void h2_goaway(h2_conn *c, uint32_t code) {
    if (c->goaway_sent) return;
    c->drain_pinged = 0;
    uint8_t p[8];
    h2_wr32(p, c->last_sid);
    h2_wr32(p + 4, code);
    h2_frame(c, 8, H2_GOAWAY, 0, 0, p);
    c->goaway_sent = 1;
}

const uint8_t h2_drain_ping[8] = {'e', 'p', 'p', '-', 'g', 'o', 'n', 'e'};

void h2_drain(h2_conn *c) {
    if (c->goaway_sent || c->drain_pinged) return;
    uint8_t p[8];
    h2_wr32(p, 0x7fffffff);
    h2_wr32(p + 4, 0); /* NO_ERROR */
    h2_frame(c, 8, H2_GOAWAY, 0, 0, p);
    h2_frame(c, 8, H2_PING, 0, 0, h2_drain_ping);
    c->drain_pinged = 1;
}
