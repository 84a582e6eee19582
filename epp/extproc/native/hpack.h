/* HPACK decoding (RFC 7541) for the ext_proc front: the peer's header blocks, its dynamic table kept in step.
 * Encoding needs no state: the front sends literals without indexing and static-table references only. */
#ifndef EPP_HPACK_H
#define EPP_HPACK_H
#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint8_t *data; /* name then value, one allocation */
    uint32_t nlen, vlen;
} hp_entry;

typedef struct {
    hp_entry *ring; /* newest entry at head - 1 (mod cap) */
    uint32_t cap, head, count;
    size_t size;     /* RFC 7541 4.1: sum of name + value + 32 */
    size_t max_size; /* the current limit, set by the peer's dynamic table size updates */
    size_t settings_max; /* what we advertised (SETTINGS_HEADER_TABLE_SIZE): the ceiling of max_size */
    uint8_t *scratch; /* decoded strings of the block being read */
    size_t scratch_cap;
} hp_decoder;

/* Called once per decoded header field; return nonzero to stop decoding (the block is then an error). */
typedef int (*hp_field_cb)(void *ctx, const uint8_t *name, size_t nlen, const uint8_t *value, size_t vlen);

void hp_init(hp_decoder *d, size_t settings_max);
void hp_free(hp_decoder *d);
/* Decode one whole header block; 0 on success, -1 on a compression error (the connection must end). */
int hp_decode(hp_decoder *d, const uint8_t *p, size_t len, hp_field_cb cb, void *ctx);
/* Huffman-decode `len` bytes into out (room for 8/5 * len bytes); the decoded length, or -1 when malformed. */
long hp_huffman_decode(const uint8_t *p, size_t len, uint8_t *out);
/* Encode an integer with an N-bit prefix (first byte's high bits in `first`); bytes written (at most 6). */
size_t hp_encode_int(uint8_t *out, uint8_t first, int prefix_bits, uint32_t value);
#endif
