/* test_optim_math.c: the CUDA target's multi-tensor optimizer checked on the CPU. kernels_cuda.cu's
 * optimizer_multi_kernel runs planrt_optim_math.h's functions per block and thread; this test
 * runs them on the host in that shape (every block of the launch, every thread of a block, each
 * finding its tensor by the prefix of block counts) over a table of tensors of odd sizes (1, 7,
 * 255, 256, 257, 1000, 4099 and 70001 elements: one block, a partial block, several, and more
 * blocks than the grid allows so threads stride), gradients in f32, bf16 and f16, some with a
 * bf16 or f16 parameter copy, for SGD, momentum, Adam and AdamW with and without weight decay,
 * unclipped, clipped (coefficient 0.37) and skipped (NaN, fp16 loss scaling's overflow). It
 * checks, bit for bit:
 *   - that each element is updated once, by the thread of the tensor's own per-tensor launch
 *     (planrt_om_first and planrt_om_stride against the grid-stride walk);
 *   - the parameters, moments and copies against the per-tensor device kernel's arithmetic (the
 *     same update, one launch per tensor) and against the CPU's update (planrt_optimizer_step
 *     then planrt_cast, libplanrt), over three steps;
 *   - the gradient norm's sum of squares: each block's partial sum and the weighted total from the
 *     multi-tensor blocks against the per-tensor launches (the CPU's, which adds in another order,
 *     within 1e-12).
 * No GPU is needed: this is what CI can check of the device kernel's arithmetic. */
#define PLANRT_INTERNAL
#include "planrt_exec.h"
#include "planrt_optim_math.h"

#include "tally.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static float uniform(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return (float)((rng_state >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

enum { NT = 8 };
static const int64_t sizes[NT] = {1, 7, 255, 256, 257, 1000, 4099, 70001};
static const int gtypes[NT] = {planrt_f32, planrt_bf16, planrt_f16, planrt_f32, planrt_bf16, planrt_f32, planrt_f16, planrt_bf16};
static const int lowtypes[NT] = {0, planrt_bf16, planrt_f16, 0, planrt_bf16, planrt_bf16, 0, planrt_bf16};

/* one copy of the optimizer's state for every tensor */
typedef struct State {
	float *param[NT], *m[NT], *v[NT];
	uint16_t *low[NT];
	void *grad[NT];
} State;

static void state_init(State *s)
{
	rng_state = 0x2545f4914f6cdd1dull;
	for (int e = 0; e < NT; e++) {
		int64_t n = sizes[e];
		s->param[e] = malloc(sizeof(float) * (size_t)n);
		s->m[e] = calloc((size_t)n, sizeof(float));
		s->v[e] = calloc((size_t)n, sizeof(float));
		s->low[e] = calloc((size_t)n, sizeof(uint16_t));
		s->grad[e] = malloc(sizeof(float) * (size_t)n);
		if (!s->param[e] || !s->m[e] || !s->v[e] || !s->low[e] || !s->grad[e]) {
			fprintf(stderr, "out of memory\n");
			exit(1);
		}
		for (int64_t i = 0; i < n; i++)
			s->param[e][i] = uniform();
	}
}

/* the step's gradients: the same values in each State, stored in the tensor's dtype */
static void new_grads(State *const *states, int nstates)
{
	for (int e = 0; e < NT; e++)
		for (int64_t i = 0; i < sizes[e]; i++) {
			float g = uniform() * (i % 97 == 0 ? 40.0f : 0.05f);
			for (int k = 0; k < nstates; k++) {
				if (gtypes[e] == planrt_f32)
					((float *)states[k]->grad[e])[i] = g;
				else
					((uint16_t *)states[k]->grad[e])[i] = sm_narrow(g, gtypes[e]);
			}
		}
}

static void state_free(State *s)
{
	for (int e = 0; e < NT; e++) {
		free(s->param[e]);
		free(s->m[e]);
		free(s->v[e]);
		free(s->low[e]);
		free(s->grad[e]);
	}
}

static planrt_om_entry_t entry_of(const State *s, int e)
{
	planrt_om_entry_t x = {s->param[e], s->grad[e], s->m[e], s->v[e], lowtypes[e] ? s->low[e] : NULL, sizes[e],
			       gtypes[e], lowtypes[e]};
	return x;
}

