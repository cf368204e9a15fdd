/* test_fd.c: every planrt kernel with a gradient against central finite differences.
 *
 * Each case is a forward function of some f64 inputs and a backward function that computes the
 * gradient of L = sum(out * dy) (dy random) with the _f64 kernels (_f64d where the kernel saves
 * statistics, whose _f64 form keeps them in float). The harness perturbs every input element by
 * +-h, compares (L+ - L-) / 2h with the analytic gradient, and requires a relative error (worst
 * absolute difference over the largest gradient entry) below 1e-6. Gradients the kernel
 * accumulates are prefilled with random values that are subtracted afterwards; overwritten ones are
 * prefilled with garbage, so both semantics are checked. Each case also runs its forward with the
 * _f32 kernels on the same inputs and requires agreement to float precision. */
#include "planrt_kernels.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FD_H 1e-6
#define FD_TOL 1e-6
#define F32_TOL 1e-5
#define MAXIN 4
#define MAXN 4096

#include "report.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double urand(double lo, double hi)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return lo + (hi - lo) * (double)(rng_state >> 11) / 9007199254740992.0;
}

static void fill(double *x, int64_t n, double lo, double hi)
{
	for (int64_t i = 0; i < n; i++)
		x[i] = urand(lo, hi);
}

/* ---- the harness ------------------------------------------------------------------------------- */
typedef struct Case Case;
struct Case {
	const char *name;
	int nin;
	const char *iname[MAXIN];
	int64_t nel[MAXIN];
	int accum[MAXIN]; /* the backward adds to this gradient */
	double in[MAXIN][MAXN], grad[MAXIN][MAXN];
	float in32[MAXIN][MAXN];
	int64_t nout;
	double out[MAXN], dy[MAXN];
	float out32[MAXN];
	void (*fwd)(Case *c, int f32); /* out (out32 when f32) from in (in32) */
	void (*bwd)(Case *c);          /* grad from in and dy */
	double fdtol;
};

static Case C; /* the case being built and run */

static Case *begin(const char *name, int64_t nout, void (*fwd)(Case *, int), void (*bwd)(Case *))
{
	memset(&C, 0, sizeof C);
	C.name = name;
	C.nout = nout;
	C.fwd = fwd;
	C.bwd = bwd;
	C.fdtol = FD_TOL;
	return &C;
}

static double *input(const char *iname, int64_t n, double lo, double hi, int accum)
{
	int i = C.nin++;
	if (n > MAXN || i >= MAXIN) {
		fprintf(stderr, "test_fd: case %s too big\n", C.name);
		exit(2);
	}
	C.iname[i] = iname;
	C.nel[i] = n;
	C.accum[i] = accum;
	fill(C.in[i], n, lo, hi);
	return C.in[i];
}

static double loss(Case *c)
{
	c->fwd(c, 0);
	double l = 0;
	for (int64_t i = 0; i < c->nout; i++)
		l += c->out[i] * c->dy[i];
	return l;
}

static double worst_kernel_err;

static void run(Case *c)
{
	static double prefill[MAXIN][MAXN];
	fill(c->dy, c->nout, -1, 1);
	for (int i = 0; i < c->nin; i++)
		for (int64_t j = 0; j < c->nel[i]; j++)
			c->grad[i][j] = prefill[i][j] = c->accum[i] ? urand(-1, 1) : 1e30;
	c->bwd(c);
	for (int i = 0; i < c->nin; i++)
		if (c->accum[i])
			for (int64_t j = 0; j < c->nel[i]; j++)
				c->grad[i][j] -= prefill[i][j];
	double worst = 0;
	char buf[512];
	int len = 0;
	for (int i = 0; i < c->nin; i++) {
		double maxd = 0, maxg = 0;
		for (int64_t j = 0; j < c->nel[i]; j++) {
			double x0 = c->in[i][j];
			c->in[i][j] = x0 + FD_H;
			double lp = loss(c);
			c->in[i][j] = x0 - FD_H;
			double lm = loss(c);
			c->in[i][j] = x0;
			double num = (lp - lm) / (2 * FD_H), ana = c->grad[i][j];
			double d = fabs(num - ana);
			if (!(d <= maxd)) /* NaN counts as worst */
				maxd = isnan(d) ? INFINITY : d;
			maxg = fmax(maxg, fmax(fabs(num), fabs(ana)));
		}
		double err = maxd == 0 ? 0 : maxd / fmax(maxg, 1e-300);
		worst = fmax(worst, err);
		len += snprintf(buf + len, sizeof buf - (size_t)len, " d%s %.1e", c->iname[i], err);
	}
	report(worst < c->fdtol, "fd %-26s worst rel err %.2e (%s)", c->name, worst, buf + 1);
	if (c->fdtol == FD_TOL)
		worst_kernel_err = fmax(worst_kernel_err, worst);

	/* f32 forward against f64 forward on the same (float-rounded) inputs */
	for (int i = 0; i < c->nin; i++)
		for (int64_t j = 0; j < c->nel[i]; j++) {
			c->in32[i][j] = (float)c->in[i][j];
			c->in[i][j] = (double)c->in32[i][j];
		}
	c->fwd(c, 0);
	c->fwd(c, 1);
	double maxd = 0, maxo = 0;
	for (int64_t j = 0; j < c->nout; j++) {
		double d = fabs((double)c->out32[j] - c->out[j]);
		if (!(d <= maxd))
			maxd = isnan(d) ? INFINITY : d;
		maxo = fmax(maxo, fabs(c->out[j]));
	}
	double err = maxd == 0 ? 0 : maxd / fmax(maxo, 1e-300);
	report(err < F32_TOL, "f32 %-25s forward vs f64 rel err %.2e", c->name, err);
}

/* scratch for composed cases */
static double TD[8][MAXN];
static float TF[8][MAXN];

/* ---- matmul ------------------------------------------------------------------------------------ */
static struct {
	int64_t batch, M, N, K, sa, sb, sc;
	int ta, tb;
} mm;

static void mm_fwd(Case *c, int f32)
{
	if (f32)
		planrt_k_matmul_f32(mm.batch, mm.M, mm.N, mm.K, c->in32[0], mm.ta, mm.sa, c->in32[1], mm.tb, mm.sb,
				    c->out32, mm.sc, 0);
	else
		planrt_k_matmul_f64(mm.batch, mm.M, mm.N, mm.K, c->in[0], mm.ta, mm.sa, c->in[1], mm.tb, mm.sb, c->out,
				    mm.sc, 0);
}

