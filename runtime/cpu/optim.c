/* optim.c: optimizer updates and the learning-rate schedule.
 *
 * Each update is torch.optim's single-tensor code path written out per element, in f32 with the
 * same operation order and the same scalars (hyper-parameters arrive as double like Python floats
 * and are rounded to f32 where torch's kernels round them), so that a run matches PyTorch up to
 * the fused multiply-adds its vector kernels may use:
 *   SGD       g = grad (+ wd * param);  param = param + (-lr) * g
 *   momentum  g as SGD; buf = g at step 1, else buf = buf * momentum + g (dampening 0, no
 *             nesterov); param = param + (-lr) * buf
 *   Adam      g as SGD (L2 decay); m = m * b1 + (1 - b1) * g; v = v * b2 + (1 - b2) * g * g;
 *             denom = sqrt(v) / sqrt(1 - b2^t) + eps;  param = param + (-lr / (1 - b1^t)) * m / denom
 *   AdamW     param = param * (1 - lr * wd) first (decoupled decay), then Adam without L2.
 * The bias corrections and step size are computed in double as torch does in Python.
 *
 * The updates and planrt_sum_squares are compiled per instruction-set level too (cpu_table.h):
 * built with PLANRT_CPU_VARIANT=LEVEL this file holds only them, named with the level. The loops
 * vectorise with the flags runtime/CMakeLists.txt gives this file and kernels.c (gcc's dynamic
 * cost model, -fno-math-errno: sqrtf inline, -fno-trapping-math: selects if-converted), which
 * change no result. Adam's and AdamW's update splits over planrt's threads (planrt_cpu.h) by
 * blocks of elements. */
#define PLANRT_INTERNAL
#include "planrt.h"
#include "planrt_cpu.h"

#include "cpu_table.h"

#include <math.h>

#ifdef PLANRT_CPU_VARIANT
#define planrt_opt_step PLANRT_CPU_NAME(planrt_opt_step, PLANRT_CPU_VARIANT)
#define planrt_sum_squares PLANRT_CPU_NAME(planrt_sum_squares, PLANRT_CPU_VARIANT)
#define DISPATCH(name, args) ((void)0)
#define DISPATCH_VALUE(name, args) ((void)0)
#else
#define DISPATCH PLANRT_CPU_DISPATCH
#define DISPATCH_VALUE PLANRT_CPU_DISPATCH_VALUE
#endif

/* Adam's scalars for one step (f32, as torch rounds them); decay is 1 without decoupled decay
 * (p * 1 is p) */
typedef struct {
	float neg_step_size, bc2_sqrt, b1, b2, one_b1, one_b2, eps, decay, wd;
} adam_t;

/* Adam's (AdamW's) element loop, for l2 (L2 decay in the gradient) known where it is inlined: the
 * arrays do not overlap and the loop has no branch, so it vectorises */
static inline __attribute__((always_inline)) void adam_loop(const adam_t *a, int l2, float *restrict param,
							    const float *restrict grad, float *restrict m,
							    float *restrict v, size_t n)
{
	const adam_t c = *a;
	for (size_t i = 0; i < n; i++) {
		float p = param[i] * c.decay;
		float g = l2 ? grad[i] + c.wd * p : grad[i];
		float mi = m[i] * c.b1 + c.one_b1 * g;
		float vi = v[i] * c.b2 + c.one_b2 * g * g;
		float denom = sqrtf(vi) / c.bc2_sqrt + c.eps;
		m[i] = mi;
		v[i] = vi;
		param[i] = p + c.neg_step_size * mi / denom;
	}
}

/* Adam's update of one tensor, split over the threads (planrt_parallel_for) in blocks of
 * ADAM_BLOCK elements: a multiple of every vector width, so that each element runs the same
 * instructions (vector body or scalar tail) at every thread count */
#define ADAM_BLOCK 16384
typedef struct {
	const adam_t *a;
	int l2;
	float *param, *m, *v;
	const float *grad;
	size_t n;
} adam_job_t;

