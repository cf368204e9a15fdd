/* step.c: the step kernels of the whole-program IR (planrt_exec.h, "step kernels of the IR"): the
 * small operations a generated step runs on flat buffers between the compute kernels. In-place
 * collectives on gradient buckets and ZeRO shards (thin wrappers over comm_mpi.c's NCCL-style
 * in-place conventions), request completion, fills, accumulation and dtype casts, the pieces of
 * gradient clipping, the optimizer step and the loss sum.
 *
 * Rounding: every result in bf16 or f16 is the exact value rounded once to nearest even. A sum
 * of two half-precision values is formed in f32 and rounded to the half type: the f32 sum is
 * exact unless the operands' exponents are far apart (more than 16 binades for bf16, 13 for f16),
 * and then it lies within a quarter of a half-type ulp of the larger operand, so rounding it
 * gives the correctly rounded sum. A double is rounded to a half type through f32 rounded to odd
 * (truncated, the last bit set when inexact), which with f32's spare bits equals the direct
 * rounding; plain (float) rounding first could land on a half-way point and round again the wrong
 * way. bf16 is narrowed exactly as planrt_k_f32_to_bf16 does (NaN becomes the quiet NaN 0x7fc0),
 * so an f32 to bf16 cast is bitwise what the master-weight copies of earlier programs produced.
 *
 * The optimizer step reads the gradient and never writes it (it may be a view other work still
 * uses): a gradient that needs widening or clipping is converted and scaled in blocks of
 * OPT_BLOCK elements on the stack and planrt_opt_step runs per block. Every update in optim.c is
 * element-wise (element i reads only element i of param, grad, m and v, and scalars computed
 * from lr and step), so the blocked run is bitwise the single call on a scaled copy, which is
 * what earlier programs did (planrt_k_scale_f32 in place, then planrt_opt_step). */
#define PLANRT_INTERNAL
#include "planrt_half.h"
#include "planrt_exec.h"
#include "planrt_kernels.h"
#include "planrt_program.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

enum { OPT_BLOCK = 4096 };

static const char *dtype_name(planrt_dtype_t t)
{
	static const char *const names[] = {"f32", "bf16", "f16", "i32", "u8", "f64"};
	return (unsigned)t <= planrt_f64 ? names[t] : "an unknown dtype";
}

static int is_half(planrt_dtype_t t)
{
	return t == planrt_bf16 || t == planrt_f16;
}

/* bf16 and f16 element conversions (planrt_half.h, inline: the loops are hot) */
static inline float half_f32(uint16_t h, planrt_dtype_t t)
{
	return t == planrt_bf16 ? planrt_widen_bf16(h) : planrt_widen_f16(h);
}

static inline uint16_t f32_half(float x, planrt_dtype_t t)
{
	return t == planrt_bf16 ? planrt_narrow_bf16(x) : planrt_narrow_f16(x);
}

static void check_count(const char *what, int64_t n)
{
	if (n < 0)
		planrt_fatal("%s: negative element count %lld", what, (long long)n);
}

/* ------------------------------------------------------------------ in-place collectives */

static void check_idle(const char *what, const planrt_request_t *req)
{
	if (req && *req)
		planrt_fatal("internal error: %s started on a request slot whose previous request was not finished", what);
}

void planrt_allreduce_inplace(void *buf, int64_t n, planrt_dtype_t t, planrt_comm_t c, planrt_request_t *req)
{
	check_count("planrt_allreduce_inplace", n);
	check_idle("planrt_allreduce_inplace", req);
	PLANRT_CHECK(planrt_allreduce(buf, buf, (size_t)n, t, planrt_sum, c, NULL, req));
}

void planrt_reduce_scatter_inplace(void *buf, int64_t chunk, planrt_dtype_t t, planrt_comm_t c, planrt_request_t *req)
{
	check_count("planrt_reduce_scatter_inplace", chunk);
	check_idle("planrt_reduce_scatter_inplace", req);
	size_t at = (size_t)(planrt_comm_rank(c) > 0 ? planrt_comm_rank(c) : 0) * (size_t)chunk * planrt_dtype_size(t);
	PLANRT_CHECK(planrt_reduce_scatter(buf, (char *)buf + at, (size_t)chunk, t, planrt_sum, c, NULL, req));
}