/* C = A' B' (A' = op(A), B' = op(B)): dA' = dC B'^T, dB' = A'^T dC, transposed back where stored so. */
static void mm_bwd(Case *c)
{
	const double *A = c->in[0], *B = c->in[1], *dC = c->dy;
	double *dA = c->grad[0], *dB = c->grad[1];
	int64_t M = mm.M, N = mm.N, K = mm.K;
	if (!mm.ta) /* dA [M, K] = dC [M, N] @ B'^T */
		planrt_k_matmul_f64(mm.batch, M, K, N, dC, 0, mm.sc, B, !mm.tb, mm.sb, dA, mm.sa, 0);
	else /* dA [K, M] = B' [K, N] @ dC^T */
		planrt_k_matmul_f64(mm.batch, K, M, N, B, mm.tb, mm.sb, dC, 1, mm.sc, dA, mm.sa, 0);
	int64_t nb = mm.sb == 0 ? 1 : mm.batch;
	if (mm.sb == 0)
		memset(dB, 0, (size_t)(K * N) * sizeof(double));
	for (int64_t b = 0; b < mm.batch; b++) {
		const double *Ab = A + b * mm.sa, *dCb = dC + b * mm.sc;
		double *dBb = dB + (nb == 1 ? 0 : b * mm.sb);
		int acc = mm.sb == 0;
		if (!mm.tb) /* dB [K, N] = A'^T [K, M] @ dC */
			planrt_k_matmul_f64(1, K, N, M, Ab, !mm.ta, 0, dCb, 0, 0, dBb, 0, acc);
		else /* dB [N, K] = dC^T [N, M] @ A' */
			planrt_k_matmul_f64(1, N, K, M, dCb, 1, 0, Ab, mm.ta, 0, dBb, 0, acc);
	}
}

static void case_matmul(const char *name, int64_t batch, int64_t M, int64_t N, int64_t K, int ta, int tb,
			int bcast_b)
{
	mm.batch = batch;
	mm.M = M;
	mm.N = N;
	mm.K = K;
	mm.ta = ta;
	mm.tb = tb;
	mm.sa = M * K;
	mm.sb = bcast_b ? 0 : K * N;
	mm.sc = M * N;
	begin(name, batch * M * N, mm_fwd, mm_bwd);
	input("A", batch * M * K, -1, 1, 0);
	input("B", (bcast_b ? 1 : batch) * K * N, -1, 1, 0);
	run(&C);
}

/* ---- matmul with broadcast batch dims ------------------------------------------------------------------
 * C [batch dims.., M, N] = op(A) @ op(B) with A's and B's batch shapes broadcast (size 1 = broadcast). The
 * backward is bmm itself: the gradient of a broadcast operand has stride 0 on the dims it was broadcast
 * along, so the products add into it. */
static struct {
	int rank, ta, tb, acc;
	int64_t dims[3], as[3], bs[3], cs[3], M, N, K;
} bm;

/* contiguous strides of an operand with batch shape shape[] (1 where it broadcasts) and block size blk */
static int64_t bm_strides(int rank, const int64_t *shape, int64_t blk, int64_t *st)
{
	int64_t s = blk;
	for (int d = rank - 1; d >= 0; d--) {
		st[d] = shape[d] == 1 ? 0 : s;
		s *= shape[d];
	}
	return s;
}

static void bm_fwd(Case *c, int f32)
{
	if (f32)
		planrt_k_bmm_f32(bm.rank, bm.dims, bm.M, bm.N, bm.K, c->in32[0], bm.ta, bm.as, c->in32[1], bm.tb, bm.bs,
				 c->out32, bm.cs, 0);
	else
		planrt_k_bmm_f64(bm.rank, bm.dims, bm.M, bm.N, bm.K, c->in[0], bm.ta, bm.as, c->in[1], bm.tb, bm.bs,
				 c->out, bm.cs, 0);
}

static void bm_bwd(Case *c)
{
	const double *A = c->in[0], *B = c->in[1], *dC = c->dy;
	int64_t M = bm.M, N = bm.N, K = bm.K;
	if (!bm.ta) /* dA [M, K] = dC @ op(B)^T */
		planrt_k_bmm_f64(bm.rank, bm.dims, M, K, N, dC, 0, bm.cs, B, !bm.tb, bm.bs, c->grad[0], bm.as, bm.acc);
	else /* dA [K, M] = op(B) @ dC^T */
		planrt_k_bmm_f64(bm.rank, bm.dims, K, M, N, B, bm.tb, bm.bs, dC, 1, bm.cs, c->grad[0], bm.as, bm.acc);
	if (!bm.tb) /* dB [K, N] = op(A)^T @ dC */
		planrt_k_bmm_f64(bm.rank, bm.dims, K, N, M, A, !bm.ta, bm.as, dC, 0, bm.cs, c->grad[1], bm.bs, bm.acc);
	else /* dB [N, K] = dC^T @ op(A) */
		planrt_k_bmm_f64(bm.rank, bm.dims, N, K, M, dC, 1, bm.cs, A, bm.ta, bm.as, c->grad[1], bm.bs, bm.acc);
}

static void case_bmm(const char *name, int rank, const int64_t *dims, const int64_t *ashape, const int64_t *bshape,
		     int64_t M, int64_t N, int64_t K, int ta, int tb, int acc)
{
	bm.rank = rank;
	bm.ta = ta;
	bm.tb = tb;
	bm.acc = acc;
	bm.M = M;
	bm.N = N;
	bm.K = K;
	for (int d = 0; d < rank; d++)
		bm.dims[d] = dims[d];
	int64_t na = bm_strides(rank, ashape, M * K, bm.as), nb = bm_strides(rank, bshape, K * N, bm.bs);
	int64_t nc = bm_strides(rank, dims, M * N, bm.cs);
	begin(name, nc, bm_fwd, bm_bwd);
	input("A", na, -1, 1, acc);
	input("B", nb, -1, 1, acc);
	run(&C);
}

static void cases_bmm(void)
{
	static const int64_t d23[2] = {2, 3}, a21[2] = {2, 1}, b13[2] = {1, 3}, one[2] = {1, 1};
	static const int64_t d223[3] = {2, 2, 3}, a213[3] = {2, 1, 3}, b121[3] = {1, 2, 1};
	case_bmm("bmm [2,1]@[1,3] nn", 2, d23, a21, b13, 2, 3, 4, 0, 0, 0);
	case_bmm("bmm [2,1]@[1,3] tt (acc)", 2, d23, a21, b13, 2, 3, 4, 1, 1, 1);
	case_bmm("bmm [2,1]@[1,3] tn", 2, d23, a21, b13, 3, 2, 4, 1, 0, 0);
	case_bmm("bmm [2,3]@[] nn (tall gemm)", 2, d23, d23, one, 2, 3, 4, 0, 0, 0);
	/* y = a @ W with a = s^T stored [2, 3, K, M]: the weight gradient sums s_i @ dy_i (one gemm) */
	case_bmm("bmm s^T@W (wgrad of transposed act)", 2, d23, d23, one, 3, 2, 4, 1, 0, 0);
	case_bmm("bmm s^T@W nt (acc)", 2, d23, d23, one, 3, 2, 4, 1, 1, 1);
	case_bmm("bmm [2,1,3]@[1,2,1] nt", 3, d223, a213, b121, 2, 3, 2, 0, 1, 0);
}

/* ---- binary ops and sum_to ------------------------------------------------------------------------ */
static struct {
	int op, rank;
	int64_t dims[4], as[4], bs[4], cs[4], n;
} bin;

