/* planrt_moe_math.h: the per-token, per-expert and per-element logic of the CUDA target's
 * mixture-of-experts kernels (moe_cuda.cu), as plain C that compiles for the device and for the
 * host, so that tests/cuda/test_moe_math.c runs exactly this code on the CPU against the CPU
 * kernels (kernels_impl.h, moe.c) and fails on any difference.
 *
 * Each function does the CPU kernel's arithmetic in the CPU kernel's order (f32: kexpf, logf; the
 * maximum over 8 running maxima as kmax; sums in index order; dot products over 8 partial sums as
 * kdot), so the results are the CPU's bit for bit on the host. On the device every product that
 * feeds a sum is rounded on its own (MOE_MUL: __fmul_rn / __dmul_rn, which nvcc never contracts into
 * a fused multiply-add), as the host rounds it, kexpf included (planrt_moe_expf): the device's
 * probabilities, choices, slots and gates are the host's bit for bit. Only logf (the z-loss's
 * logsumexp) is the device's own, within 1 ulp of the host's.
 *
 * Routing (docs/moe.md) in two passes. The token pass (planrt_moe_route_token) computes a token's
 * probabilities, its top_k experts and its gates, and leaves in idx the code -(e + 2) of each
 * choice e. The expert pass walks the pairs in the drop order (every token's first choice in token
 * order, then every second choice, ..., group by group), one piece at a time (a run of tokens of one
 * group for one choice k: planrt_moe_drop_order), and each expert turns its own codes into slots (or
 * -1, dropped; planrt_moe_assign_piece): slots are per expert, so one expert's walk decides its pairs
 * alone. The kernel copies each piece's codes to shared memory before the experts walk it, so no
 * entry is read while another thread writes it. */
#ifndef PLANRT_MOE_MATH_H
#define PLANRT_MOE_MATH_H

#include <stdint.h>

#include "planrt_math.h"

#ifdef __CUDA_ARCH__
#define MOE_MUL(a, b) __fmul_rn((a), (b))
#define MOE_DMUL(a, b) __dmul_rn((a), (b))
#else
#define MOE_MUL(a, b) ((a) * (b))
#define MOE_DMUL(a, b) ((a) * (b))
#endif

/* The most choices per token the device kernels take (route_grad keeps a token's choices in
 * registers); planc build --target cuda refuses a router with more. */
enum { PLANRT_MOE_MAX_TOP_K = 32 };

/* the largest of n >= 1 values, as kmax takes it (8 running maxima, then the tail) */
static inline PLANRT_HD float planrt_moe_max(const float *x, int64_t n)
{
	float acc[8];
	for (int j = 0; j < 8; j++)
		acc[j] = x[0];
	int64_t i = 0;
	for (; i + 8 <= n; i += 8)
		for (int j = 0; j < 8; j++)
			acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
	float m = acc[0];
	for (int j = 1; j < 8; j++)
		m = acc[j] > m ? acc[j] : m;
	for (; i < n; i++)
		m = x[i] > m ? x[i] : m;
	return m;
}

/* planrt_math.h's kexpf, operation for operation, with its products rounded on their own on the
 * device too (MOE_MUL): nvcc would otherwise fuse them with the following additions, and a
 * probability one ulp off can change which expert a near tie goes to. On the host it is kexpf
 * (the test compares the results with the CPU kernels, which call kexpf). */
static inline PLANRT_HD float planrt_moe_expf(float x)
{
	const float hi = 88.7228317f, lo = -87.3365479f;
	float xc = x > hi ? hi : (x < lo ? lo : x);
	float k = MOE_MUL(xc, 1.44269504089f) + 12582912.0f;
	k -= 12582912.0f;
	float r = xc - MOE_MUL(k, 0.693359375f);
	r = r - MOE_MUL(k, -2.12194440e-4f);
	float p = 1.9875691500e-4f;
	p = MOE_MUL(p, r) + 1.3981999507e-3f;
	p = MOE_MUL(p, r) + 8.3334519073e-3f;
	p = MOE_MUL(p, r) + 4.1665795894e-2f;
	p = MOE_MUL(p, r) + 1.6666665459e-1f;
	p = MOE_MUL(p, r) + 5.0000001201e-1f;
	p = MOE_MUL(MOE_MUL(p, r), r) + r + 1.0f;
	int32_t ki = (int32_t)k;
	int32_t k1 = ki >> 1, k2 = ki - k1;
	union {
		int32_t i;
		float f;
	} s1, s2;
	s1.i = (k1 + 127) << 23;
	s2.i = (k2 + 127) << 23;
	float y = MOE_MUL(MOE_MUL(p, s1.f), s2.f);
	y = x > hi ? INFINITY : y;
	y = x < lo ? 0.0f : y;
	return x != x ? x : y;
}

