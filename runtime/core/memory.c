/* memory.c: the per-rank arena, the device layer and the peak memory figure.
 *
 * planc plans every activation, gradient and temporary of a step at a fixed offset in one block,
 * so the runtime makes exactly one allocation of the planned size (page aligned, zero so that a run
 * never depends on what the allocator left there; planrt_main then writes a canary into every
 * word, which makes every planned byte resident from the start). Peak memory is the OS's
 * high-water mark of the resident set (getrusage ru_maxrss), which tests compare against planc
 * explain's prediction.
 *
 * The device layer (planrt_device.h) decides where the arena and the state live: here, the CPU's
 * memory; a CUDA program sets the GPU's (device_cuda.c) before planrt_main. */
#define PLANRT_INTERNAL
#include "planrt.h"
#include "planrt_device.h"
#include "planrt_program.h"

#include <errno.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

enum { ARENA_ALIGN = 4096 };

static void *arena;
static size_t arena_bytes;
static unsigned char *arena_copy; /* planrt_arena_snapshot of device memory */

/* ------------------------------------------------------------------ the process heap */

/* A training step frees what it allocated and allocates the same sizes again the next step: MPI's
 * temporary buffers (Open MPI's all-reduce and reduce-scatter malloc a copy of the message each
 * call), staging copies, the data loader's batch. glibc serves an allocation of 128 KiB or more
 * (the threshold adapts up to 32 MiB) with its own mapping and unmaps it at free, so each call
 * faulted its pages in again: GPT data = 4, 20 steps, took 38-52 thousand minor page faults where
 * its start takes 20 thousand, 0.69-0.81 s of system time against 0.41-0.49, and 1.63-1.77 s wall
 * against 1.35-1.37 (tests/README.md, "Time"). planrt_heap_keep_ asks glibc to serve every
 * allocation from the heap and to keep up to 1 GiB of freed memory at its top, as a caching
 * allocator would: a step reuses the pages the previous one touched. The arena and the state
 * buffers (cpu_alloc below) are mappings of their own and are not affected. Called once, before
 * MPI starts. Elsewhere than glibc it does nothing. */