static void bin_fwd(Case *c, int f32)
{
	if (f32)
		planrt_k_binary_f32(bin.op, bin.rank, bin.dims, c->in32[0], bin.as, c->in32[1], bin.bs, c->out32);
	else
		planrt_k_binary_f64(bin.op, bin.rank, bin.dims, c->in[0], bin.as, c->in[1], bin.bs, c->out);
}

static void bin_bwd(Case *c)
{
	const double *a = c->in[0], *b = c->in[1];
	double *t = TD[0], *u = TD[1];
	/* da = sum_to(dy * d out / d a), db likewise */
	switch (bin.op) {
	case PLANRT_ADD:
	case PLANRT_SUB:
		planrt_k_sum_to_f64(bin.rank, bin.dims, c->dy, bin.as, c->grad[0], c->nel[0]);
		planrt_k_sum_to_f64(bin.rank, bin.dims, c->dy, bin.bs, c->grad[1], c->nel[1]);
		if (bin.op == PLANRT_SUB)
			planrt_k_scale_f64(c->grad[1], c->grad[1], c->nel[1], -1.0);
		break;
	case PLANRT_MUL:
		planrt_k_binary_f64(PLANRT_MUL, bin.rank, bin.dims, c->dy, bin.cs, b, bin.bs, t);
		planrt_k_sum_to_f64(bin.rank, bin.dims, t, bin.as, c->grad[0], c->nel[0]);
		planrt_k_binary_f64(PLANRT_MUL, bin.rank, bin.dims, c->dy, bin.cs, a, bin.as, t);
		planrt_k_sum_to_f64(bin.rank, bin.dims, t, bin.bs, c->grad[1], c->nel[1]);
		break;
	case PLANRT_DIV: /* da = dy / b, db = -dy out / b */
		planrt_k_binary_f64(PLANRT_DIV, bin.rank, bin.dims, c->dy, bin.cs, b, bin.bs, t);
		planrt_k_sum_to_f64(bin.rank, bin.dims, t, bin.as, c->grad[0], c->nel[0]);
		planrt_k_binary_f64(PLANRT_DIV, bin.rank, bin.dims, a, bin.as, b, bin.bs, u);
		planrt_k_binary_f64(PLANRT_MUL, bin.rank, bin.dims, t, bin.cs, u, bin.cs, t);
		planrt_k_sum_to_f64(bin.rank, bin.dims, t, bin.bs, c->grad[1], c->nel[1]);
		planrt_k_scale_f64(c->grad[1], c->grad[1], c->nel[1], -1.0);
		break;
	}
}

/* out [d0, d1, d2]; a and b given by their strides into their own storage of na / nb elements. */
static void case_binary(const char *name, int op, const int64_t *dims, const int64_t *as, int64_t na,
			const int64_t *bs, int64_t nb)
{
	bin.op = op;
	bin.rank = 3;
	bin.n = 1;
	for (int d = 0; d < 3; d++) {
		bin.dims[d] = dims[d];
		bin.as[d] = as[d];
		bin.bs[d] = bs[d];
		bin.n *= dims[d];
	}
	bin.cs[2] = 1;
	bin.cs[1] = dims[2];
	bin.cs[0] = dims[1] * dims[2];
	begin(name, bin.n, bin_fwd, bin_bwd);
	input("a", na, -1, 1, 0);
	input("b", nb, op == PLANRT_DIV ? 0.5 : -1, op == PLANRT_DIV ? 1.5 : 1, 0);
	run(&C);
}

static void cases_binary(void)
{
	static const char *opname[] = {"add", "sub", "mul", "div"};
	static const int64_t dims[3] = {2, 3, 4};
	static const int64_t full[3] = {12, 4, 1}, col[3] = {0, 1, 0}, row[3] = {4, 0, 1}, scalar[3] = {0, 0, 0};
	static const int64_t trans[3] = {1, 2, 6}; /* a [4, 3, 2] tensor read transposed */
	char name[64];
	for (int op = 0; op < 4; op++) {
		snprintf(name, sizeof name, "binary_%s same", opname[op]);
		case_binary(name, op, dims, full, 24, full, 24);
		snprintf(name, sizeof name, "binary_%s a[2,3,4] b[3,1]", opname[op]);
		case_binary(name, op, dims, full, 24, col, 3);
		snprintf(name, sizeof name, "binary_%s a[2,1,4] b[3,1]", opname[op]);
		case_binary(name, op, dims, row, 8, col, 3);
		snprintf(name, sizeof name, "binary_%s scalar b", opname[op]);
		case_binary(name, op, dims, full, 24, scalar, 1);
		snprintf(name, sizeof name, "binary_%s strided a", opname[op]);
		case_binary(name, op, dims, trans, 24, row, 8);
	}
	/* rows longer than the 8-wide partial sums: sum_to reduces b's inner broadcast dim of 19 */
	static const int64_t wdims[3] = {3, 5, 19}, wfull[3] = {95, 19, 1}, wcol[3] = {0, 1, 0};
	case_binary("binary_mul a[3,5,19] b[5,1]", PLANRT_MUL, wdims, wfull, 285, wcol, 5);
}

/* ---- element-wise --------------------------------------------------------------------------------- */
static int act_kind, gelu_approx, unary_op;
enum { ACT_SCALE, ACT_GELU, ACT_RELU, ACT_SILU, ACT_UNARY };
#define ALPHA (-1.7)

static void act_fwd(Case *c, int f32)
{
	int64_t n = c->nout;
	switch (act_kind) {
	case ACT_SCALE:
		f32 ? planrt_k_scale_f32(c->in32[0], c->out32, n, ALPHA) : planrt_k_scale_f64(c->in[0], c->out, n, ALPHA);
		break;
	case ACT_GELU:
		f32 ? planrt_k_gelu_f32(c->in32[0], c->out32, n, gelu_approx)
		    : planrt_k_gelu_f64(c->in[0], c->out, n, gelu_approx);
		break;
	case ACT_RELU:
		f32 ? planrt_k_relu_f32(c->in32[0], c->out32, n) : planrt_k_relu_f64(c->in[0], c->out, n);
		break;
	case ACT_SILU:
		f32 ? planrt_k_silu_f32(c->in32[0], c->out32, n) : planrt_k_silu_f64(c->in[0], c->out, n);
		break;
	case ACT_UNARY:
		f32 ? planrt_k_unary_f32(unary_op, c->in32[0], c->out32, n) : planrt_k_unary_f64(unary_op, c->in[0], c->out, n);
		break;
	}
}

