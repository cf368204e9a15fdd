/* planrt_device.h: the device layer. Where a program's persistent state and its arena live: the
 * CPU's memory (memory.c, the default) or a GPU's (device_cuda.c, set by planrt_cuda_main before
 * planrt_main runs). planrt_main allocates through it, so the arena is one allocation of exactly
 * the planned bytes on whichever device runs the program, and PLANRT_REPORT_MEMORY reads back
 * what the device allocated. */
#ifndef PLANRT_DEVICE_H
#define PLANRT_DEVICE_H

#include "planrt.h"

#ifdef __cplusplus
extern "C" {
#endif

struct planrt_state_buf;
typedef struct planrt_device {
	const char *name; /* "cpu", "cuda" */
	/* bytes of zeros for state buffer b (its kind and the program's pointer it sets tell the
	 * device where it lives: offloaded state in pinned host memory), or for the arena (b NULL) */
	planrt_result_t (*alloc)(size_t bytes, const struct planrt_state_buf *b, void **p);
	void (*release)(void *p, const struct planrt_state_buf *b);
	void (*fill64)(void *p, size_t words, uint64_t value);     /* words 64-bit words of device memory */
	void (*to_host)(void *dst, const void *src, size_t bytes); /* synchronous */
	void (*report)(char *buf, size_t n);                       /* more fields for PLANRT_REPORT_MEMORY */
	void (*start)(void); /* after the mesh exists: the device's communicators (NULL: nothing) */
	/* seconds the device's compute stream has stood still waiting for communication so far,
	 * measured with --trace or PLANRT_REPORT_TIMING (NULL: the CPU, whose waits the host times) */
	double (*comm_wait_s)(void);
} planrt_device_t;

void planrt_device_set(const planrt_device_t *d); /* NULL: the CPU */
const planrt_device_t *planrt_device_get(void);
/* State buffers through the device layer (64-byte aligned, zeroed); free sets the pointer to NULL. */
planrt_result_t planrt_state_alloc(const struct planrt_state_buf *b, void **p);
void planrt_state_free(const struct planrt_state_buf *b);
/* Calls fn(b, arg) on every state buffer of a stage: its state table's entries, then each member
 * of each family as an entry of its own (the family's name, kind and size, the member's pointer). */
struct planrt_stage;
void planrt_stage_state_each(const struct planrt_stage *s, void (*fn)(const struct planrt_state_buf *b, void *arg),
			     void *arg);
void planrt_stage_state_free(const struct planrt_stage *s); /* every state buffer of the stage */
/* The arena (planrt_arena_create): every 64-bit word set to value; its bytes on the host (the
 * arena itself on the CPU, a copy read back from a GPU, valid until planrt_arena_destroy). */
void planrt_arena_fill64(uint64_t value);
const unsigned char *planrt_arena_snapshot(void);
/* planrt_main, once the mesh exists: the device's own start (the CUDA layer's NCCL communicators) */
void planrt_device_start(void);
/* " device=cuda device_allocated=N ..." for the memory report, "" on the CPU */
const char *planrt_device_report(void);
/* the device's comm_wait_s(), 0 on the CPU */
double planrt_device_comm_wait_s(void);

#ifdef __cplusplus
}
#endif
#endif