/* the multi-tensor launch: every block of prefix[NT] blocks, every thread */
static void run_multi(const planrt_om_scalars_t *o, const State *s, double k, const int64_t *prefix)
{
	planrt_om_entry_t table[NT];
	for (int e = 0; e < NT; e++)
		table[e] = entry_of(s, e);
	for (int64_t b = 0; b < prefix[NT]; b++) {
		int e = planrt_om_tensor_of(prefix, NT, b);
		for (int t = 0; t < PLANRT_OM_BLOCK; t++)
			planrt_om_thread(o, &table[e], k, planrt_om_first(prefix, e, b, t), planrt_om_stride(prefix, e));
	}
}

/* one launch per tensor, grid-stride as optimizer_kernel, then the cast */
static void run_per_tensor(const planrt_om_scalars_t *o, const State *s, double k, int64_t most)
{
	for (int e = 0; e < NT; e++) {
		planrt_om_entry_t x = entry_of(s, e);
		x.low = NULL;
		int64_t grid = planrt_om_blocks(x.n, most);
		for (int64_t b = 0; b < grid; b++)
			for (int t = 0; t < PLANRT_OM_BLOCK; t++)
				planrt_om_thread(o, &x, k, b * PLANRT_OM_BLOCK + t, grid * PLANRT_OM_BLOCK);
		if (lowtypes[e] && k == k)
			for (int64_t i = 0; i < x.n; i++)
				s->low[e][i] = sm_narrow(s->param[e][i], lowtypes[e]);
	}
}

/* libplanrt's update and cast */
static void run_cpu(int kind, double lr, double wd, int64_t step, const State *s, const double *coef)
{
	for (int e = 0; e < NT; e++) {
		planrt_optimizer_step(kind, lr, 0.9, 0.999, 1e-8, wd, 0.9, 0, 0, 0, step, s->param[e], s->grad[e],
				      (planrt_dtype_t)gtypes[e], kind == planrt_opt_sgd ? NULL : s->m[e],
				      kind >= planrt_opt_adam ? s->v[e] : NULL, sizes[e], coef);
		if (lowtypes[e] && !(coef && isnan(*coef)))
			planrt_cast(s->param[e], planrt_f32, s->low[e], (planrt_dtype_t)lowtypes[e], sizes[e]);
	}
}

static int same(const State *a, const State *b)
{
	for (int e = 0; e < NT; e++) {
		size_t n = (size_t)sizes[e];
		if (memcmp(a->param[e], b->param[e], 4 * n) || memcmp(a->m[e], b->m[e], 4 * n) ||
		    memcmp(a->v[e], b->v[e], 4 * n) || memcmp(a->low[e], b->low[e], 2 * n))
			return 0;
	}
	return 1;
}

/* each element of each tensor is visited once, by the thread of the per-tensor launch */
static void check_index_math(int64_t most)
{
	int64_t prefix[NT + 1] = {0};
	for (int e = 0; e < NT; e++)
		prefix[e + 1] = prefix[e] + planrt_om_blocks(sizes[e], most);
	int ok = 1;
	for (int e = 0; e < NT && ok; e++) {
		int64_t grid = prefix[e + 1] - prefix[e];
		char *visits = calloc((size_t)sizes[e], 1);
		for (int64_t b = prefix[e]; b < prefix[e + 1]; b++) {
			ok &= planrt_om_tensor_of(prefix, NT, b) == e;
			ok &= planrt_om_stride(prefix, e) == grid * PLANRT_OM_BLOCK;
			for (int t = 0; t < PLANRT_OM_BLOCK; t++) {
				int64_t first = planrt_om_first(prefix, e, b, t);
				ok &= first == (b - prefix[e]) * PLANRT_OM_BLOCK + t;
				for (int64_t i = first; i < sizes[e]; i += planrt_om_stride(prefix, e))
					visits[i]++;
			}
		}
		for (int64_t i = 0; i < sizes[e]; i++)
			ok &= visits[i] == 1;
		free(visits);
	}
	CHECK(ok, "index math, at most %lld blocks a tensor", (long long)most);
}