static void act_bwd(Case *c)
{
	int64_t n = c->nout;
	switch (act_kind) {
	case ACT_SCALE:
		planrt_k_scale_f64(c->dy, c->grad[0], n, ALPHA);
		break;
	case ACT_GELU:
		planrt_k_gelu_grad_f64(c->in[0], c->dy, c->grad[0], n, gelu_approx);
		break;
	case ACT_RELU: /* from the output */
		planrt_k_relu_f64(c->in[0], TD[0], n);
		planrt_k_relu_grad_f64(TD[0], c->dy, c->grad[0], n);
		break;
	case ACT_SILU:
		planrt_k_silu_grad_f64(c->in[0], c->dy, c->grad[0], n);
		break;
	case ACT_UNARY:
		planrt_k_unary_grad_f64(unary_op, c->in[0], c->dy, c->grad[0], n);
		break;
	}
}

static void case_act(const char *name, int kind, int approx)
{
	act_kind = kind;
	gelu_approx = approx;
	begin(name, 64, act_fwd, act_bwd);
	double *x = input("x", 64, -4, 4, 0);
	if (kind == ACT_RELU) /* keep away from the kink */
		for (int i = 0; i < 64; i++)
			x[i] = (x[i] < 0 ? -0.1 : 0.1) + x[i];
	run(&C);
}

static void case_unary(const char *name, int op, double lo, double hi)
{
	act_kind = ACT_UNARY;
	unary_op = op;
	begin(name, 64, act_fwd, act_bwd);
	input("x", 64, lo, hi, 0);
	run(&C);
}

/* ---- reductions over one dim, slicing, concat, repeat_kv ----------------------------------------------- */
static struct {
	int64_t outer, n, inner, start, len, rep;
	double scale;
	int acc;
} sh;
static int32_t sh_argmax[MAXN];

static void sum_fwd(Case *c, int f32)
{
	if (f32)
		planrt_k_sum_dim_f32(c->in32[0], c->out32, sh.outer, sh.n, sh.inner, sh.scale);
	else
		planrt_k_sum_dim_f64(c->in[0], c->out, sh.outer, sh.n, sh.inner, sh.scale);
}

static void sum_bwd(Case *c)
{
	planrt_k_sum_dim_grad_f64(c->dy, c->grad[0], sh.outer, sh.n, sh.inner, sh.scale);
}

static void max_fwd(Case *c, int f32)
{
	if (f32)
		planrt_k_max_dim_f32(c->in32[0], c->out32, sh_argmax, sh.outer, sh.n, sh.inner);
	else
		planrt_k_max_dim_f64(c->in[0], c->out, sh_argmax, sh.outer, sh.n, sh.inner);
}

static void max_bwd(Case *c)
{
	max_fwd(c, 0);
	planrt_k_max_dim_grad_f64(sh_argmax, c->dy, c->grad[0], sh.outer, sh.n, sh.inner);
}

static void case_reduce(const char *name, int max, int64_t outer, int64_t n, int64_t inner, double scale)
{
	sh.outer = outer;
	sh.n = n;
	sh.inner = inner;
	sh.scale = scale;
	begin(name, outer * inner, max ? max_fwd : sum_fwd, max ? max_bwd : sum_bwd);
	input("x", outer * n * inner, -2, 2, 0);
	run(&C);
}

static void slice_fwd(Case *c, int f32)
{
	if (f32)
		planrt_k_slice_f32(c->in32[0], c->out32, sh.outer, sh.n, sh.inner, sh.start, sh.len);
	else
		planrt_k_slice_f64(c->in[0], c->out, sh.outer, sh.n, sh.inner, sh.start, sh.len);
}

static void slice_bwd(Case *c)
{
	planrt_k_slice_grad_f64(c->dy, c->grad[0], sh.outer, sh.n, sh.inner, sh.start, sh.len, sh.acc);
}

static void case_slice(const char *name, int64_t outer, int64_t n, int64_t inner, int64_t start, int64_t len, int acc)
{
	sh.outer = outer;
	sh.n = n;
	sh.inner = inner;
	sh.start = start;
	sh.len = len;
	sh.acc = acc;
	begin(name, outer * len * inner, slice_fwd, slice_bwd);
	input("x", outer * n * inner, -1, 1, acc);
	run(&C);
}

/* three inputs [2, 1 | 3 | 2, 3] along the middle dim */
static const int64_t cat_ns[3] = {1, 3, 2};

static void cat_fwd(Case *c, int f32)
{
	if (f32) {
		const float *xs[3] = {c->in32[0], c->in32[1], c->in32[2]};
		planrt_k_concat_f32(3, xs, cat_ns, c->out32, 2, 3);
	} else {
		const double *xs[3] = {c->in[0], c->in[1], c->in[2]};
		planrt_k_concat_f64(3, xs, cat_ns, c->out, 2, 3);
	}
}

static void cat_bwd(Case *c)
{
	double *dxs[3] = {c->grad[0], c->grad[1], c->grad[2]};
	planrt_k_concat_grad_f64(3, c->dy, dxs, cat_ns, 2, 3);
}

/* [outer, heads, inner] -> [outer, heads * rep, inner] */
static void rkv_fwd(Case *c, int f32)
{
	if (f32)
		planrt_k_repeat_kv_f32(c->in32[0], c->out32, sh.outer, sh.n, sh.rep, sh.inner, sh.n * sh.rep, 0);
	else
		planrt_k_repeat_kv_f64(c->in[0], c->out, sh.outer, sh.n, sh.rep, sh.inner, sh.n * sh.rep, 0);
}

static void rkv_bwd(Case *c)
{
	planrt_k_repeat_kv_grad_f64(c->dy, c->grad[0], sh.outer, sh.n, sh.rep, sh.inner, sh.n * sh.rep, 0);
}

/* ---- rotary position embeddings ------------------------------------------------------------------------ */
static struct {
	int64_t batch, seq, heads, dim, rot, pos_stride, pos_off;
	int heads_first;
	const int32_t *pos;
	double theta;
} rp;

static void rope_fwd(Case *c, int f32)
{
	if (f32)
		planrt_k_rope_f32(c->in32[0], c->out32, rp.batch, rp.seq, rp.heads, rp.dim, rp.rot, rp.heads_first, rp.pos,
				  rp.pos_stride, rp.pos_off, rp.pos_off + rp.seq / 2, rp.theta);
	else
		planrt_k_rope_f64(c->in[0], c->out, rp.batch, rp.seq, rp.heads, rp.dim, rp.rot, rp.heads_first, rp.pos,
				  rp.pos_stride, rp.pos_off, rp.pos_off + rp.seq / 2, rp.theta);
}

static void rope_bwd(Case *c)
{
	planrt_k_rope_grad_f64(c->dy, c->grad[0], rp.batch, rp.seq, rp.heads, rp.dim, rp.rot, rp.heads_first, rp.pos,
			       rp.pos_stride, rp.pos_off, rp.pos_off + rp.seq / 2, rp.theta);
}

static void case_rope(const char *name, int64_t batch, int64_t seq, int64_t heads, int64_t dim, int64_t rot,
		      int heads_first, const int32_t *pos, int64_t pos_stride, int64_t pos_off, double theta)
{
	rp.batch = batch;
	rp.seq = seq;
	rp.heads = heads;
	rp.dim = dim;
	rp.rot = rot;
	rp.heads_first = heads_first;
	rp.pos = pos;
	rp.pos_stride = pos_stride;
	rp.pos_off = pos_off;
	rp.theta = theta;
	int64_t n = batch * seq * heads * dim;
	begin(name, n, rope_fwd, rope_bwd);
	input("x", n, -1, 1, 0);
	run(&C);
}

