/* test_program.c (mpirun -np 2): planrt_main and the kernels of planrt_program.h, driven by
 * hand-written program descriptors, the way a generated program drives them.
 *
 * usage: test_program SCENARIO [planrt_main's options]
 *   pipe     a 2-stage pipeline (mesh pipe = 2), 1 chunk, 4 micro-batches in a 1F1B table with 2
 *            slots. The phase functions record the order of calls and check every ctx field they
 *            see (step, seeds, micro, chunk, slot, inbox, request set); stage 0 sends an activation
 *            in its forward, stage 1 receives it into the inbox in its prepare_forward and finishes
 *            in its forward; stage 1 sends a gradient back in its backward, which stage 0 receives
 *            in its prepare_backward. Sends are never finished by the program: the walker must
 *            drain them before the slot is reused: stage 1's before its next prepare_forward of the
 *            slot, stage 0's backward sends (on channel 2, as a middle stage's) before the forward
 *            that reuses the slot right after the backward runs.
 *   zero     mesh data = 2, no pipeline: ZeRO shards (lo = coord * chunk, padding), a parameter
 *            split over the axis, a replicated one whose copies differ (only coordinate 0 may
 *            write it), bf16 storage; planrt_load_input against planrt_data_batch.
 *   badsave  zero, but rank 1 saves from an invalid dtype: every rank must fail, with no file left.
 * Parameters are initialised with planrt_init_param and compared with planrt_init_block (or the
 * --init file); each step adds 0.5 to the f32 parameters. After planrt_main returns, rank 0 reads
 * the --save file back with planrt_st_open / planrt_st_read_block, compares it with what it must
 * hold, and checks that planrt_st_write of the same tensors writes the same bytes.
 * tests/runtime/test_program.sh runs the scenarios and the argument errors. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "planrt_exec.h"
#include "planrt_kernels.h"
#include "planrt_program.h"

static int me = -1;  /* world rank, set in init (MPI is finalized when the checks after run) */
static long failures;
static int steps_done;

#define CHECK(cond, ...)                                                                                           \
	do {                                                                                                       \
		if (!(cond) && failures++ < 20) {                                                                  \
			fprintf(stderr, "test_program: rank %d: %s:%d: ", me, __FILE__, __LINE__);                 \
			fprintf(stderr, __VA_ARGS__);                                                              \
			fputc('\n', stderr);                                                                       \
		}                                                                                                  \
	} while (0)

static const planrt_program_t *program;

/* ------------------------------------------------------------------ helpers */

static int64_t elems(const planrt_param_t *p, const int64_t *dims)
{
	int64_t n = 1;
	for (int d = 0; d < p->rank; d++)
		n *= dims[d];
	return n;
}

/* the local block's expected initial values, as planrt_init_param must produce them */
static float *expected_block(planrt_ctx_t *ctx, int param)
{
	const planrt_param_t *p = &program->params[param];
	int64_t offs[8], n = elems(p, p->ldims);
	for (int d = 0; d < p->rank; d++)
		offs[d] = p->split_axis[d] >= 0 ? planrt_mesh_coord(p->split_axis[d]) * p->ldims[d] : 0;
	float *x = malloc(sizeof(float) * (size_t)(n ? n : 1));
	if (ctx->init_file)
		CHECK(planrt_st_read_block(ctx->init_file, p->name, p->rank, p->gdims, p->ldims, offs, x) == planrt_success,
		      "read %s: %s", p->name, planrt_last_error());
	else
		planrt_init_block(x, p->rank, p->gdims, p->ldims, offs, p->init_kind, p->a, p->b, ctx->seed, p->name);
	return x;
}

/* initialises elements [lo, lo + n) of param's local block into dst and checks them */
static void init_and_check(planrt_ctx_t *ctx, void *dst, planrt_dtype_t t, int param, int64_t lo, int64_t n)
{
	const planrt_param_t *p = &program->params[param];
	size_t elem = t == planrt_bf16 ? 2 : 4;
	unsigned char *before = malloc(elem * (size_t)n);
	memcpy(before, dst, elem * (size_t)n);
	planrt_init_param(ctx, dst, t, param, lo, n);
	float *want = expected_block(ctx, param);
	int64_t local = elems(p, p->ldims);
	for (int64_t j = 0; j < n; j++) {
		bool mine = lo + j >= 0 && lo + j < local;
		if (!mine) { /* padding, or another parameter's part of a shard: left as it was */
			CHECK(!memcmp((char *)dst + elem * (size_t)j, before + elem * (size_t)j, elem),
			      "%s[%lld]: padding position changed by init", p->name, (long long)(lo + j));
			continue;
		}
		float w = want[lo + j];
		if (t == planrt_bf16) {
			uint16_t h;
			planrt_k_f32_to_bf16(&w, &h, 1);
			CHECK(((uint16_t *)dst)[j] == h, "%s[%lld]: bf16 %04x, want %04x", p->name, (long long)(lo + j),
			      ((uint16_t *)dst)[j], h);
		} else {
			CHECK(((float *)dst)[j] == w, "%s[%lld]: %g, want %g", p->name, (long long)(lo + j),
			      ((float *)dst)[j], w);
		}
	}
	free(before);
	free(want);
}

