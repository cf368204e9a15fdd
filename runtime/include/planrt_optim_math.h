/* planrt_optim_math.h: the optimizer update and the multi-tensor index math of the CUDA target,
 * as functions that compile for the device (kernels_cuda.cu) and for the host
 * (tests/cuda/test_optim_math.c, which checks them on the CPU against runtime/cpu's update).
 *
 * The per-tensor optimizer kernel and the multi-tensor one (one launch over a table of tensors:
 * the parameters of a step, with their gradients, moments and low-precision copies) run the same
 * element update, om_update, so a step updated by one launch or by one launch per tensor gives the
 * same numbers bit for bit. The multi-tensor launch gives tensor e om_blocks(n_e) blocks (the
 * per-tensor launch's grid); a block finds its tensor by a binary search of the prefix sums of the
 * block counts (om_tensor_of) and walks its elements with the stride of the tensor's own grid
 * (om_first, om_stride), so each element is visited by the thread that visits it in the per-tensor
 * launch, and a sum of squares adds in the same order. */
#ifndef PLANRT_OPTIM_MATH_H
#define PLANRT_OPTIM_MATH_H

#include <math.h>
#include <stdint.h>

#include "planrt_sync_math.h"

#ifdef __CUDACC__
#define PLANRT_OM static inline __host__ __device__
#else
#define PLANRT_OM static inline
#endif

/* planrt_opt_kind_t's values (planrt_program.h), repeated so the header stands alone */
enum { PLANRT_OM_SGD = 0, PLANRT_OM_MOMENTUM = 1 };

/* the threads of a block (PLANRT_CU_BLOCK) */
enum { PLANRT_OM_BLOCK = 256 };

/* the scalars of one step, computed on the host exactly as optim.c computes them */
typedef struct planrt_om_scalars {
	int kind, l2, decoupled, first;
	float wd, neg_lr, mu, neg_step_size, bc2_sqrt, b1, b2, one_b1, one_b2, eps, decay;
} planrt_om_scalars_t;

/* one tensor of a multi-tensor update: f32 parameter (or master weights) and moments, the gradient
 * (f32, bf16 or f16: gt is a planrt_dtype_t), and, where low is not NULL, the lower-precision
 * parameter the update also writes (low_t: planrt_bf16 or planrt_f16), as the cast after
 * the update does. 48 bytes; the device table is an array of these. */
typedef struct planrt_om_entry {
	float *param;
	const void *grad;
	float *m, *v;
	void *low;
	int64_t n;
	int32_t gt, low_t;
} planrt_om_entry_t;

/* the scalars for kind at schedule learning rate lr_t and Adam's step t (1 for the first update) */
static inline planrt_om_scalars_t planrt_om_scalars(int kind, double lr_t, double t, double beta1, double beta2,
						    double eps, double weight_decay, double momentum, int adamw)
{
	double bc1 = 1 - pow(beta1, t), bc2 = 1 - pow(beta2, t);
	planrt_om_scalars_t o;
	o.kind = kind;
	o.l2 = !adamw && weight_decay != 0;
	o.decoupled = adamw && weight_decay != 0;
	o.first = t <= 1;
	o.wd = (float)weight_decay;
	o.neg_lr = (float)-lr_t;
	o.mu = (float)momentum;
	o.neg_step_size = (float)-(lr_t / bc1);
	o.bc2_sqrt = (float)sqrt(bc2);
	o.b1 = (float)beta1;
	o.b2 = (float)beta2;
	o.one_b1 = (float)(1 - beta1);
	o.one_b2 = (float)(1 - beta2);
	o.eps = (float)eps;
	o.decay = (float)(1 - lr_t * weight_decay);
	return o;
}

/* gradient element i as f32. gt is a planrt_dtype_t: planrt_f32 = 0, planrt_bf16 = 1 and
 * planrt_f16 = 2 are PLANRT_SM_BF16 and PLANRT_SM_F16 (kernels_cuda.cu checks it at compile time) */
PLANRT_OM float planrt_om_grad(const void *grad, int gt, int64_t i)
{
	if (gt == 0)
		return ((const float *)grad)[i];
	return sm_widen(((const uint16_t *)grad)[i], gt);
}