static void cases_rope(void)
{
	static const int32_t pos_bs[6] = {0, 5, 17, 3, 4, 40}, pos_row[2] = {7, 31};
	case_rope("rope [2,3,2,8] pos ids", 2, 3, 2, 8, 8, 0, pos_bs, 3, 0, 10000.0);
	case_rope("rope [2,2,3,6] rot 4, no ids, off 5", 2, 3, 2, 6, 4, 1, NULL, 0, 5, 500000.0);
	case_rope("rope [2,2,1,140] one id row (chunks)", 2, 2, 1, 140, 140, 0, pos_row, 0, 0, 10000.0);
}

/* ---- regression losses and cross-entropy over classes ----------------------------------------------------- */
#define LN 20
static int loss_l1;

static void ploss_fwd(Case *c, int f32)
{
	if (f32)
		c->out32[0] = (float)(loss_l1 ? planrt_k_l1_loss_f32 : planrt_k_mse_loss_f32)(c->in32[0], c->in32[1], LN,
											    1.0 / LN);
	else
		c->out[0] = (loss_l1 ? planrt_k_l1_loss_f64 : planrt_k_mse_loss_f64)(c->in[0], c->in[1], LN, 1.0 / LN);
}

static void ploss_bwd(Case *c)
{
	(loss_l1 ? planrt_k_l1_loss_grad_f64 : planrt_k_mse_loss_grad_f64)(c->in[0], c->in[1], LN, c->dy[0] / LN,
									     c->grad[0], c->grad[1]);
}

static void case_ploss(const char *name, int l1)
{
	loss_l1 = l1;
	begin(name, 1, ploss_fwd, ploss_bwd);
	double *x = input("x", LN, -2, 2, 0), *t = input("target", LN, -2, 2, 0);
	for (int i = 0; i < LN; i++) /* keep l1 away from its kink */
		if (fabs(x[i] - t[i]) < 0.05)
			x[i] += 0.1;
	run(&C);
}

#define XR 7
#define XC 5
static const int32_t xlabels[XR] = {0, 4, PLANRT_IGNORE_INDEX, 2, 2, 1, 3};
#define XVALID 6

static void xent_fwd(Case *c, int f32)
{
	int64_t br = -1;
	int32_t bv = 0;
	double l;
	if (f32) {
		float lse[XR];
		planrt_k_cross_entropy_f32(c->in32[0], xlabels, XR, XC, PLANRT_IGNORE_INDEX, 1.0 / XVALID, lse, &l, &br, &bv);
		c->out32[0] = (float)l;
	} else {
		double lse[XR];
		planrt_k_cross_entropy_f64d(c->in[0], xlabels, XR, XC, PLANRT_IGNORE_INDEX, 1.0 / XVALID, lse, &l, &br, &bv);
		c->out[0] = l;
	}
}

static void xent_bwd(Case *c)
{
	double lse[XR], l;
	int64_t br;
	int32_t bv;
	planrt_k_cross_entropy_f64d(c->in[0], xlabels, XR, XC, PLANRT_IGNORE_INDEX, 1.0 / XVALID, lse, &l, &br, &bv);
	planrt_k_cross_entropy_grad_f64d(c->in[0], xlabels, lse, XR, XC, PLANRT_IGNORE_INDEX, c->dy[0] / XVALID,
					 c->grad[0]);
}

/* ---- dropout ----------------------------------------------------------------------------------- */
static const int64_t dgd[3] = {4, 6, 8}, dld[3] = {2, 3, 5}, dof[6] = {1, 2, 3, 2, 3, 5}; /* offsets: first halves, second halves */
#define DROP_P 0.3
static uint8_t dmask[64];

static void drop_fwd(Case *c, int f32)
{
	if (f32)
		planrt_k_dropout_f32(c->in32[0], c->out32, dmask, DROP_P, 1234, 77, 3, dgd, dld, dof);
	else
		planrt_k_dropout_f64(c->in[0], c->out, dmask, DROP_P, 1234, 77, 3, dgd, dld, dof);
}

static void drop_bwd(Case *c)
{
	drop_fwd(c, 0);
	planrt_k_dropout_grad_f64(dmask, c->dy, c->grad[0], c->nout, DROP_P);
}

/* ---- causal mask and softmax ------------------------------------------------------------------- */
static struct {
	int64_t batch, rows, cols, roff, coff;
	double fill;
	int with_softmax;
} cm;

static void cm_fwd(Case *c, int f32)
{
	int64_t n = cm.batch * cm.rows;
	if (f32) {
		planrt_k_causal_mask_f32(c->in32[0], TF[0], cm.batch, cm.rows, cm.cols, cm.roff, cm.coff, (float)cm.fill);
		if (cm.with_softmax)
			planrt_k_softmax_f32(TF[0], c->out32, n, cm.cols);
		else
			memcpy(c->out32, TF[0], (size_t)c->nout * sizeof(float));
	} else {
		planrt_k_causal_mask_f64(c->in[0], TD[0], cm.batch, cm.rows, cm.cols, cm.roff, cm.coff, cm.fill);
		if (cm.with_softmax)
			planrt_k_softmax_f64(TD[0], c->out, n, cm.cols);
		else
			memcpy(c->out, TD[0], (size_t)c->nout * sizeof(double));
	}
}

static void cm_bwd(Case *c)
{
	const double *g = c->dy;
	if (cm.with_softmax) {
		cm_fwd(c, 0);
		planrt_k_softmax_grad_f64(c->out, c->dy, TD[1], cm.batch * cm.rows, cm.cols);
		g = TD[1];
	}
	planrt_k_causal_mask_f64(g, c->grad[0], cm.batch, cm.rows, cm.cols, cm.roff, cm.coff, 0.0);
}

static void case_causal(const char *name, int64_t roff, int64_t coff, double fillv, int with_softmax)
{
	cm.batch = 2;
	cm.rows = 3;
	cm.cols = 5;
	cm.roff = roff;
	cm.coff = coff;
	cm.fill = fillv;
	cm.with_softmax = with_softmax;
	begin(name, 30, cm_fwd, cm_bwd);
	input("x", 30, -2, 2, 0);
	run(&C);
}

static int64_t sm_cols;

static void sm_fwd(Case *c, int f32)
{
	int64_t rows = c->nout / sm_cols;
	f32 ? planrt_k_softmax_f32(c->in32[0], c->out32, rows, sm_cols)
	    : planrt_k_softmax_f64(c->in[0], c->out, rows, sm_cols);
}

static void sm_bwd(Case *c)
{
	sm_fwd(c, 0);
	planrt_k_softmax_grad_f64(c->out, c->dy, c->grad[0], c->nout / sm_cols, sm_cols);
}