/* A token's softmax as its maximum and sum: p[e] = kexpf(l[e] - m) / s (kmoe_probs). */
typedef struct planrt_moe_softmax {
	float m, s;
} planrt_moe_softmax_t;

static inline PLANRT_HD planrt_moe_softmax_t planrt_moe_softmax(const float *l, int64_t experts)
{
	planrt_moe_softmax_t x;
	x.m = planrt_moe_max(l, experts);
	x.s = 0;
	for (int64_t e = 0; e < experts; e++)
		x.s += planrt_moe_expf(l[e] - x.m);
	return x;
}

static inline PLANRT_HD float planrt_moe_prob(const float *l, planrt_moe_softmax_t x, int64_t e)
{
	return planrt_moe_expf(l[e] - x.m) / x.s;
}

/* The top_k experts of a token by descending probability, ties to the lower index (kmoe_topk). */
static inline PLANRT_HD void planrt_moe_topk(const float *l, planrt_moe_softmax_t x, int64_t experts, int64_t top_k,
					     int32_t *choice)
{
	for (int64_t k = 0; k < top_k; k++) {
		int64_t best = -1;
		float pbest = 0;
		for (int64_t e = 0; e < experts; e++) {
			int taken = 0;
			for (int64_t j = 0; j < k; j++)
				taken |= choice[j] == e;
			if (taken)
				continue;
			float p = planrt_moe_prob(l, x, e);
			if (best < 0 || p > pbest) {
				best = e;
				pbest = p;
			}
		}
		choice[k] = (int32_t)best;
	}
}

/* The token pass of moe_route for token t: gates[t * top_k + j] (kmoe_gates) and the code
 * -(e_j + 2) of each choice in idx[t * top_k + j]. */
static inline PLANRT_HD void planrt_moe_route_token(const float *logits, int64_t t, int64_t experts, int64_t top_k,
						    int normalize, float *gates, int32_t *idx)
{
	const float *l = logits + t * experts;
	int32_t *choice = idx + t * top_k;
	planrt_moe_softmax_t x = planrt_moe_softmax(l, experts);
	planrt_moe_topk(l, x, experts, top_k, choice);
	float s = 0;
	for (int64_t k = 0; k < top_k; k++)
		s += planrt_moe_prob(l, x, choice[k]);
	for (int64_t k = 0; k < top_k; k++) {
		float p = planrt_moe_prob(l, x, choice[k]);
		gates[t * top_k + k] = normalize ? p / s : p;
		choice[k] = -(choice[k] + 2);
	}
}

/* The drop order in pieces: piece i of a group's walk is choice k = i / per_k over tokens
 * [g0 + j * chunk, + n) with j = i % per_k, per_k = ceil(group / chunk). Returns n; sets *t0, *k. */
static inline PLANRT_HD int64_t planrt_moe_drop_order(int64_t g0, int64_t group, int64_t chunk, int64_t i, int64_t *t0,
						      int64_t *k)
{
	int64_t per_k = (group + chunk - 1) / chunk, j = i % per_k;
	*k = i / per_k;
	*t0 = g0 + j * chunk;
	return group - j * chunk < chunk ? group - j * chunk : chunk;
}

/* Expert e's walk over one piece of the drop order: codes[i] is pair (t0 + i, k)'s entry of idx as the
 * token pass left it. Each pair that chose e gets its slot in idx: e * slots + g * capacity +
 * position in the group (position >= capacity: -1), or dropless e * tokens + position in the
 * micro-batch; *c counts e's pairs so far (reset by the caller at each group when capacity > 0),
 * *routed and *kept add the pairs that chose e and those that got a slot. */
static inline PLANRT_HD void planrt_moe_assign_piece(const int32_t *codes, int64_t n, int64_t t0, int64_t k,
						     int64_t tokens, int64_t top_k, int64_t group, int64_t capacity,
						     int64_t e, int64_t *c, int64_t *routed, int64_t *kept, int32_t *idx)
{
	int64_t slots = capacity > 0 ? tokens / group * capacity : tokens; /* per expert */
	int32_t code = -(int32_t)(e + 2);
	for (int64_t i = 0; i < n; i++) {
		if (codes[i] != code)
			continue;
		int64_t t = t0 + i, slot = (*c)++;
		int32_t at = -1;
		if (capacity <= 0)
			at = (int32_t)(e * slots + slot);
		else if (slot < capacity)
			at = (int32_t)(e * slots + t / group * capacity + slot);
		idx[t * top_k + k] = at;
		*routed += 1;
		*kept += at >= 0;
	}
}

