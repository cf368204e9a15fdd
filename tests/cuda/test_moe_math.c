/* test_moe_math.c: the CUDA target's mixture-of-experts logic checked on the CPU. moe_cuda.cu's
 * kernels run planrt_moe_math.h's functions per token, per expert and per element; this test runs
 * the same functions on the host, in the shape the kernels run them (the token pass then the
 * expert pass of routing piece by piece, a zeroed buffer then one call per element, the losses' per-group and
 * per-token values summed in order as the kernels' thread 0 sums them), and compares every result
 * bit for bit with the CPU kernels (kernels_impl.h via libplanrt, moe.c) on random inputs: routing
 * with drops (top-1 Switch, top-2 GShard, top-3 over 13 experts, ties), dropless routing with
 * normalised gates, dispatch, combine, every gradient and both routing losses. The dropless expert
 * exchange is run for 2 and 4 simulated ranks (the counts' all-to-all and the rows' alltoallv done
 * in memory) with planrt_moe_math.h's counts, displacements and blocks, and compared with the
 * expert-side buffer built directly from its definition (docs/moe.md), and back. Any difference
 * fails. No GPU is needed: this is what CI can check of the device kernels' arithmetic. */
#define PLANRT_INTERNAL
#include "planrt_exec.h"
#include "planrt_kernels.h"
#include "../../runtime/cuda/planrt_moe_math.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures, checks;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t next_u32(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return (uint32_t)(rng_state >> 16);
}

static float uniform(float lo, float hi)
{
	return lo + (hi - lo) * (float)(next_u32() % 1000003) / 1000003.0f;
}

static void *alloc(size_t bytes)
{
	void *p = calloc(bytes ? bytes : 1, 1);
	if (!p) {
		fprintf(stderr, "test_moe_math: out of memory\n");
		exit(2);
	}
	return p;
}

static void fill(float *x, int64_t n, float lo, float hi)
{
	for (int64_t i = 0; i < n; i++)
		x[i] = uniform(lo, hi);
}

/* bytes equal, or the first difference reported; elem: 4 float, 8 double, -4 int32 */
static void same(const char *what, const char *cs, const void *want, const void *got, size_t bytes, int type)
{
	size_t elem = (size_t)(type < 0 ? -type : type);
	checks++;
	if (!memcmp(want, got, bytes))
		return;
	failures++;
	for (size_t i = 0; i < bytes / elem; i++)
		if (memcmp((const char *)want + i * elem, (const char *)got + i * elem, elem)) {
			if (type < 0)
				fprintf(stderr, "FAIL %s (%s): element %zu: CPU %d, device logic %d\n", what, cs, i,
					((const int32_t *)want)[i], ((const int32_t *)got)[i]);
			else if (elem == 4)
				fprintf(stderr, "FAIL %s (%s): element %zu: CPU %.9g, device logic %.9g\n", what, cs, i,
					(double)((const float *)want)[i], (double)((const float *)got)[i]);
			else
				fprintf(stderr, "FAIL %s (%s): element %zu: CPU %.17g, device logic %.17g\n", what, cs, i,
					((const double *)want)[i], ((const double *)got)[i]);
			return;
		}
}

static void expect(int ok, const char *what, const char *cs)
{
	checks++;
	if (!ok) {
		failures++;
		fprintf(stderr, "FAIL %s (%s)\n", what, cs);
	}
}

/* route_experts_kernel's walk: the drop order piece by piece, each piece's codes copied out
 * first, then every expert's walk over it; experts in rounds of `round` (the block's threads) */
static void route_experts(int32_t *idx, int64_t T, int64_t E, int64_t K, int64_t G, int64_t capacity, int64_t piece,
			  int32_t *counts, double *stats)
{
	enum { ROUND = 64 };
	int32_t *codes = alloc(sizeof(int32_t) * (size_t)piece);
	int64_t c[ROUND], routed[ROUND], kept[ROUND], pieces = K * ((G + piece - 1) / piece);
	long long dropped = 0;
	for (int64_t base = 0; base < E; base += ROUND) {
		for (int j = 0; j < ROUND; j++)
			c[j] = routed[j] = kept[j] = 0;
		for (int64_t g0 = 0; g0 < T; g0 += G) {
			for (int j = 0; j < ROUND && capacity > 0; j++)
				c[j] = 0;
			for (int64_t i = 0; i < pieces; i++) {
				int64_t t0, k, n = planrt_moe_drop_order(g0, G, piece, i, &t0, &k);
				for (int64_t j = 0; j < n; j++)
					codes[j] = idx[(t0 + j) * K + k];
				for (int j = 0; j < ROUND && base + j < E; j++)
					planrt_moe_assign_piece(codes, n, t0, k, T, K, G, capacity, base + j, &c[j], &routed[j],
								&kept[j], idx);
			}
		}
		for (int j = 0; j < ROUND && base + j < E; j++) {
			counts[base + j] = (int32_t)kept[j];
			stats[1 + base + j] += (double)routed[j];
			dropped += routed[j] - kept[j];
		}
	}
	stats[0] += (double)dropped;
	free(codes);
}