/* ---- norms --------------------------------------------------------------------------------------- */
#define NR 4
#define NC 9
static int norm_float_stats; /* use the _f64 kernels (float statistics) instead of _f64d */
static float st32a[NR], st32b[NR];
static double st64a[NR], st64b[NR];

static void ln_fwd(Case *c, int f32)
{
	if (f32)
		planrt_k_layer_norm_f32(c->in32[0], c->in32[1], c->in32[2], c->out32, st32a, st32b, NR, NC, 1e-5);
	else if (norm_float_stats)
		planrt_k_layer_norm_f64(c->in[0], c->in[1], c->in[2], c->out, st32a, st32b, NR, NC, 1e-5);
	else
		planrt_k_layer_norm_f64d(c->in[0], c->in[1], c->in[2], c->out, st64a, st64b, NR, NC, 1e-5);
}

static void ln_bwd(Case *c)
{
	ln_fwd(c, 0);
	if (norm_float_stats)
		planrt_k_layer_norm_grad_f64(c->in[0], c->in[1], st32a, st32b, c->dy, c->grad[0], c->grad[1], c->grad[2],
					     NR, NC);
	else
		planrt_k_layer_norm_grad_f64d(c->in[0], c->in[1], st64a, st64b, c->dy, c->grad[0], c->grad[1],
					      c->grad[2], NR, NC);
}

static void rms_fwd(Case *c, int f32)
{
	if (f32)
		planrt_k_rms_norm_f32(c->in32[0], c->in32[1], c->out32, st32a, NR, NC, 1e-5);
	else if (norm_float_stats)
		planrt_k_rms_norm_f64(c->in[0], c->in[1], c->out, st32a, NR, NC, 1e-5);
	else
		planrt_k_rms_norm_f64d(c->in[0], c->in[1], c->out, st64a, NR, NC, 1e-5);
}

static void rms_bwd(Case *c)
{
	rms_fwd(c, 0);
	if (norm_float_stats)
		planrt_k_rms_norm_grad_f64(c->in[0], c->in[1], st32a, c->dy, c->grad[0], c->grad[1], NR, NC);
	else
		planrt_k_rms_norm_grad_f64d(c->in[0], c->in[1], st64a, c->dy, c->grad[0], c->grad[1], NR, NC);
}

static void case_norm(const char *name, int rms, int float_stats)
{
	norm_float_stats = float_stats;
	begin(name, NR * NC, rms ? rms_fwd : ln_fwd, rms ? rms_bwd : ln_bwd);
	double *x = input("x", NR * NC, -2, 2, 0);
	for (int i = 0; i < NR * NC; i++) /* an offset mean, as real activations have */
		x[i] += 0.5;
	input("w", NC, 0.5, 1.5, 1);
	if (!rms)
		input("b", NC, -1, 1, 1);
	if (float_stats) /* statistics rounded to float cap the gradient's accuracy */
		C.fdtol = 1e-5;
	run(&C);
}

/* ---- embedding ----------------------------------------------------------------------------------- */
#define EV 7  /* rows held here: global ids [3, 10) */
#define ED 5
#define ENT 10
static const int32_t eids[ENT] = {3, 9, 0, 4, 4, 11, 9, 5, 2, 3};

static void emb_fwd(Case *c, int f32)
{
	if (f32)
		planrt_k_embed_f32(c->in32[0], eids, c->out32, ENT, ED, 3, EV);
	else
		planrt_k_embed_f64(c->in[0], eids, c->out, ENT, ED, 3, EV);
}

static void emb_bwd(Case *c)
{
	planrt_k_embed_grad_f64(eids, c->dy, c->grad[0], ENT, ED, 3, EV);
}

/* ---- cross-entropy from its pieces, optionally over two vocab blocks ------------------------------ */
#define CR 5
#define CV 11
static int ce_split; /* vocab columns [0, ce_split) and [ce_split, CV) as two ranks' blocks; 0: one block */
static int32_t ctargets[CR];

/* One template for both precisions: the program's sequence of pieces, the all-reduces done by hand. */
#define CE_FORWARD(T, ST, S, logits, LOSS)                                                                    \
	do {                                                                                                   \
		int64_t gd[2] = {CR, CV}, lo[2] = {0, ce_split ? ce_split : CV};                              \
		int nb = ce_split ? 2 : 1;                                                                     \
		ST mx[2][CR], se[2][CR], tl[2][CR], lse[CR];                                                   \
		T *blk[2] = {(T *)TD[2], (T *)TD[3]};                                                          \
		for (int k = 0; k < nb; k++) {                                                                 \
			int64_t ld[2] = {CR, k ? CV - lo[1] : lo[1]}, of[2] = {0, k ? lo[1] : 0};             \
			planrt_k_block_copy(sizeof(T), 2, gd, ld, of, (void *)(logits), blk[k], 1);           \
			planrt_k_ce_max_##S(blk[k], CR, ld[1], mx[k]);                                         \
		}                                                                                              \
		for (int r = 0; r < CR && nb == 2; r++) /* all-reduce max */                                 \
			mx[0][r] = mx[1][r] = mx[0][r] > mx[1][r] ? mx[0][r] : mx[1][r];                       \
		for (int k = 0; k < nb; k++) {                                                                 \
			int64_t w = k ? CV - lo[1] : lo[1];                                                    \
			planrt_k_ce_sumexp_##S(blk[k], mx[k], CR, w, se[k]);                                   \
			planrt_k_ce_target_##S(blk[k], ctargets, CR, w, k ? lo[1] : 0, tl[k]);                 \
		}                                                                                              \
		for (int r = 0; r < CR && nb == 2; r++) { /* all-reduce sum */                               \
			se[0][r] += se[1][r];                                                                  \
			tl[0][r] += tl[1][r];                                                                  \
		}                                                                                              \
		LOSS = planrt_k_ce_loss_##S(mx[0], se[0], tl[0], CR, lse, 1.0 / CR);                            \
		if (ce_grad_out) {                                                                             \
			for (int k = 0; k < nb; k++) {                                                         \
				int64_t ld[2] = {CR, k ? CV - lo[1] : lo[1]}, of[2] = {0, k ? lo[1] : 0};     \
				T *g = (T *)TD[4];                                                             \
				planrt_k_ce_grad_##S(blk[k], ctargets, lse, CR, ld[1], of[1], ce_dscale / CR, g); \
				planrt_k_block_copy(sizeof(T), 2, gd, ld, of, ce_grad_out, g, 0);              \
			}                                                                                      \
		}                                                                                              \
	} while (0)

static double ce_dscale;

static void ce_fwd(Case *c, int f32)
{
	void *ce_grad_out = NULL;
	if (f32) {
		double l;
		CE_FORWARD(float, float, f32, c->in32[0], l);
		c->out32[0] = (float)l;
	} else {
		CE_FORWARD(double, double, f64d, c->in[0], c->out[0]);
	}
}

static void ce_bwd(Case *c)
{
	void *ce_grad_out = c->grad[0];
	double l;
	ce_dscale = c->dy[0];
	CE_FORWARD(double, double, f64d, c->in[0], l);
	(void)l;
}

