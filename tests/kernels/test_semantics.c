/* test_semantics.c: the kernels' meaning on fixed inputs, against PyTorch reference values
 * (reference.txt, written once by make_reference.py) and values worked out by hand: activations,
 * norms, softmax, cross-entropy, dropout (Philox stream, keep fraction, block independence), causal
 * mask offsets, MoE routing, bf16 rounding, block copies, matmul accumulate and broadcast forms; and
 * issue 9's ops: element-wise sin .. sigmoid, sum / mean / max over a dim, slicing, indexing, concat,
 * transpose, repeat_kv, broadcasting batched matmul, RoPE (Hugging Face's float recipe), mse / l1,
 * cross-entropy over classes with ignore_index and bad labels.
 * Usage: test_semantics reference.txt */
#include "planrt_cpu.h"
#include "planrt_kernels.h"
#include "planrt_math.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report.h"

/* ---- reference file -------------------------------------------------------------------------- */
typedef struct {
	char name[64];
	int n;
	double *v;
} Ref;
#define MAXREFS 256
static Ref refs[MAXREFS];
static int nrefs;

static void load_refs(const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f) {
		fprintf(stderr, "test_semantics: cannot open %s\n", path);
		exit(2);
	}
	while (nrefs < MAXREFS && fscanf(f, "%63s %d", refs[nrefs].name, &refs[nrefs].n) == 2) {
		Ref *r = &refs[nrefs++];
		r->v = malloc((size_t)r->n * sizeof(double));
		for (int i = 0; i < r->n; i++)
			if (fscanf(f, "%lf", &r->v[i]) != 1) {
				fprintf(stderr, "test_semantics: bad value in %s\n", r->name);
				exit(2);
			}
	}
	fclose(f);
}

static const double *ref(const char *name, int n)
{
	for (int i = 0; i < nrefs; i++)
		if (!strcmp(refs[i].name, name)) {
			if (n >= 0 && refs[i].n != n) {
				fprintf(stderr, "test_semantics: %s has %d values, expected %d\n", name, refs[i].n, n);
				exit(2);
			}
			return refs[i].v;
		}
	fprintf(stderr, "test_semantics: no reference %s\n", name);
	exit(2);
}

static float *to_f32(const double *x, int n)
{
	float *y = malloc((size_t)n * sizeof(float));
	for (int i = 0; i < n; i++)
		y[i] = (float)x[i];
	return y;
}

/* |got - want| <= tol * max(1, |want|) everywhere (infinities and NaN must match exactly). */
static void close64(const char *what, const double *got, const double *want, int n, double tol)
{
	double worst = 0;
	int bad = 0;
	for (int i = 0; i < n; i++) {
		if (isnan(want[i]) || isinf(want[i])) {
			bad |= !(isnan(want[i]) ? isnan(got[i]) : got[i] == want[i]);
			continue;
		}
		double e = fabs(got[i] - want[i]) / fmax(1, fabs(want[i]));
		if (!(e <= worst))
			worst = isnan(e) ? INFINITY : e;
	}
	report(!bad && worst <= tol, "%-40s max err %.2e (tol %.0e)", what, worst, tol);
}

static void close32(const char *what, const float *got, const double *want, int n, double tol)
{
	double *g = malloc((size_t)n * sizeof(double));
	for (int i = 0; i < n; i++)
		g[i] = got[i];
	close64(what, g, want, n, tol);
	free(g);
}

/* ---- activations, norms, softmax, cross-entropy against torch ---------------------------------- */
static void test_activations(void)
{
	const int n = 31;
	const double *x = ref("act_x", n);
	float *x32 = to_f32(x, n);
	double y[31];
	float y32[31];
	static const struct {
		const char *name;
		int kind;
	} acts[] = {{"gelu_erf", 0}, {"gelu_tanh", 1}, {"silu", 2}, {"relu", 3}};
	for (int a = 0; a < 4; a++) {
		char what[64];
		switch (acts[a].kind) {
		case 0:
		case 1:
			planrt_k_gelu_f64(x, y, n, acts[a].kind ? PLANRT_GELU_TANH : PLANRT_GELU_ERF);
			planrt_k_gelu_f32(x32, y32, n, acts[a].kind ? PLANRT_GELU_TANH : PLANRT_GELU_ERF);
			break;
		case 2:
			planrt_k_silu_f64(x, y, n);
			planrt_k_silu_f32(x32, y32, n);
			break;
		default:
			planrt_k_relu_f64(x, y, n);
			planrt_k_relu_f32(x32, y32, n);
		}
		snprintf(what, sizeof what, "%s f64 vs torch", acts[a].name);
		close64(what, y, ref(acts[a].name, n), n, 1e-14);
		snprintf(what, sizeof what, "%s f32 vs torch", acts[a].name);
		close32(what, y32, ref(acts[a].name, n), n, 1e-6);
	}
	free(x32);
	double nan_in = NAN, nan_out = 0;
	planrt_k_relu_f64(&nan_in, &nan_out, 1);
	report(isnan(nan_out), "relu(NaN) is NaN, as torch.relu");
}

static void test_norms(void)
{
	const int R = 3, D = 10, n = 30;
	const double *x = ref("ln_x", n), *w = ref("ln_w", D), *b = ref("ln_b", D);
	float *x32 = to_f32(x, n), *w32 = to_f32(w, D), *b32 = to_f32(b, D);
	double y[30], md[3], rd[3];
	float y32[30], mf[3], rf[3];
	planrt_k_layer_norm_f64(x, w, b, y, mf, rf, R, D, 1e-5);
	close64("layer_norm f64 vs torch", y, ref("ln_y", n), n, 1e-13);
	planrt_k_layer_norm_f64d(x, w, b, y, md, rd, R, D, 1e-5);
	close64("layer_norm f64d vs torch", y, ref("ln_y", n), n, 1e-13);
	planrt_k_layer_norm_f32(x32, w32, b32, y32, mf, rf, R, D, 1e-5);
	close32("layer_norm f32 vs torch", y32, ref("ln_y", n), n, 2e-6);
	planrt_k_layer_norm_f64(x, NULL, NULL, y, mf, rf, R, D, 1e-5);
	close64("layer_norm no affine (w = b = NULL)", y, ref("ln_y_noaffine", n), n, 1e-13);
	/* saved statistics: mean and 1 / sqrt(biased var + eps) */
	double mean0 = 0, var0 = 0;
	for (int j = 0; j < D; j++)
		mean0 += x[j] / D;
	for (int j = 0; j < D; j++)
		var0 += (x[j] - mean0) * (x[j] - mean0) / D;
	report(fabs(md[0] - mean0) < 1e-14 && fabs(rd[0] - 1 / sqrt(var0 + 1e-5)) < 1e-13,
	       "layer_norm saves mean and rstd = 1/sqrt(biased var + eps)");
	planrt_k_rms_norm_f64d(x, w, y, rd, R, D, 1e-5);
	close64("rms_norm f64d vs torch formula", y, ref("rms_y", n), n, 1e-13);
	planrt_k_rms_norm_f32(x32, w32, y32, rf, R, D, 1e-5);
	close32("rms_norm f32 vs torch formula", y32, ref("rms_y", n), n, 2e-6);

	/* dw, db accumulate: twice the backward = twice the gradient */
	double dy[30], dx[30], dw[10] = {0}, db[10] = {0}, dw2[10] = {0}, db2[10] = {0};
	for (int i = 0; i < n; i++)
		dy[i] = sin(i + 1.0);
	planrt_k_layer_norm_f64d(x, w, b, y, md, rd, R, D, 1e-5);
	planrt_k_layer_norm_grad_f64d(x, w, md, rd, dy, dx, dw, db, R, D);
	planrt_k_layer_norm_grad_f64d(x, w, md, rd, dy, dx, dw2, db2, R, D);
	planrt_k_layer_norm_grad_f64d(x, w, md, rd, dy, dx, dw2, db2, R, D);
	int ok = 1;
	for (int j = 0; j < D; j++)
		ok &= fabs(dw2[j] - 2 * dw[j]) < 1e-13 && fabs(db2[j] - 2 * db[j]) < 1e-13;
	report(ok, "layer_norm_grad accumulates dw and db");
	free(x32);
	free(w32);
	free(b32);
}