/* a state buffer planrt_main allocated: 64-byte aligned and zero; then filled, so that the phases
 * would see it if it were reused */
static void check_buffer_fresh(const char *name, unsigned char *b, size_t bytes)
{
	CHECK(b && (uintptr_t)b % 64 == 0, "state %s at %p", name, (void *)b);
	size_t n = bytes ? bytes : 64;
	for (size_t k = 0; b && k < n; k++)
		CHECK(b[k] == 0, "state %s byte %zu is %d, not zero", name, k, b[k]);
	if (b)
		memset(b, 0xab, n); /* a size-0 buffer is still a usable 64-byte block */
}

/* every state buffer: the state table's, and each member of each state family (its own block) */
static void check_state_fresh(const planrt_stage_t *s)
{
	for (int i = 0; i < s->nstate; i++)
		check_buffer_fresh(s->state[i].name, *s->state[i].ptr, s->state[i].bytes);
	for (int i = 0; i < s->nfamilies; i++) {
		int stride = s->families[i].stride > 1 ? s->families[i].stride : 1;
		void **first = s->families[i].ptrs ? s->families[i].ptrs : (void **)((char *)s->layers + s->families[i].offset);
		for (int m = 0; m < s->families[i].count; m++) {
			unsigned char *b = first[m * stride];
			CHECK(b != NULL, "family %s: member %d has no buffer", s->families[i].name, m);
			for (int o = 0; o < m; o++)
				CHECK(b != first[o * stride], "family %s: members %d and %d share a block",
				      s->families[i].name, o, m);
			check_buffer_fresh(s->families[i].name, b, s->families[i].bytes);
		}
	}
}

static void add_half(float *x, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		x[i] += 0.5f;
}

/* ------------------------------------------------------------------ scenario pipe */

enum { PAYLOAD = 16, SLOT_OFF = 1024, SLOT_BYTES = 1024, INBOX_OFF = 3072, INBOX_BYTES = 256, GRAD_AT = 512,
       DX_AT = 768, NREQS = 3 };

enum { P_EMBED, P_NORM, P_HEAD, P_EMBED_TIED };
static const planrt_param_t pipe_params[] = {
	{"embed", 2, {5, 6}, {5, 6}, {-1, -1, -1, -1, -1, -1, -1, -1}, 0, 1, 0.0, 0.02},
	{"norm", 1, {7}, {7}, {-1, -1, -1, -1, -1, -1, -1, -1}, 1, 1, -1.0, 1.0},
	{"head", 2, {6, 5}, {6, 5}, {-1, -1, -1, -1, -1, -1, -1, -1}, 0, 1, 0.0, 1.0},
	/* the tied copy of embed on the last stage: same values, never saved */
	{"embed", 2, {5, 6}, {5, 6}, {-1, -1, -1, -1, -1, -1, -1, -1}, 0, 0, 0.0, 0.02},
};

static void *s0_embed, *s0_norm, *s0_grad, *s0_m, *s0_master, *s0_bucket, *s0_loss, *s0_norm2;
static void *s1_head, *s1_embed, *s1_loss, *s1_norm2;

static void *s0_layer_w[3]; /* a state family: one buffer a layer, a packed array of pointers */
static struct layer_ab {
	void *a, *b;
} s0_layer[3]; /* two families as the C target holds them: fields of a per-layer struct */
static const planrt_state_family_t s0_families[] = {
	{"layer_w", planrt_state_param, 40, s0_layer_w, 3, 0, 0},
	{"layer_a", planrt_state_param, 24, &s0_layer[0].a, 3, 2, 0},                 /* at its pointer */
	{"layer_b", planrt_state_optim, 8, NULL, 3, 2, offsetof(struct layer_ab, b)}}; /* in the stage's layers */