static void case_ce(const char *name, int split)
{
	ce_split = split;
	for (int r = 0; r < CR; r++)
		ctargets[r] = (int32_t)(urand(0, CV));
	ctargets[0] = split; /* one target at the block boundary */
	ctargets[1] = CV - 1;
	begin(name, 1, ce_fwd, ce_bwd);
	input("logits", CR * CV, -3, 3, 0);
	run(&C);
}

/* ---- permute ------------------------------------------------------------------------------------- */
static const int64_t pdims[4] = {2, 3, 4, 5};
static int pperm[4];

static void perm_fwd(Case *c, int f32)
{
	if (f32)
		planrt_k_permute_f32(4, pdims, pperm, c->in32[0], c->out32);
	else
		planrt_k_permute_f64(4, pdims, pperm, c->in[0], c->out);
}

static void perm_bwd(Case *c)
{
	int64_t od[4];
	int inv[4];
	for (int i = 0; i < 4; i++) {
		od[i] = pdims[pperm[i]];
		inv[pperm[i]] = i;
	}
	planrt_k_permute_f64(4, od, inv, c->dy, c->grad[0]);
}

static void case_permute(const char *name, int p0, int p1, int p2, int p3)
{
	pperm[0] = p0;
	pperm[1] = p1;
	pperm[2] = p2;
	pperm[3] = p3;
	begin(name, 120, perm_fwd, perm_bwd);
	input("x", 120, -1, 1, 0);
	run(&C);
}

/* ---- mixture of experts ---------------------------------------------------------------------------- */
#define MT 6 /* tokens: two groups of three */
#define MG 3
#define ME 4 /* experts */
#define MK 2 /* top_k */
#define MCAP 1 /* per expert and group: drops some pairs */
#define MSLOTS (ME * MCAP * (MT / MG))
#define MD 3
static int32_t midx[MT * MK];
static double mlogits[MT * ME];
static int mnorm; /* route cases: normalised gates */

static void moe_setup(void)
{
	double g[MT * MK];
	fill(mlogits, MT * ME, -2, 2);
	planrt_k_moe_route_f64(mlogits, MT, ME, MK, MG, MCAP, 0, g, midx, NULL, NULL);
}

static void disp_fwd(Case *c, int f32)
{
	if (f32)
		planrt_k_moe_dispatch_f32(c->in32[0], midx, MT, MK, MD, MSLOTS, c->out32);
	else
		planrt_k_moe_dispatch_f64(c->in[0], midx, MT, MK, MD, MSLOTS, c->out);
}

static void disp_bwd(Case *c)
{
	planrt_k_moe_dispatch_grad_f64(c->dy, midx, MT, MK, MD, c->grad[0]);
}

static void comb_fwd(Case *c, int f32)
{
	if (f32)
		planrt_k_moe_combine_f32(c->in32[0], c->in32[1], midx, MT, MK, MD, c->out32);
	else
		planrt_k_moe_combine_f64(c->in[0], c->in[1], midx, MT, MK, MD, c->out);
}

static void comb_bwd(Case *c)
{
	planrt_k_moe_combine_grad_f64(c->dy, c->in[0], c->in[1], midx, MT, MK, MD, MSLOTS, c->grad[0], c->grad[1]);
}

static void route_fwd(Case *c, int f32)
{
	int32_t idx[MT * MK];
	if (f32)
		planrt_k_moe_route_f32(c->in32[0], MT, ME, MK, MG, MCAP, mnorm, c->out32, idx, NULL, NULL);
	else
		planrt_k_moe_route_f64(c->in[0], MT, ME, MK, MG, MCAP, mnorm, c->out, idx, NULL, NULL);
}

static void route_bwd(Case *c)
{
	planrt_k_moe_route_grad_f64(c->in[0], c->dy, MT, ME, MK, mnorm, c->grad[0]);
}

static void aux_fwd(Case *c, int f32)
{
	if (f32)
		c->out32[0] = (float)planrt_k_moe_aux_loss_f32(c->in32[0], MT, ME, MG, 0.5);
	else
		c->out[0] = planrt_k_moe_aux_loss_f64(c->in[0], MT, ME, MG, 0.5);
}

static void aux_bwd(Case *c)
{
	planrt_k_moe_aux_loss_grad_f64(c->in[0], MT, ME, MG, 0.5 * c->dy[0], c->grad[0]);
}

static void zloss_fwd(Case *c, int f32)
{
	if (f32)
		c->out32[0] = (float)planrt_k_moe_z_loss_f32(c->in32[0], MT, ME, 1.0 / MT);
	else
		c->out[0] = planrt_k_moe_z_loss_f64(c->in[0], MT, ME, 1.0 / MT);
}

static void zloss_bwd(Case *c)
{
	planrt_k_moe_z_loss_grad_f64(c->in[0], MT, ME, c->dy[0] / MT, c->grad[0]);
}

/* A whole MoE layer: route, dispatch, a gelu "expert", combine; gradients to x and the logits. */
#define MOE_LAYER(T, S, x, logits, out)                                                                       \
	do {                                                                                                   \
		T *g = (T *)TD[0], *b1 = (T *)TD[1], *b2 = (T *)TD[2];                                       \
		int32_t *ix = (int32_t *)TD[3];                                                                \
		planrt_k_moe_route_##S(logits, MT, ME, MK, MG, MCAP, mnorm, g, ix, NULL, NULL);                \
		planrt_k_moe_dispatch_##S(x, ix, MT, MK, MD, MSLOTS, b1);                                      \
		planrt_k_gelu_##S(b1, b2, MSLOTS * MD, PLANRT_GELU_ERF);                                       \
		planrt_k_moe_combine_##S(b2, g, ix, MT, MK, MD, out);                                          \
	} while (0)

static void layer_fwd(Case *c, int f32)
{
	if (f32)
		MOE_LAYER(float, f32, c->in32[0], c->in32[1], c->out32);
	else
		MOE_LAYER(double, f64, c->in[0], c->in[1], c->out);
}

static void layer_bwd(Case *c)
{
	layer_fwd(c, 0); /* TD[0] gates, TD[1] buf, TD[2] gelu(buf), TD[3] idx */
	double *dgates = TD[4], *db2 = TD[5], *db1 = TD[6];
	const int32_t *ix = (const int32_t *)TD[3];
	planrt_k_moe_combine_grad_f64(c->dy, TD[2], TD[0], ix, MT, MK, MD, MSLOTS, db2, dgates);
	planrt_k_gelu_grad_f64(TD[1], db2, db1, MSLOTS * MD, PLANRT_GELU_ERF);
	planrt_k_moe_dispatch_grad_f64(db1, ix, MT, MK, MD, c->grad[0]);
	planrt_k_moe_route_grad_f64(c->in[1], dgates, MT, ME, MK, mnorm, c->grad[1]);
}