/* optim.c's update of element i, the gradient g already scaled by the clipping coefficient */
PLANRT_OM void planrt_om_update(const planrt_om_scalars_t *o, float g, float *param, float *m, float *v, int64_t i)
{
	float p = param[i];
	switch (o->kind) {
	case PLANRT_OM_SGD:
		if (o->l2)
			g = g + o->wd * p;
		param[i] = p + o->neg_lr * g;
		break;
	case PLANRT_OM_MOMENTUM: {
		if (o->l2)
			g = g + o->wd * p;
		float b = o->first ? g : m[i] * o->mu + g;
		m[i] = b;
		param[i] = p + o->neg_lr * b;
		break;
	}
	default: {
		if (o->decoupled)
			p = p * o->decay;
		if (o->l2)
			g = g + o->wd * p;
		float mi = m[i] * o->b1 + o->one_b1 * g;
		float vi = v[i] * o->b2 + o->one_b2 * g * g;
		float denom = sqrtf(vi) / o->bc2_sqrt + o->eps;
		m[i] = mi;
		v[i] = vi;
		param[i] = p + o->neg_step_size * mi / denom;
	}
	}
}

/* the blocks a per-tensor launch over n elements has: planrt_cu_grid's, at least 1 and at most
 * `most` (16 per multiprocessor) */
PLANRT_OM int64_t planrt_om_blocks(int64_t n, int64_t most)
{
	int64_t b = (n + PLANRT_OM_BLOCK - 1) / PLANRT_OM_BLOCK;
	return b < 1 ? 1 : b > most ? most : b;
}

/* the tensor block `block` of a multi-tensor launch works on: prefix[e] is the first block of
 * tensor e, prefix[count] the launch's blocks (prefix[e + 1] > prefix[e]) */
PLANRT_OM int planrt_om_tensor_of(const int64_t *prefix, int count, int64_t block)
{
	int lo = 0, hi = count - 1;
	while (lo < hi) {
		int mid = lo + (hi - lo + 1) / 2;
		if (prefix[mid] <= block)
			lo = mid;
		else
			hi = mid - 1;
	}
	return lo;
}

/* the first element and the stride of thread `thread` of block `block` on tensor e: its place in
 * the per-tensor launch's grid-stride walk */
PLANRT_OM int64_t planrt_om_first(const int64_t *prefix, int e, int64_t block, int thread)
{
	return (block - prefix[e]) * PLANRT_OM_BLOCK + thread;
}

PLANRT_OM int64_t planrt_om_stride(const int64_t *prefix, int e)
{
	return (prefix[e + 1] - prefix[e]) * PLANRT_OM_BLOCK;
}

/* one thread's share of the multi-tensor update: entry e's elements first, first + stride, ... with
 * the gradient scaled by k (k = 1: unclipped; NaN: a step skipped by fp16 loss scaling, nothing
 * changes) and the low-precision copy written from the new parameter */
PLANRT_OM void planrt_om_thread(const planrt_om_scalars_t *o, const planrt_om_entry_t *x, double k, int64_t first,
				int64_t stride)
{
	if (k != k)
		return;
	for (int64_t i = first; i < x->n; i += stride) {
		float g = planrt_om_grad(x->grad, x->gt, i);
		if (k != 1.0)
			g = (float)k * g;
		planrt_om_update(o, g, x->param, x->m, x->v, i);
		if (x->low)
			((uint16_t *)x->low)[i] = sm_narrow(x->param[i], x->low_t);
	}
}

/* one tensor of a multi-tensor sum of squares: *acc += weight * the sum of x^2 (in double), x of
 * n elements of dtype t (f32, bf16 or f16) */
typedef struct planrt_om_sq_entry {
	const void *x;
	int64_t n;
	double weight;
	int32_t t, pad;
} planrt_om_sq_entry_t;

/* one thread's part of the sum of squares of x: elements first, first + stride, ... in order, as
 * the per-tensor kernel's thread adds them */
PLANRT_OM double planrt_om_sumsq_thread(const planrt_om_sq_entry_t *x, int64_t first, int64_t stride)
{
	double s = 0;
	for (int64_t i = first; i < x->n; i += stride) {
		double v = planrt_om_grad(x->x, x->t, i);
		s += v * v;
	}
	return s;
}

#endif