static const planrt_state_buf_t s0_state[] = {
	{"embed", planrt_state_param, 120, &s0_embed},   {"norm", planrt_state_param, 14, &s0_norm},
	{"embed.grad", planrt_state_grad, 120, &s0_grad}, {"embed.m", planrt_state_optim, 120, &s0_m},
	{"norm.master", planrt_state_master, 28, &s0_master}, {"bucket", planrt_state_buffer, 0, &s0_bucket},
	{"loss", planrt_state_metric, 8, &s0_loss},      {"grad_norm", planrt_state_metric, 8, &s0_norm2},
};
static const planrt_state_buf_t s1_state[] = {
	{"head", planrt_state_param, 120, &s1_head},
	{"embed", planrt_state_param, 120, &s1_embed},
	{"loss", planrt_state_metric, 8, &s1_loss},
	{"grad_norm", planrt_state_metric, 8, &s1_norm2},
};

static char calls[1024];
static unsigned char *arena_seen;
static planrt_request_t *reqs_seen[2];

static void record(const char *what, int micro)
{
	size_t len = strlen(calls);
	snprintf(calls + len, sizeof calls - len, "%s%s%d", len ? " " : "", what, micro);
}

static float payload(int64_t step, int micro, int j)
{
	return (float)(1000 * step + 10 * micro + j);
}

/* what an action of micro-batch m sees: slot m % 2, its request set, inbox m % 2 or none */
static void check_ctx(planrt_ctx_t *ctx, int has_inbox)
{
	int slot = ctx->micro % 2;
	CHECK(ctx->chunk == 0, "chunk %d", ctx->chunk);
	CHECK(ctx->micro >= 0 && ctx->micro < 4, "micro %d", ctx->micro);
	CHECK(ctx->arena == arena_seen, "arena moved");
	CHECK(ctx->slot == ctx->arena + SLOT_OFF + (size_t)slot * SLOT_BYTES, "micro %d: slot at %td", ctx->micro,
	      ctx->slot - ctx->arena);
	if (has_inbox)
		CHECK(ctx->inbox == ctx->arena + INBOX_OFF + (size_t)slot * INBOX_BYTES, "micro %d: inbox at %td",
		      ctx->micro, ctx->inbox - ctx->arena);
	else
		CHECK(ctx->inbox == NULL, "micro %d: an inbox where the action has none", ctx->micro);
	if (!reqs_seen[slot])
		reqs_seen[slot] = ctx->reqs;
	CHECK(ctx->reqs == reqs_seen[slot], "micro %d: request set moved", ctx->micro);
	if (reqs_seen[0] && reqs_seen[1])
		CHECK(reqs_seen[1] - reqs_seen[0] == NREQS, "request sets %td apart", reqs_seen[1] - reqs_seen[0]);
}

static void check_step_phase(planrt_ctx_t *ctx)
{
	CHECK(ctx->step_seed == ctx->seed * 0x9E3779B97F4A7C15ull + (uint64_t)ctx->step, "step_seed");
	CHECK(ctx->micro == 0 && ctx->chunk == 0, "micro %d chunk %d outside actions", ctx->micro, ctx->chunk);
	CHECK(ctx->step == steps_done, "step %lld, want %d", (long long)ctx->step, steps_done);
}

static void s0_init(planrt_ctx_t *ctx)
{
	me = planrt_comm_rank(planrt_world_comm());
	check_state_fresh(&program->stages[0]);
	arena_seen = ctx->arena;
	CHECK(ctx->micro == 0 && ctx->slot == NULL, "init runs outside actions");
	init_and_check(ctx, s0_embed, planrt_f32, P_EMBED, 0, 30);
	init_and_check(ctx, s0_norm, planrt_bf16, P_NORM, 0, 7);
	init_and_check(ctx, s0_master, planrt_f32, P_NORM, 0, 7);
}

static void s1_init(planrt_ctx_t *ctx)
{
	me = planrt_comm_rank(planrt_world_comm());
	check_state_fresh(&program->stages[1]);
	arena_seen = ctx->arena;
	init_and_check(ctx, s1_head, planrt_f32, P_HEAD, 0, 30);
	init_and_check(ctx, s1_embed, planrt_f32, P_EMBED_TIED, 0, 30);
}

static void pipe_begin(planrt_ctx_t *ctx)
{
	check_step_phase(ctx);
	calls[0] = 0;
}

