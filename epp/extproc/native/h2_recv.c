/* Frames in: the client preface, then each whole frame as it completes (a partial frame waits in `in`). The
 * checks follow RFC 9113's frame definitions; what a violation costs (the connection or just the stream) is the
 * RFC's too. gRPC's messages are cut out of each stream's DATA here (5-byte prefix: compressed flag, length). */
#include <stdlib.h>
#include <string.h>

#include "h2.h"

#define MAX_BLOCK (256u << 10) /* a header block larger than this is abuse */
#define MAX_WINDOW 0x7fffffffLL

enum { GRPC_UNIMPLEMENTED = 12, GRPC_RESOURCE_EXHAUSTED = 8, GRPC_INTERNAL = 13 };

static const char PREFACE[24] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

int h2_init(h2_conn *c, uint32_t max_message) {
    memset(c, 0, sizeof *c);
    hp_init(&c->dec, 4096);
    c->conn_send_window = 65535, c->conn_recv_window = H2_CONN_WINDOW;
    c->peer_initial_window = 65535, c->peer_max_frame = 16384;
    c->max_message = max_message;
    /* Our SETTINGS (no push, a larger stream window), then the connection window opened to its size. */
    uint8_t s[12] = {0, 2, 0, 0, 0, 0, 0, 4};
    h2_wr32(s + 8, H2_STREAM_WINDOW);
    uint8_t w[4];
    h2_wr32(w, H2_CONN_WINDOW - 65535);
    if (h2_frame(c, sizeof s, H2_SETTINGS, 0, 0, s) < 0 || h2_frame(c, 4, H2_WINDOW_UPDATE, 0, 0, w) < 0) return -1;
    return 0;
}

void h2_free(h2_conn *c) {
    for (uint32_t i = 0; i < c->map_cap; i++)
        if (c->map[i]) {
            buf_free(&c->map[i]->msg), buf_free(&c->map[i]->pending), buf_free(&c->map[i]->trailers);
            free(c->map[i]);
        }
    free(c->map);
    buf_free(&c->in), buf_free(&c->out), buf_free(&c->block);
    hp_free(&c->dec);
}

/* A stream's failure as gRPC sees it: its status in trailers (trailers-only when nothing was sent), the stream
 * reset, Python told. */
static void stream_fail(h2_conn *c, h2_stream *s, uint32_t status, const char *why) {
    uint32_t sid = s->id;
    s->pending.len = 0;
    if (h2_finish(c, sid, status, why, strlen(why)) == 0) h2_emit(c, EV_RESET, sid, NULL, 0, 0);
}

/* gRPC messages out of a stream's DATA; 1 when the stream failed (and is gone). */
static int deframe(h2_conn *c, h2_stream *s, const uint8_t *p, size_t n) {
    if (s->msg.len > 0) { /* a message already started: gather there */
        if (buf_append(&s->msg, p, n) < 0) return h2_conn_error(c, H2_INTERNAL_ERROR), 1;
        p = s->msg.p, n = s->msg.len;
    }
    size_t pos = 0;
    while (n - pos >= 5) {
        uint32_t mlen = h2_rd32(p + pos + 1);
        if (p[pos] != 0) return stream_fail(c, s, GRPC_UNIMPLEMENTED, "compressed messages are not accepted"), 1;
        if (mlen > c->max_message) return stream_fail(c, s, GRPC_RESOURCE_EXHAUSTED, "message too large"), 1;
        if (n - pos - 5 < mlen) break;
        if (h2_emit(c, EV_MESSAGE, s->id, p + pos + 5, mlen, 0) < 0) return 1;
        pos += 5 + (size_t)mlen;
    }
    if (s->msg.len > 0) {
        buf_consume(&s->msg, pos);
    } else if (pos < n && buf_append(&s->msg, p + pos, n - pos) < 0) {
        return h2_conn_error(c, H2_INTERNAL_ERROR), 1;
    }
    return 0;
}

/* The peer half-closed the stream: a message cut short fails it, else Python hears of the end. */
static void remote_end(h2_conn *c, h2_stream *s) {
    s->remote_closed = 1;
    if (s->msg.len > 0) {
        stream_fail(c, s, GRPC_INTERNAL, "the stream ended inside a message");
        return;
    }
    h2_emit(c, EV_END, s->id, NULL, 0, 0);
}