static void test_softmax(void)
{
	const int R = 3, C = 9, n = 27;
	const double *x = ref("sm_x", n);
	float *x32 = to_f32(x, n);
	double y[27];
	float y32[27];
	planrt_k_softmax_f64(x, y, R, C);
	close64("softmax f64 vs torch (huge row, -inf)", y, ref("sm_y", n), n, 1e-15);
	/* f32 against f64 on the same float-rounded inputs (rounding 1000.x to float moves the softmax) */
	double xr[27];
	for (int i = 0; i < n; i++)
		xr[i] = x32[i];
	planrt_k_softmax_f64(xr, y, R, C);
	planrt_k_softmax_f32(x32, y32, R, C);
	close32("softmax f32 vs f64 (huge row, -inf)", y32, y, n, 1e-6);
	report(y32[2 * C + 5] == 0.0f && y[2 * C + 5] == 0.0, "softmax of -inf is exactly 0");
	double allinf[3] = {-INFINITY, -INFINITY, -INFINITY}, yn[3];
	planrt_k_softmax_f64(allinf, yn, 1, 3);
	report(isnan(yn[0]), "softmax of an all -inf row is NaN, as torch");
	free(x32);
}

/* The f32 kernels' own expf (through ce_sumexp with one column: sumexp = exp(x - 0)) against exp:
 * within 2 ulp where normal, 0 below -87.33 (where exp is subnormal), inf above 88.72. */
static void test_expf(void)
{
	enum { N = 200001 };
	static float x[N], s[N], zero[N];
	for (int i = 0; i < N; i++)
		x[i] = -110.0f + 200.0f * (float)i / (N - 1);
	x[0] = -INFINITY;
	x[N - 1] = INFINITY;
	planrt_k_ce_sumexp_f32(x, zero, N, 1, s);
	double worst = 0;
	int ok = s[0] == 0.0f && isinf(s[N - 1]);
	for (int i = 1; i < N - 1; i++) {
		double want = exp((double)x[i]);
		if (x[i] < -87.3365f)
			ok &= s[i] == 0.0f;
		else if (x[i] > 88.7228f)
			ok &= isinf(s[i]);
		else
			worst = fmax(worst, fabs(s[i] - want) / want);
	}
	report(ok && worst < 2.4e-7, "f32 exp: max rel err %.2e over [-87.3, 88.7], 0 below, inf above", worst);
}

static void test_cross_entropy(void)
{
	enum { R = 5, V = 13 };
	const double *x = ref("ce_logits", R * V), *tg = ref("ce_targets", R);
	double want = ref("ce_loss", 1)[0];
	int32_t targets[R];
	for (int r = 0; r < R; r++)
		targets[r] = (int32_t)tg[r];
	/* f64d: double statistics */
	double mx[R], se[R], tl[R], lse[R], dl[R * V];
	planrt_k_ce_max_f64d(x, R, V, mx);
	planrt_k_ce_sumexp_f64d(x, mx, R, V, se);
	planrt_k_ce_target_f64d(x, targets, R, V, 0, tl);
	double loss = planrt_k_ce_loss_f64d(mx, se, tl, R, lse, 1.0 / R);
	report(fabs(loss - want) < 1e-14 * want, "cross_entropy f64d = torch mean loss (%.17g vs %.17g)", loss, want);
	planrt_k_ce_grad_f64d(x, targets, lse, R, V, 0, 1.0 / R, dl);
	close64("cross_entropy grad f64d vs torch", dl, ref("ce_dlogits", R * V), R * V, 1e-15);
	/* f32 in two vocab blocks [0, 6) and [6, 13), combined as a vocab-parallel program would */
	float *x32 = to_f32(x, R * V), blk[2][R * V], m32[2][R], s32[2][R], t32[2][R], l32[R], g32[R * V];
	int64_t gd[2] = {R, V};
	int64_t w[2] = {6, V - 6}, lo[2] = {0, 6};
	for (int k = 0; k < 2; k++) {
		int64_t ld[2] = {R, w[k]}, of[2] = {0, lo[k]};
		planrt_k_block_copy(sizeof(float), 2, gd, ld, of, x32, blk[k], 1);
		planrt_k_ce_max_f32(blk[k], R, w[k], m32[k]);
	}
	for (int r = 0; r < R; r++)
		m32[0][r] = m32[1][r] = fmaxf(m32[0][r], m32[1][r]);
	for (int k = 0; k < 2; k++) {
		planrt_k_ce_sumexp_f32(blk[k], m32[k], R, w[k], s32[k]);
		planrt_k_ce_target_f32(blk[k], targets, R, w[k], lo[k], t32[k]);
	}
	for (int r = 0; r < R; r++) {
		s32[0][r] += s32[1][r];
		t32[0][r] += t32[1][r];
	}
	double loss32 = planrt_k_ce_loss_f32(m32[0], s32[0], t32[0], R, l32, 1.0 / R);
	report(fabs(loss32 - want) < 1e-6 * want, "cross_entropy f32 two vocab blocks = torch (%.9g vs %.9g)", loss32,
	       want);
	for (int k = 0; k < 2; k++) {
		int64_t ld[2] = {R, w[k]}, of[2] = {0, lo[k]};
		float gb[R * V];
		planrt_k_ce_grad_f32(blk[k], targets, l32, R, w[k], lo[k], 1.0 / R, gb);
		planrt_k_block_copy(sizeof(float), 2, gd, ld, of, g32, gb, 0);
	}
	close32("cross_entropy grad f32 two blocks vs torch", g32, ref("ce_dlogits", R * V), R * V, 1e-7);
	free(x32);
}