static void s0_forward(planrt_ctx_t *ctx)
{
	record("F", ctx->micro);
	check_ctx(ctx, 0);
	CHECK(ctx->reqs[0] == NULL && ctx->reqs[2] == NULL, "micro %d: the slot's last sends were not drained",
	      ctx->micro);
	memset(ctx->arena, 1, 64); /* the transient region */
	float *x = (float *)ctx->slot;
	for (int j = 0; j < PAYLOAD; j++)
		x[j] = payload(ctx->step, ctx->micro, j);
	planrt_p2p_send_start(x, PAYLOAD, planrt_f32, 1, 0, &ctx->reqs[0]);
}

static void s0_prepare_backward(planrt_ctx_t *ctx)
{
	record("pB", ctx->micro);
	check_ctx(ctx, 0);
	CHECK(ctx->reqs[1] == NULL, "micro %d: a receive still pending", ctx->micro);
	planrt_p2p_recv_start(ctx->slot + GRAD_AT, PAYLOAD, planrt_f32, 1, 1, &ctx->reqs[1]);
}

static void s0_backward(planrt_ctx_t *ctx)
{
	record("B", ctx->micro);
	check_ctx(ctx, 0);
	CHECK(ctx->reqs[1] != NULL, "micro %d: the prepared receive is missing", ctx->micro);
	planrt_p2p_finish(ctx, &ctx->reqs[1]);
	CHECK(ctx->reqs[1] == NULL, "finish did not clear the request");
	const float *g = (const float *)(ctx->slot + GRAD_AT);
	for (int j = 0; j < PAYLOAD; j++)
		CHECK(g[j] == -payload(ctx->step, ctx->micro, j), "step %lld micro %d: gradient[%d] = %g",
		      (long long)ctx->step, ctx->micro, j, g[j]);
	/* a gradient for a stage before this one (as a middle stage sends it), from the slot and left in
	 * flight: F m + 2 reuses the slot right after this action, so the walker must complete this
	 * send before that forward runs (its prepare ran before this action) */
	float *dx = (float *)(ctx->slot + DX_AT);
	for (int j = 0; j < PAYLOAD; j++)
		dx[j] = 0.5f * payload(ctx->step, ctx->micro, j);
	planrt_p2p_send_start(dx, PAYLOAD, planrt_f32, 1, 2, &ctx->reqs[2]);
}

static void s1_prepare_forward(planrt_ctx_t *ctx)
{
	record("pF", ctx->micro);
	check_ctx(ctx, 1);
	CHECK(ctx->reqs[0] == NULL && ctx->reqs[1] == NULL, "micro %d: slot requests not drained", ctx->micro);
	planrt_p2p_recv_start(ctx->inbox, PAYLOAD, planrt_f32, 0, 0, &ctx->reqs[0]);
}

static void s1_forward(planrt_ctx_t *ctx)
{
	record("F", ctx->micro);
	check_ctx(ctx, 1);
	planrt_p2p_finish(ctx, &ctx->reqs[0]);
	const float *x = (const float *)ctx->inbox;
	for (int j = 0; j < PAYLOAD; j++)
		CHECK(x[j] == payload(ctx->step, ctx->micro, j), "step %lld micro %d: activation[%d] = %g",
		      (long long)ctx->step, ctx->micro, j, x[j]);
	memcpy(ctx->slot, x, sizeof(float) * PAYLOAD);
}

static void s1_backward(planrt_ctx_t *ctx)
{
	record("B", ctx->micro);
	check_ctx(ctx, 0);
	float *g = (float *)ctx->slot;
	for (int j = 0; j < PAYLOAD; j++)
		g[j] = -g[j];
	/* left in flight: the walker completes it before the slot's next forward */
	planrt_p2p_send_start(g, PAYLOAD, planrt_f32, 0, 1, &ctx->reqs[1]);
}

static void pipe_end(planrt_ctx_t *ctx, const char *want, float *const *params, const int64_t *counts, int n,
		     double *loss, double *norm)
{
	check_step_phase(ctx);
	CHECK(!strcmp(calls, want), "step %lld calls\n  %s\nwant\n  %s", (long long)ctx->step, calls, want);
	for (int i = 0; i < n; i++)
		add_half(params[i], counts[i]);
	*loss = 1.5 + (double)ctx->step;
	*norm = 0.25 * (double)ctx->step;
	steps_done++;
}

static void s0_end(planrt_ctx_t *ctx)
{
	float *params[] = {s0_embed};
	int64_t counts[] = {30};
	pipe_end(ctx, "F0 pB0 F1 B0 pB1 F2 B1 pB2 F3 pB3 B2 B3", params, counts, 1, s0_loss, s0_norm2);
}