/* moe_dispatch's element q of the pairs' rows (pair q / dim, column q % dim), after buf is zeroed */
static inline PLANRT_HD void planrt_moe_dispatch_elem(const float *x, const int32_t *idx, int64_t top_k, int64_t dim,
						      int64_t q, float *buf)
{
	int64_t pair = q / dim, j = q % dim;
	int32_t s = idx[pair];
	if (s >= 0)
		buf[(int64_t)s * dim + j] = x[pair / top_k * dim + j];
}

/* moe_dispatch_grad's dx[t, j], q = t * dim + j: the sum of the token's kept rows in choice order */
static inline PLANRT_HD float planrt_moe_dispatch_grad_elem(const float *dbuf, const int32_t *idx, int64_t top_k,
							    int64_t dim, int64_t q)
{
	int64_t t = q / dim, j = q % dim;
	float o = 0;
	for (int64_t k = 0; k < top_k; k++) {
		int32_t s = idx[t * top_k + k];
		if (s >= 0)
			o += dbuf[(int64_t)s * dim + j];
	}
	return o;
}

/* moe_combine's out[t, j], q = t * dim + j: sum over the kept pairs of gate * row */
static inline PLANRT_HD float planrt_moe_combine_elem(const float *buf, const float *gates, const int32_t *idx,
						      int64_t top_k, int64_t dim, int64_t q)
{
	int64_t t = q / dim, j = q % dim;
	float o = 0;
	for (int64_t k = 0; k < top_k; k++) {
		int32_t s = idx[t * top_k + k];
		if (s >= 0)
			o += MOE_MUL(gates[t * top_k + k], buf[(int64_t)s * dim + j]);
	}
	return o;
}

/* moe_combine_grad's dbuf element q of the pairs' rows (pair q / dim), after dbuf is zeroed */
static inline PLANRT_HD void planrt_moe_combine_grad_elem(const float *dout, const float *gates, const int32_t *idx,
							  int64_t top_k, int64_t dim, int64_t q, float *dbuf)
{
	int64_t pair = q / dim, j = q % dim;
	int32_t s = idx[pair];
	if (s >= 0)
		dbuf[(int64_t)s * dim + j] = MOE_MUL(gates[pair], dout[pair / top_k * dim + j]);
}

/* moe_combine_grad's dgate of one pair: the output gradient's dot with the pair's row (kdot's
 * order: 8 partial sums), 0 for a dropped pair */
