/* memory.c: the per-rank arena and the peak memory figure.
 *
 * planc plans every activation, gradient and temporary of a step at a fixed offset in one block,
 * so the runtime makes exactly one allocation of the planned size (page aligned, zero filled so
 * that a run never depends on what the allocator left there, and so that every planned byte is
 * resident from the start). Peak memory is the OS's high-water mark of the resident set
 * (getrusage ru_maxrss), which tests compare against planc explain's prediction. */
#define PLANRT_INTERNAL
#include "planrt.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

enum { ARENA_ALIGN = 4096 };

static void *arena;
static size_t arena_bytes;

planrt_result_t planrt_arena_create(size_t bytes, void **base)
{
	*base = NULL;
	if (arena)
		return planrt_error_(planrt_invalid_usage,
				     "the arena exists already (%zu bytes); call planrt_arena_destroy first", arena_bytes);
	void *p = NULL;
	int rc = posix_memalign(&p, ARENA_ALIGN, bytes ? bytes : 1);
	if (rc)
		return planrt_error_(planrt_system_error,
				     "cannot allocate the %zu-byte arena: %s; run fewer ranks per node or choose a plan "
				     "with less memory per rank (planc explain shows it)",
				     bytes, strerror(rc));
	memset(p, 0, bytes);
	arena = p;
	arena_bytes = bytes;
	*base = p;
	return planrt_success;
}

void planrt_arena_destroy(void)
{
	free(arena);
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
