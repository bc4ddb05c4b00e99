/*
 * inbuf.h - the buffers of a frame stream on a socket: a non-blocking drain
 * of an output buffer (struct proto_buf) and the two shapes every reader of
 * frames keeps its input in.
 *
 * Threads: stateless functions; any thread.
 */
#ifndef UMBP_NET_INBUF_H
#define UMBP_NET_INBUF_H

#include <stddef.h>
#include <stdint.h>

#include "proto.h"

/* Sends b's bytes [*off, b->len) on a non-blocking socket, advancing *off,
 * until they are all sent or the socket would block (then *off < b->len).
 * 0, or -errno when the peer is gone (-EPIPE for a zero-length send). */
int proto_out_send(int sock, const struct proto_buf *b, size_t *off);

/* Room for `bytes` more in b (proto_buf_reserve), every page of the room
 * touched, so that the first frames written there fault no page in: what a
 * connection makes ready when it comes up.  Without memory nothing changes
 * (b grows when written, as it would anyway). */
void proto_out_warm(struct proto_buf *b, size_t bytes);

/* ---- input buffers ----------------------------------------------------------- */

/* The two shapes every reader of frames keeps its input in.
 *
 * proto_in_room (a peer that reads whole frames into [0, *len), parses from
 * 0 and moves the rest down): a full buffer doubles, up to one largest frame
 * (the parser's len check guarantees that is enough); an empty one that grew
 * shrinks back to `initial`.  -ENOBUFS when full at the largest frame,
 * -ENOMEM when it cannot grow and is full.
 *
 * proto_in_reserve (a peer that parses at *off): drops what was parsed,
 * then makes room for at least `chunk` more bytes (compacting first,
 * doubling after).  -ENOMEM. */
int proto_in_room(uint8_t **buf, size_t len, size_t *cap, size_t initial);
int proto_in_reserve(uint8_t **buf, size_t *off, size_t *len, size_t *cap, size_t chunk);

#endif /* UMBP_NET_INBUF_H */