typedef struct Case {
	const char *name;
	int64_t tokens, experts, top_k, group, capacity, dim;
	int normalize;
	int ties;       /* logits on a coarse grid: equal probabilities, broken to the lower index */
	int want_drops; /* the inputs must drop pairs (the case tests dropping) */
	int64_t piece;  /* tokens per piece of the drop order in the expert pass */
} Case;

static void run_case(const Case *c)
{
	const char *cs = c->name;
	int64_t T = c->tokens, E = c->experts, K = c->top_k, G = c->group, D = c->dim, pairs = T * K;
	int64_t slots = c->capacity > 0 ? T / G * c->capacity : T; /* per expert */
	int64_t rows = E * slots;
	float *logits = alloc(sizeof(float) * (size_t)(T * E));
	if (c->ties)
		for (int64_t i = 0; i < T * E; i++)
			logits[i] = 0.5f * (float)(next_u32() % 4);
	else
		fill(logits, T * E, -3, 3);

	/* routing: the CPU kernel against the token pass then the expert pass */
	float *gates_cpu = alloc(sizeof(float) * (size_t)pairs), *gates_dev = alloc(sizeof(float) * (size_t)pairs);
	int32_t *idx_cpu = alloc(sizeof(int32_t) * (size_t)pairs), *idx_dev = alloc(sizeof(int32_t) * (size_t)pairs);
	int32_t *counts_cpu = alloc(sizeof(int32_t) * (size_t)E), *counts_dev = alloc(sizeof(int32_t) * (size_t)E);
	double *stats_cpu = alloc(sizeof(double) * (size_t)(1 + E)), *stats_dev = alloc(sizeof(double) * (size_t)(1 + E));
	for (int64_t e = 0; e <= E; e++) /* a step's earlier micro-batches */
		stats_cpu[e] = stats_dev[e] = (double)(next_u32() % 50);
	planrt_k_moe_route_f32(logits, T, E, K, G, c->capacity, c->normalize, gates_cpu, idx_cpu, counts_cpu, stats_cpu);
	for (int64_t t = 0; t < T; t++)
		planrt_moe_route_token(logits, t, E, K, c->normalize, gates_dev, idx_dev);
	route_experts(idx_dev, T, E, K, G, c->capacity, c->piece, counts_dev, stats_dev);
	same("moe_route gates", cs, gates_cpu, gates_dev, sizeof(float) * (size_t)pairs, 4);
	same("moe_route idx", cs, idx_cpu, idx_dev, sizeof(int32_t) * (size_t)pairs, -4);
	same("moe_route counts", cs, counts_cpu, counts_dev, sizeof(int32_t) * (size_t)E, -4);
	same("moe_route stats", cs, stats_cpu, stats_dev, sizeof(double) * (size_t)(1 + E), 8);
	int64_t drops = 0;
	for (int64_t i = 0; i < pairs; i++)
		drops += idx_cpu[i] < 0;
	expect(c->want_drops ? drops > 0 : drops == 0, c->want_drops ? "the inputs drop pairs" : "no pair is dropped", cs);

	/* dispatch and its gradient */
	float *x = alloc(sizeof(float) * (size_t)(T * D));
	fill(x, T * D, -1, 1);
	float *buf_cpu = alloc(sizeof(float) * (size_t)(rows * D)), *buf_dev = alloc(sizeof(float) * (size_t)(rows * D));
	fill(buf_dev, rows * D, 5, 6); /* the kernel zeroes it first */
	planrt_k_moe_dispatch_f32(x, idx_cpu, T, K, D, rows, buf_cpu);
	memset(buf_dev, 0, sizeof(float) * (size_t)(rows * D));
	for (int64_t q = 0; q < pairs * D; q++)
		planrt_moe_dispatch_elem(x, idx_dev, K, D, q, buf_dev);
	same("moe_dispatch", cs, buf_cpu, buf_dev, sizeof(float) * (size_t)(rows * D), 4);

	float *dbuf = alloc(sizeof(float) * (size_t)(rows * D));
	fill(dbuf, rows * D, -1, 1);
	float *dx_cpu = alloc(sizeof(float) * (size_t)(T * D)), *dx_dev = alloc(sizeof(float) * (size_t)(T * D));
	planrt_k_moe_dispatch_grad_f32(dbuf, idx_cpu, T, K, D, dx_cpu);
	for (int64_t q = 0; q < T * D; q++)
		dx_dev[q] = planrt_moe_dispatch_grad_elem(dbuf, idx_dev, K, D, q);
	same("moe_dispatch_grad", cs, dx_cpu, dx_dev, sizeof(float) * (size_t)(T * D), 4);

	/* combine and its gradient (the experts' output: random rows) */
	float *h = alloc(sizeof(float) * (size_t)(rows * D));
	fill(h, rows * D, -2, 2);
	float *y_cpu = alloc(sizeof(float) * (size_t)(T * D)), *y_dev = alloc(sizeof(float) * (size_t)(T * D));
	planrt_k_moe_combine_f32(h, gates_cpu, idx_cpu, T, K, D, y_cpu);
	for (int64_t q = 0; q < T * D; q++)
		y_dev[q] = planrt_moe_combine_elem(h, gates_dev, idx_dev, K, D, q);
	same("moe_combine", cs, y_cpu, y_dev, sizeof(float) * (size_t)(T * D), 4);

	float *dy = alloc(sizeof(float) * (size_t)(T * D));
	fill(dy, T * D, -1, 1);
	float *dh_cpu = alloc(sizeof(float) * (size_t)(rows * D)), *dh_dev = alloc(sizeof(float) * (size_t)(rows * D));
	float *dg_cpu = alloc(sizeof(float) * (size_t)pairs), *dg_dev = alloc(sizeof(float) * (size_t)pairs);
	planrt_k_moe_combine_grad_f32(dy, h, gates_cpu, idx_cpu, T, K, D, rows, dh_cpu, dg_cpu);
	for (int64_t q = 0; q < pairs * D; q++)
		planrt_moe_combine_grad_elem(dy, gates_dev, idx_dev, K, D, q, dh_dev);
	for (int64_t i = 0; i < pairs; i++)
		dg_dev[i] = planrt_moe_combine_dgate(dy, h, idx_dev, K, D, i);
	same("moe_combine_grad dbuf", cs, dh_cpu, dh_dev, sizeof(float) * (size_t)(rows * D), 4);
	same("moe_combine_grad dgates", cs, dg_cpu, dg_dev, sizeof(float) * (size_t)pairs, 4);

	/* the router's gradient (dgates: combine_grad's, plus noise on the dropped pairs' zeros) */
	float *dgates = alloc(sizeof(float) * (size_t)pairs);
	for (int64_t i = 0; i < pairs; i++)
		dgates[i] = dg_cpu[i] + uniform(-0.5f, 0.5f);
	float *dl_cpu = alloc(sizeof(float) * (size_t)(T * E)), *dl_dev = alloc(sizeof(float) * (size_t)(T * E));
	planrt_k_moe_route_grad_f32(logits, dgates, T, E, K, c->normalize, dl_cpu);
	for (int64_t t = 0; t < T; t++)
		planrt_moe_route_grad_token(logits, dgates, t, E, K, c->normalize, dl_dev);
	same("moe_route_grad", cs, dl_cpu, dl_dev, sizeof(float) * (size_t)(T * E), 4);

	/* the load-balancing loss and its gradient, as aux_loss_kernel and aux_loss_grad_kernel sum */
	double scale = 0.01 / (double)(T / G), factor = scale, dloss = 1.0 + uniform(0, 1);
	float loss_cpu, loss_dev;
	planrt_moe_aux_loss_f32(logits, T, E, G, scale, &loss_cpu);
	double total = 0;
	double *f = alloc(sizeof(double) * (size_t)E);
	for (int64_t g0 = 0; g0 < T; g0 += G) {
		double l = 0;
		for (int64_t e = 0; e < E; e++) {
			double fe, pe;
			planrt_moe_group_fp(logits + g0 * E, G, E, e, &fe, &pe);
			double prod = MOE_DMUL(fe, pe);
			l += prod;
		}
		total += MOE_DMUL((double)E, l);
	}
	loss_dev = (float)(scale * total);
	same("moe_aux_loss", cs, &loss_cpu, &loss_dev, sizeof(float), 4);
	double dscale = dloss * factor;
	planrt_k_moe_aux_loss_grad_f32(logits, T, E, G, dscale, dl_cpu);
	double cgrad = MOE_DMUL(dscale, (double)E) / (double)G;
	for (int64_t g0 = 0; g0 < T; g0 += G) {
		for (int64_t e = 0; e < E; e++) {
			double pe;
			planrt_moe_group_fp(logits + g0 * E, G, E, e, &f[e], &pe);
		}
		for (int64_t t = g0; t < g0 + G; t++)
			planrt_moe_aux_grad_token(logits, f, t, E, cgrad, dl_dev);
	}
	same("moe_aux_loss_grad", cs, dl_cpu, dl_dev, sizeof(float) * (size_t)(T * E), 4);

	/* the z-loss and its gradient, as z_loss_kernel sums */
	planrt_moe_z_loss_f32(logits, T, E, scale, &loss_cpu);
	total = 0;
	for (int64_t t = 0; t < T; t++) {
		double z = (double)planrt_moe_lse(logits + t * E, E);
		total += MOE_DMUL(z, z);
	}
	loss_dev = (float)(scale * total);
	same("moe_z_loss", cs, &loss_cpu, &loss_dev, sizeof(float), 4);
	planrt_k_moe_z_loss_grad_f32(logits, T, E, dscale, dl_cpu);
	for (int64_t t = 0; t < T; t++)
		planrt_moe_z_grad_token(logits, t, E, dscale, dl_dev);
	same("moe_z_loss_grad", cs, dl_cpu, dl_dev, sizeof(float) * (size_t)(T * E), 4);

	void *bufs[] = {logits, gates_cpu, gates_dev, idx_cpu, idx_dev, counts_cpu, counts_dev, stats_cpu, stats_dev, x,
			buf_cpu, buf_dev, dbuf, dx_cpu, dx_dev, h, y_cpu, y_dev, dy, dh_cpu, dh_dev, dg_cpu, dg_dev,
			dgates, dl_cpu, dl_dev, f};
	for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
		free(bufs[i]);
}