static void s1_end(planrt_ctx_t *ctx)
{
	for (int m = 0; m < 4; m++) { /* stage 0's channel-2 messages, in order */
		float dx[PAYLOAD];
		planrt_request_t r = NULL;
		planrt_p2p_recv_start(dx, PAYLOAD, planrt_f32, 0, 2, &r);
		planrt_p2p_finish(ctx, &r);
		for (int j = 0; j < PAYLOAD; j++)
			CHECK(dx[j] == 0.5f * payload(ctx->step, m, j), "step %lld: channel 2 message %d [%d] = %g",
			      (long long)ctx->step, m, j, dx[j]);
	}
	float *params[] = {s1_head, s1_embed};
	int64_t counts[] = {30, 30};
	pipe_end(ctx, "pF0 F0 pF1 B0 F1 pF2 B1 F2 pF3 B2 F3 B3", params, counts, 2, s1_loss, s1_norm2);
}

static void s0_save(planrt_ctx_t *ctx)
{
	CHECK(ctx->save_file != NULL, "save without a file");
	/* in two pieces, as a program that writes a parameter by ranges would */
	planrt_save_param(ctx, s0_embed, planrt_f32, P_EMBED, 0, 13, -1);
	planrt_save_param(ctx, (float *)s0_embed + 13, planrt_f32, P_EMBED, 13, 17, -1);
	planrt_save_param(ctx, s0_norm, planrt_bf16, P_NORM, 0, 7, -1);
}

static void s1_save(planrt_ctx_t *ctx)
{
	planrt_save_param(ctx, s1_head, planrt_f32, P_HEAD, 0, 30, -1);
	planrt_save_param(ctx, s1_embed, planrt_f32, P_EMBED_TIED, 0, 30, -1); /* saved = 0: skipped */
}

static const planrt_phase_fn s0_fwd[] = {s0_forward}, s0_bwd[] = {s0_backward}, s0_pfwd[] = {NULL},
			     s0_pbwd[] = {s0_prepare_backward};
static const planrt_phase_fn s1_fwd[] = {s1_forward}, s1_bwd[] = {s1_backward}, s1_pfwd[] = {s1_prepare_forward};

#define F(m) {PLANRT_FORWARD, 0, (m) % 2, 0xffff, (m)}
#define FI(m) {PLANRT_FORWARD, 0, (m) % 2, (m) % 2, (m)}
#define B(m) {PLANRT_BACKWARD, 0, (m) % 2, 0xffff, (m)}
static const planrt_action_t s0_actions[] = {F(0), F(1), B(0), F(2), B(1), F(3), B(2), B(3)};
static const planrt_action_t s1_actions[] = {FI(0), B(0), FI(1), B(1), FI(2), B(2), FI(3), B(3)};

static const planrt_stage_t pipe_stages[] = {
	{s0_init, pipe_begin, s0_end, s0_save, 1, s0_fwd, s0_bwd, s0_pfwd, s0_pbwd, s0_actions, 8, 4096, SLOT_OFF,
	 SLOT_BYTES, INBOX_OFF, INBOX_BYTES, 2, 2, NREQS, s0_state, 8, (double *const *)&s0_loss, (double *const *)&s0_norm2,
	 0, NULL, 0, NULL, NULL, NULL, NULL, NULL, NULL, s0_families, 3, s0_layer},
	{s1_init, pipe_begin, s1_end, s1_save, 1, s1_fwd, s1_bwd, s1_pfwd, NULL, s1_actions, 8, 4096, SLOT_OFF,
	 SLOT_BYTES, INBOX_OFF, INBOX_BYTES, 2, 2, NREQS, s1_state, 4, (double *const *)&s1_loss, (double *const *)&s1_norm2,
	 0, NULL, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL},
};

static const int pipe_sizes[] = {2};
static const char *const pipe_names[] = {"pipe"};
static const planrt_program_t pipe_program = {
	"pipe2", "toy", "tests/runtime/test_program.c", 2, 1, 0, pipe_sizes, pipe_names, 2, pipe_stages,
	pipe_params, 4, 4, 4, 8, 256, 0.001, 0.0001, 0, 0, 0, 0, NULL, NULL, 0, NULL, NULL, 0,
};

/* ------------------------------------------------------------------ scenario zero */