/* ---- dropout ------------------------------------------------------------------------------------ */
static void test_dropout(void)
{
	/* the Philox stream: first words for global indices past 2^32 against the Python reference */
	const double *sk = ref("philox_seed_key_start", 5), *u = ref("philox_u", 64);
	uint64_t seed = ((uint64_t)sk[0] << 32) | (uint64_t)sk[1], key = ((uint64_t)sk[2] << 32) | (uint64_t)sk[3];
	int64_t start = (int64_t)sk[4];
	double p = 0.37;
	int64_t gd[1] = {start + 100}, ld[1] = {64}, of[2] = {start, start + 32}; /* offsets: first half, second half */
	double x[64], y[64];
	uint8_t mask[64];
	for (int i = 0; i < 64; i++)
		x[i] = i + 1;
	planrt_k_dropout_f64(x, y, mask, p, seed, key, 1, gd, ld, of);
	int ok = 1, kept = 0;
	for (int i = 0; i < 64; i++) {
		int want = u[i] / 4294967296.0 >= p;
		ok &= mask[i] == want && y[i] == (want ? x[i] * (1 / (1 - p)) : 0);
		kept += mask[i];
	}
	report(ok, "dropout mask = Philox-4x32-10 reference stream (64 elements past 2^32, %d kept)", kept);
	/* the f32 kernel: the running instruction-set level's vectorised Philox, the same stream */
	float x32[64], y32[64];
	for (int i = 0; i < 64; i++)
		x32[i] = (float)(i + 1);
	planrt_k_dropout_f32(x32, y32, mask, p, seed, key, 1, gd, ld, of);
	ok = 1;
	for (int i = 0; i < 64; i++)
		ok &= mask[i] == (u[i] / 4294967296.0 >= p);
	report(ok, "dropout mask (f32, %s) = Philox-4x32-10 reference stream", planrt_cpu_name(planrt_cpu_level_));
	/* a row whose element indices cross 2^32 (the counters' high word changes between lanes): the
	 * vector lanes give what each element alone gives (a block of one element: the scalar path) */
	int64_t big[1] = {((int64_t)1 << 32) + 64}, row[1] = {64}, at[2] = {((int64_t)1 << 32) - 37, ((int64_t)1 << 32) - 37 + 32},
		one1[1] = {1};
	planrt_k_dropout_f32(x32, y32, mask, 0.5, seed, key, 1, big, row, at);
	ok = 1;
	for (int i = 0; i < 64; i++) {
		uint8_t m1;
		float y1;
		int64_t ati[2] = {at[0] + i, at[0] + i};
		planrt_k_dropout_f32(&x32[i], &y1, &m1, 0.5, seed, key, 1, big, one1, ati);
		ok &= m1 == mask[i];
	}
	report(ok, "dropout mask across the 2^32 boundary of element indices = element by element");

	/* Random123 known answer: counter 0, key 0 gives 0x6627e8d5 first; kept iff u / 2^32 >= p */
	double one = 1, o;
	int64_t g1[1] = {1}, l1[1] = {1}, z1[2] = {0, 0};
	double u0 = (double)0x6627e8d5u / 4294967296.0, u1 = (double)0x6627e8d6u / 4294967296.0;
	planrt_k_dropout_f64(&one, &o, mask, u0, 0, 0, 1, g1, l1, z1);
	int keep_at = mask[0];
	planrt_k_dropout_f64(&one, &o, mask, u1, 0, 0, 1, g1, l1, z1);
	report(keep_at && !mask[0], "dropout threshold: kept iff u/2^32 >= p (Random123 zero vector 0x6627e8d5)");

	/* keep fraction ~ 1 - p over 2^20 elements (5 sigma), values scaled by 1 / (1 - p) */
	enum { N = 1 << 20 };
	float *xf = malloc(N * sizeof(float)), *yf = malloc(N * sizeof(float)), *df = malloc(N * sizeof(float));
	uint8_t *mk = malloc(N), *mk2 = malloc(N);
	for (int i = 0; i < N; i++)
		xf[i] = 1.0f;
	static const double ps[] = {0.1, 0.5, 0.9};
	for (int k = 0; k < 3; k++) {
		int64_t gdn[2] = {1024, 1024};
		int64_t ofn[4] = {0, 0, 512, 512};
		planrt_k_dropout_f32(xf, yf, mk, ps[k], 42, 7, 2, gdn, gdn, ofn);
		long cnt = 0;
		int vals = 1;
		for (int i = 0; i < N; i++) {
			cnt += mk[i];
			vals &= yf[i] == (mk[i] ? (float)(1.0 / (1.0 - ps[k])) : 0.0f);
		}
		double frac = (double)cnt / N, sig = sqrt(ps[k] * (1 - ps[k]) / N);
		report(fabs(frac - (1 - ps[k])) < 5 * sig && vals, "dropout p=%.1f keeps %.5f (want %.1f +- %.5f), kept scaled by 1/(1-p)",
		       ps[k], frac, 1 - ps[k], 5 * sig);
	}
	/* another key, another mask: agreement ~ p^2 + (1-p)^2 */
	int64_t gdn[2] = {1024, 1024}, ofn[4] = {0, 0, 512, 512};
	planrt_k_dropout_f32(xf, yf, mk, 0.5, 42, 7, 2, gdn, gdn, ofn);
	planrt_k_dropout_f32(xf, yf, mk2, 0.5, 42, 8, 2, gdn, gdn, ofn);
	long same = 0;
	for (int i = 0; i < N; i++)
		same += mk[i] == mk2[i];
	report(fabs((double)same / N - 0.5) < 0.005, "dropout keys 7 and 8 give independent masks (agree %.4f)",
	       (double)same / N);
	planrt_k_dropout_f32(xf, yf, mk2, 0.5, 43, 7, 2, gdn, gdn, ofn);
	same = 0;
	for (int i = 0; i < N; i++)
		same += mk[i] == mk2[i];
	report(fabs((double)same / N - 0.5) < 0.005, "dropout seeds 42 and 43 give independent masks (agree %.4f)",
	       (double)same / N);
	/* dropout_grad applies the same mask and scale */
	planrt_k_dropout_grad_f32(mk, xf, df, N, 0.5);
	ok = 1;
	for (int i = 0; i < N; i++)
		ok &= df[i] == (mk2[i] || !mk2[i] ? (mk[i] ? 2.0f : 0.0f) : 0.0f);
	report(ok, "dropout_grad = mask * dy / (1 - p)");
	/* p = 0 is the identity, p = 1 gives zeros (no NaN) */
	planrt_k_dropout_f32(xf, yf, mk, 0.0, 1, 1, 2, gdn, gdn, ofn);
	ok = 1;
	for (int i = 0; i < N; i++)
		ok &= yf[i] == 1.0f && mk[i];
	planrt_k_dropout_f32(xf, yf, mk, 1.0, 1, 1, 2, gdn, gdn, ofn);
	for (int i = 0; i < N; i++)
		ok &= yf[i] == 0.0f && !mk[i];
	report(ok, "dropout p=0 keeps all, p=1 gives zeros");
	free(xf);
	free(yf);
	free(df);
	free(mk);
	free(mk2);

	/* block independence: a block's mask is the matching block of the whole tensor's mask */
	enum { A = 6, B = 10, Cc = 12 };
	static double xs[A * B * Cc], ys[A * B * Cc];
	static uint8_t full[A * B * Cc], part[A * B * Cc], want[A * B * Cc];
	int64_t g3[3] = {A, B, Cc}, z3[6] = {0, 0, 0, A / 2, B / 2, Cc / 2};
	for (int i = 0; i < A * B * Cc; i++)
		xs[i] = 1;
	planrt_k_dropout_f64(xs, ys, full, 0.5, 99, 5, 3, g3, g3, z3);
	static const int64_t blocks[][6] = {
	    {3, 10, 12, 3, 0, 0}, /* rows split: contiguous */
	    {6, 5, 12, 0, 5, 0},  {6, 10, 4, 0, 0, 8}, /* column split */
	    {2, 3, 5, 4, 7, 7},   {1, 1, 1, 5, 9, 11}, {6, 10, 12, 0, 0, 0},
	};
	for (unsigned k = 0; k < sizeof blocks / sizeof blocks[0]; k++) {
		const int64_t *bl = blocks[k];
		int64_t l3[3] = {bl[0], bl[1], bl[2]},
			o3[6] = {bl[3], bl[4], bl[5], bl[3] + bl[0] / 2, bl[4] + bl[1] / 2, bl[5] + bl[2] / 2};
		planrt_k_dropout_f64(xs, ys, part, 0.5, 99, 5, 3, g3, l3, o3);
		planrt_k_block_copy(1, 3, g3, l3, o3, full, want, 1);
		int64_t n = bl[0] * bl[1] * bl[2];
		report(!memcmp(part, want, (size_t)n), "dropout block [%lld,%lld,%lld] at (%lld,%lld,%lld) = slice of full mask",
		       (long long)bl[0], (long long)bl[1], (long long)bl[2], (long long)bl[3], (long long)bl[4],
		       (long long)bl[5]);
	}
	/* the same tensor seen as rank 1 has the same global indices */
	int64_t g1n[1] = {A * B * Cc}, l1n[1] = {100}, o1n[2] = {250, 300};
	planrt_k_dropout_f64(xs, ys, part, 0.5, 99, 5, 1, g1n, l1n, o1n);
	report(!memcmp(part, full + 250, 100), "dropout mask depends on the global flat index only");
}

/* ---- causal mask ------------------------------------------------------------------------------- */
static void test_causal(void)
{
	/* a [2 batch, 3 rows, 4 cols] block at global (row 4, col 3) of the score matrix */
	double x[24], y[24];
	for (int i = 0; i < 24; i++)
		x[i] = i + 1;
	planrt_k_causal_mask_f64(x, y, 2, 3, 4, 4, 3, -INFINITY);
	int ok = 1;
	for (int b = 0; b < 2; b++)
		for (int r = 0; r < 3; r++)
			for (int c = 0; c < 4; c++) {
				int i = (b * 3 + r) * 4 + c;
				ok &= (3 + c > 4 + r) ? y[i] == -INFINITY : y[i] == x[i];
			}
	report(ok, "causal_mask with global offsets: col > row becomes -inf");
	planrt_k_causal_mask_f64(x, x, 2, 3, 4, 4, 3, 0.0);
	ok = 1;
	for (int i = 0; i < 24; i++)
		ok &= x[i] == (isinf(y[i]) ? 0.0 : y[i]);
	report(ok, "causal_mask in place with fill 0 (the gradient)");
	float xf[4] = {1, 2, 3, 4}, yf[4];
	planrt_k_causal_mask_f32(xf, yf, 1, 1, 4, 0, 8, -INFINITY); /* block entirely above the diagonal */
	report(isinf(yf[0]) && isinf(yf[3]), "causal_mask block right of the diagonal is all fill");
}