/* The dropless exchange among n simulated ranks, each with its own tokens routed dropless and
 * dispatched ([E, slots, D], slots = its tokens); expert e lives on rank e / el. */
static void run_exchange(int n, int64_t T, int64_t E, int64_t K, int64_t D)
{
	char cs[64];
	snprintf(cs, sizeof cs, "exchange over %d ranks, %lld experts, top %lld", n, (long long)E, (long long)K);
	int64_t el = E / n, slots = T, rows = E * slots, pairs = T * K;
	float *tok[8], *exp_side[8], *want[8], *back[8];
	int32_t *idx[8], *mine[8], *theirs[8];
	for (int r = 0; r < n; r++) {
		float *logits = alloc(sizeof(float) * (size_t)(T * E)), *gates = alloc(sizeof(float) * (size_t)pairs);
		float *x = alloc(sizeof(float) * (size_t)(T * D));
		fill(logits, T * E, -2, 2);
		fill(x, T * D, -1, 1);
		idx[r] = alloc(sizeof(int32_t) * (size_t)pairs);
		planrt_k_moe_route_f32(logits, T, E, K, T, 0, 1, gates, idx[r], NULL, NULL);
		tok[r] = alloc(sizeof(float) * (size_t)(rows * D));
		planrt_k_moe_dispatch_f32(x, idx[r], T, K, D, rows, tok[r]);
		mine[r] = alloc(sizeof(int32_t) * (size_t)E);
		for (int64_t i = 0; i < pairs; i++) { /* count_rows_kernel */
			int64_t e = planrt_moe_row_expert(idx[r], slots, i);
			if (e >= 0)
				mine[r][e]++;
		}
		free(logits);
		free(gates);
		free(x);
	}
	for (int q = 0; q < n; q++) { /* the counts' all-to-all: block q of r's counts to q */
		theirs[q] = alloc(sizeof(int32_t) * (size_t)E);
		for (int r = 0; r < n; r++)
			memcpy(theirs[q] + r * el, mine[r] + q * el, sizeof(int32_t) * (size_t)el);
	}
	/* the expert side by its definition: rank q's expert e holds the rows of expert q * el + e from
	 * rank 0, then rank 1, ..., packed from its first row, zero after */
	for (int q = 0; q < n; q++) {
		want[q] = alloc(sizeof(float) * (size_t)(rows * D));
		for (int64_t e = 0; e < el; e++) {
			int64_t at = e * n * slots, ge = q * el + e;
			for (int r = 0; r < n; r++) {
				memcpy(want[q] + at * D, tok[r] + ge * slots * D, sizeof(float) * (size_t)(mine[r][ge] * D));
				at += mine[r][ge];
			}
		}
	}
	for (int dir = 1; dir >= 0; dir--) { /* to the experts, then back */
		float **from = dir ? tok : exp_side, **to = dir ? exp_side : back;
		float *send[8], *recv[8];
		int64_t sc[8][8], sd[8][8], rc[8][8], rd[8][8];
		for (int r = 0; r < n; r++) {
			planrt_moe_exchange_counts(mine[r], theirs[r], n, el, dir, D, sc[r], sd[r], rc[r], rd[r]);
			send[r] = alloc(sizeof(float) * (size_t)(rows * D));
			recv[r] = alloc(sizeof(float) * (size_t)(rows * D));
			float *p = send[r];
			for (int q = 0; q < n; q++)
				for (int64_t e = 0; e < el; e++) {
					int64_t at, k = planrt_moe_exchange_block(mine[r], theirs[r], n, el, slots, dir, 1, q, e, &at);
					memcpy(p, from[r] + at * D, sizeof(float) * (size_t)(k * D));
					p += k * D;
				}
		}
		for (int r = 0; r < n; r++) /* the alltoallv */
			for (int q = 0; q < n; q++) {
				expect(sc[r][q] == rc[q][r], "what a rank sends is what its peer expects", cs);
				memcpy(recv[q] + rd[q][r], send[r] + sd[r][q], sizeof(float) * (size_t)sc[r][q]);
			}
		for (int r = 0; r < n; r++) {
			to[r] = alloc(sizeof(float) * (size_t)(rows * D));
			float *p = recv[r];
			for (int q = 0; q < n; q++)
				for (int64_t e = 0; e < el; e++) {
					int64_t at, k = planrt_moe_exchange_block(mine[r], theirs[r], n, el, slots, dir, 0, q, e, &at);
					memcpy(to[r] + at * D, p, sizeof(float) * (size_t)(k * D));
					p += k * D;
				}
			free(send[r]);
			free(recv[r]);
		}
	}
	for (int r = 0; r < n; r++) {
		same("moe_exchange to the experts", cs, want[r], exp_side[r], sizeof(float) * (size_t)(rows * D), 4);
		same("moe_exchange back to the tokens", cs, tok[r], back[r], sizeof(float) * (size_t)(rows * D), 4);
		free(tok[r]);
		free(exp_side[r]);
		free(want[r]);
		free(back[r]);
		free(idx[r]);
		free(mine[r]);
		free(theirs[r]);
	}
}