void planrt_allgather_inplace(void *buf, int64_t chunk, planrt_dtype_t t, planrt_comm_t c, planrt_request_t *req)
{
	check_count("planrt_allgather_inplace", chunk);
	check_idle("planrt_allgather_inplace", req);
	size_t at = (size_t)(planrt_comm_rank(c) > 0 ? planrt_comm_rank(c) : 0) * (size_t)chunk * planrt_dtype_size(t);
	PLANRT_CHECK(planrt_allgather((char *)buf + at, buf, (size_t)chunk, t, c, NULL, req));
}

void planrt_ring_shift_start(const void *send, void *recv, int64_t n, planrt_dtype_t t, planrt_comm_t c, int tag,
			     planrt_request_t *send_req, planrt_request_t *recv_req)
{
	check_count("planrt_ring_shift_start", n);
	check_idle("planrt_ring_shift_start", send_req);
	check_idle("planrt_ring_shift_start", recv_req);
	int size = planrt_comm_size(c), rank = planrt_comm_rank(c);
	if (size < 2 || rank < 0)
		planrt_fatal("internal error: a ring shift on a communicator of %d member(s)", size);
	PLANRT_CHECK(planrt_recv_tagged(recv, (size_t)n, t, (rank + size - 1) % size, tag, c, NULL, recv_req));
	PLANRT_CHECK(planrt_send_tagged(send, (size_t)n, t, (rank + 1) % size, tag, c, NULL, send_req));
}

void planrt_request_finish(planrt_request_t *req)
{
	planrt_request_t q = *req;
	if (!q)
		return;
	*req = NULL; /* planrt_wait frees it, also when it fails */
	PLANRT_CHECK(planrt_wait(q));
}

/* ------------------------------------------------------------------ fills, sums and casts */

/* x rounded to f32 with round-to-odd: then rounding that to a half type is x rounded once. */
static float f32_round_odd(double x)
{
	float f = (float)x;
	if (!isfinite(f) || (double)f == x)
		return f;
	uint32_t u;
	memcpy(&u, &f, 4);
	if (!(u & 1)) /* even: the odd neighbour on x's side is the truncation's odd result */
		u = fabs((double)f) > fabs(x) ? u - 1 : u + 1;
	memcpy(&f, &u, 4);
	return f;
}

static uint16_t f64_to_half(double x, planrt_dtype_t t)
{
	return f32_half(f32_round_odd(x), t);
}

void planrt_fill_f32(float *x, int64_t n, double value)
{
	float v = (float)value;
	for (int64_t i = 0; i < n; i++)
		x[i] = v;
}

void planrt_fill(void *dst, int64_t n, planrt_dtype_t t, double value)
{
	check_count("planrt_fill", n);
	switch (t) {
	case planrt_f32: planrt_fill_f32(dst, n, value); return;
	case planrt_f64:
		for (int64_t i = 0; i < n; i++)
			((double *)dst)[i] = value;
		return;
	case planrt_bf16:
	case planrt_f16: {
		uint16_t h = f64_to_half(value, t), *d = dst;
		for (int64_t i = 0; i < n; i++)
			d[i] = h;
		return;
	}
	case planrt_i32:
		if (!(value >= INT32_MIN && value <= INT32_MAX && value == floor(value)))
			planrt_fatal("planrt_fill: %g is not an i32 value", value);
		for (int64_t i = 0; i < n; i++)
			((int32_t *)dst)[i] = (int32_t)value;
		return;
	case planrt_u8:
		if (!(value >= 0 && value <= 255 && value == floor(value)))
			planrt_fatal("planrt_fill: %g is not a u8 value", value);
		memset(dst, (int)value, (size_t)n);
		return;
	}
	planrt_fatal("planrt_fill: unknown dtype %d", (int)t);
}

void planrt_accumulate(void *dst, const void *src, int64_t n, planrt_dtype_t t)
{
	check_count("planrt_accumulate", n);
	switch (t) {
	case planrt_f32: {
		float *d = dst;
		const float *s = src;
		for (int64_t i = 0; i < n; i++)
			d[i] += s[i];
		return;
	}
	case planrt_f64: {
		double *d = dst;
		const double *s = src;
		for (int64_t i = 0; i < n; i++)
			d[i] += s[i];
		return;
	}
	case planrt_bf16:
	case planrt_f16: {
		uint16_t *d = dst;
		const uint16_t *s = src;
		if (t == planrt_bf16)
			for (int64_t i = 0; i < n; i++)
				d[i] = f32_half(half_f32(d[i], planrt_bf16) + half_f32(s[i], planrt_bf16), planrt_bf16);
		else
			for (int64_t i = 0; i < n; i++)
				d[i] = f32_half(half_f32(d[i], planrt_f16) + half_f32(s[i], planrt_f16), planrt_f16);
		return;
	}
	case planrt_i32:
	case planrt_u8: break;
	}
	planrt_fatal("planrt_accumulate: %s buffers are not accumulated (f32, bf16, f16 or f64)", dtype_name(t));
}