/* ---- MoE routing by hand ---------------------------------------------------------------------- */
static void test_moe(void)
{
	/* 4 tokens, 3 experts, top 2 */
	double lg[12] = {1, 2, 0, /* e1, e0 */
			 2, 2, 0, /* tie: e0 before e1 */
			 0, 3, 1, /* e1, e2 */
			 0, 1, 2 /* e2, e1 */};
	double gates[8], stats[4] = {0, 0, 0, 0};
	int32_t idx[8], counts[3];
	/* one group of 4, capacity 2: first choices in token order, then second choices */
	planrt_k_moe_route_f64(lg, 4, 3, 2, 4, 2, 0, gates, idx, counts, stats);
	static const int32_t want_idx[8] = {2, 1, 0, -1, 3, 5, 4, -1};
	report(!memcmp(idx, want_idx, sizeof idx), "moe_route: every first choice before any second choice, ties to the "
		"lower expert, drops past capacity (idx %d %d %d %d %d %d %d %d)", idx[0], idx[1], idx[2], idx[3], idx[4],
	       idx[5], idx[6], idx[7]);
	report(counts[0] == 2 && counts[1] == 2 && counts[2] == 2 && stats[0] == 2 && stats[1] == 2 && stats[2] == 4 &&
		       stats[3] == 2,
	       "moe_route counts kept pairs per expert, and stats the drops and the pairs routed to each expert");
	double e = exp(1.0), s0 = 1 + e + e * e, s1 = 2 * e * e + 1;
	report(fabs(gates[0] - e * e / s0) < 1e-15 && fabs(gates[1] - e / s0) < 1e-15 &&
		   fabs(gates[2] - e * e / s1) < 1e-15 && gates[2] == gates[3],
	       "moe_route gates are the softmax probabilities");
	/* two groups of 2, capacity 1 per group */
	planrt_k_moe_route_f64(lg, 4, 3, 2, 2, 1, 1, gates, idx, NULL, NULL);
	static const int32_t want_groups[8] = {2, -1, 0, -1, 3, -1, 5, -1};
	report(!memcmp(idx, want_groups, sizeof idx), "moe_route: capacity per group of tokens, slot e * groups * cap + "
		"g * cap + k (idx %d %d %d %d %d %d %d %d)", idx[0], idx[1], idx[2], idx[3], idx[4], idx[5], idx[6], idx[7]);
	report(fabs(gates[0] - e * e / (e * e + e)) < 1e-15 && fabs(gates[0] + gates[1] - 1) < 1e-15,
	       "moe_route normalised gates: the top-k probabilities over their sum (dropped pairs still count)");
	/* dropless: every pair, packed per expert in the same order */
	planrt_k_moe_route_f64(lg, 4, 3, 2, 2, 0, 0, gates, idx, counts, NULL);
	static const int32_t want_dropless[8] = {4, 1, 0, 5, 6, 9, 8, 7}; /* group by group */
	report(!memcmp(idx, want_dropless, sizeof idx) && counts[0] == 2 && counts[1] == 4 && counts[2] == 2,
	       "moe_route dropless: packed per expert, group by group (idx %d %d %d %d %d %d %d %d)", idx[0], idx[1], idx[2], idx[3],
	       idx[4], idx[5], idx[6], idx[7]);
	/* aux loss: first choices e1, e0, e1, e2 -> f = (1/4, 1/2, 1/4) */
	double P[3] = {0, 0, 0};
	for (int t = 0; t < 4; t++) {
		double m = fmax(lg[t * 3], fmax(lg[t * 3 + 1], lg[t * 3 + 2])), s = 0;
		for (int j = 0; j < 3; j++)
			s += exp(lg[t * 3 + j] - m);
		for (int j = 0; j < 3; j++)
			P[j] += exp(lg[t * 3 + j] - m) / s / 4;
	}
	double want = 3 * (0.25 * P[0] + 0.5 * P[1] + 0.25 * P[2]);
	double got = planrt_k_moe_aux_loss_f64(lg, 4, 3, 4, 1.0);
	report(fabs(got - want) < 1e-15, "moe_aux_loss = E sum f_e P_e (%.15g)", got);
	double z = 0;
	for (int t = 0; t < 4; t++) {
		double s = 0;
		for (int j = 0; j < 3; j++)
			s += exp(lg[t * 3 + j]);
		z += log(s) * log(s);
	}
	got = planrt_k_moe_z_loss_f64(lg, 4, 3, 0.25);
	report(fabs(got - z / 4) < 1e-14, "moe_z_loss = mean logsumexp^2 (%.15g)", got);
	/* dispatch / combine: slots filled from tokens, unused slots zero; combine is the gated sum */
	planrt_k_moe_route_f64(lg, 4, 3, 2, 4, 2, 0, gates, idx, NULL, NULL);
	double x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, buf[12], out[8];
	planrt_k_moe_dispatch_f64(x, idx, 4, 2, 2, 6, buf);
	static const double want_buf[12] = {3, 4, 1, 2, 1, 2, 5, 6, 7, 8, 5, 6};
	report(!memcmp(buf, want_buf, sizeof buf), "moe_dispatch fills slots from tokens");
	planrt_k_moe_combine_f64(buf, gates, idx, 4, 2, 2, out);
	report(fabs(out[0] - (gates[0] + gates[1]) * 1) < 1e-15 && fabs(out[2] - gates[2] * 3) < 1e-15 &&
		   fabs(out[6] - gates[6] * 7) < 1e-15,
	       "moe_combine sums gate * expert output, dropped pairs add nothing");
}