enum { Z_EMB, Z_ODD, Z_TP, Z_REP, Z_BFZ, Z_BATCH = 4, Z_SEQ = 8 };
static const planrt_param_t zero_params[] = {
	{"emb", 2, {10, 4}, {10, 4}, {-1, -1, -1, -1, -1, -1, -1, -1}, 0, 1, 0.0, 1.0},
	{"odd", 2, {3, 5}, {3, 5}, {-1, -1, -1, -1, -1, -1, -1, -1}, 1, 1, -2.0, 2.0},
	{"tp", 2, {6, 4}, {6, 2}, {-1, 0, -1, -1, -1, -1, -1, -1}, 0, 1, 1.0, 0.5},
	{"rep", 1, {7}, {7}, {-1, -1, -1, -1, -1, -1, -1, -1}, 3, 1, 0.0, 0.0},
	{"bfz", 1, {9}, {9}, {-1, -1, -1, -1, -1, -1, -1, -1}, 0, 1, 0.0, 1.0},
};
/* ZeRO chunks of 2 ranks: emb 20, odd 8 (rank 1: 7 + 1 padding), bfz 5 (rank 1: 4 + 1) */
static void *z_emb, *z_odd, *z_tp, *z_rep, *z_bfz, *z_loss, *z_norm;
static const planrt_state_buf_t zero_state[] = {
	{"emb", planrt_state_param, 80, &z_emb}, {"odd", planrt_state_param, 32, &z_odd},
	{"tp", planrt_state_param, 48, &z_tp},   {"rep", planrt_state_param, 28, &z_rep},
	{"bfz", planrt_state_param, 10, &z_bfz}, {"loss", planrt_state_metric, 8, &z_loss},
	{"grad_norm", planrt_state_metric, 8, &z_norm},
};

static void zero_init(planrt_ctx_t *ctx)
{
	me = planrt_comm_rank(planrt_world_comm());
	check_state_fresh(&program->stages[0]);
	int c = planrt_mesh_coord(0);
	init_and_check(ctx, z_emb, planrt_f32, Z_EMB, c * 20, 20);
	init_and_check(ctx, z_odd, planrt_f32, Z_ODD, c * 8, 8);
	init_and_check(ctx, z_tp, planrt_f32, Z_TP, 0, 12);
	init_and_check(ctx, z_rep, planrt_f32, Z_REP, 0, 7);
	init_and_check(ctx, z_bfz, planrt_bf16, Z_BFZ, c * 5, 5);
	float scratch[10];
	for (int i = 0; i < 10; i++)
		scratch[i] = -7.0f - (float)i;
	init_and_check(ctx, scratch, planrt_f32, Z_ODD, -3, 10); /* padding before the block too */
	init_and_check(ctx, scratch, planrt_f32, Z_ODD, 40, 4);  /* all padding */
}

static void zero_begin(planrt_ctx_t *ctx)
{
	check_step_phase(ctx);
}

/* rows [coord * 2 + micro] of the step's batch: tokens whole, targets positions [2, 6) */
static void zero_forward(planrt_ctx_t *ctx)
{
	CHECK(ctx->inbox == NULL && ctx->slot == ctx->arena + 256, "zero: slot %td inbox %p", ctx->slot - ctx->arena,
	      (void *)ctx->inbox);
	int64_t row = planrt_mesh_coord(0) * 2 + ctx->micro;
	int32_t tok[Z_SEQ], tgt[4], want_tok[Z_SEQ], want_tgt[Z_SEQ];
	planrt_load_input(ctx, tok, 0, row, 1, 0, Z_SEQ);
	planrt_load_input(ctx, tgt, 1, row, 1, 2, 4);
	CHECK(planrt_data_batch(ctx->data, ctx->step, row, row + 1, ctx->seed, want_tok, want_tgt) == planrt_success,
	      "data batch");
	for (int j = 0; j < Z_SEQ; j++)
		CHECK(tok[j] == want_tok[j], "step %lld row %lld token %d: %d, want %d", (long long)ctx->step,
		      (long long)row, j, tok[j], want_tok[j]);
	for (int j = 0; j < 4; j++)
		CHECK(tgt[j] == want_tgt[2 + j], "row %lld target %d: %d, want %d", (long long)row, j, tgt[j],
		      want_tgt[2 + j]);
}

static void zero_backward(planrt_ctx_t *ctx)
{
	CHECK(ctx->reqs != NULL, "zero: no request set");
}

static void zero_end(planrt_ctx_t *ctx)
{
	check_step_phase(ctx);
	add_half(z_emb, 20);
	add_half(z_odd, 8);
	add_half(z_tp, 12);
	/* the replicas drift apart: the file must hold coordinate 0's copy */
	for (int i = 0; i < 7; i++)
		((float *)z_rep)[i] += planrt_mesh_coord(0) ? 0.25f : 0.5f;
	*(double *)z_loss = 1.5 + (double)ctx->step;
	*(double *)z_norm = 0.25 * (double)ctx->step;
	steps_done++;
}