static void adam_blocks(void *ctx, int64_t lo, int64_t hi, int thread)
{
	const adam_job_t *j = ctx;
	size_t first = (size_t)lo * ADAM_BLOCK, end = (size_t)hi * ADAM_BLOCK < j->n ? (size_t)hi * ADAM_BLOCK : j->n;
	(void)thread;
	if (j->l2)
		adam_loop(j->a, 1, j->param + first, j->grad + first, j->m + first, j->v + first, end - first);
	else
		adam_loop(j->a, 0, j->param + first, j->grad + first, j->m + first, j->v + first, end - first);
}

static void adam_update(const adam_t *a, int l2, float *param, const float *grad, float *m, float *v, size_t n)
{
	adam_job_t job = {a, l2, param, m, v, grad, n};
	planrt_parallel_for((int64_t)((n + ADAM_BLOCK - 1) / ADAM_BLOCK), adam_blocks, &job);
}

void planrt_opt_step(const planrt_opt_t *o, double lr, int64_t step, float *param, const float *grad, float *m,
		     float *v, size_t n)
{
	DISPATCH(planrt_opt_step, (o, lr, step, param, grad, m, v, n));
	const float wd = (float)o->weight_decay, neg_lr = (float)-lr;
	const int l2 = o->kind != planrt_opt_adamw && o->weight_decay != 0;
	switch (o->kind) {
	case planrt_opt_sgd:
		for (size_t i = 0; i < n; i++) {
			float g = l2 ? grad[i] + wd * param[i] : grad[i];
			param[i] = param[i] + neg_lr * g;
		}
		return;
	case planrt_opt_momentum: {
		const float mu = (float)o->momentum;
		for (size_t i = 0; i < n; i++) {
			float g = l2 ? grad[i] + wd * param[i] : grad[i];
			float b = step <= 1 ? g : m[i] * mu + g;
			m[i] = b;
			param[i] = param[i] + neg_lr * b;
		}
		return;
	}
	case planrt_opt_adam:
	case planrt_opt_adamw: {
		const double t = (double)step;
		const double bc1 = 1 - pow(o->beta1, t), bc2 = 1 - pow(o->beta2, t);
		const adam_t a = {
			.neg_step_size = (float)-(lr / bc1),
			.bc2_sqrt = (float)sqrt(bc2),
			.b1 = (float)o->beta1,
			.b2 = (float)o->beta2,
			.one_b1 = (float)(1 - o->beta1),
			.one_b2 = (float)(1 - o->beta2),
			.eps = (float)o->eps,
			.decay = o->kind == planrt_opt_adamw && o->weight_decay != 0 ? (float)(1 - lr * o->weight_decay) : 1.0f,
			.wd = wd,
		};
		adam_update(&a, l2, param, grad, m, v, n);
		return;
	}
	}
	planrt_fatal("planrt_opt_step: unknown optimizer kind %d", (int)o->kind);
}

#ifndef PLANRT_CPU_VARIANT
/* step counts from 0. step < warmup: lr * (step + 1) / warmup (the first step already moves).
 * Then, with total > 0, cosine from lr at step = warmup to min_lr at step = total, and min_lr
 * from total on; total <= 0: lr after the warmup (no decay). */
double planrt_lr_at(double lr, int64_t step, int64_t warmup, int64_t total, double min_lr)
{
	if (step < 0)
		step = 0;
	if (step < warmup)
		return lr * (double)(step + 1) / (double)warmup;
	if (total <= 0)
		return lr;
	if (step >= total)
		return min_lr;
	double progress = (double)(step - warmup) / (double)(total - warmup);
	return min_lr + 0.5 * (lr - min_lr) * (1.0 + cos(M_PI * progress));
}

#endif

/* in double, with eight partial sums (a vector's lanes), added pairwise at the end */
double planrt_sum_squares(const float *x, size_t n)
{
	DISPATCH_VALUE(planrt_sum_squares, (x, n));
	double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0}, s = 0;
	size_t i = 0;
	for (; i + 8 <= n; i += 8)
		for (int j = 0; j < 8; j++)
			acc[j] += (double)x[i + j] * (double)x[i + j];
	for (; i < n; i++)
		s += (double)x[i] * (double)x[i];
	return s + ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}