/* ---- bf16 ---------------------------------------------------------------------------------------- */
static float fbits(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static void test_bf16(void)
{
	static const struct {
		uint32_t in;
		uint16_t out;
		const char *what;
	} cases[] = {
	    {0x3f800000u, 0x3f80, "1.0 exact"},
	    {0x3f808000u, 0x3f80, "tie to even (down)"},
	    {0x3f818000u, 0x3f82, "tie to even (up)"},
	    {0x3f808001u, 0x3f81, "above half rounds up"},
	    {0x3f807fffu, 0x3f80, "below half rounds down"},
	    {0xbf818000u, 0xbf82, "negative tie to even"},
	    {0x7f800000u, 0x7f80, "+inf"},
	    {0xff800000u, 0xff80, "-inf"},
	    {0x7f7fffffu, 0x7f80, "largest float rounds to inf"},
	    {0x7f7f7fffu, 0x7f7f, "largest bf16 stays finite"},
	    {0x7fc00000u, 0x7fc0, "quiet NaN"},
	    {0x7f800001u, 0x7fc0, "signalling NaN stays NaN (not inf)"},
	    {0xffffffffu, 0x7fc0, "negative NaN"},
	    {0x80000000u, 0x8000, "-0"},
	    {0x00018000u, 0x0002, "subnormal tie to even"},
	};
	for (unsigned i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		float f = fbits(cases[i].in);
		uint16_t h;
		planrt_k_f32_to_bf16(&f, &h, 1);
		report(h == cases[i].out, "bf16 %-36s 0x%08x -> 0x%04x (want 0x%04x)", cases[i].what, cases[i].in, h,
		       cases[i].out);
	}
	/* round trip of every bf16 value (NaNs aside) is exact */
	int ok = 1;
	for (uint32_t v = 0; v < 0x10000u; v++) {
		uint16_t h = (uint16_t)v, h2;
		float f;
		planrt_k_bf16_to_f32(&h, &f, 1);
		if (isnan(f))
			continue;
		planrt_k_f32_to_bf16(&f, &h2, 1);
		ok &= h2 == h && f == fbits(v << 16);
	}
	report(ok, "bf16 -> f32 -> bf16 is exact for all 65536 non-NaN values");
}

/* ---- block copy --------------------------------------------------------------------------------- */
static void test_block_copy(void)
{
	int64_t gd[3] = {5, 7, 9};
	static const int64_t blocks[][6] = {{5, 7, 9, 0, 0, 0}, {2, 7, 9, 3, 0, 0}, {5, 3, 9, 0, 4, 0},
					    {5, 7, 1, 0, 0, 8}, {2, 3, 4, 1, 2, 5}, {1, 1, 9, 4, 6, 0}};
	static const size_t elems[] = {1, 2, 4, 8};
	int ok = 1;
	for (unsigned e = 0; e < 4; e++)
		for (unsigned k = 0; k < sizeof blocks / sizeof blocks[0]; k++) {
			size_t es = elems[e];
			const int64_t *bl = blocks[k];
			int64_t ld[3] = {bl[0], bl[1], bl[2]}, of[3] = {bl[3], bl[4], bl[5]};
			unsigned char t[315 * 8], blk[315 * 8], back[315 * 8];
			for (size_t i = 0; i < sizeof t; i++)
				t[i] = (unsigned char)(i * 7 + 1);
			memset(back, 0, sizeof back);
			planrt_k_block_copy(es, 3, gd, ld, of, t, blk, 1);
			planrt_k_block_copy(es, 3, gd, ld, of, back, blk, 0);
			for (int64_t a = 0; a < 5; a++)
				for (int64_t b = 0; b < 7; b++)
					for (int64_t c = 0; c < 9; c++) {
						int in = a >= of[0] && a < of[0] + ld[0] && b >= of[1] && b < of[1] + ld[1] &&
							 c >= of[2] && c < of[2] + ld[2];
						size_t i = (size_t)((a * 7 + b) * 9 + c) * es;
						for (size_t j = 0; j < es; j++)
							ok &= back[i + j] == (in ? t[i + j] : 0);
						if (in) {
							size_t bi = (size_t)(((a - of[0]) * ld[1] + (b - of[1])) * ld[2] +
									     (c - of[2])) * es;
							ok &= !memcmp(blk + bi, t + i, es);
						}
					}
		}
	report(ok, "block_copy gather then scatter round trip (elem 1, 2, 4, 8; 6 block shapes)");
}

/* ---- matmul, sum_to, embed semantics ------------------------------------------------------------ */
static void naive_mm(int64_t M, int64_t N, int64_t K, const float *A, int ta, const float *B, int tb, double *C)
{
	for (int64_t i = 0; i < M; i++)
		for (int64_t j = 0; j < N; j++) {
			double s = 0;
			for (int64_t k = 0; k < K; k++)
				s += (double)A[ta ? k * M + i : i * K + k] * (double)B[tb ? j * K + k : k * N + j];
			C[i * N + j] = s;
		}
}

static void test_matmul(void)
{
	enum { M = 37, N = 53, K = 29, BT = 3 };
	static float A[BT * M * K], B[BT * K * N], Cf[BT * M * N];
	static double want[BT * M * N];
	for (int i = 0; i < BT * M * K; i++)
		A[i] = (float)sin(i * 0.37);
	for (int i = 0; i < BT * K * N; i++)
		B[i] = (float)cos(i * 0.11);
	for (int ta = 0; ta < 2; ta++)
		for (int tb = 0; tb < 2; tb++) {
			naive_mm(M, N, K, A, ta, B, tb, want);
			planrt_k_matmul_f32(1, M, N, K, A, ta, 0, B, tb, 0, Cf, 0, 0);
			char what[64];
			snprintf(what, sizeof what, "matmul f32 %c%c 37x53x29 vs naive", ta ? 't' : 'n', tb ? 't' : 'n');
			close32(what, Cf, want, M * N, 2e-5);
		}
	/* accumulate adds, overwrite ignores old contents */
	for (int i = 0; i < M * N; i++)
		Cf[i] = 1.0f;
	naive_mm(M, N, K, A, 0, B, 0, want);
	planrt_k_matmul_f32(1, M, N, K, A, 0, 0, B, 0, 0, Cf, 0, 1);
	for (int i = 0; i < M * N; i++)
		want[i] += 1;
	close32("matmul accumulate adds to C", Cf, want, M * N, 2e-5);
	/* broadcast B, batched A (one tall gemm) and transposed A (a gemm per batch entry) */
	for (int ta = 0; ta < 2; ta++) {
		planrt_k_matmul_f32(BT, M, N, K, A, ta, M * K, B, 0, 0, Cf, M * N, 0);
		double worst = 0;
		for (int b = 0; b < BT; b++) {
			naive_mm(M, N, K, A + b * M * K, ta, B, 0, want);
			for (int i = 0; i < M * N; i++)
				worst = fmax(worst, fabs(Cf[b * M * N + i] - want[i]) / fmax(1, fabs(want[i])));
		}
		report(worst < 2e-5, "matmul batch 3, broadcast B, trans_a=%d (err %.1e)", ta, worst);
	}
	/* sum_to overwrites */
	double in[6] = {1, 2, 3, 4, 5, 6}, out[3] = {100, 100, 100};
	int64_t dims[2] = {2, 3}, os[2] = {0, 1};
	planrt_k_sum_to_f64(2, dims, in, os, out, 3);
	report(out[0] == 5 && out[1] == 7 && out[2] == 9, "sum_to overwrites (column sums 5 7 9)");
	planrt_k_sum_to_acc_f64(2, dims, in, os, out, 3);
	report(out[0] == 10 && out[1] == 14 && out[2] == 18, "sum_to_acc adds to what is there (10 14 18)");
	/* embed: ids outside [vocab_lo, vocab_lo + vocab_local) give zero rows; grad accumulates */
	double table[6] = {1, 2, 3, 4, 5, 6}, eo[8], dt[6] = {1, 1, 1, 1, 1, 1}, dy[8] = {1, 2, 3, 4, 5, 6, 7, 8};
	int32_t ids[4] = {10, 12, 9, 10};
	planrt_k_embed_f64(table, ids, eo, 4, 2, 10, 3);
	report(eo[0] == 1 && eo[1] == 2 && eo[2] == 5 && eo[3] == 6 && eo[4] == 0 && eo[5] == 0 && eo[6] == 1,
	       "embed: local rows, zero rows for other ranks' ids");
	planrt_k_embed_grad_f64(ids, dy, dt, 4, 2, 10, 3);
	report(dt[0] == 1 + 1 + 7 && dt[1] == 1 + 2 + 8 && dt[2] == 1 && dt[4] == 1 + 3 && dt[5] == 1 + 4,
	       "embed_grad accumulates, repeated ids add");
}

/* ---- issue 9's ops against torch ------------------------------------------------------------------ */
static double *from_f32(const float *x, int n)
{
	double *y = malloc((size_t)n * sizeof(double));
	for (int i = 0; i < n; i++)
		y[i] = x[i];
	return y;
}

static int ref_count(const char *name)
{
	for (int i = 0; i < nrefs; i++)
		if (!strcmp(refs[i].name, name))
			return refs[i].n;
	ref(name, -1); /* exits */
	return 0;
}

static int32_t *ref_i32(const char *name, int n)
{
	const double *v = ref(name, n);
	int32_t *y = malloc((size_t)n * sizeof(int32_t));
	for (int i = 0; i < n; i++)
		y[i] = (int32_t)v[i];
	return y;
}

static void test_unary(void)
{
	static const struct {
		const char *fn, *name, *dname;
		int op;
		float (*f)(float);
		float (*g)(float, float);
	} fs[] = {{"sin", "un_sin", "un_dsin", PLANRT_SIN, planrt_sin, planrt_sin_grad},
		  {"cos", "un_cos", "un_dcos", PLANRT_COS, planrt_cos, planrt_cos_grad},
		  {"exp", "un_exp", "un_dexp", PLANRT_EXP, planrt_exp, planrt_exp_grad},
		  {"tanh", "un_tanh", "un_dtanh", PLANRT_TANH, planrt_tanh, planrt_tanh_grad},
		  {"sigmoid", "un_sigmoid", "un_dsigmoid", PLANRT_SIGMOID, planrt_sigmoid, planrt_sigmoid_grad},
		  {"log", "log_y", "log_dx", PLANRT_LOG, planrt_log, planrt_log_grad}};
	for (unsigned k = 0; k < sizeof fs / sizeof fs[0]; k++) {
		int log = fs[k].op == PLANRT_LOG, n = ref_count(log ? "log_x" : "un_x");
		const double *x = ref(log ? "log_x" : "un_x", n), *dy = ref(log ? "log_dy" : "un_dy", n);
		/* log's gradient skips x = 0 */
		const double *gx = log ? x + 1 : x, *gdy = log ? dy + 1 : dy;
		int gn = log ? n - 1 : n;
		double *y = malloc((size_t)n * sizeof(double));
		float *x32 = to_f32(x, n), *y32 = malloc((size_t)n * sizeof(float));
		float *gx32 = to_f32(gx, gn), *gdy32 = to_f32(gdy, gn);
		char what[96];
		planrt_k_unary_f64(fs[k].op, x, y, n);
		snprintf(what, sizeof what, "%s f64 vs torch", fs[k].name);
		close64(what, y, ref(fs[k].name, n), n, 1e-14);
		planrt_k_unary_grad_f64(fs[k].op, gx, gdy, y, gn);
		snprintf(what, sizeof what, "%s f64 vs torch autograd", fs[k].dname);
		close64(what, y, ref(fs[k].dname, gn), gn, 1e-14);
		/* f32 against torch on the float-rounded inputs (pi, 1e-30, .. move when rounded) */
		double *xr = from_f32(x32, n), *want = malloc((size_t)n * sizeof(double));
		planrt_k_unary_f64(fs[k].op, xr, want, n);
		planrt_k_unary_f32(fs[k].op, x32, y32, n);
		snprintf(what, sizeof what, "%s f32 vs f64", fs[k].name);
		close32(what, y32, want, n, 1e-6);
		/* and what the fused loops compute, planrt_math.h (the same formulas; FMA contraction may differ) */
		double worst = 0;
		for (int i = 0; i < n; i++) {
			double m = fs[k].f(x32[i]);
			if (m != y32[i]) /* log(0) = -inf on both sides */
				worst = fmax(worst, fabs(m - y32[i]) / fmax(fabs(m), 1e-30));
		}
		for (int i = 0; i < gn; i++) {
			float gk;
			planrt_k_unary_grad_f32(fs[k].op, gx32 + i, gdy32 + i, &gk, 1);
			/* relative to dy: 1 - t t of tanh cancels, and contracted to an FMA or not it differs there */
			double m = fs[k].g(gx32[i], gdy32[i]);
			worst = fmax(worst, fabs(m - gk) / fmax(fmax(fabs(m), fabs(gdy32[i])), 1e-30));
		}
		report(worst < 5e-7, "%-10s kernel f32 = planrt_math.h planrt_F and planrt_F_grad (rel %.1e)", fs[k].fn, worst);
		free(y);
		free(x32);
		free(y32);
		free(gx32);
		free(gdy32);
		free(xr);
		free(want);
	}
}

static void test_reductions(void)
{
	enum { A = 3, N = 5, I = 4 };
	const double *x = ref("red_x", A * N * I), *dy = ref("red_dy", A * I);
	double y[A * N * I], dx[A * N * I];
	int32_t am[A * I];
	planrt_k_sum_dim_f64(x, y, A, N, I, 1.0);
	close64("sum dim 1 of [3,5,4] vs torch", y, ref("red_sum1", A * I), A * I, 1e-15);
	planrt_k_sum_dim_f64(x, y, A, N, I, 1.0 / N);
	close64("mean dim 1 of [3,5,4] vs torch", y, ref("red_mean1", A * I), A * I, 1e-15);
	planrt_k_sum_dim_f64(x, y, A * N, I, 1, 1.0);
	close64("sum dim 2 of [3,5,4] (inner 1) vs torch", y, ref("red_sum2", A * N), A * N, 1e-15);
	planrt_k_sum_dim_f64(x, y, 1, A, N * I, 1.0 / A);
	close64("mean dim 0 of [3,5,4] (outer 1) vs torch", y, ref("red_mean0", N * I), N * I, 1e-15);
	float *x32 = to_f32(x, A * N * I), y32[A * N * I];
	planrt_k_sum_dim_f32(x32, y32, A, N, I, 1.0 / N);
	close32("mean dim 1 f32 vs torch", y32, ref("red_mean1", A * I), A * I, 1e-6);
	planrt_k_max_dim_f64(x, y, am, A, N, I);
	close64("max dim 1 of [3,5,4] vs torch", y, ref("red_max1", A * I), A * I, 0);
	const double *want_am = ref("red_argmax1", A * I);
	int ok = 1;
	for (int i = 0; i < A * I; i++)
		ok &= am[i] == (int32_t)want_am[i];
	report(ok && am[0] == 1 && am[I + 2] == 0, "argmax dim 1 = torch's indices, ties to the first");
	planrt_k_max_dim_grad_f64(am, dy, dx, A, N, I);
	close64("max dim 1 gradient vs torch autograd (ties)", dx, ref("red_dmax1", A * N * I), A * N * I, 0);
	/* the mean's gradient: dy / n everywhere (by hand) */
	planrt_k_sum_dim_grad_f64(dy, dx, A, N, I, 1.0 / N);
	ok = 1;
	for (int a = 0; a < A; a++)
		for (int k = 0; k < N; k++)
			for (int i = 0; i < I; i++)
				ok &= dx[(a * N + k) * I + i] == dy[a * I + i] * (1.0 / N);
	report(ok, "mean gradient is dy / n broadcast over the dim");
	/* NaN is the largest, the first NaN's index (torch.max) */
	double xn[8] = {1, NAN, 3, NAN, 2, 5, 5, 1}, yn[2];
	int32_t an[2];
	planrt_k_max_dim_f64(xn, yn, an, 2, 4, 1);
	report(isnan(yn[0]) && an[0] == 1 && yn[1] == 5 && an[1] == 1, "max: NaN wins at its first index, as torch");
	free(x32);
}

static void test_slicing(void)
{
	const double *x = ref("sl_x", 36);
	double y[66];
	planrt_k_slice_f64(x, y, 2, 6, 3, 2, 3);
	close64("slice x[:, 2:5] vs torch", y, ref("sl_slice", 18), 18, 0);
	planrt_k_slice_f64(x, y, 2, 6, 3, 0, 1);
	close64("index x[:, 0] ([CLS]) vs torch", y, ref("sl_cls", 6), 6, 0);
	planrt_k_slice_f64(x, y, 12, 3, 1, 2, 1);
	close64("index x[..., -1] vs torch", y, ref("sl_last", 12), 12, 0);
	const double *xs[3] = {x, ref("cat_y", 6), ref("cat_z", 24)};
	const int64_t ns[3] = {6, 1, 4};
	planrt_k_concat_f64(3, xs, ns, y, 2, 3);
	close64("concat dim 1 vs torch.cat", y, ref("cat_xyz", 66), 66, 0);
	/* slice_grad of rows [2, 5) of [2, 6, 3]: accumulate adds to those rows only, overwrite zeros the rest */
	double d[36], d0[36], g[18];
	for (int i = 0; i < 18; i++)
		g[i] = i + 1;
	for (int i = 0; i < 36; i++)
		d[i] = 100;
	planrt_k_slice_grad_f64(g, d, 2, 6, 3, 2, 3, 1);
	planrt_k_slice_grad_f64(g, d0, 2, 6, 3, 2, 3, 0);
	int ok = 1;
	for (int o = 0; o < 2; o++)
		for (int r = 0; r < 6; r++)
			for (int i = 0; i < 3; i++) {
				double gi = r >= 2 && r < 5 ? g[(o * 3 + r - 2) * 3 + i] : 0;
				ok &= d[(o * 6 + r) * 3 + i] == 100 + gi && d0[(o * 6 + r) * 3 + i] == gi;
			}
	report(ok, "slice_grad accumulate = 1 adds to its rows only, 0 zeros the others");
	/* transpose of dims 1 and 3 is permute (0, 3, 2, 1) */
	const int64_t td[4] = {2, 3, 4, 5};
	const int perm[4] = {0, 3, 2, 1};
	double tr[120];
	planrt_k_permute_f64(4, td, perm, ref("tr_x", 120), tr);
	close64("transpose(1, 3) = permute (0,3,2,1) vs torch", tr, ref("tr_13", 120), 120, 0);
}

static void test_repeat_kv(void)
{
	/* [B = 2, Hkv = 2, S = 3, Dh = 4], n_rep 3 */
	const double *x = ref("rkv_x", 48);
	double y[144], xt[48], dx[48];
	planrt_k_repeat_kv_f64(x, y, 2, 2, 3, 12, 6, 0);
	close64("repeat_kv [B,Hkv,S,Dh] vs Hugging Face", y, ref("rkv_y", 144), 144, 0);
	const int64_t d[4] = {2, 2, 3, 4};
	const int perm[4] = {0, 2, 1, 3};
	planrt_k_permute_f64(4, d, perm, x, xt); /* [B, S, Hkv, Dh] */
	planrt_k_repeat_kv_f64(xt, y, 6, 2, 3, 4, 6, 0);
	close64("repeat_kv [B,S,Hkv,Dh] vs repeat_interleave", y, ref("rkv_y_bshd", 144), 144, 0);
	planrt_k_repeat_kv_grad_f64(ref("rkv_dy", 144), dx, 2, 2, 3, 12, 6, 0);
	close64("repeat_kv gradient vs torch autograd", dx, ref("rkv_dx", 48), 48, 1e-15);
	/* key/value heads replicated over 3 tensor ranks: rank r holds query heads [2r, 2r + 2) of the
	 * 6 from the whole 2 kv heads; its gradient holds its heads' part, and the ranks' parts sum to
	 * the whole gradient (the all-reduce of the replicated projection's gradient) */
	double block[48], want[48], sum[48] = {0}, part[48];
	const double *yref = ref("rkv_y", 144), *dy = ref("rkv_dy", 144);
	for (int r = 0; r < 3; r++) {
		planrt_k_repeat_kv_f64(x, block, 2, 2, 3, 12, 2, 2 * r);
		double dyr[48];
		for (int o = 0; o < 2; o++) {
			memcpy(want + o * 24, yref + o * 72 + r * 24, 24 * sizeof(double));
			memcpy(dyr + o * 24, dy + o * 72 + r * 24, 24 * sizeof(double));
		}
		close64("repeat_kv: a rank's block of query heads from the whole kv heads", block, want, 48, 0);
		planrt_k_repeat_kv_grad_f64(dyr, part, 2, 2, 3, 12, 2, 2 * r);
		for (int i = 0; i < 48; i++)
			sum[i] += part[i];
	}
	close64("repeat_kv gradient: the ranks' partial sums add to torch autograd's", sum, ref("rkv_dx", 48), 48, 1e-15);
}

static void test_bmm(void)
{
	/* A [2, 1, 3, 4] @ B [3, 4, 5] -> C [2, 3, 3, 5]: batch dims [2, 3], A broadcast on 1, B on 0 */
	const int64_t bd[2] = {2, 3}, as[2] = {12, 0}, bs[2] = {0, 20}, cs[2] = {45, 15};
	const double *a = ref("mm_a", 24), *b = ref("mm_b", 60), *dy = ref("mm_dy", 90);
	double c[90], da[24], db[60];
	planrt_k_bmm_f64(2, bd, 3, 5, 4, a, 0, as, b, 0, bs, c, cs, 0);
	close64("bmm [2,1,3,4]@[3,4,5] vs torch.matmul", c, ref("mm_c", 90), 90, 1e-14);
	float *a32 = to_f32(a, 24), *b32 = to_f32(b, 60), c32[90];
	planrt_k_bmm_f32(2, bd, 3, 5, 4, a32, 0, as, b32, 0, bs, c32, cs, 0);
	close32("bmm f32 vs torch.matmul", c32, ref("mm_c", 90), 90, 1e-6);
	/* gradients: the broadcast dims sum (c strides 0), overwriting */
	for (int i = 0; i < 24; i++)
		da[i] = 1e30;
	for (int i = 0; i < 60; i++)
		db[i] = 1e30;
	planrt_k_bmm_f64(2, bd, 3, 4, 5, dy, 0, cs, b, 1, bs, da, as, 0);
	close64("bmm dA (summed over B's batch) vs autograd", da, ref("mm_da", 24), 24, 1e-14);
	planrt_k_bmm_f64(2, bd, 4, 5, 3, a, 1, as, dy, 0, cs, db, bs, 0);
	close64("bmm dB (summed over A's batch) vs autograd", db, ref("mm_db", 60), 60, 1e-14);
	/* A stored transposed [2, 1, 4, 3] */
	const double *at = ref("mm_at", 24);
	planrt_k_bmm_f64(2, bd, 3, 5, 4, at, 1, as, b, 0, bs, c, cs, 0);
	close64("bmm A^T (stored transposed) vs torch", c, ref("mm_c_ta", 90), 90, 1e-14);
	planrt_k_bmm_f64(2, bd, 4, 3, 5, b, 0, bs, dy, 1, cs, da, as, 0);
	close64("bmm dA of a transposed A vs autograd", da, ref("mm_dat", 24), 24, 1e-14);
	/* y = s^T @ W, s stored [2, 3, 4, 2], W [4, 5]: dW = sum_i s_i @ dy_i (accumulate: added to 1) */
	const int64_t ss[2] = {24, 8}, ws[2] = {0, 0}, ys[2] = {30, 10};
	const double *s = ref("wg_s", 48), *w = ref("wg_w", 20), *wdy = ref("wg_dy", 60);
	double y[60], ds[48], dw[20], want[20];
	planrt_k_bmm_f64(2, bd, 2, 5, 4, s, 1, ss, w, 0, ws, y, ys, 0);
	close64("s^T @ W vs torch", y, ref("wg_y", 60), 60, 1e-14);
	for (int i = 0; i < 20; i++)
		dw[i] = 1;
	planrt_k_bmm_f64(2, bd, 4, 5, 2, s, 0, ss, wdy, 0, ys, dw, ws, 1);
	for (int i = 0; i < 20; i++)
		want[i] = ref("wg_dw", 20)[i] + 1;
	close64("wgrad of a transposed activation (acc) vs autograd", dw, want, 20, 1e-14);
	planrt_k_bmm_f64(2, bd, 4, 2, 5, w, 0, ws, wdy, 1, ys, ds, ss, 0);
	close64("its activation gradient ds vs autograd", ds, ref("wg_ds", 48), 48, 1e-14);
	free(a32);
	free(b32);
}

/* rows [s0, s0 + n) of a [B, rows, H, D] tensor (gather 1: into blk, 0: scatter blk back) */
static void rope_rows_of(int64_t rows, double *t, double *blk, int64_t s0, int64_t n, int gather)
{
	int64_t gd[4] = {2, rows, 3, 8}, ld[4] = {2, n, 3, 8}, of[4] = {0, s0, 0, 0};
	planrt_k_block_copy(sizeof(double), 4, gd, ld, of, t, blk, gather);
}

static void rope_rows(double *t, double *blk, int64_t s0, int64_t n, int gather)
{
	rope_rows_of(5, t, blk, s0, n, gather);
}

/* the rows [0, 2) and [3, 5) of a [B, 5, H, D] tensor as one 4-row block (a balanced context-parallel
 * ring's two mirrored chunks) */
static void rope_two_chunks(double *t, double *two)
{
	double half[2 * 2 * 3 * 8];
	rope_rows(t, half, 0, 2, 1);
	rope_rows_of(4, two, half, 0, 2, 0);
	rope_rows(t, half, 3, 2, 1);
	rope_rows_of(4, two, half, 2, 2, 0);
}

static void test_rope(void)
{
	enum { B = 2, S = 5, H = 3, D = 8, NE = B * S * H * D };
	const double *x = ref("rope_x", NE), *dy = ref("rope_dy", NE);
	int32_t *pos = ref_i32("rope_pos", B * S);
	double y[NE], xt[NE], yt[NE], blk[NE], yb[NE];
	planrt_k_rope_f64(x, y, B, S, H, D, D, 0, pos, S, 0, 0, 10000.0);
	close64("rope f64 [B,S,H,D] pos ids vs torch", y, ref("rope_y64", NE), NE, 1e-13);
	float *x32 = to_f32(x, NE), y32[NE];
	planrt_k_rope_f32(x32, y32, B, S, H, D, D, 0, pos, S, 0, 0, 500000.0);
	close32("rope f32 vs Hugging Face's float32 recipe", y32, ref("rope_y32", NE), NE, 1e-6);
	/* that check tells the recipes apart: at positions to 65535, exact angles are far from HF's */
	double far = 0;
	for (int i = 0; i < NE; i++)
		far = fmax(far, fabs(ref("rope_y64_5e5", NE)[i] - ref("rope_y32", NE)[i]));
	planrt_k_rope_f64(x, y, B, S, H, D, D, 0, pos, S, 0, 0, 500000.0);
	close64("rope f64 theta 5e5 vs torch", y, ref("rope_y64_5e5", NE), NE, 1e-13);
	report(far > 1e-5, "rope: HF's float angles differ from exact ones by %.1e (> 10x the f32 tolerance)", far);
	planrt_k_rope_grad_f64(dy, y, B, S, H, D, D, 0, pos, S, 0, 0, 10000.0);
	close64("rope gradient vs torch autograd", y, ref("rope_dx64", NE), NE, 1e-13);
	planrt_k_rope_f64(x, y, B, S, H, D, 4, 0, pos, S, 0, 0, 500000.0);
	close64("rope rot_dim 4 of 8 (GPT-NeoX partial) vs torch", y, ref("rope_y64_rot4", NE), NE, 1e-13);
	/* heads first: [B, H, S, D] */
	const int64_t d[4] = {B, S, H, D}, dt[4] = {B, H, S, D};
	const int perm[4] = {0, 2, 1, 3};
	planrt_k_permute_f64(4, d, perm, x, xt);
	planrt_k_rope_f64(xt, yt, B, S, H, D, D, 1, pos, S, 0, 0, 10000.0);
	planrt_k_permute_f64(4, dt, perm, yt, y);
	close64("rope heads_first [B,H,S,D] vs torch", y, ref("rope_y64", NE), NE, 1e-13);
	/* a sequence-parallel block, rows [2, 5): ids from pos + 2 (row length S), or no ids and pos_off 2 */
	rope_rows((double *)x, blk, 2, 3, 1);
	planrt_k_rope_f64(blk, yb, B, 3, H, D, D, 0, pos + 2, S, 0, 0, 10000.0);
	memcpy(y, ref("rope_y64", NE), sizeof y);
	memset(yt, 0, sizeof yt);
	rope_rows(yt, yb, 2, 3, 0);
	rope_rows(y, blk, 2, 3, 1);
	rope_rows(yt, blk, 2, 3, 1); /* blk = the block of the kernel's result */
	rope_rows(y, yb, 2, 3, 1);   /* yb = the block of torch's */
	close64("rope block rows 2..4 with pos + 2 vs torch", blk, yb, B * 3 * H * D, 1e-13);
	rope_rows((double *)x, blk, 2, 3, 1);
	planrt_k_rope_f64(blk, blk, B, 3, H, D, D, 0, NULL, 0, 2, 3, 10000.0); /* in place */
	memcpy(y, ref("rope_y64_arange", NE), sizeof y);
	rope_rows(y, yb, 2, 3, 1);
	close64("rope block rows 2..4, no ids, pos_off 2 (in place)", blk, yb, B * 3 * H * D, 1e-13);
	/* a block of two chunks apart, rows 0..1 and 3..4: the second half starts at pos_off2 = 3 */
	rope_two_chunks((double *)x, blk);
	planrt_k_rope_f64(blk, blk, B, 4, H, D, D, 0, NULL, 0, 0, 3, 10000.0);
	rope_two_chunks(y, yb);
	close64("rope two mirrored chunks, rows 0..1 and 3..4 (pos_off 0, pos_off2 3) vs torch", blk, yb, B * 4 * H * D,
		1e-13);
	free(pos);
	free(x32);
}

static void test_losses(void)
{
	const double *x = ref("pl_x", 20), *tg = ref("pl_t", 20);
	double dx[20], dt[20];
	double mse = planrt_k_mse_loss_f64(x, tg, 20, 1.0 / 20), l1 = planrt_k_l1_loss_f64(x, tg, 20, 1.0 / 20);
	close64("mse_loss (mean) vs torch", &mse, ref("pl_mse", 1), 1, 1e-15);
	close64("l1_loss (mean) vs torch", &l1, ref("pl_l1", 1), 1, 1e-15);
	planrt_k_mse_loss_grad_f64(x, tg, 20, 1.0 / 20, dx, dt);
	close64("mse_loss dx vs autograd", dx, ref("pl_mse_dx", 20), 20, 1e-15);
	close64("mse_loss dtarget vs autograd", dt, ref("pl_mse_dt", 20), 20, 1e-15);
	planrt_k_l1_loss_grad_f64(x, tg, 20, 1.0 / 20, dx, dt);
	close64("l1_loss dx vs autograd (0 where equal)", dx, ref("pl_l1_dx", 20), 20, 1e-15);
	close64("l1_loss dtarget vs autograd", dt, ref("pl_l1_dt", 20), 20, 1e-15);
	float *x32 = to_f32(x, 20), *t32 = to_f32(tg, 20);
	double mse32 = planrt_k_mse_loss_f32(x32, t32, 20, 1.0 / 20);
	close64("mse_loss f32 vs torch", &mse32, ref("pl_mse", 1), 1, 1e-6);
	free(x32);
	free(t32);

	/* cross-entropy over classes: [6, 4], one label ignored (-100): the mean over the 5 others */
	enum { R = 6, K = 4 };
	const double *lg = ref("cec_logits", R * K);
	int32_t *lab = ref_i32("cec_labels", R);
	int64_t valid = -1, bad_row = -7;
	int32_t bad_value = -7;
	int64_t nbad = planrt_k_check_labels(lab, R, K, PLANRT_IGNORE_INDEX, &valid, &bad_row, &bad_value);
	report(nbad == 0 && valid == 5 && bad_row == -7, "check_labels: 5 count, -100 ignored, none bad");
	double lse[R], loss, dl[R * K];
	nbad = planrt_k_cross_entropy_f64d(lg, lab, R, K, PLANRT_IGNORE_INDEX, 1.0 / (double)valid, lse, &loss, &bad_row,
					   &bad_value);
	close64("cross_entropy classes (ignore -100) vs torch", &loss, ref("cec_loss", 1), 1, 1e-15);
	planrt_k_cross_entropy_grad_f64d(lg, lab, lse, R, K, PLANRT_IGNORE_INDEX, 1.0 / (double)valid, dl);
	close64("cross_entropy classes grad vs autograd", dl, ref("cec_dlogits", R * K), R * K, 1e-15);
	float *lg32 = to_f32(lg, R * K), lse32[R], dl32[R * K];
	planrt_k_cross_entropy_f32(lg32, lab, R, K, PLANRT_IGNORE_INDEX, 1.0 / (double)valid, lse32, &loss, &bad_row,
				   &bad_value);
	close64("cross_entropy classes f32 vs torch", &loss, ref("cec_loss", 1), 1, 1e-6);
	planrt_k_cross_entropy_grad_f32(lg32, lab, lse32, R, K, PLANRT_IGNORE_INDEX, 1.0 / (double)valid, dl32);
	close32("cross_entropy classes grad f32 vs autograd", dl32, ref("cec_dlogits", R * K), R * K, 1e-7);

	/* bad labels: counted, the first reported with its row and value, their rows inert */
	int32_t badlab[R] = {0, 4, -100, -3, 7, 1};
	nbad = planrt_k_cross_entropy_f64d(lg, badlab, R, K, PLANRT_IGNORE_INDEX, 1.0, lse, &loss, &bad_row, &bad_value);
	double want = 0;
	for (int r = 0; r < R; r++)
		if (r == 0 || r == 5)
			want += lse[r] - lg[r * K + badlab[r]];
	planrt_k_cross_entropy_grad_f64d(lg, badlab, lse, R, K, PLANRT_IGNORE_INDEX, 1.0, dl);
	int inert = 1;
	for (int j = 0; j < K; j++)
		inert &= dl[1 * K + j] == 0 && dl[3 * K + j] == 0 && dl[4 * K + j] == 0 && dl[2 * K + j] == 0;
	report(nbad == 3 && bad_row == 1 && bad_value == 4 && fabs(loss - want) < 1e-14 && inert,
	       "cross_entropy: 3 bad labels, first row 1 value 4; bad and ignored rows add nothing");
	nbad = planrt_k_check_labels(badlab, R, K, PLANRT_IGNORE_INDEX, &valid, &bad_row, &bad_value);
	report(nbad == 3 && valid == 2 && bad_row == 1 && bad_value == 4, "check_labels: 3 bad (first row 1 value 4), 2 count");
	/* the vocab-parallel pieces' targets, checked without an ignore index (-100 is bad then) */
	int32_t tok[4] = {3, 255, 256, -100};
	nbad = planrt_k_check_labels(tok, 4, 256, INT32_MIN, NULL, &bad_row, &bad_value);
	report(nbad == 2 && bad_row == 2 && bad_value == 256, "check_labels: ids 256 and -100 out of [0, 256)");
	free(lab);
	free(lg32);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: test_semantics reference.txt\n");
		return 2;
	}
	/* the kernels of one instruction-set level (PLANRT_ISA; unset: this CPU's best), skipped when
	 * the CPU lacks it */
	if (planrt_cpu_select() != planrt_success) {
		printf("SKIP: %s\n", planrt_last_error());
		return 77;
	}
	printf("instruction-set level: %s\n", planrt_cpu_name(planrt_cpu_level_));
	load_refs(argv[1]);
	test_activations();
	test_norms();
	test_softmax();
	test_expf();
	test_cross_entropy();
	test_dropout();
	test_causal();
	test_moe();
	test_bf16();
	test_block_copy();
	test_matmul();
	test_unary();
	test_reductions();
	test_slicing();
	test_repeat_kv();
	test_bmm();
	test_rope();
	test_losses();
	printf("%d passed, %d failed\n", npass, nfail);
	return nfail != 0;
}