static int on_data(h2_conn *c, uint32_t sid, uint8_t flags, const uint8_t *p, uint32_t n) {
    if (sid == 0) return h2_conn_error(c, H2_PROTOCOL_ERROR);
    c->conn_recv_window -= n; /* the whole frame counts, padding included */
    if (c->conn_recv_window < 0) return h2_conn_error(c, H2_FLOW_CONTROL_ERROR);
    if (c->conn_recv_window < H2_CONN_WINDOW / 2) {
        uint8_t w[4];
        h2_wr32(w, (uint32_t)(H2_CONN_WINDOW - c->conn_recv_window));
        h2_frame(c, 4, H2_WINDOW_UPDATE, 0, 0, w);
        c->conn_recv_window = H2_CONN_WINDOW;
    }
    uint32_t frame_len = n;
    if (flags & H2_PADDED) {
        if (n < 1 || p[0] >= n) return h2_conn_error(c, H2_PROTOCOL_ERROR);
        n -= 1 + p[0], p++;
    }
    h2_stream *s = h2_find(c, sid);
    if (!s) return sid > c->last_sid ? h2_conn_error(c, H2_PROTOCOL_ERROR) : 0; /* idle: error; closed: ignored */
    if (s->remote_closed) return h2_stream_error(c, s, H2_STREAM_CLOSED), 0;
    s->recv_window -= frame_len;
    if (s->recv_window < 0) return h2_stream_error(c, s, H2_FLOW_CONTROL_ERROR), 0;
    if (deframe(c, s, p, n)) return c->closed ? -1 : 0;
    if (flags & H2_END_STREAM) {
        remote_end(c, s);
    } else if (s->recv_window < H2_STREAM_WINDOW / 2) {
        uint8_t w[4];
        h2_wr32(w, (uint32_t)(H2_STREAM_WINDOW - s->recv_window));
        h2_frame(c, 4, H2_WINDOW_UPDATE, 0, sid, w);
        s->recv_window = H2_STREAM_WINDOW;
    }
    return 0;
}

typedef struct {
    uint8_t path[512];
    size_t plen;
    uint8_t meta[4096]; /* the other fields, "name\0value\0" each: the stream's gRPC metadata */
    size_t mlen;
} block_fields;

static int on_field(void *ctx, const uint8_t *name, size_t nlen, const uint8_t *value, size_t vlen) {
    block_fields *f = ctx;
    if (nlen == 5 && memcmp(name, ":path", 5) == 0) {
        f->plen = vlen < sizeof f->path ? vlen : sizeof f->path;
        memcpy(f->path, value, f->plen);
    } else if (nlen > 0 && name[0] != ':' && f->mlen + nlen + vlen + 2 <= sizeof f->meta) {
        memcpy(f->meta + f->mlen, name, nlen);
        f->meta[f->mlen + nlen] = 0;
        memcpy(f->meta + f->mlen + nlen + 1, value, vlen);
        f->meta[f->mlen + nlen + 1 + vlen] = 0;
        f->mlen += nlen + vlen + 2;
    }
    return 0;
}

/* A whole header block: decoded always (the dynamic table must stay in step), then a new stream or trailers. */
static int on_block(h2_conn *c) {
    uint32_t sid = c->block_sid;
    int end_stream = c->block_end_stream;
    block_fields f;
    f.plen = f.mlen = 0;
    c->block_sid = 0;
    int rc = hp_decode(&c->dec, c->block.p, c->block.len, on_field, &f);
    c->block.len = 0;
    if (rc < 0) return h2_conn_error(c, H2_COMPRESSION_ERROR);
    h2_stream *s = h2_find(c, sid);
    if (s) { /* trailers: they must end the stream */
        if (!end_stream || s->remote_closed) return h2_stream_error(c, s, H2_PROTOCOL_ERROR), 0;
        remote_end(c, s);
        return 0;
    }
    if (sid <= c->last_sid) return 0; /* a stream we already closed */
    c->last_sid = sid;
    if (c->goaway_sent) return h2_rst(c, sid, H2_REFUSED_STREAM), 0;
    s = calloc(1, sizeof *s);
    if (!s) return h2_conn_error(c, H2_INTERNAL_ERROR);
    s->id = sid;
    if (h2_insert(c, s) < 0) return free(s), h2_conn_error(c, H2_INTERNAL_ERROR);
    s->send_window = c->peer_initial_window;
    s->recv_window = H2_STREAM_WINDOW;
    c->meta = f.meta, c->meta_len = f.mlen;
    rc = h2_emit(c, EV_OPEN, sid, f.path, f.plen, 0);
    c->meta = NULL, c->meta_len = 0;
    if (rc < 0) return -1;
    if (end_stream) remote_end(c, s);
    return 0;
}

