/* The HTTP/2 server connection of the ext_proc front (sans I/O): bytes in, events out; messages in, bytes out. */
#ifndef EPP_H2_H
#define EPP_H2_H
#include <stddef.h>
#include <stdint.h>

#include "hpack.h"

typedef struct {
    uint8_t *p;
    size_t len, cap;
} h2_buf;

int buf_reserve(h2_buf *b, size_t extra);
int buf_append(h2_buf *b, const void *data, size_t n);
void buf_consume(h2_buf *b, size_t n);
void buf_free(h2_buf *b);

typedef struct h2_stream {
    uint32_t id;
    uint8_t remote_closed, headers_sent, trailers_queued;
    int64_t send_window;
    int64_t recv_window;
    h2_buf msg;      /* a gRPC message not yet whole */
    h2_buf pending;  /* DATA payload waiting for flow-control window */
    h2_buf trailers; /* the trailer block, sent once `pending` is empty */
} h2_stream;

/* What `receive` reports; the Python module turns each into a tuple (kind, stream id, value). */
enum { EV_MESSAGE = 0, EV_OPEN = 1, EV_END = 2, EV_RESET = 3, EV_GOAWAY = 4, EV_CLOSE = 5 };

typedef int (*h2_event_cb)(void *ctx, int kind, uint32_t sid, const uint8_t *data, size_t len, uint32_t code);

typedef struct {
    h2_buf in, out, block;
    hp_decoder dec;
    int preface_done, closed, goaway_sent;
    int drain_pinged;      /* the first of a graceful drain's two GOAWAYs sent, its PING not yet acknowledged */
    uint32_t block_sid;    /* nonzero while a header block is being assembled (HEADERS then CONTINUATION) */
    uint8_t block_end_stream;
    uint32_t last_sid;     /* highest stream id the peer opened */
    int64_t conn_send_window, conn_recv_window;
    uint32_t peer_initial_window, peer_max_frame;
    uint32_t max_message;  /* largest gRPC message accepted */
    h2_stream **map;       /* open addressing by stream id */
    uint32_t map_cap, nstreams;
    h2_event_cb cb;
    void *ctx;
    int cb_failed;         /* the callback raised: stop and report */
    const uint8_t *meta;   /* during an EV_OPEN callback: the stream's other header fields ("name\0value\0"...) */
    size_t meta_len;
} h2_conn;

int h2_init(h2_conn *c, uint32_t max_message);
void h2_free(h2_conn *c);
/* Feed received bytes: 0, or -1 when the callback failed (events up to then were delivered). */
int h2_receive(h2_conn *c, const uint8_t *data, size_t len);
/* Send one gRPC message on a stream (response headers first); 0 sent or queued, 1 the stream is gone. */
int h2_send_message(h2_conn *c, uint32_t sid, const uint8_t *msg, size_t len);
/* End a stream with its status (trailers; trailers-only when nothing was sent); 1 when the stream is gone. */
int h2_finish(h2_conn *c, uint32_t sid, uint32_t status, const char *message, size_t mlen);
int h2_reset(h2_conn *c, uint32_t sid, uint32_t code);
void h2_goaway(h2_conn *c, uint32_t code);
/* The graceful drain of RFC 9113 section 6.8: GOAWAY with the largest stream id and a PING; the final GOAWAY (the
   last stream id seen) goes when the peer acknowledges that PING, reported as an EV_GOAWAY with stream id 0, so no
   stream the peer opened before it read the first can be refused. */
void h2_drain(h2_conn *c);

/* Shared by h2.c (streams, sending) and h2_recv.c (frames in). */
#define H2_MAX_FRAME 16384u         /* ours: the default, never raised */
#define H2_STREAM_WINDOW (1u << 20) /* SETTINGS_INITIAL_WINDOW_SIZE we advertise */
#define H2_CONN_WINDOW (16u << 20)  /* the connection window we open at once */
extern const uint8_t h2_drain_ping[8]; /* the opaque data of a graceful drain's PING */
int h2_frame(h2_conn *c, uint32_t len, uint8_t type, uint8_t flags, uint32_t sid, const void *payload);
int h2_emit(h2_conn *c, int kind, uint32_t sid, const uint8_t *data, size_t len, uint32_t code);
h2_stream *h2_find(h2_conn *c, uint32_t id);
int h2_insert(h2_conn *c, h2_stream *s);
void h2_drop(h2_conn *c, h2_stream *s);
int h2_conn_error(h2_conn *c, uint32_t code);
void h2_rst(h2_conn *c, uint32_t sid, uint32_t code);
void h2_stream_error(h2_conn *c, h2_stream *s, uint32_t code);
int h2_flush_stream(h2_conn *c, h2_stream *s);
void h2_flush_blocked(h2_conn *c);
uint32_t h2_rd32(const uint8_t *p);
void h2_wr32(uint8_t *p, uint32_t v);
enum { H2_DATA = 0, H2_HEADERS = 1, H2_PRIORITY = 2, H2_RST_STREAM = 3, H2_SETTINGS = 4, H2_PUSH_PROMISE = 5,
       H2_PING = 6, H2_GOAWAY = 7, H2_WINDOW_UPDATE = 8, H2_CONTINUATION = 9 };
enum { H2_END_STREAM = 0x1, H2_ACK = 0x1, H2_END_HEADERS = 0x4, H2_PADDED = 0x8, H2_PRIORITY_FLAG = 0x20 };
enum { H2_NO_ERROR = 0, H2_PROTOCOL_ERROR = 1, H2_INTERNAL_ERROR = 2, H2_FLOW_CONTROL_ERROR = 3,
       H2_STREAM_CLOSED = 5, H2_FRAME_SIZE_ERROR = 6, H2_REFUSED_STREAM = 7, H2_COMPRESSION_ERROR = 9,
       H2_ENHANCE_YOUR_CALM = 11 };
#endif