static void zero_save(planrt_ctx_t *ctx)
{
	int c = planrt_mesh_coord(0);
	planrt_save_param(ctx, z_emb, planrt_f32, Z_EMB, c * 20, 20, 0);
	planrt_save_param(ctx, z_odd, planrt_f32, Z_ODD, c * 8, 8, 0);
	planrt_save_param(ctx, z_tp, planrt_f32, Z_TP, 0, 12, -1);
	planrt_save_param(ctx, z_rep, planrt_f32, Z_REP, 0, 7, -1);
	planrt_save_param(ctx, z_bfz, planrt_bf16, Z_BFZ, c * 5, 5, 0);
}

static void badsave_save(planrt_ctx_t *ctx)
{
	zero_save(ctx);
	if (planrt_mesh_coord(0) == 1)
		planrt_save_param(ctx, z_emb, planrt_i32, Z_EMB, 0, 1, 0);
}

static const planrt_phase_fn z_fwd[] = {zero_forward}, z_bwd[] = {zero_backward};
static const planrt_action_t zero_actions[] = {{PLANRT_FORWARD, 0, 0, 0xffff, 0}, {PLANRT_BACKWARD, 0, 0, 0xffff, 0},
					       {PLANRT_FORWARD, 0, 0, 0xffff, 1}, {PLANRT_BACKWARD, 0, 0, 0xffff, 1}};
static const planrt_stage_t zero_stage = {zero_init, zero_begin, zero_end, zero_save, 1, z_fwd, z_bwd, NULL, NULL,
					  zero_actions, 4, 1024, 256, 512, 0, 0, 1, 0, 0, zero_state, 7,
					  (double *const *)&z_loss, (double *const *)&z_norm, 0, NULL, 0, NULL, NULL, NULL, NULL, NULL, NULL,
					  NULL, 0, NULL};
static const planrt_stage_t badsave_stage = {zero_init, zero_begin, zero_end, badsave_save, 1, z_fwd, z_bwd, NULL,
					     NULL, zero_actions, 4, 1024, 256, 512, 0, 0, 1, 0, 0, zero_state, 7,
					     (double *const *)&z_loss, (double *const *)&z_norm, 0, NULL, 0, NULL, NULL, NULL, NULL, NULL, NULL,
					     NULL, 0, NULL};
static const int zero_sizes[] = {2};
static const char *const zero_names[] = {"data"};
static const planrt_program_t zero_program = {
	"zero2", "toy", "tests/runtime/test_program.c", 2, 1, -1, zero_sizes, zero_names, 1, &zero_stage,
	zero_params, 5, 2, Z_BATCH, Z_SEQ, 256, 0.001, 0.0001, 0, 0, 0, 0, NULL, NULL, 0, NULL, NULL, 0,
};
static const planrt_program_t badsave_program = {
	"badsave2", "toy", "tests/runtime/test_program.c", 2, 1, -1, zero_sizes, zero_names, 1, &badsave_stage,
	zero_params, 5, 2, Z_BATCH, Z_SEQ, 256, 0.001, 0.0001, 0, 0, 0, 0, NULL, NULL, 0, NULL, NULL, 0,
};

/* ------------------------------------------------------------------ the checkpoint, after the run */

/* what the file must hold for parameter i: its initial values, then 0.5 per step (f32 state) */
static float *expected_tensor(int i, const char *init_path, uint64_t seed, int64_t steps)
{
	const planrt_param_t *p = &program->params[i];
	int64_t n = elems(p, p->gdims), offs[8] = {0};
	float *x = malloc(sizeof(float) * (size_t)(n ? n : 1));
	if (init_path) {
		planrt_st_t f;
		CHECK(planrt_st_open(init_path, &f) == planrt_success, "open %s: %s", init_path, planrt_last_error());
		CHECK(planrt_st_read_block(f, p->name, p->rank, p->gdims, p->gdims, offs, x) == planrt_success, "read %s",
		      p->name);
		planrt_st_close(f);
	} else {
		planrt_init_block(x, p->rank, p->gdims, p->gdims, offs, p->init_kind, p->a, p->b, seed, p->name);
	}
	int bf16 = !strcmp(p->name, "norm") || !strcmp(p->name, "bfz");
	for (int64_t k = 0; k < n; k++) {
		if (bf16) { /* stored as bf16, never updated */
			uint16_t h;
			planrt_k_f32_to_bf16(&x[k], &h, 1);
			planrt_k_bf16_to_f32(&h, &x[k], 1);
		} else {
			for (int64_t s = 0; s < steps; s++)
				x[k] += 0.5f;
		}
	}
	return x;
}