static void cases_moe(void)
{
	moe_setup();
	int dropped = 0;
	for (int i = 0; i < MT * MK; i++)
		dropped += midx[i] < 0;
	report(dropped > 0, "moe setup drops %d of %d pairs (capacity %d per expert and group of %d)", dropped, MT * MK,
	       MCAP, MG);

	begin("moe_dispatch", MSLOTS * MD, disp_fwd, disp_bwd);
	input("x", MT * MD, -1, 1, 0);
	run(&C);

	begin("moe_combine", MT * MD, comb_fwd, comb_bwd);
	input("buf", MSLOTS * MD, -1, 1, 0);
	input("gates", MT * MK, 0, 1, 0);
	run(&C);

	for (mnorm = 0; mnorm < 2; mnorm++) {
		begin(mnorm ? "moe_route (normalised gates)" : "moe_route", MT * MK, route_fwd, route_bwd);
		memcpy(input("logits", MT * ME, 0, 0, 0), mlogits, sizeof mlogits);
		run(&C);
	}

	begin("moe_aux_loss (per group)", 1, aux_fwd, aux_bwd);
	memcpy(input("logits", MT * ME, 0, 0, 0), mlogits, sizeof mlogits);
	run(&C);

	begin("moe_z_loss", 1, zloss_fwd, zloss_bwd);
	memcpy(input("logits", MT * ME, 0, 0, 0), mlogits, sizeof mlogits);
	run(&C);

	for (mnorm = 0; mnorm < 2; mnorm++) {
		begin(mnorm ? "moe layer (route..combine, normalised gates)" : "moe layer (route..combine)", MT * MD,
		      layer_fwd, layer_bwd);
		input("x", MT * MD, -1, 1, 0);
		memcpy(input("logits", MT * ME, 0, 0, 0), mlogits, sizeof mlogits);
		run(&C);
	}
}

int main(void)
{
	case_matmul("matmul nn", 1, 3, 4, 5, 0, 0, 0);
	case_matmul("matmul nt", 1, 3, 4, 5, 0, 1, 0);
	case_matmul("matmul tn", 1, 3, 4, 5, 1, 0, 0);
	case_matmul("matmul tt", 1, 3, 4, 5, 1, 1, 0);
	case_matmul("matmul batched nn", 3, 2, 4, 3, 0, 0, 0);
	case_matmul("matmul batched tt", 3, 2, 4, 3, 1, 1, 0);
	case_matmul("matmul bcast-B nn", 3, 2, 4, 3, 0, 0, 1);
	case_matmul("matmul bcast-B nt", 3, 2, 4, 3, 0, 1, 1);
	case_matmul("matmul bcast-B tn", 3, 2, 4, 3, 1, 0, 1);
	cases_bmm();
	cases_binary();
	case_act("scale", ACT_SCALE, 0);
	case_act("gelu erf", ACT_GELU, PLANRT_GELU_ERF);
	case_act("gelu tanh", ACT_GELU, PLANRT_GELU_TANH);
	case_act("relu", ACT_RELU, 0);
	case_act("silu", ACT_SILU, 0);
	case_unary("sin", PLANRT_SIN, -4, 4);
	case_unary("cos", PLANRT_COS, -4, 4);
	case_unary("exp", PLANRT_EXP, -4, 4);
	case_unary("log", PLANRT_LOG, 0.05, 4);
	case_unary("tanh", PLANRT_TANH, -4, 4);
	case_unary("sigmoid", PLANRT_SIGMOID, -6, 6);

	case_reduce("sum_dim [3,5,4] dim 1", 0, 3, 5, 4, 1.0);
	case_reduce("mean_dim [3,11] dim 1", 0, 3, 11, 1, 1.0 / 11);
	case_reduce("max_dim [3,5,4] dim 1", 1, 3, 5, 4, 0);
	case_reduce("max_dim [4,9] dim 1", 1, 4, 9, 1, 0);
	case_slice("slice [3,6,4] dim 1 [2:5]", 3, 6, 4, 2, 3, 0);
	case_slice("slice [3,6,4] dim 1 [2:5] (acc)", 3, 6, 4, 2, 3, 1);
	case_slice("index [3,6,4] [:, 0] ([CLS])", 3, 6, 4, 0, 1, 0);
	case_slice("index [4,5] [:, 4] (acc)", 4, 5, 1, 4, 1, 1);
	begin("concat 3 inputs dim 1", 2 * 6 * 3, cat_fwd, cat_bwd);
	input("x0", 2 * 1 * 3, -1, 1, 0);
	input("x1", 2 * 3 * 3, -1, 1, 0);
	input("x2", 2 * 2 * 3, -1, 1, 0);
	run(&C);
	sh.outer = 2 * 3;
	sh.n = 2;
	sh.rep = 3;
	sh.inner = 4;
	begin("repeat_kv [2,3,2,4] n_rep 3", 6 * 2 * 3 * 4, rkv_fwd, rkv_bwd);
	input("x", 6 * 2 * 4, -1, 1, 0);
	run(&C);
	cases_rope();
	case_ploss("mse_loss", 0);
	case_ploss("l1_loss", 1);
	begin("cross_entropy classes (f64d)", 1, xent_fwd, xent_bwd);
	input("logits", XR * XC, -3, 3, 0);
	run(&C);

	begin("dropout (fixed mask)", 30, drop_fwd, drop_bwd);
	input("x", 30, -1, 1, 0);
	run(&C);

	case_causal("causal_mask", 2, 1, 0.25, 0);
	case_causal("causal_mask (row_off<col)", 0, 2, 0.25, 0);
	case_causal("causal_mask + softmax", 2, 1, -INFINITY, 1);
	sm_cols = 7;
	begin("softmax [4,7]", 28, sm_fwd, sm_bwd);
	input("x", 28, -3, 3, 0);
	run(&C);
	sm_cols = 19;
	begin("softmax [3,19]", 57, sm_fwd, sm_bwd);
	input("x", 57, -3, 3, 0);
	run(&C);

	case_norm("layer_norm (f64d)", 0, 0);
	case_norm("layer_norm (f64)", 0, 1);
	case_norm("rms_norm (f64d)", 1, 0);
	case_norm("rms_norm (f64)", 1, 1);

	begin("embed", ENT * ED, emb_fwd, emb_bwd);
	input("table", EV * ED, -1, 1, 1);
	run(&C);

	case_ce("cross_entropy", 0);
	case_ce("cross_entropy vocab 5+6", 5);

	case_permute("permute (2,0,3,1)", 2, 0, 3, 1);
	case_permute("permute (0,2,1,3)", 0, 2, 1, 3);
	case_permute("permute (3,2,1,0)", 3, 2, 1, 0);
	case_permute("transpose 1<->3 (0,3,2,1)", 0, 3, 2, 1);
	case_permute("transpose 0<->1 (1,0,2,3)", 1, 0, 2, 3);

	cases_moe();

	printf("worst finite-difference error over all kernels: %.2e\n", worst_kernel_err);
	printf("%d passed, %d failed\n", npass, nfail);
	return nfail != 0;
}