static void check_update(int kind, double wd, double clip, int64_t most)
{
	int64_t prefix[NT + 1] = {0};
	for (int e = 0; e < NT; e++)
		prefix[e + 1] = prefix[e] + planrt_om_blocks(sizes[e], most);
	State multi, per, cpu;
	state_init(&multi);
	state_init(&per);
	state_init(&cpu);
	State *all[3] = {&multi, &per, &cpu};
	const double lr = 1e-3;
	for (int64_t step = 0; step < 3; step++) {
		new_grads(all, 3);
		double k = clip;
		planrt_om_scalars_t o = planrt_om_scalars(kind, planrt_lr_at(lr, step, 0, 0, 0), (double)(step + 1), 0.9,
							  0.999, 1e-8, wd, 0.9, kind == planrt_opt_adamw);
		run_multi(&o, &multi, k, prefix);
		run_per_tensor(&o, &per, k, most);
		run_cpu(kind, lr, wd, step, &cpu, k == 1.0 ? NULL : &k);
	}
	CHECK(same(&multi, &per), "optimizer %d, weight decay %g, coefficient %g, at most %lld blocks: multi-tensor = per-tensor",
	      kind, wd, clip, (long long)most);
	CHECK(same(&multi, &cpu), "optimizer %d, weight decay %g, coefficient %g, at most %lld blocks: multi-tensor = CPU",
	      kind, wd, clip, (long long)most);
	state_free(&multi);
	state_free(&per);
	state_free(&cpu);
}

/* the sum of squares: each block's partial sum (its threads' sums, reduced in one fixed order as
 * block_sum_d reduces them on the device) and the weighted totals added in the table's order, from
 * the multi-tensor launch's blocks and from one launch per tensor */
static void check_sumsq(int64_t most)
{
	State st;
	state_init(&st);
	State *one[1] = {&st};
	new_grads(one, 1);
	planrt_om_sq_entry_t table[NT];
	int64_t prefix[NT + 1] = {0};
	for (int e = 0; e < NT; e++) {
		planrt_om_sq_entry_t x = {st.grad[e], sizes[e], 1.0 / (e + 1), gtypes[e], 0};
		table[e] = x;
		prefix[e + 1] = prefix[e] + planrt_om_blocks(sizes[e], most);
	}
	double *partial = calloc((size_t)prefix[NT], sizeof(double));
	for (int64_t b = 0; b < prefix[NT]; b++) {
		int e = planrt_om_tensor_of(prefix, NT, b);
		for (int t = 0; t < PLANRT_OM_BLOCK; t++)
			partial[b] += planrt_om_sumsq_thread(&table[e], planrt_om_first(prefix, e, b, t),
							     planrt_om_stride(prefix, e));
	}
	double multi = 0, per = 0;
	for (int e = 0; e < NT; e++) {
		double s = 0;
		for (int64_t b = prefix[e]; b < prefix[e + 1]; b++)
			s += partial[b];
		multi += table[e].weight * s;
		int64_t grid = planrt_om_blocks(sizes[e], most);
		double t_sum = 0;
		for (int64_t b = 0; b < grid; b++) {
			double block = 0;
			for (int t = 0; t < PLANRT_OM_BLOCK; t++)
				block += planrt_om_sumsq_thread(&table[e], b * PLANRT_OM_BLOCK + t, grid * PLANRT_OM_BLOCK);
			t_sum += block;
		}
		per += table[e].weight * t_sum;
	}
	double cpu = 0;
	for (int e = 0; e < NT; e++)
		planrt_sum_squares_acc(&cpu, table[e].x, sizes[e], (planrt_dtype_t)table[e].t, table[e].weight);
	CHECK(memcmp(&multi, &per, sizeof multi) == 0, "sum of squares, at most %lld blocks: multi-tensor = per-tensor",
	      (long long)most);
	CHECK(fabs(multi - cpu) <= 1e-12 * fabs(cpu), "sum of squares, at most %lld blocks: within 1e-12 of the CPU's (%.17g, %.17g)",
	      (long long)most, multi, cpu);
	free(partial);
	state_free(&st);
}

int main(void)
{
	static const int64_t most[] = {2112, 3}; /* an H200's 132 multiprocessors x 16; a tiny grid that strides */
	for (int g = 0; g < 2; g++) {
		check_index_math(most[g]);
		check_sumsq(most[g]);
		for (int kind = planrt_opt_sgd; kind <= planrt_opt_adamw; kind++)
			for (int d = 0; d < 2; d++) {
				check_update(kind, d ? 0.01 : 0.0, 1.0, most[g]);
				check_update(kind, d ? 0.01 : 0.0, 0.37, most[g]);
				check_update(kind, d ? 0.01 : 0.0, NAN, most[g]);
			}
	}
	return tally_report("the multi-tensor optimizer's arithmetic");
}