static int same_bytes(const char *a, const char *b)
{
	FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
	int same = fa && fb;
	while (same) {
		int ca = fgetc(fa), cb = fgetc(fb);
		same = ca == cb;
		if (ca == EOF)
			break;
	}
	if (fa)
		fclose(fa);
	if (fb)
		fclose(fb);
	return same;
}

static void check_checkpoint(const char *path, const char *init_path, uint64_t seed, int64_t steps)
{
	planrt_st_t f;
	if (planrt_st_open(path, &f) != planrt_success) {
		CHECK(0, "cannot read the checkpoint back: %s", planrt_last_error());
		return;
	}
	planrt_st_tensor_t t[8];
	float *want[8];
	int n = 0;
	for (int i = 0; i < program->nparams; i++) {
		const planrt_param_t *p = &program->params[i];
		if (!p->saved)
			continue;
		int64_t count = elems(p, p->gdims), offs[8] = {0};
		want[n] = expected_tensor(i, init_path, seed, steps);
		float *got = malloc(sizeof(float) * (size_t)count);
		CHECK(planrt_st_read_block(f, p->name, p->rank, p->gdims, p->gdims, offs, got) == planrt_success,
		      "checkpoint: %s", planrt_last_error());
		for (int64_t k = 0; k < count; k++)
			CHECK(got[k] == want[n][k], "checkpoint %s[%lld] = %g, want %g", p->name, (long long)k, got[k],
			      want[n][k]);
		free(got);
		t[n] = (planrt_st_tensor_t){p->name, planrt_f32, p->rank, {0}, want[n], NULL};
		memcpy(t[n].dims, p->gdims, sizeof t[n].dims);
		n++;
	}
	planrt_st_close(f);
	/* the same bytes as the single-writer path */
	char ref[4096];
	snprintf(ref, sizeof ref, "%s.ref", path);
	CHECK(planrt_st_write(ref, t, n) == planrt_success, "planrt_st_write: %s", planrt_last_error());
	CHECK(same_bytes(path, ref), "'%s' differs from what planrt_st_write writes ('%s')", path, ref);
	if (!failures)
		unlink(ref);
	for (int i = 0; i < n; i++)
		free(want[i]);
}

int main(int argc, char **argv)
{
	if (argc < 2 || argv[1][0] == '-') {
		fprintf(stderr, "usage: test_program pipe|zero|badsave [planrt_main options]\n");
		return 2;
	}
	const char *scenario = argv[1];
	program = !strcmp(scenario, "pipe") ? &pipe_program : !strcmp(scenario, "zero") ? &zero_program
							  : !strcmp(scenario, "badsave") ? &badsave_program
											 : NULL;
	if (!program) {
		fprintf(stderr, "test_program: unknown scenario '%s'\n", scenario);
		return 2;
	}
	argv[1] = argv[0];
	argv++;
	argc--;
	/* the options the checks after the run need (planrt_main validates them) */
	const char *save = NULL, *init = NULL;
	uint64_t seed = 1234;
	int64_t steps = 0;
	for (int i = 1; i + 1 < argc; i++) {
		if (!strcmp(argv[i], "--save"))
			save = argv[i + 1];
		else if (!strcmp(argv[i], "--init"))
			init = argv[i + 1];
		else if (!strcmp(argv[i], "--seed"))
			seed = strtoull(argv[i + 1], NULL, 10);
		else if (!strcmp(argv[i], "--steps"))
			steps = strtoll(argv[i + 1], NULL, 10);
	}
	int rc = planrt_main(argc, argv, program);
	if (me < 0) /* --help: nothing ran */
		return rc;
	CHECK(steps_done == steps, "%d steps ran, want %lld", steps_done, (long long)steps);
	for (int m = 0; m < 3; m++) /* released, as every state buffer */
		CHECK(s0_layer_w[m] == NULL && s0_layer[m].a == NULL && s0_layer[m].b == NULL,
		      "state family member %d still set after planrt_main", m);
	if (me == 0 && save)
		check_checkpoint(save, init, seed, steps);
	if (failures) {
		fprintf(stderr, "test_program: rank %d: %s: %ld failures\n", me, scenario, failures);
		return 1;
	}
	fprintf(stderr, "test_program: rank %d: %s: ok\n", me, scenario);
	return rc;
}