static inline PLANRT_HD float planrt_moe_combine_dgate(const float *dout, const float *buf, const int32_t *idx,
						       int64_t top_k, int64_t dim, int64_t pair)
{
	int32_t s = idx[pair];
	if (s < 0)
		return 0;
	const float *x = dout + pair / top_k * dim, *y = buf + (int64_t)s * dim;
	float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
	int64_t i = 0;
	for (; i + 8 <= dim; i += 8)
		for (int j = 0; j < 8; j++)
			acc[j] += MOE_MUL(x[i + j], y[i + j]);
	float sum = 0;
	for (; i < dim; i++)
		sum += MOE_MUL(x[i], y[i]);
	return sum + ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* moe_route_grad of token t: dlogits row t (overwritten) from the gates' gradient, through the
 * normalisation and the softmax (planrt_k_moe_route_grad). top_k <= PLANRT_MOE_MAX_TOP_K. */
static inline PLANRT_HD void planrt_moe_route_grad_token(const float *logits, const float *dgates, int64_t t,
							 int64_t experts, int64_t top_k, int normalize, float *dlogits)
{
	const float *l = logits + t * experts, *dg = dgates + t * top_k;
	float *d = dlogits + t * experts;
	int32_t choice[PLANRT_MOE_MAX_TOP_K];
	planrt_moe_softmax_t x = planrt_moe_softmax(l, experts);
	planrt_moe_topk(l, x, experts, top_k, choice);
	float s = 0, dgsum = 0;
	for (int64_t k = 0; k < top_k; k++)
		s += planrt_moe_prob(l, x, choice[k]);
	for (int64_t k = 0; k < top_k; k++)
		dgsum += MOE_MUL(dg[k], planrt_moe_prob(l, x, choice[k])) / s;
	for (int64_t e = 0; e < experts; e++)
		d[e] = 0;
	for (int64_t k = 0; k < top_k; k++)
		d[choice[k]] = normalize ? (dg[k] - dgsum) / s : dg[k]; /* dp */
	float pdp = 0;
	for (int64_t e = 0; e < experts; e++)
		pdp += MOE_MUL(planrt_moe_prob(l, x, e), d[e]);
	for (int64_t e = 0; e < experts; e++)
		d[e] = MOE_MUL(planrt_moe_prob(l, x, e), d[e] - pdp);
}

/* The load-balancing loss's per-group statistics for expert e (kmoe_fractions): *f the fraction of
 * the group's tokens whose first choice is e, *P the group's mean probability of e. */
static inline PLANRT_HD void planrt_moe_group_fp(const float *logits_g, int64_t group, int64_t experts, int64_t e,
						 double *f, double *P)
{
	double fe = 0, pe = 0;
	for (int64_t t = 0; t < group; t++) {
		const float *l = logits_g + t * experts;
		planrt_moe_softmax_t x = planrt_moe_softmax(l, experts);
		int32_t first;
		planrt_moe_topk(l, x, experts, 1, &first);
		fe += first == e;
		pe += (double)planrt_moe_prob(l, x, e);
	}
	*f = fe / (double)group;
	*P = pe / (double)group;
}

/* moe_aux_loss_grad of token t of a group whose fractions are f[0..E): dlogits row t overwritten,
 * c = dscale * E / group */
static inline PLANRT_HD void planrt_moe_aux_grad_token(const float *logits, const double *f, int64_t t, int64_t experts,
						       double c, float *dlogits)
{
	const float *l = logits + t * experts;
	planrt_moe_softmax_t x = planrt_moe_softmax(l, experts);
	double fp = 0;
	for (int64_t e = 0; e < experts; e++)
		fp += MOE_DMUL(f[e], (double)planrt_moe_prob(l, x, e));
	float *d = dlogits + t * experts;
	for (int64_t e = 0; e < experts; e++)
		d[e] = (float)MOE_DMUL(MOE_DMUL(c, (double)planrt_moe_prob(l, x, e)), f[e] - fp);
}

/* a token's logsumexp (kmoe_lse) */
static inline PLANRT_HD float planrt_moe_lse(const float *l, int64_t experts)
{
	float m = planrt_moe_max(l, experts), s = 0;
	for (int64_t e = 0; e < experts; e++)
		s += planrt_moe_expf(l[e] - m);
	return m + logf(s);
}

/* moe_z_loss_grad of token t: dlogits[t, e] = 2 dscale z_t softmax(logits_t)[e] */
static inline PLANRT_HD void planrt_moe_z_grad_token(const float *logits, int64_t t, int64_t experts, double dscale,
						     float *dlogits)
{
	const float *l = logits + t * experts;
	float z = planrt_moe_lse(l, experts);
	float c = MOE_MUL((float)(2 * dscale), z);
	float *d = dlogits + t * experts;
	for (int64_t e = 0; e < experts; e++)
		d[e] = MOE_MUL(c, planrt_moe_expf(l[e] - z));
}

/* ------------------------------------------------------------------ the dropless exchange (host side)
 * Between the token side (each rank [E, slots, dim], expert e's rows packed from its row 0) and the
 * expert side (each rank [E / n, n * slots, dim], expert e's rows from every rank in rank order), as
 * runtime/moe.c's planrt_moe_exchange moves them. mine[E]: this rank's kept rows per expert;
 * theirs[n * el]: member r's rows for this rank's el = E / n experts (the counts' all-to-all). */

/* rows of expert e (token side: any expert) from the pair codes: one pair's expert */
static inline PLANRT_HD int64_t planrt_moe_row_expert(const int32_t *idx, int64_t slots, int64_t pair)
{
	return idx[pair] >= 0 ? idx[pair] / slots : -1;
}

/* The alltoallv's counts and displacements in elements (rows times dim) for each member r. */
static inline void planrt_moe_exchange_counts(const int32_t *mine, const int32_t *theirs, int n, int64_t el,
					      int to_experts, int64_t dim, int64_t *sc, int64_t *sd, int64_t *rc,
					      int64_t *rd)
{
	int64_t at = 0, from = 0;
	for (int r = 0; r < n; r++) {
		int64_t a = 0, b = 0;
		for (int64_t e = 0; e < el; e++) {
			a += mine[r * el + e];
			b += theirs[r * el + e];
		}
		int64_t s = to_experts ? a : b, v = to_experts ? b : a;
		sc[r] = s * dim;
		sd[r] = at * dim;
		rc[r] = v * dim;
		rd[r] = from * dim;
		at += s;
		from += v;
	}
}

/* Block (r, e) of the packed send (sending) or receive (!sending) buffer, walked r-major then e:
 * returns its rows and sets *row to where they are in the unpacked buffer (in when sending, out when
 * receiving). */
static inline int64_t planrt_moe_exchange_block(const int32_t *mine, const int32_t *theirs, int n, int64_t el,
						int64_t slots, int to_experts, int sending, int r, int64_t e,
						int64_t *row)
{
	int expert_side = to_experts != sending; /* the unpacked buffer of this block is the experts' */
	int64_t k = expert_side ? theirs[r * el + e] : mine[r * el + e];
	if (!expert_side) {
		*row = (r * el + e) * slots;
		return k;
	}
	int64_t start = 0;
	for (int q = 0; q < r; q++)
		start += theirs[q * el + e];
	*row = e * n * slots + start;
	return k;
}

#endif