void planrt_accumulate_f32(void *dst, planrt_dtype_t t, const float *src, int64_t n)
{
	check_count("planrt_accumulate_f32", n);
	if (t == planrt_f32) {
		planrt_accumulate(dst, src, n, t);
		return;
	}
	if (!is_half(t))
		planrt_fatal("planrt_accumulate_f32: into %s (f32, bf16 or f16)", dtype_name(t));
	uint16_t *d = dst;
	for (int64_t i = 0; i < n; i++) /* f32 sum of a half value and an f32 one, rounded once */
		d[i] = f32_half(half_f32(d[i], t) + src[i], t);
}

/* a half-precision buffer widened to f32 */
static void half_to_f32(const uint16_t *x, float *y, int64_t n, planrt_dtype_t t)
{
	if (t == planrt_bf16) {
		planrt_k_bf16_to_f32(x, y, n);
		return;
	}
	for (int64_t i = 0; i < n; i++)
		y[i] = half_f32(x[i], t);
}

static void f32_to_half(const float *x, uint16_t *y, int64_t n, planrt_dtype_t t)
{
	if (t == planrt_bf16) {
		planrt_k_f32_to_bf16(x, y, n);
		return;
	}
	for (int64_t i = 0; i < n; i++)
		y[i] = f32_half(x[i], t);
}

static int is_float(planrt_dtype_t t)
{
	return t == planrt_f32 || t == planrt_f64 || is_half(t);
}

void planrt_cast(const void *src, planrt_dtype_t from, void *dst, planrt_dtype_t to, int64_t n)
{
	check_count("planrt_cast", n);
	if (from == to && (unsigned)from <= planrt_f64) {
		memmove(dst, src, (size_t)n * planrt_dtype_size(from));
		return;
	}
	if (!is_float(from) || !is_float(to))
		planrt_fatal("planrt_cast: no cast from %s to %s (casts are among f32, bf16, f16 and f64)",
			     dtype_name(from), dtype_name(to));
	if (from == planrt_f32 && to == planrt_f64) {
		for (int64_t i = 0; i < n; i++)
			((double *)dst)[i] = ((const float *)src)[i];
	} else if (from == planrt_f64 && to == planrt_f32) {
		for (int64_t i = 0; i < n; i++)
			((float *)dst)[i] = (float)((const double *)src)[i];
	} else if (from == planrt_f32) {
		f32_to_half(src, dst, n, to);
	} else if (to == planrt_f32) {
		half_to_f32(src, dst, n, from);
	} else if (from == planrt_f64) {
		for (int64_t i = 0; i < n; i++)
			((uint16_t *)dst)[i] = f64_to_half(((const double *)src)[i], to);
	} else if (to == planrt_f64) {
		for (int64_t i = 0; i < n; i++)
			((double *)dst)[i] = half_f32(((const uint16_t *)src)[i], from);
	} else { /* bf16 <-> f16: widening is exact, so one rounding */
		for (int64_t i = 0; i < n; i++)
			((uint16_t *)dst)[i] = f32_half(half_f32(((const uint16_t *)src)[i], from), to);
	}
}

void planrt_sum_squares_acc(double *acc, const void *x, int64_t n, planrt_dtype_t t, double weight)
{
	check_count("planrt_sum_squares_acc", n);
	double s = 0;
	if (t == planrt_f32) {
		s = planrt_sum_squares(x, (size_t)n);
	} else if (is_half(t)) {
		const uint16_t *h = x;
		for (int64_t i = 0; i < n; i++) {
			double v = half_f32(h[i], t);
			s += v * v;
		}
	} else {
		planrt_fatal("planrt_sum_squares_acc: %s input (f32, bf16 or f16)", dtype_name(t));
	}
	*acc += weight * s;
}

void planrt_sum_squares_shard(double *acc, const void *shard, planrt_dtype_t t, int64_t lo, int64_t n, int nseg,
			      const int64_t *seg_off, const int64_t *seg_len, const int64_t *replicas)
{
	check_count("planrt_sum_squares_shard", n);
	size_t elem = t == planrt_f32 ? 4 : 2;
	for (int i = 0; i < nseg; i++) {
		if (replicas[i] <= 0)
			continue; /* a tied copy: its original counts */
		int64_t a = seg_off[i] > lo ? seg_off[i] : lo;
		int64_t b = seg_off[i] + seg_len[i] < lo + n ? seg_off[i] + seg_len[i] : lo + n;
		if (b <= a)
			continue;
		double s = 0;
		planrt_sum_squares_acc(&s, (const char *)shard + (size_t)(a - lo) * elem, b - a, t, 1.0);
		*acc += s / (double)replicas[i];
	}
}