static int on_settings(h2_conn *c, uint8_t flags, const uint8_t *p, uint32_t n) {
    if (flags & H2_ACK) return n ? h2_conn_error(c, H2_FRAME_SIZE_ERROR) : 0;
    if (n % 6) return h2_conn_error(c, H2_FRAME_SIZE_ERROR);
    for (uint32_t i = 0; i < n; i += 6) {
        uint16_t id = (uint16_t)(p[i] << 8 | p[i + 1]);
        uint32_t v = h2_rd32(p + i + 2);
        if (id == 2 && v > 1) return h2_conn_error(c, H2_PROTOCOL_ERROR);
        if (id == 4) {
            if (v > MAX_WINDOW) return h2_conn_error(c, H2_FLOW_CONTROL_ERROR);
            int64_t delta = (int64_t)v - c->peer_initial_window;
            c->peer_initial_window = v;
            for (uint32_t j = 0; j < c->map_cap; j++)
                if (c->map[j] && (c->map[j]->send_window += delta) > MAX_WINDOW)
                    return h2_conn_error(c, H2_FLOW_CONTROL_ERROR);
        }
        if (id == 5) {
            if (v < 16384 || v > 16777215) return h2_conn_error(c, H2_PROTOCOL_ERROR);
            c->peer_max_frame = v;
        }
    }
    h2_frame(c, 0, H2_SETTINGS, H2_ACK, 0, NULL);
    h2_flush_blocked(c);
    return 0;
}

static int on_frame(h2_conn *c, uint8_t type, uint8_t flags, uint32_t sid, const uint8_t *p, uint32_t n) {
    if (c->block_sid && type != H2_CONTINUATION) return h2_conn_error(c, H2_PROTOCOL_ERROR);
    switch (type) {
    case H2_DATA:
        return on_data(c, sid, flags, p, n);
    case H2_HEADERS:
        if (sid == 0 || !(sid & 1)) return h2_conn_error(c, H2_PROTOCOL_ERROR);
        if (flags & H2_PADDED) {
            if (n < 1 || p[0] >= n) return h2_conn_error(c, H2_PROTOCOL_ERROR);
            n -= 1 + p[0], p++;
        }
        if (flags & H2_PRIORITY_FLAG) {
            if (n < 5) return h2_conn_error(c, H2_FRAME_SIZE_ERROR);
            p += 5, n -= 5;
        }
        c->block_sid = sid, c->block_end_stream = flags & H2_END_STREAM, c->block.len = 0;
        /* fall through */ /* the fragment is gathered as a CONTINUATION's would be */
    case H2_CONTINUATION:
        if (!c->block_sid || sid != c->block_sid) return h2_conn_error(c, H2_PROTOCOL_ERROR);
        if (c->block.len + n > MAX_BLOCK) return h2_conn_error(c, H2_ENHANCE_YOUR_CALM);
        if (buf_append(&c->block, p, n) < 0) return h2_conn_error(c, H2_INTERNAL_ERROR);
        return flags & H2_END_HEADERS ? on_block(c) : 0;
    case H2_PRIORITY:
        if (sid == 0) return h2_conn_error(c, H2_PROTOCOL_ERROR);
        return n == 5 ? 0 : h2_conn_error(c, H2_FRAME_SIZE_ERROR);
    case H2_RST_STREAM: {
        if (sid == 0) return h2_conn_error(c, H2_PROTOCOL_ERROR);
        if (n != 4) return h2_conn_error(c, H2_FRAME_SIZE_ERROR);
        if (sid > c->last_sid) return h2_conn_error(c, H2_PROTOCOL_ERROR);
        h2_stream *s = h2_find(c, sid);
        if (!s) return 0;
        h2_drop(c, s);
        return h2_emit(c, EV_RESET, sid, NULL, 0, h2_rd32(p));
    }
    case H2_SETTINGS:
        if (sid != 0) return h2_conn_error(c, H2_PROTOCOL_ERROR);
        return on_settings(c, flags, p, n);
    case H2_PUSH_PROMISE:
        return h2_conn_error(c, H2_PROTOCOL_ERROR); /* a client never pushes */
    case H2_PING:
        if (sid != 0) return h2_conn_error(c, H2_PROTOCOL_ERROR);
        if (n != 8) return h2_conn_error(c, H2_FRAME_SIZE_ERROR);
        if (!(flags & H2_ACK)) return h2_frame(c, 8, H2_PING, H2_ACK, 0, p);
        if (!c->drain_pinged || memcmp(p, h2_drain_ping, 8) != 0) return 0;
        /* every stream the peer opened before it read the first GOAWAY came before this: the final one */
        h2_goaway(c, 0);
        return h2_emit(c, EV_GOAWAY, 0, NULL, 0, 0);
    case H2_GOAWAY:
        if (sid != 0) return h2_conn_error(c, H2_PROTOCOL_ERROR);
        if (n < 8) return h2_conn_error(c, H2_FRAME_SIZE_ERROR);
        return h2_emit(c, EV_GOAWAY, h2_rd32(p) & 0x7fffffff, NULL, 0, h2_rd32(p + 4));
    case H2_WINDOW_UPDATE: {
        if (n != 4) return h2_conn_error(c, H2_FRAME_SIZE_ERROR);
        uint32_t inc = h2_rd32(p) & 0x7fffffff;
        if (sid == 0) {
            if (inc == 0 || (c->conn_send_window += inc) > MAX_WINDOW) return h2_conn_error(c, H2_FLOW_CONTROL_ERROR);
        } else {
            h2_stream *s = h2_find(c, sid);
            if (!s) return sid > c->last_sid ? h2_conn_error(c, H2_PROTOCOL_ERROR) : 0;
            if (inc == 0) return h2_stream_error(c, s, H2_PROTOCOL_ERROR), 0;
            if ((s->send_window += inc) > MAX_WINDOW) return h2_stream_error(c, s, H2_FLOW_CONTROL_ERROR), 0;
        }
        h2_flush_blocked(c);
        return 0;
    }
    default:
        return 0; /* unknown frame types are ignored (RFC 9113 5.5) */
    }
}