void planrt_heap_keep_(void)
{
#ifdef __GLIBC__
	mallopt(M_MMAP_MAX, 0);
	mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

/* ------------------------------------------------------------------ the CPU device */

/* An allocation of at least MAPPED_BYTES is its own mapping, whose fresh pages the kernel zeroes:
 * nothing zeroes them again. It asks for transparent huge pages (where the kernel offers them,
 * madvise mode): a page's first touch is what a rank's start paid for, not the zeroing. Measured
 * on a 40 MiB arena: touching it took 130 ms of CPU in 4 KiB pages and 4 ms in 2 MiB ones, and a
 * 1-rank GPT run of one step 0.70-0.77 s before, 0.47-0.50 s after (tests/README.md, "Time").
 * Smaller allocations come from malloc and are zeroed here. */
enum { MAPPED_BYTES = 64 * 1024 };

static size_t cpu_bytes(size_t bytes)
{
	return bytes ? bytes : 1;
}

static planrt_result_t cpu_alloc(size_t bytes, const struct planrt_state_buf *b, void **out)
{
	void *p = NULL;
	*out = NULL;
	if (cpu_bytes(bytes) >= MAPPED_BYTES) {
		p = mmap(NULL, cpu_bytes(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p == MAP_FAILED)
			return planrt_error_(planrt_system_error, "cannot allocate %zu bytes: %s", bytes, strerror(errno));
		madvise(p, cpu_bytes(bytes), MADV_HUGEPAGE); /* a hint: without it, 4 KiB pages */
	} else {
		int rc = posix_memalign(&p, b ? 64 : ARENA_ALIGN, cpu_bytes(bytes));
		if (rc)
			return planrt_error_(planrt_system_error, "cannot allocate %zu bytes: %s", bytes, strerror(rc));
		memset(p, 0, bytes);
	}
	*out = p;
	return planrt_success;
}

static void cpu_release(void *p, const struct planrt_state_buf *b)
{
	size_t bytes = cpu_bytes(b ? b->bytes ? b->bytes : 64 : arena_bytes);
	if (bytes >= MAPPED_BYTES)
		munmap(p, bytes);
	else
		free(p);
}

static void cpu_fill64(void *p, size_t words, uint64_t value)
{
	for (size_t w = 0; w < words; w++)
		memcpy((unsigned char *)p + 8 * w, &value, 8);
}

static void cpu_to_host(void *dst, const void *src, size_t bytes)
{
	memcpy(dst, src, bytes);
}

static const planrt_device_t cpu_device = {"cpu", cpu_alloc, cpu_release, cpu_fill64, cpu_to_host, NULL, NULL, NULL};
static const planrt_device_t *device = &cpu_device;

void planrt_device_set(const planrt_device_t *d)
{
	device = d ? d : &cpu_device;
}

const planrt_device_t *planrt_device_get(void)
{
	return device;
}

planrt_result_t planrt_state_alloc(const planrt_state_buf_t *b, void **p)
{
	return device->alloc(b->bytes ? b->bytes : 64, b, p);
}

void planrt_state_free(const planrt_state_buf_t *b)
{
	if (*b->ptr)
		device->release(*b->ptr, b);
	*b->ptr = NULL;
}

static void free_one(const planrt_state_buf_t *b, void *arg)
{
	(void)arg;
	planrt_state_free(b);
}

void planrt_stage_state_free(const planrt_stage_t *s)
{
	planrt_stage_state_each(s, free_one, NULL);
}

void planrt_stage_state_each(const planrt_stage_t *s, void (*fn)(const planrt_state_buf_t *b, void *arg), void *arg)
{
	for (int i = 0; i < s->nstate; i++)
		fn(&s->state[i], arg);
	for (int i = 0; i < s->nfamilies; i++) {
		const planrt_state_family_t *f = &s->families[i];
		int stride = f->stride > 1 ? f->stride : 1;
		void **first = f->ptrs ? f->ptrs : (void **)((char *)s->layers + f->offset);
		for (int m = 0; m < f->count; m++) {
			planrt_state_buf_t b = {.name = f->name, .kind = f->kind, .bytes = f->bytes, .ptr = &first[(size_t)m * stride]};
			fn(&b, arg);
		}
	}
}

void planrt_arena_fill64(uint64_t value)
{
	if (arena)
		device->fill64(arena, arena_bytes / 8, value);
}

const unsigned char *planrt_arena_snapshot(void)
{
	if (device == &cpu_device || !arena)
		return arena;
	free(arena_copy);
	arena_copy = malloc(arena_bytes ? arena_bytes : 1);
	if (!arena_copy)
		return NULL;
	device->to_host(arena_copy, arena, arena_bytes);
	return arena_copy;
}

void planrt_device_start(void)
{
	if (device->start)
		device->start();
}

double planrt_device_comm_wait_s(void)
{
	return device->comm_wait_s ? device->comm_wait_s() : 0;
}

const char *planrt_device_report(void)
{
	static char text[256];
	text[0] = 0;
	if (device->report)
		device->report(text, sizeof text);
	return text;
}

/* ------------------------------------------------------------------ the arena */

planrt_result_t planrt_arena_create(size_t bytes, void **base)
{
	*base = NULL;
	if (arena)
		return planrt_error_(planrt_invalid_usage,
				     "the arena exists already (%zu bytes); call planrt_arena_destroy first", arena_bytes);
	void *p = NULL;
	if (device->alloc(bytes, NULL, &p) != planrt_success)
		return planrt_error_(planrt_system_error,
				     "cannot allocate the %zu-byte arena on the %s: %s; run fewer ranks per node or choose a "
				     "plan with less memory per rank (planc explain shows it)",
				     bytes, device->name, planrt_last_error());
	arena = p;
	arena_bytes = bytes;
	*base = p;
	return planrt_success;
}

void planrt_arena_destroy(void)
{
	if (arena)
		device->release(arena, NULL);
	free(arena_copy);
	arena_copy = NULL;
	arena = NULL;
	arena_bytes = 0;
}

size_t planrt_peak_rss_bytes(void)
{
	struct rusage ru;
	if (getrusage(RUSAGE_SELF, &ru) != 0)
		return 0;
	return (size_t)ru.ru_maxrss * 1024; /* Linux reports kilobytes */
}