void planrt_clip_coef(const double *sumsq, double *norm, double *coef, double max_norm)
{
	*norm = sqrt(*sumsq);
	*coef = max_norm > 0 && *norm > max_norm ? max_norm / (*norm + 1e-6) : 1.0;
}

int64_t planrt_steps_skipped_ = 0;

float planrt_f16_to_f32(uint16_t h)
{
	return planrt_half_to_f32_(h, planrt_f16);
}

uint16_t planrt_f32_to_f16(float x)
{
	return planrt_f32_to_half_(x, planrt_f16);
}

void planrt_loss_seed(planrt_ctx_t *ctx, float *dl, double per_micro)
{
	*dl = (float)(ctx->loss_scale * per_micro);
}

void planrt_unscale_clip_coef(planrt_ctx_t *ctx, const double *sumsq, double *norm, double *coef, double max_norm)
{
	double s = ctx->loss_scale;
	*norm = sqrt(*sumsq) / s;
	if (!isfinite(*norm)) {
		ctx->step_skipped = 1;
		*coef = NAN;
		return;
	}
	*coef = (max_norm > 0 && *norm > max_norm ? max_norm / (*norm + 1e-6) : 1.0) / s;
}

void planrt_loss_accumulate(double *acc, const float *loss, double scale)
{
	*acc += scale * (double)*loss;
}

/* ------------------------------------------------------------------ the optimizer */

void planrt_optimizer_step(int kind, double lr, double beta1, double beta2, double eps, double weight_decay,
			   double momentum, int64_t warmup, int64_t total, double min_lr, int64_t step, float *param,
			   const void *grad, planrt_dtype_t gt, float *m, float *v, int64_t n, const double *coef)
{
	check_count("planrt_optimizer_step", n);
	if (kind < planrt_opt_sgd || kind > planrt_opt_adamw)
		planrt_fatal("planrt_optimizer_step: unknown optimizer kind %d", kind);
	if (gt != planrt_f32 && !is_half(gt))
		planrt_fatal("planrt_optimizer_step: %s gradients (f32, bf16 or f16)", dtype_name(gt));
	int needs_m = kind != planrt_opt_sgd, needs_v = kind >= planrt_opt_adam;
	if (n > 0 && ((needs_m && !m) || (needs_v && !v)))
		planrt_fatal("planrt_optimizer_step: optimizer kind %d without its moment buffers", kind);
	const planrt_opt_t o = {(planrt_opt_kind_t)kind, lr, beta1, beta2, eps, weight_decay, momentum};
	const double lr_t = planrt_lr_at(lr, step, warmup, total, min_lr), k = coef ? *coef : 1.0;
	if (isnan(k)) /* a step skipped by loss scaling (planrt_unscale_clip_coef): nothing changes */
		return;
	step -= planrt_steps_skipped_; /* Adam's t counts the steps that updated */
	if (planrt_tracing_) { /* --trace: a kernel event (ends with its element count) */
		planrt_trace_begin_("optimizer_step", "kernel");
		char args[64];
		snprintf(args, sizeof args, "\"elements\":%lld", (long long)n);
		planrt_trace_args_(args);
	}
	if (gt == planrt_f32 && k == 1.0) {
		planrt_opt_step(&o, lr_t, step + 1, param, grad, m, v, (size_t)n);
		planrt_trace_end_(NULL);
		return;
	}
	float block[OPT_BLOCK];
	for (int64_t i = 0; i < n; i += OPT_BLOCK) {
		int64_t len = n - i < OPT_BLOCK ? n - i : OPT_BLOCK;
		if (gt == planrt_f32) {
			planrt_k_scale_f32((const float *)grad + i, block, len, k);
		} else {
			half_to_f32((const uint16_t *)grad + i, block, len, gt);
			if (k != 1.0)
				planrt_k_scale_f32(block, block, len, k);
		}
		planrt_opt_step(&o, lr_t, step + 1, param + i, block, needs_m ? m + i : NULL, needs_v ? v + i : NULL,
				(size_t)len);
	}
	planrt_trace_end_(NULL);
}