/* Whole frames out of p[0..n); returns how many bytes were used, or -1 once the connection is over. */
static long frames(h2_conn *c, const uint8_t *p, size_t n) {
    size_t pos = 0;
    if (!c->preface_done) {
        size_t k = n < 24 ? n : 24;
        if (memcmp(p, PREFACE, k) != 0) return h2_conn_error(c, H2_PROTOCOL_ERROR);
        if (n < 24) return 0;
        c->preface_done = 1, pos = 24;
    }
    while (n - pos >= 9) {
        const uint8_t *h = p + pos;
        uint32_t len = (uint32_t)h[0] << 16 | h[1] << 8 | h[2];
        if (len > H2_MAX_FRAME) return h2_conn_error(c, H2_FRAME_SIZE_ERROR);
        if (n - pos - 9 < len) break;
        if (c->preface_done == 1) { /* the first frame must be SETTINGS */
            if (h[3] != H2_SETTINGS || (h[4] & H2_ACK)) return h2_conn_error(c, H2_PROTOCOL_ERROR);
            c->preface_done = 2;
        }
        if (on_frame(c, h[3], h[4], h2_rd32(h + 5) & 0x7fffffff, h + 9, len) < 0 || c->closed || c->cb_failed)
            return -1;
        pos += 9 + len;
    }
    return (long)pos;
}

int h2_receive(h2_conn *c, const uint8_t *data, size_t len) {
    if (c->closed) return 0;
    long used;
    if (c->in.len == 0) { /* the common case: whole frames straight from the caller's bytes */
        used = frames(c, data, len);
        if (used >= 0 && (size_t)used < len && buf_append(&c->in, data + used, len - (size_t)used) < 0)
            h2_conn_error(c, H2_INTERNAL_ERROR);
    } else {
        if (buf_append(&c->in, data, len) < 0) return h2_conn_error(c, H2_INTERNAL_ERROR), 0;
        used = frames(c, c->in.p, c->in.len);
        if (used >= 0) buf_consume(&c->in, (size_t)used);
    }
    if (used < 0 && !c->closed && !c->cb_failed) h2_conn_error(c, H2_PROTOCOL_ERROR);
    return c->cb_failed ? -1 : 0;
}