int main(void)
{
	static const Case cases[] = {
		{"switch top-1 with drops", 64, 4, 1, 16, 3, 16, 0, 0, 1, 2048},
		{"switch top-1 with drops, pieces of 5", 64, 4, 1, 16, 3, 16, 0, 0, 1, 5},
		{"gshard top-2 with drops", 96, 8, 2, 32, 5, 24, 0, 0, 1, 2048},
		{"gshard top-2 with drops, pieces of 7", 96, 8, 2, 32, 5, 24, 0, 0, 1, 7},
		{"top-3 of 13 experts with drops, dim 19", 40, 13, 3, 10, 2, 19, 0, 0, 1, 3},
		{"top-2 ties with drops", 64, 6, 2, 16, 4, 9, 1, 1, 1, 16},
		{"mixtral top-2 dropless", 64, 8, 2, 16, 0, 16, 1, 0, 0, 2048},
		{"mixtral top-2 dropless, pieces of 6", 64, 8, 2, 16, 0, 16, 1, 0, 0, 6},
		{"top-2 dropless ties, 1000 experts", 12, 1000, 2, 4, 0, 8, 0, 1, 0, 3},
		{"top-2 roomy capacity", 32, 4, 2, 16, 32, 8, 1, 0, 0, 2048},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		for (int rep = 0; rep < 3; rep++)
			run_case(&cases[i]);
	run_exchange(2, 48, 4, 2, 12);
	run_exchange(4, 32, 8, 2, 9);
	run_exchange(4, 20, 4, 1, 5);
	printf("%d of %d checks passed (the CUDA target's MoE logic against the CPU kernels)\n", checks - failures, checks);
	return failures ? 1 : 0;
}
