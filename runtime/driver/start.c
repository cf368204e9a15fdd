/* start.c: what a run starts with, for planrt_main (main.c) and --generate (generate.c) alike: MPI,
 * the instruction-set level and the world size checked against the program's, the mesh and the
 * device; then a stage's persistent state buffers, its arena (a canary in every word) and its
 * slots' request sets, and their release. */
#include "driver.h"
#include "planrt_cpu.h"
#include "planrt_device.h"

#include <stdlib.h>

void planrt_start_world_(int *argc, char ***argv, const planrt_program_t *program, int *rank, int *world)
{
	PLANRT_CHECK(planrt_init(argc, argv, rank, world));
	if (planrt_cpu_select() != planrt_success) /* the instruction-set level: this rank's CPU, or PLANRT_ISA */
		planrt_fatal("%s", planrt_last_error());
	if (planrt_threads_start(*rank) != planrt_success) /* planrt's threads: OpenBLAS's setting */
		planrt_fatal("%s", planrt_last_error());
	if (*world != program->world)
		planrt_fatal("this program was built for %d ranks (plan %s) but runs on %d; launch it with mpirun -np %d",
			     program->world, program->plan, *world, program->world);
	PLANRT_CHECK(planrt_mesh_init(program->naxes, program->axis_sizes, program->axis_names));
	planrt_device_start();
}

static void allocate_one(const planrt_state_buf_t *b, void *holdings)
{
	holdings_t *h = holdings;
	void *ptr = NULL;
	if (planrt_state_alloc(b, &ptr) != planrt_success)
		planrt_fatal("cannot allocate %zu bytes for '%s' (%s); choose a plan with less memory per rank (planc "
			     "explain shows it)",
			     b->bytes, b->name, planrt_last_error());
	*b->ptr = ptr;
	h->kind_bytes[b->kind] += b->bytes;
	h->state_bytes += b->bytes;
}

void planrt_stage_allocate_(const planrt_stage_t *stage, holdings_t *h)
{
	planrt_stage_state_each(stage, allocate_one, h);
	void *arena_base;
	PLANRT_CHECK(planrt_arena_create(stage->arena_bytes, &arena_base));
	h->arena = arena_base;
	planrt_arena_fill64(PLANRT_ARENA_CANARY);
	size_t nreq = (size_t)stage->nslots * (size_t)stage->nreqs;
	h->reqs = calloc(nreq ? nreq : 1, sizeof *h->reqs);
	h->own = calloc(nreq ? nreq : 1, 1);
	if (!h->reqs || !h->own)
		planrt_fatal("out of memory for %zu requests", nreq);
}

void planrt_stage_release_(const planrt_stage_t *stage, holdings_t *h)
{
	free(h->reqs);
	free(h->own);
	planrt_arena_destroy();
	planrt_stage_state_free(stage);
}
