/* kernels_impl.h: the typed kernels, included by kernels.c once per instantiation (no include guard).
 * The includer defines
 *   T      the element type (float, double)
 *   ST     the type of saved statistics (mean, rstd, rowmax, sumexp, tlogit, lse)
 *   S      the name suffix (f32, f64, f64d)
 *   KEXP KLOG KERF KTANH KSQRT KSIN KCOS KPOW   the math functions for T, KGEMM the cblas gemm
 *   KI_STATS_ONLY   defined: only the kernels that take statistics (the _f64d set)
 *   KLEVEL(name, (args)), KLEVEL_VALUE   each public kernel's first statement: hands the call to
 *                   the running instruction-set level's build of it (cpu_table.h), or nothing
 * and FN(name) (name_S), and provides KView, kfatal, kstrides and the dropout mask helpers. Static
 * helpers carry the suffix too so that instantiations do not collide. */

/* Sum of n values with eight partial sums: vectorises without reassociation flags. */
static inline T FN(ksum)(const T *x, int64_t n)
{
	T acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
	int64_t i = 0;
	for (; i + 8 <= n; i += 8)
		for (int j = 0; j < 8; j++)
			acc[j] += x[i + j];
	T s = 0;
	for (; i < n; i++)
		s += x[i];
	return s + ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

static inline T FN(kdot)(const T *x, const T *y, int64_t n)
{
	T acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
	int64_t i = 0;
	for (; i + 8 <= n; i += 8)
		for (int j = 0; j < 8; j++)
			acc[j] += x[i + j] * y[i + j];
	T s = 0;
	for (; i < n; i++)
		s += x[i] * y[i];
	return s + ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* Largest of n >= 1 values (NaN-propagating like torch.max when a NaN comes first or last aside,
 * which the kernels do not rely on). */
static inline T FN(kmax)(const T *x, int64_t n)
{
	T acc[8];
	for (int j = 0; j < 8; j++)
		acc[j] = x[0];
	int64_t i = 0;
	for (; i + 8 <= n; i += 8)
		for (int j = 0; j < 8; j++)
			acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
	T m = acc[0];
	for (int j = 1; j < 8; j++)
		m = acc[j] > m ? acc[j] : m;
	for (; i < n; i++)
		m = x[i] > m ? x[i] : m;
	return m;
}

#ifndef KI_STATS_ONLY

/* ---- matmul ---------------------------------------------------------------------------------- */
static inline void FN(kgemm)(int ta, int tb, int64_t M, int64_t N, int64_t K, const T *A, const T *B, T *C, T beta)
{
	int lda = (int)(ta ? M : K), ldb = (int)(tb ? K : N), ldc = (int)N;
	planrt_comm_progress_(); /* a transfer in flight moves before the GEMM, not after it (planrt.h) */
	if (planrt_tracing_) /* --trace: every GEMM is a kernel event */
		planrt_trace_begin_("gemm", "kernel");
	KGEMM(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K,
	      (T)1, A, lda > 0 ? lda : 1, B, ldb > 0 ? ldb : 1, beta, C, ldc);
	if (planrt_tracing_) {
		char args[160];
		snprintf(args, sizeof args, "\"M\":%lld,\"N\":%lld,\"K\":%lld,\"flops\":%.0f,\"dtype\":\"%s\"", (long long)M,
			 (long long)N, (long long)K, 2.0 * (double)M * (double)N * (double)K, sizeof(T) == 8 ? "f64" : "f32");
		planrt_trace_end_(args);
	}
}

/* The batch dims go through a KView (size-1 dims dropped, dims that every operand walks contiguously
 * merged); along the innermost one, two patterns become one gemm: a shared B under row-major A blocks
 * laid end to end (one tall gemm: a linear layer), and a sum into one C of A_i^T B_i over blocks laid
 * end to end (one gemm over the stacked K: a weight gradient). */
void FN(planrt_k_bmm)(int batch_rank, const int64_t *batch_dims, int64_t M, int64_t N, int64_t K, const T *A,
		      int trans_a, const int64_t *a_strides, const T *B, int trans_b, const int64_t *b_strides, T *C,
		      const int64_t *c_strides, int accumulate)
{
	KLEVEL(planrt_k_bmm,
	       (batch_rank, batch_dims, M, N, K, A, trans_a, a_strides, B, trans_b, b_strides, C, c_strides, accumulate));
	if (M <= 0 || N <= 0)
		return;
	KView v;
	kview_init(&v, batch_rank, batch_dims, 3, c_strides, a_strides, b_strides);
	if (v.total == 0)
		return;
	int64_t n = v.dims[v.rank - 1], sc = v.st[0][v.rank - 1], sa = v.st[1][v.rank - 1], sb = v.st[2][v.rank - 1];
	int reduces = 0;
	for (int d = 0; d < v.rank; d++)
		reduces |= v.dims[d] > 1 && v.st[0][d] == 0;
	T beta = accumulate ? (T)1 : (T)0;
	if (reduces && !accumulate) { /* zero every C block, then add each product */
		KView z = v;
		for (int64_t done = 0; done < z.total; done += n) {
			for (int64_t j = 0; j < n; j++)
				memset(C + z.off[0] + j * sc, 0, (size_t)(M * N) * sizeof(T));
			kview_next(&z);
		}
		beta = 1;
	}
	for (int64_t done = 0; done < v.total; done += n) {
		const T *a = A + v.off[1], *b = B + v.off[2];
		T *c = C + v.off[0];
		if (n > 1 && sb == 0 && !trans_a && sa == M * K && sc == M * N)
			FN(kgemm)(0, trans_b, n * M, N, K, a, b, c, beta);
		else if (n > 1 && sc == 0 && trans_a && !trans_b && sa == K * M && sb == K * N)
			FN(kgemm)(1, 0, M, N, n * K, a, b, c, beta);
		else
			for (int64_t j = 0; j < n; j++)
				FN(kgemm)(trans_a, trans_b, M, N, K, a + j * sa, b + j * sb, c + j * sc, beta);
		kview_next(&v);
	}
}

void FN(planrt_k_matmul)(int64_t batch, int64_t M, int64_t N, int64_t K, const T *A, int trans_a, int64_t stride_a,
			 const T *B, int trans_b, int64_t stride_b, T *C, int64_t stride_c, int accumulate)
{
	KLEVEL(planrt_k_matmul, (batch, M, N, K, A, trans_a, stride_a, B, trans_b, stride_b, C, stride_c, accumulate));
	if (batch <= 0)
		return;
	FN(planrt_k_bmm)(1, &batch, M, N, K, A, trans_a, &stride_a, B, trans_b, &stride_b, C, &stride_c, accumulate);
}

/* ---- element-wise with broadcasting ------------------------------------------------------------- */
#define KI_ROW(EXPR)                                                                                           \
	do {                                                                                                   \
		if (sa == 1 && sb == 1) {                                                                      \
			for (int64_t i = 0; i < n; i++) {                                                      \
				T x = a[i], y = b[i];                                                          \
				o[i] = EXPR;                                                                   \
			}                                                                                      \
		} else if (sa == 1 && sb == 0) {                                                               \
			T y = b[0];                                                                            \
			for (int64_t i = 0; i < n; i++) {                                                      \
				T x = a[i];                                                                    \
				o[i] = EXPR;                                                                   \
			}                                                                                      \
		} else if (sa == 0 && sb == 1) {                                                               \
			T x = a[0];                                                                            \
			for (int64_t i = 0; i < n; i++) {                                                      \
				T y = b[i];                                                                    \
				o[i] = EXPR;                                                                   \
			}                                                                                      \
		} else {                                                                                       \
			for (int64_t i = 0; i < n; i++) {                                                      \
				T x = a[i * sa], y = b[i * sb];                                                \
				o[i] = EXPR;                                                                   \
			}                                                                                      \
		}                                                                                              \
	} while (0)

static void FN(kbinary_row)(int op, int64_t n, const T *a, int64_t sa, const T *b, int64_t sb, T *o)
{
	switch (op) {
	case PLANRT_ADD:
		KI_ROW(x + y);
		break;
	case PLANRT_SUB:
		KI_ROW(x - y);
		break;
	case PLANRT_MUL:
		KI_ROW(x * y);
		break;
	case PLANRT_DIV:
		KI_ROW(x / y);
		break;
	default:
		kfatal("binary: unknown op");
	}
}
#undef KI_ROW

void FN(planrt_k_binary)(int op, int rank, const int64_t *dims, const T *a, const int64_t *a_strides, const T *b,
			 const int64_t *b_strides, T *out)
{
	KLEVEL(planrt_k_binary, (op, rank, dims, a, a_strides, b, b_strides, out));
	int64_t ost[KMAX_RANK];
	if (rank < 0 || rank > KMAX_RANK)
		kfatal("binary rank out of range");
	kstrides(rank, dims, ost);
	KView v;
	kview_init(&v, rank, dims, 3, ost, a_strides, b_strides);
	if (v.total == 0)
		return;
	int64_t n = v.dims[v.rank - 1], sa = v.st[1][v.rank - 1], sb = v.st[2][v.rank - 1];
	for (int64_t done = 0; done < v.total; done += n) {
		FN(kbinary_row)(op, n, a + v.off[1], sa, b + v.off[2], sb, out + v.off[0]);
		kview_next(&v);
	}
}

/* out (+)= in summed over the dims where out_strides is 0. */
static void FN(ksum_to_into)(int rank, const int64_t *dims, const T *in, const int64_t *out_strides, T *out,
			     int64_t out_elems, int accumulate)
{
	int64_t ist[KMAX_RANK];
	if (rank < 0 || rank > KMAX_RANK)
		kfatal("sum_to rank out of range");
	if (!accumulate)
		for (int64_t i = 0; i < out_elems; i++)
			out[i] = 0;
	kstrides(rank, dims, ist);
	KView v;
	kview_init(&v, rank, dims, 2, ist, out_strides, NULL);
	if (v.total == 0)
		return;
	int64_t n = v.dims[v.rank - 1], os = v.st[1][v.rank - 1];
	for (int64_t done = 0; done < v.total; done += n) {
		const T *x = in + v.off[0];
		T *o = out + v.off[1];
		if (os == 0) {
			o[0] += FN(ksum)(x, n);
		} else if (os == 1) {
			for (int64_t i = 0; i < n; i++)
				o[i] += x[i];
		} else {
			for (int64_t i = 0; i < n; i++)
				o[i * os] += x[i];
		}
		kview_next(&v);
	}
}

void FN(planrt_k_sum_to)(int rank, const int64_t *dims, const T *in, const int64_t *out_strides, T *out,
			 int64_t out_elems)
{
	KLEVEL(planrt_k_sum_to, (rank, dims, in, out_strides, out, out_elems));
	FN(ksum_to_into)(rank, dims, in, out_strides, out, out_elems, 0);
}

void FN(planrt_k_sum_to_acc)(int rank, const int64_t *dims, const T *in, const int64_t *out_strides, T *out,
			     int64_t out_elems)
{
	KLEVEL(planrt_k_sum_to_acc, (rank, dims, in, out_strides, out, out_elems));
	FN(ksum_to_into)(rank, dims, in, out_strides, out, out_elems, 1);
}

void FN(planrt_k_scale)(const T *x, T *y, int64_t n, double alpha)
{
	KLEVEL(planrt_k_scale, (x, y, n, alpha));
	T a = (T)alpha;
	for (int64_t i = 0; i < n; i++)
		y[i] = a * x[i];
}

/* ---- activations ------------------------------------------------------------------------------ */
#define KI_SQRT1_2 0.70710678118654752440
#define KI_SQRT2_PI 0.79788456080286535588  /* sqrt(2 / pi) */
#define KI_INV_SQRT2PI 0.39894228040143267794 /* 1 / sqrt(2 pi) */

void FN(planrt_k_gelu)(const T *x, T *y, int64_t n, int approx)
{
	KLEVEL(planrt_k_gelu, (x, y, n, approx));
	if (approx == PLANRT_GELU_TANH) {
		const T c = (T)KI_SQRT2_PI, k = (T)0.044715;
		for (int64_t i = 0; i < n; i++) {
			T v = x[i];
			T u = c * (v + k * v * v * v);
			/* tanh(u) = 1 - 2 / (exp(2u) + 1), finite at both ends */
			T t = 1 - 2 / (KEXP(2 * u) + 1);
			y[i] = (T)0.5 * v * (1 + t);
		}
	} else {
		for (int64_t i = 0; i < n; i++) {
			T v = x[i];
			y[i] = (T)0.5 * v * (1 + KERF(v * (T)KI_SQRT1_2));
		}
	}
}

void FN(planrt_k_gelu_grad)(const T *x, const T *dy, T *dx, int64_t n, int approx)
{
	KLEVEL(planrt_k_gelu_grad, (x, dy, dx, n, approx));
	if (approx == PLANRT_GELU_TANH) {
		const T c = (T)KI_SQRT2_PI, k = (T)0.044715;
		for (int64_t i = 0; i < n; i++) {
			T v = x[i];
			T u = c * (v + k * v * v * v);
			T t = 1 - 2 / (KEXP(2 * u) + 1);
			T du = c * (1 + 3 * k * v * v);
			dx[i] = dy[i] * ((T)0.5 * (1 + t) + (T)0.5 * v * (1 - t * t) * du);
		}
	} else {
		for (int64_t i = 0; i < n; i++) {
			T v = x[i];
			T cdf = (T)0.5 * (1 + KERF(v * (T)KI_SQRT1_2));
			T pdf = (T)KI_INV_SQRT2PI * KEXP((T)-0.5 * v * v);
			dx[i] = dy[i] * (cdf + v * pdf);
		}
	}
}

void FN(planrt_k_relu)(const T *x, T *y, int64_t n)
{
	KLEVEL(planrt_k_relu, (x, y, n));
	for (int64_t i = 0; i < n; i++)
		y[i] = x[i] < 0 ? (T)0 : x[i]; /* NaN passes through, as torch.relu */
}

void FN(planrt_k_relu_grad)(const T *y, const T *dy, T *dx, int64_t n)
{
	KLEVEL(planrt_k_relu_grad, (y, dy, dx, n));
	for (int64_t i = 0; i < n; i++)
		dx[i] = y[i] > 0 ? dy[i] : (T)0;
}

void FN(planrt_k_silu)(const T *x, T *y, int64_t n)
{
	KLEVEL(planrt_k_silu, (x, y, n));
	for (int64_t i = 0; i < n; i++)
		y[i] = x[i] / (1 + KEXP(-x[i]));
}

void FN(planrt_k_silu_grad)(const T *x, const T *dy, T *dx, int64_t n)
{
	KLEVEL(planrt_k_silu_grad, (x, dy, dx, n));
	for (int64_t i = 0; i < n; i++) {
		T s = 1 / (1 + KEXP(-x[i]));
		dx[i] = dy[i] * (s * (1 + x[i] * (1 - s)));
	}
}

void FN(planrt_k_unary)(int op, const T *x, T *y, int64_t n)
{
	KLEVEL(planrt_k_unary, (op, x, y, n));
	switch (op) {
	case PLANRT_SIN:
		for (int64_t i = 0; i < n; i++)
			y[i] = KSIN(x[i]);
		break;
	case PLANRT_COS:
		for (int64_t i = 0; i < n; i++)
			y[i] = KCOS(x[i]);
		break;
	case PLANRT_EXP:
		for (int64_t i = 0; i < n; i++)
			y[i] = KEXP(x[i]);
		break;
	case PLANRT_LOG:
		for (int64_t i = 0; i < n; i++)
			y[i] = KLOG(x[i]);
		break;
	case PLANRT_TANH:
		for (int64_t i = 0; i < n; i++)
			y[i] = KTANH(x[i]);
		break;
	case PLANRT_SIGMOID:
		for (int64_t i = 0; i < n; i++)
			y[i] = 1 / (1 + KEXP(-x[i]));
		break;
	default:
		kfatal("unary: unknown op");
	}
}

void FN(planrt_k_unary_grad)(int op, const T *x, const T *dy, T *dx, int64_t n)
{
	KLEVEL(planrt_k_unary_grad, (op, x, dy, dx, n));
	switch (op) {
	case PLANRT_SIN:
		for (int64_t i = 0; i < n; i++)
			dx[i] = dy[i] * KCOS(x[i]);
		break;
	case PLANRT_COS:
		for (int64_t i = 0; i < n; i++)
			dx[i] = -dy[i] * KSIN(x[i]);
		break;
	case PLANRT_EXP:
		for (int64_t i = 0; i < n; i++)
			dx[i] = dy[i] * KEXP(x[i]);
		break;
	case PLANRT_LOG:
		for (int64_t i = 0; i < n; i++)
			dx[i] = dy[i] / x[i];
		break;
	case PLANRT_TANH:
		for (int64_t i = 0; i < n; i++) {
			T t = KTANH(x[i]);
			dx[i] = dy[i] * (1 - t * t);
		}
		break;
	case PLANRT_SIGMOID:
		for (int64_t i = 0; i < n; i++) {
			T s = 1 / (1 + KEXP(-x[i]));
			dx[i] = dy[i] * s * (1 - s);
		}
		break;
	default:
		kfatal("unary_grad: unknown op");
	}
}

/* ---- dropout ----------------------------------------------------------------------------------- */
/* p >= 1 drops everything (torch returns zeros rather than 0 * inf). */
static T FN(kdropout_scale)(double p)
{
	return p >= 1 ? (T)0 : (T)(1.0 / (1.0 - p));
}

void FN(planrt_k_dropout)(const T *x, T *y, uint8_t *mask, double p, uint64_t seed, uint64_t key, int rank,
			  const int64_t *gdims, const int64_t *ldims, const int64_t *offs)
{
	KLEVEL(planrt_k_dropout, (x, y, mask, p, seed, key, rank, gdims, ldims, offs));
	if (planrt_evaluating_) /* evaluation: the identity (kernels.c) */
		p = 0;
	int64_t n = dropout_mask(mask, p, seed, key, rank, gdims, ldims, offs);
	T sc = FN(kdropout_scale)(p);
	for (int64_t i = 0; i < n; i++)
		y[i] = mask[i] ? x[i] * sc : (T)0;
}

void FN(planrt_k_dropout_grad)(const uint8_t *mask, const T *dy, T *dx, int64_t n, double p)
{
	KLEVEL(planrt_k_dropout_grad, (mask, dy, dx, n, p));
	T sc = FN(kdropout_scale)(p);
	for (int64_t i = 0; i < n; i++)
		dx[i] = mask[i] ? dy[i] * sc : (T)0;
}

/* ---- attention pieces ----------------------------------------------------------------------------- */
void FN(planrt_k_causal_mask)(const T *x, T *y, int64_t batch, int64_t rows, int64_t cols, int64_t row_off,
			      int64_t col_off, T fill)
{
	KLEVEL(planrt_k_causal_mask, (x, y, batch, rows, cols, row_off, col_off, fill));
	for (int64_t b = 0; b < batch; b++) {
		for (int64_t r = 0; r < rows; r++) {
			const T *xr = x + (b * rows + r) * cols;
			T *yr = y + (b * rows + r) * cols;
			/* local cols j < keep are kept: global col_off + j <= row_off + r */
			int64_t keep = row_off + r - col_off + 1;
			keep = keep < 0 ? 0 : (keep > cols ? cols : keep);
			if (yr != xr)
				for (int64_t j = 0; j < keep; j++)
					yr[j] = xr[j];
			for (int64_t j = keep; j < cols; j++)
				yr[j] = fill;
		}
	}
}

void FN(planrt_k_softmax)(const T *x, T *y, int64_t rows, int64_t cols)
{
	KLEVEL(planrt_k_softmax, (x, y, rows, cols));
	for (int64_t r = 0; r < rows; r++) {
		const T *xr = x + r * cols;
		T *yr = y + r * cols;
		T m = FN(kmax)(xr, cols);
		for (int64_t j = 0; j < cols; j++)
			yr[j] = KEXP(xr[j] - m);
		T inv = 1 / FN(ksum)(yr, cols);
		for (int64_t j = 0; j < cols; j++)
			yr[j] *= inv;
	}
}

void FN(planrt_k_softmax_grad)(const T *y, const T *dy, T *dx, int64_t rows, int64_t cols)
{
	KLEVEL(planrt_k_softmax_grad, (y, dy, dx, rows, cols));
	for (int64_t r = 0; r < rows; r++) {
		const T *yr = y + r * cols, *gr = dy + r * cols;
		T *dr = dx + r * cols;
		T s = FN(kdot)(yr, gr, cols);
		for (int64_t j = 0; j < cols; j++)
			dr[j] = yr[j] * (gr[j] - s);
	}
}

#endif /* !KI_STATS_ONLY */

/* ---- kernels with saved statistics ---------------------------------------------------------------
 * Declared with float statistics for _f32 and _f64 and double ones for _f64d. w, b may be NULL
 * (no affine part) and then dw, db too. */
/* layer norm's arguments, for its row chunks on planrt's threads */
typedef struct FN(LayerNormJob) {
	const T *x, *w, *b, *dy;
	T *y, *dx, *dw, *db;
	ST *mean, *rstd;
	const ST *cmean, *crstd;
	int64_t rows, cols;
	double eps;
} FN(LayerNormJob);

static void FN(layer_norm_rows)(void *ctx, int64_t lo, int64_t hi, int thread)
{
	const FN(LayerNormJob) *j = ctx;
	const T *w = j->w, *b = j->b;
	int64_t cols = j->cols;
	(void)thread;
	for (int64_t r = lo; r < hi; r++) {
		const T *xr = j->x + r * cols;
		T *yr = j->y + r * cols;
		T mu = FN(ksum)(xr, cols) / (T)cols;
		for (int64_t c = 0; c < cols; c++)
			yr[c] = xr[c] - mu;
		T var = FN(kdot)(yr, yr, cols) / (T)cols; /* biased, as torch */
		T rs = 1 / KSQRT(var + (T)j->eps);
		if (w && b)
			for (int64_t c = 0; c < cols; c++)
				yr[c] = yr[c] * rs * w[c] + b[c];
		else if (w)
			for (int64_t c = 0; c < cols; c++)
				yr[c] = yr[c] * rs * w[c];
		else
			for (int64_t c = 0; c < cols; c++)
				yr[c] = yr[c] * rs + (b ? b[c] : (T)0);
		j->mean[r] = (ST)mu;
		j->rstd[r] = (ST)rs;
	}
}

/* rows split over planrt's threads (independent rows: the same bits at every thread count) */
void FN(planrt_k_layer_norm)(const T *x, const T *w, const T *b, T *y, ST *mean, ST *rstd, int64_t rows,
			     int64_t cols, double eps)
{
	KLEVEL(planrt_k_layer_norm, (x, w, b, y, mean, rstd, rows, cols, eps));
	FN(LayerNormJob) job = {.x = x, .w = w, .b = b, .y = y, .mean = mean, .rstd = rstd, .rows = rows, .cols = cols,
				.eps = eps};
	planrt_parallel_for(rows, FN(layer_norm_rows), &job);
}

/* dx of rows [lo, hi) */
static void FN(layer_norm_grad_rows)(void *ctx, int64_t lo, int64_t hi, int thread)
{
	const FN(LayerNormJob) *jb = ctx;
	const T *w = jb->w;
	int64_t cols = jb->cols;
	(void)thread;
	for (int64_t r = lo; r < hi; r++) {
		const T *xr = jb->x + r * cols, *gr = jb->dy + r * cols;
		T *dr = jb->dx + r * cols;
		T mu = (T)jb->cmean[r], rs = (T)jb->crstd[r];
		T sg[8] = {0, 0, 0, 0, 0, 0, 0, 0}, sgx[8] = {0, 0, 0, 0, 0, 0, 0, 0};
		int64_t j = 0;
		for (; j + 8 <= cols; j += 8)
			for (int k = 0; k < 8; k++) {
				T g = gr[j + k] * (w ? w[j + k] : (T)1);
				sg[k] += g;
				sgx[k] += g * (xr[j + k] - mu);
			}
		for (; j < cols; j++) {
			T g = gr[j] * (w ? w[j] : (T)1);
			sg[0] += g;
			sgx[0] += g * (xr[j] - mu);
		}
		T mg = FN(ksum)(sg, 8) / (T)cols, mgx = FN(ksum)(sgx, 8) * rs / (T)cols;
		if (w)
			for (j = 0; j < cols; j++) {
				T xh = (xr[j] - mu) * rs;
				dr[j] = rs * (gr[j] * w[j] - mg - xh * mgx);
			}
		else
			for (j = 0; j < cols; j++) {
				T xh = (xr[j] - mu) * rs;
				dr[j] = rs * (gr[j] - mg - xh * mgx);
			}
	}
}

/* dw and db of column blocks [lo, hi) of KCOL_BLOCK columns (a multiple of every vector width):
 * each column sums the rows in row order, as one thread does */
#define KCOL_BLOCK 64
static void FN(layer_norm_grad_cols)(void *ctx, int64_t lo, int64_t hi, int thread)
{
	const FN(LayerNormJob) *jb = ctx;
	int64_t c0 = lo * KCOL_BLOCK, c1 = hi * KCOL_BLOCK < jb->cols ? hi * KCOL_BLOCK : jb->cols;
	(void)thread;
	for (int64_t r = 0; r < jb->rows; r++) {
		const T *xr = jb->x + r * jb->cols, *gr = jb->dy + r * jb->cols;
		T mu = (T)jb->cmean[r], rs = (T)jb->crstd[r];
		if (jb->dw)
			for (int64_t j = c0; j < c1; j++)
				jb->dw[j] += gr[j] * (xr[j] - mu) * rs;
		if (jb->db)
			for (int64_t j = c0; j < c1; j++)
				jb->db[j] += gr[j];
	}
}

/* dx = rstd (g - mean(g) - xhat mean(g xhat)) with g = dy w, xhat = (x - mean) rstd; dw += dy xhat,
 * db += dy. dx splits over planrt's threads by rows, dw and db by columns. */
void FN(planrt_k_layer_norm_grad)(const T *x, const T *w, const ST *mean, const ST *rstd, const T *dy, T *dx, T *dw,
				  T *db, int64_t rows, int64_t cols)
{
	KLEVEL(planrt_k_layer_norm_grad, (x, w, mean, rstd, dy, dx, dw, db, rows, cols));
	FN(LayerNormJob) job = {.x = x, .w = w, .dy = dy, .dx = dx, .dw = dw, .db = db, .cmean = mean, .crstd = rstd,
				.rows = rows, .cols = cols};
	planrt_parallel_for(rows, FN(layer_norm_grad_rows), &job);
	if (dw || db)
		planrt_parallel_for((cols + KCOL_BLOCK - 1) / KCOL_BLOCK, FN(layer_norm_grad_cols), &job);
}

/* torch.nn.functional.rms_norm: y = x / sqrt(mean(x^2) + eps) * w. */
void FN(planrt_k_rms_norm)(const T *x, const T *w, T *y, ST *rstd, int64_t rows, int64_t cols, double eps)
{
	KLEVEL(planrt_k_rms_norm, (x, w, y, rstd, rows, cols, eps));
	for (int64_t r = 0; r < rows; r++) {
		const T *xr = x + r * cols;
		T *yr = y + r * cols;
		T rs = 1 / KSQRT(FN(kdot)(xr, xr, cols) / (T)cols + (T)eps);
		if (w)
			for (int64_t j = 0; j < cols; j++)
				yr[j] = xr[j] * rs * w[j];
		else
			for (int64_t j = 0; j < cols; j++)
				yr[j] = xr[j] * rs;
		rstd[r] = (ST)rs;
	}
}

/* dx = rstd (g - xhat mean(g xhat)) with g = dy w, xhat = x rstd; dw += dy xhat. */
void FN(planrt_k_rms_norm_grad)(const T *x, const T *w, const ST *rstd, const T *dy, T *dx, T *dw, int64_t rows,
				int64_t cols)
{
	KLEVEL(planrt_k_rms_norm_grad, (x, w, rstd, dy, dx, dw, rows, cols));
	for (int64_t r = 0; r < rows; r++) {
		const T *xr = x + r * cols, *gr = dy + r * cols;
		T *dr = dx + r * cols;
		T rs = (T)rstd[r];
		T sgx[8] = {0, 0, 0, 0, 0, 0, 0, 0};
		int64_t j = 0;
		for (; j + 8 <= cols; j += 8)
			for (int k = 0; k < 8; k++)
				sgx[k] += gr[j + k] * (w ? w[j + k] : (T)1) * xr[j + k];
		for (; j < cols; j++)
			sgx[0] += gr[j] * (w ? w[j] : (T)1) * xr[j];
		T c = FN(ksum)(sgx, 8) * rs * rs / (T)cols;
		if (w)
			for (j = 0; j < cols; j++)
				dr[j] = rs * (gr[j] * w[j] - xr[j] * c);
		else
			for (j = 0; j < cols; j++)
				dr[j] = rs * (gr[j] - xr[j] * c);
		if (dw)
			for (j = 0; j < cols; j++)
				dw[j] += gr[j] * xr[j] * rs;
	}
}

/* ---- cross-entropy pieces ------------------------------------------------------------------------ */
void FN(planrt_k_ce_max)(const T *logits, int64_t rows, int64_t cols, ST *rowmax)
{
	KLEVEL(planrt_k_ce_max, (logits, rows, cols, rowmax));
	for (int64_t r = 0; r < rows; r++)
		rowmax[r] = cols > 0 ? (ST)FN(kmax)(logits + r * cols, cols) : (ST)-INFINITY;
}

/* sum of exp(x - m) over one row */
static inline T FN(ksumexp)(const T *xr, T m, int64_t cols)
{
	T acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
	int64_t j = 0;
	for (; j + 8 <= cols; j += 8)
		for (int k = 0; k < 8; k++)
			acc[k] += KEXP(xr[j + k] - m);
	for (; j < cols; j++)
		acc[0] += KEXP(xr[j] - m);
	return FN(ksum)(acc, 8);
}

void FN(planrt_k_ce_sumexp)(const T *logits, const ST *rowmax, int64_t rows, int64_t cols, ST *sumexp)
{
	KLEVEL(planrt_k_ce_sumexp, (logits, rowmax, rows, cols, sumexp));
	for (int64_t r = 0; r < rows; r++)
		sumexp[r] = (ST)FN(ksumexp)(logits + r * cols, (T)rowmax[r], cols);
}

void FN(planrt_k_ce_target)(const T *logits, const int32_t *targets, int64_t rows, int64_t cols, int64_t vocab_lo,
			    ST *tlogit)
{
	KLEVEL(planrt_k_ce_target, (logits, targets, rows, cols, vocab_lo, tlogit));
	for (int64_t r = 0; r < rows; r++) {
		int64_t c = (int64_t)targets[r] - vocab_lo;
		tlogit[r] = c >= 0 && c < cols ? (ST)logits[r * cols + c] : (ST)0;
	}
}

double FN(planrt_k_ce_loss)(const ST *rowmax, const ST *sumexp, const ST *tlogit, int64_t rows, ST *lse,
			    double scale)
{
	KLEVEL_VALUE(planrt_k_ce_loss, (rowmax, sumexp, tlogit, rows, lse, scale));
	double loss = 0;
	for (int64_t r = 0; r < rows; r++) {
		double l = (double)rowmax[r] + log((double)sumexp[r]);
		lse[r] = (ST)l;
		loss += l - (double)tlogit[r];
	}
	return loss * scale;
}

void FN(planrt_k_ce_grad)(const T *logits, const int32_t *targets, const ST *lse, int64_t rows, int64_t cols,
			  int64_t vocab_lo, double dscale, T *dlogits)
{
	KLEVEL(planrt_k_ce_grad, (logits, targets, lse, rows, cols, vocab_lo, dscale, dlogits));
	T ds = (T)dscale;
	for (int64_t r = 0; r < rows; r++) {
		const T *xr = logits + r * cols;
		T *dr = dlogits + r * cols;
		T l = (T)lse[r];
		for (int64_t j = 0; j < cols; j++)
			dr[j] = KEXP(xr[j] - l) * ds;
		int64_t c = (int64_t)targets[r] - vocab_lo;
		if (c >= 0 && c < cols)
			dr[c] -= ds;
	}
}

/* Cross-entropy over classes in one call: the statistics of each row as the pieces above compute
 * them (max, sum of exponentials, lse = max + log(sumexp), in ST), the loss over the rows whose label
 * counts. */
int64_t FN(planrt_k_cross_entropy)(const T *logits, const int32_t *labels, int64_t rows, int64_t classes,
				   int32_t ignore_index, double scale, ST *lse, double *loss, int64_t *bad_row,
				   int32_t *bad_value)
{
	KLEVEL_VALUE(planrt_k_cross_entropy,
	       (logits, labels, rows, classes, ignore_index, scale, lse, loss, bad_row, bad_value));
	if (rows > 0 && classes < 1)
		kfatal("cross_entropy without classes");
	int64_t bad = planrt_k_check_labels(labels, rows, classes, ignore_index, NULL, bad_row, bad_value);
	double sum = 0;
	for (int64_t r = 0; r < rows; r++) {
		const T *xr = logits + r * classes;
		ST m = (ST)FN(kmax)(xr, classes);
		ST se = (ST)FN(ksumexp)(xr, (T)m, classes);
		double l = (double)m + log((double)se);
		lse[r] = (ST)l;
		if (klabel_counts(labels[r], classes, ignore_index))
			sum += l - (double)xr[labels[r]];
	}
	*loss = sum * scale;
	return bad;
}

void FN(planrt_k_cross_entropy_grad)(const T *logits, const int32_t *labels, const ST *lse, int64_t rows,
				     int64_t classes, int32_t ignore_index, double dscale, T *dlogits)
{
	KLEVEL(planrt_k_cross_entropy_grad, (logits, labels, lse, rows, classes, ignore_index, dscale, dlogits));
	for (int64_t r = 0; r < rows; r++) {
		T *dr = dlogits + r * classes;
		if (klabel_counts(labels[r], classes, ignore_index))
			FN(planrt_k_ce_grad)(logits + r * classes, labels + r, lse + r, 1, classes, 0, dscale, dr);
		else
			memset(dr, 0, (size_t)classes * sizeof(T));
	}
}

#ifndef KI_STATS_ONLY

/* ---- embedding ----------------------------------------------------------------------------------- */
void FN(planrt_k_embed)(const T *table, const int32_t *ids, T *out, int64_t ntok, int64_t dim, int64_t vocab_lo,
			int64_t vocab_local)
{
	KLEVEL(planrt_k_embed, (table, ids, out, ntok, dim, vocab_lo, vocab_local));
	for (int64_t t = 0; t < ntok; t++) {
		int64_t v = (int64_t)ids[t] - vocab_lo;
		T *o = out + t * dim;
		if (v >= 0 && v < vocab_local)
			memcpy(o, table + v * dim, (size_t)dim * sizeof(T));
		else
			for (int64_t j = 0; j < dim; j++)
				o[j] = 0;
	}
}

void FN(planrt_k_embed_grad)(const int32_t *ids, const T *dy, T *dtable, int64_t ntok, int64_t dim, int64_t vocab_lo,
			     int64_t vocab_local)
{
	KLEVEL(planrt_k_embed_grad, (ids, dy, dtable, ntok, dim, vocab_lo, vocab_local));
	for (int64_t t = 0; t < ntok; t++) {
		int64_t v = (int64_t)ids[t] - vocab_lo;
		if (v < 0 || v >= vocab_local)
			continue;
		const T *g = dy + t * dim;
		T *o = dtable + v * dim;
		for (int64_t j = 0; j < dim; j++)
			o[j] += g[j];
	}
}

#include "permute_impl.h"

/* ---- reductions over one dim ---------------------------------------------------------------------- */
void FN(planrt_k_sum_dim)(const T *x, T *y, int64_t outer, int64_t n, int64_t inner, double scale)
{
	KLEVEL(planrt_k_sum_dim, (x, y, outer, n, inner, scale));
	T a = (T)scale;
	for (int64_t o = 0; o < outer; o++) {
		const T *xo = x + o * n * inner;
		T *yo = y + o * inner;
		if (inner == 1) {
			yo[0] = a * FN(ksum)(xo, n);
			continue;
		}
		for (int64_t i = 0; i < inner; i++)
			yo[i] = 0;
		for (int64_t k = 0; k < n; k++)
			for (int64_t i = 0; i < inner; i++)
				yo[i] += xo[k * inner + i];
		for (int64_t i = 0; i < inner; i++)
			yo[i] *= a;
	}
}

void FN(planrt_k_sum_dim_grad)(const T *dy, T *dx, int64_t outer, int64_t n, int64_t inner, double scale)
{
	KLEVEL(planrt_k_sum_dim_grad, (dy, dx, outer, n, inner, scale));
	T a = (T)scale;
	for (int64_t o = 0; o < outer; o++)
		for (int64_t k = 0; k < n; k++) {
			const T *g = dy + o * inner;
			T *d = dx + (o * n + k) * inner;
			for (int64_t i = 0; i < inner; i++)
				d[i] = a * g[i];
		}
}

void FN(planrt_k_max_dim)(const T *x, T *y, int32_t *argmax, int64_t outer, int64_t n, int64_t inner)
{
	KLEVEL(planrt_k_max_dim, (x, y, argmax, outer, n, inner));
	if (n < 1)
		kfatal("max_dim over an empty dim");
	for (int64_t o = 0; o < outer; o++) {
		const T *xo = x + o * n * inner;
		T *yo = y + o * inner;
		int32_t *ao = argmax + o * inner;
		for (int64_t i = 0; i < inner; i++) {
			yo[i] = xo[i];
			ao[i] = 0;
		}
		for (int64_t k = 1; k < n; k++)
			for (int64_t i = 0; i < inner; i++) {
				T v = xo[k * inner + i], m = yo[i];
				int take = v > m || (v != v && m == m); /* strictly larger, or the first NaN */
				yo[i] = take ? v : m;
				ao[i] = take ? (int32_t)k : ao[i];
			}
	}
}

void FN(planrt_k_max_dim_grad)(const int32_t *argmax, const T *dy, T *dx, int64_t outer, int64_t n, int64_t inner)
{
	KLEVEL(planrt_k_max_dim_grad, (argmax, dy, dx, outer, n, inner));
	memset(dx, 0, (size_t)(outer * n * inner) * sizeof(T));
	for (int64_t o = 0; o < outer; o++)
		for (int64_t i = 0; i < inner; i++)
			dx[(o * n + argmax[o * inner + i]) * inner + i] = dy[o * inner + i];
}

/* ---- slicing and concatenation -------------------------------------------------------------------- */
/* Rows [s0, s0 + len) of src [outer, sn, inner] to rows [d0, d0 + len) of dst [outer, dn, inner],
 * copied or (accumulate) added. */
static void FN(kcopy_rows)(const T *src, int64_t sn, int64_t s0, T *dst, int64_t dn, int64_t d0, int64_t len,
			   int64_t outer, int64_t inner, int accumulate)
{
	int64_t m = len * inner;
	for (int64_t o = 0; o < outer; o++) {
		const T *a = src + (o * sn + s0) * inner;
		T *b = dst + (o * dn + d0) * inner;
		if (accumulate)
			for (int64_t j = 0; j < m; j++)
				b[j] += a[j];
		else if (m > 0)
			memcpy(b, a, (size_t)m * sizeof(T));
	}
}

void FN(planrt_k_slice)(const T *x, T *y, int64_t outer, int64_t n, int64_t inner, int64_t start, int64_t len)
{
	KLEVEL(planrt_k_slice, (x, y, outer, n, inner, start, len));
	if (start < 0 || len < 0 || start + len > n)
		kfatal("slice out of range");
	FN(kcopy_rows)(x, n, start, y, len, 0, len, outer, inner, 0);
}

void FN(planrt_k_slice_grad)(const T *dy, T *dx, int64_t outer, int64_t n, int64_t inner, int64_t start, int64_t len,
			     int accumulate)
{
	KLEVEL(planrt_k_slice_grad, (dy, dx, outer, n, inner, start, len, accumulate));
	if (start < 0 || len < 0 || start + len > n)
		kfatal("slice_grad out of range");
	if (!accumulate)
		memset(dx, 0, (size_t)(outer * n * inner) * sizeof(T));
	FN(kcopy_rows)(dy, len, 0, dx, n, start, len, outer, inner, accumulate);
}

void FN(planrt_k_concat)(int count, const T *const *xs, const int64_t *ns, T *y, int64_t outer, int64_t inner)
{
	KLEVEL(planrt_k_concat, (count, xs, ns, y, outer, inner));
	int64_t total = 0, off = 0;
	for (int i = 0; i < count; i++)
		total += ns[i];
	for (int i = 0; i < count; i++) {
		FN(kcopy_rows)(xs[i], ns[i], 0, y, total, off, ns[i], outer, inner, 0);
		off += ns[i];
	}
}

void FN(planrt_k_concat_grad)(int count, const T *dy, T *const *dxs, const int64_t *ns, int64_t outer, int64_t inner)
{
	KLEVEL(planrt_k_concat_grad, (count, dy, dxs, ns, outer, inner));
	int64_t total = 0, off = 0;
	for (int i = 0; i < count; i++)
		total += ns[i];
	for (int i = 0; i < count; i++) {
		FN(kcopy_rows)(dy, total, off, dxs[i], ns[i], 0, ns[i], outer, inner, 0);
		off += ns[i];
	}
}

/* ---- repeat_kv: the head dim broadcast over n_rep copies, and back ---------------------------------- */
void FN(planrt_k_repeat_kv)(const T *x, T *y, int64_t outer, int64_t heads, int64_t n_rep, int64_t inner,
			    int64_t y_heads, int64_t y_head_lo)
{
	KLEVEL(planrt_k_repeat_kv, (x, y, outer, heads, n_rep, inner, y_heads, y_head_lo));
	for (int64_t o = 0; o < outer; o++)
		for (int64_t h = 0; h < y_heads; h++)
			memcpy(y + (o * y_heads + h) * inner, x + (o * heads + (h + y_head_lo) / n_rep) * inner,
			       sizeof(T) * (size_t)inner);
}

void FN(planrt_k_repeat_kv_grad)(const T *dy, T *dx, int64_t outer, int64_t heads, int64_t n_rep, int64_t inner,
				 int64_t y_heads, int64_t y_head_lo)
{
	KLEVEL(planrt_k_repeat_kv_grad, (dy, dx, outer, heads, n_rep, inner, y_heads, y_head_lo));
	memset(dx, 0, sizeof(T) * (size_t)(outer * heads * inner));
	for (int64_t o = 0; o < outer; o++)
		for (int64_t h = 0; h < y_heads; h++) { /* each head's copies in order */
			T *d = dx + (o * heads + (h + y_head_lo) / n_rep) * inner;
			const T *s = dy + (o * y_heads + h) * inner;
			for (int64_t j = 0; j < inner; j++)
				d[j] += s[j];
		}
}

/* ---- rotary position embeddings ------------------------------------------------------------------ */
#define KROPE_CHUNK 64 /* frequencies whose cos and sin are tabled at once (no allocation) */

/* y = x rotated by the angles p f_i (sign = 1) or -p f_i (sign = -1), see planrt_kernels.h. A chunk of
 * frequencies at a time: their inv_freq once, then per row (b, s) their cosines and sines, once for all
 * heads. */
static void FN(krope)(const T *x, T *y, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, int64_t rot_dim,
		      int heads_first, const int32_t *pos, int64_t pos_stride, int64_t pos_off, int64_t pos_off2, double theta,
		      T sign)
{
	if (rot_dim < 0 || rot_dim % 2 || rot_dim > head_dim)
		kfatal("rope: rot_dim must be even and at most head_dim");
	int64_t h = rot_dim / 2;
	T c[KROPE_CHUNK], sn[KROPE_CHUNK], inv[KROPE_CHUNK];
	for (int64_t i0 = 0; i0 < h; i0 += KROPE_CHUNK) {
		int64_t m = h - i0 < KROPE_CHUNK ? h - i0 : KROPE_CHUNK;
		for (int64_t i = 0; i < m; i++) /* LlamaRotaryEmbedding's inv_freq, in T */
			inv[i] = (T)1 / KPOW((T)theta, (T)(2 * (i0 + i)) / (T)rot_dim);
		for (int64_t b = 0; b < batch; b++)
			for (int64_t s = 0; s < seq; s++) {
				T p = pos ? (T)pos[b * pos_stride + s] : (T)(s < seq / 2 ? pos_off + s : pos_off2 + s - seq / 2);
				for (int64_t i = 0; i < m; i++) {
					T a = p * inv[i];
					c[i] = KCOS(a);
					sn[i] = sign * KSIN(a);
				}
				for (int64_t hd = 0; hd < heads; hd++) {
					int64_t row = (heads_first ? (b * heads + hd) * seq + s : (b * seq + s) * heads + hd) *
						      head_dim;
					const T *x1 = x + row + i0, *x2 = x1 + h;
					T *y1 = y + row + i0, *y2 = y1 + h;
					for (int64_t i = 0; i < m; i++) {
						T u = x1[i], w = x2[i];
						y1[i] = u * c[i] - w * sn[i];
						y2[i] = w * c[i] + u * sn[i];
					}
				}
			}
	}
	if (y != x) /* the dims that pass through, the same in every row whatever the layout */
		for (int64_t r = 0; r < batch * seq * heads; r++)
			for (int64_t j = rot_dim; j < head_dim; j++)
				y[r * head_dim + j] = x[r * head_dim + j];
}

void FN(planrt_k_rope)(const T *x, T *y, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, int64_t rot_dim,
		       int heads_first, const int32_t *pos, int64_t pos_stride, int64_t pos_off, int64_t pos_off2, double theta)
{
	KLEVEL(planrt_k_rope,
	       (x, y, batch, seq, heads, head_dim, rot_dim, heads_first, pos, pos_stride, pos_off, pos_off2, theta));
	FN(krope)(x, y, batch, seq, heads, head_dim, rot_dim, heads_first, pos, pos_stride, pos_off, pos_off2, theta,
		  (T)1);
}

void FN(planrt_k_rope_grad)(const T *dy, T *dx, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
			    int64_t rot_dim, int heads_first, const int32_t *pos, int64_t pos_stride, int64_t pos_off,
			    int64_t pos_off2, double theta)
{
	KLEVEL(planrt_k_rope_grad,
	       (dy, dx, batch, seq, heads, head_dim, rot_dim, heads_first, pos, pos_stride, pos_off, pos_off2, theta));
	FN(krope)(dy, dx, batch, seq, heads, head_dim, rot_dim, heads_first, pos, pos_stride, pos_off, pos_off2, theta,
		  (T)-1);
}
#undef KROPE_CHUNK

/* ---- regression losses ----------------------------------------------------------------------------- */
/* scale * sum of (x - t)^2 (l1 = 0) or |x - t| (l1 = 1), summed in double. */
static double FN(kpoint_loss)(int l1, const T *x, const T *t, int64_t n, double scale)
{
	double s = 0;
	for (int64_t i = 0; i < n; i++) {
		double d = (double)x[i] - (double)t[i];
		s += l1 ? fabs(d) : d * d;
	}
	return s * scale;
}

static void FN(kpoint_loss_grad)(int l1, const T *x, const T *t, int64_t n, double dscale, T *dx, T *dt)
{
	T ds = (T)dscale, ds2 = (T)(2 * dscale);
	for (int64_t i = 0; i < n; i++) {
		T d = x[i] - t[i];
		/* sign(d) as torch 1.13's: 0 at 0 and at NaN */
		dx[i] = l1 ? (d > 0 ? ds : (d < 0 ? -ds : (T)0)) : ds2 * d;
		if (dt)
			dt[i] = -dx[i];
	}
}

double FN(planrt_k_mse_loss)(const T *x, const T *target, int64_t n, double scale)
{
	KLEVEL_VALUE(planrt_k_mse_loss, (x, target, n, scale));
	return FN(kpoint_loss)(0, x, target, n, scale);
}

void FN(planrt_k_mse_loss_grad)(const T *x, const T *target, int64_t n, double dscale, T *dx, T *dtarget)
{
	KLEVEL(planrt_k_mse_loss_grad, (x, target, n, dscale, dx, dtarget));
	FN(kpoint_loss_grad)(0, x, target, n, dscale, dx, dtarget);
}

double FN(planrt_k_l1_loss)(const T *x, const T *target, int64_t n, double scale)
{
	KLEVEL_VALUE(planrt_k_l1_loss, (x, target, n, scale));
	return FN(kpoint_loss)(1, x, target, n, scale);
}

void FN(planrt_k_l1_loss_grad)(const T *x, const T *target, int64_t n, double dscale, T *dx, T *dtarget)
{
	KLEVEL(planrt_k_l1_loss_grad, (x, target, n, dscale, dx, dtarget));
	FN(kpoint_loss_grad)(1, x, target, n, dscale, dx, dtarget);
}

/* ---- mixture of experts ------------------------------------------------------------------------------
 * Routing is recomputed from the logits wherever an expert's identity is needed (route_grad, aux
 * loss): the selection is deterministic, and idx does not name the expert of a dropped pair. Tokens
 * come in groups of `group` consecutive rows (a group is one sample: capacity and the auxiliary
 * loss are per group, so that a plan that splits the batch routes every sample as one rank does). */

/* Router probabilities of one token: p[e] = exp(l[e] - max) / sum. */
static void FN(kmoe_probs)(const T *l, int64_t experts, T *p)
{
	T m = FN(kmax)(l, experts), s = 0;
	for (int64_t e = 0; e < experts; e++) {
		p[e] = KEXP(l[e] - m);
		s += p[e];
	}
	for (int64_t e = 0; e < experts; e++)
		p[e] /= s;
}

/* The top_k experts of one token by descending probability, ties to the lower index. */
static void FN(kmoe_topk)(const T *p, int64_t experts, int64_t top_k, int64_t *choice)
{
	for (int64_t k = 0; k < top_k; k++) {
		int64_t best = -1;
		for (int64_t e = 0; e < experts; e++) {
			int taken = 0;
			for (int64_t j = 0; j < k; j++)
				taken |= choice[j] == e;
			if (!taken && (best < 0 || p[e] > p[best]))
				best = e;
		}
		choice[k] = best;
	}
}

/* Scratch for per-expert values: the stack up to KSTACK_EXPERTS, else the heap; choice holds a
 * token's top_k experts (a group's, group * top_k, in route). */
typedef struct {
	T stack_p[KSTACK_EXPERTS];
	int64_t stack_c[KSTACK_EXPERTS], stack_choice[64];
	T *p;
	int64_t *c, *choice;
} FN(KMoeScratch);

static void FN(kmoe_scratch)(FN(KMoeScratch) * s, int64_t experts, int64_t nchoice)
{
	s->p = experts <= KSTACK_EXPERTS ? s->stack_p : malloc((size_t)experts * sizeof(T));
	s->c = experts <= KSTACK_EXPERTS ? s->stack_c : malloc((size_t)experts * sizeof(int64_t));
	s->choice = nchoice <= 64 ? s->stack_choice : malloc((size_t)nchoice * sizeof(int64_t));
	if (!s->p || !s->c || !s->choice)
		kfatal("moe: out of memory for per-expert scratch");
}

static void FN(kmoe_scratch_free)(FN(KMoeScratch) * s)
{
	if (s->p != s->stack_p)
		free(s->p);
	if (s->c != s->stack_c)
		free(s->c);
	if (s->choice != s->stack_choice)
		free(s->choice);
}

/* A token's gates from its probabilities and choices: p[e_j], or p[e_j] / sum_i p[e_i]. */
static void FN(kmoe_gates)(const T *p, const int64_t *choice, int64_t top_k, int normalize, T *gates)
{
	T s = 0;
	for (int64_t k = 0; k < top_k; k++)
		s += p[choice[k]];
	for (int64_t k = 0; k < top_k; k++)
		gates[k] = normalize ? p[choice[k]] / s : p[choice[k]];
}

void FN(planrt_k_moe_route)(const T *logits, int64_t tokens, int64_t experts, int64_t top_k, int64_t group,
			    int64_t capacity, int normalize, T *gates, int32_t *idx, int32_t *counts, double *stats)
{
	KLEVEL(planrt_k_moe_route,
	       (logits, tokens, experts, top_k, group, capacity, normalize, gates, idx, counts, stats));
	if (group <= 0 || tokens % group)
		kfatal("moe_route: tokens are not a whole number of groups");
	FN(KMoeScratch) sp; /* sp.p: probabilities of a token, sp.c: pairs per expert, sp.choice: the group's */
	FN(kmoe_scratch)(&sp, experts, group * top_k);
	int64_t slots = capacity > 0 ? tokens / group * capacity : tokens; /* per expert */
	if (capacity <= 0)
		for (int64_t e = 0; e < experts; e++)
			sp.c[e] = 0;
	for (int64_t g0 = 0; g0 < tokens; g0 += group) {
		for (int64_t t = g0; t < g0 + group; t++) {
			FN(kmoe_probs)(logits + t * experts, experts, sp.p);
			FN(kmoe_topk)(sp.p, experts, top_k, sp.choice + (t - g0) * top_k);
			FN(kmoe_gates)(sp.p, sp.choice + (t - g0) * top_k, top_k, normalize, gates + t * top_k);
		}
		if (capacity > 0)
			for (int64_t e = 0; e < experts; e++)
				sp.c[e] = 0;
		/* every token's first choice in token order, then every second choice, ... (GShard) */
		for (int64_t k = 0; k < top_k; k++)
			for (int64_t t = g0; t < g0 + group; t++) {
				int64_t e = sp.choice[(t - g0) * top_k + k], slot = sp.c[e]++;
				int32_t at = -1;
				if (capacity <= 0)
					at = (int32_t)(e * slots + slot);
				else if (slot < capacity)
					at = (int32_t)(e * slots + g0 / group * capacity + slot);
				idx[t * top_k + k] = at;
				if (stats) {
					stats[1 + e] += 1;
					stats[0] += at < 0;
				}
			}
		if (counts && capacity > 0) /* the group's kept pairs */
			for (int64_t e = 0; e < experts; e++)
				counts[e] = (g0 ? counts[e] : 0) + (int32_t)(sp.c[e] < capacity ? sp.c[e] : capacity);
	}
	if (counts && capacity <= 0)
		for (int64_t e = 0; e < experts; e++)
			counts[e] = (int32_t)sp.c[e];
	FN(kmoe_scratch_free)(&sp);
}

void FN(planrt_k_moe_dispatch)(const T *x, const int32_t *idx, int64_t tokens, int64_t top_k, int64_t dim,
			       int64_t slots, T *buf)
{
	KLEVEL(planrt_k_moe_dispatch, (x, idx, tokens, top_k, dim, slots, buf));
	memset(buf, 0, (size_t)(slots * dim) * sizeof(T));
	for (int64_t t = 0; t < tokens; t++)
		for (int64_t k = 0; k < top_k; k++) {
			int32_t s = idx[t * top_k + k];
			if (s >= 0)
				memcpy(buf + (int64_t)s * dim, x + t * dim, (size_t)dim * sizeof(T));
		}
}

void FN(planrt_k_moe_dispatch_grad)(const T *dbuf, const int32_t *idx, int64_t tokens, int64_t top_k, int64_t dim,
				    T *dx)
{
	KLEVEL(planrt_k_moe_dispatch_grad, (dbuf, idx, tokens, top_k, dim, dx));
	for (int64_t t = 0; t < tokens; t++) {
		T *o = dx + t * dim;
		for (int64_t j = 0; j < dim; j++)
			o[j] = 0;
		for (int64_t k = 0; k < top_k; k++) {
			int32_t s = idx[t * top_k + k];
			if (s < 0)
				continue;
			const T *g = dbuf + (int64_t)s * dim;
			for (int64_t j = 0; j < dim; j++)
				o[j] += g[j];
		}
	}
}

void FN(planrt_k_moe_combine)(const T *buf, const T *gates, const int32_t *idx, int64_t tokens, int64_t top_k,
			      int64_t dim, T *out)
{
	KLEVEL(planrt_k_moe_combine, (buf, gates, idx, tokens, top_k, dim, out));
	for (int64_t t = 0; t < tokens; t++) {
		T *o = out + t * dim;
		for (int64_t j = 0; j < dim; j++)
			o[j] = 0;
		for (int64_t k = 0; k < top_k; k++) {
			int32_t s = idx[t * top_k + k];
			if (s < 0)
				continue;
			const T *v = buf + (int64_t)s * dim;
			T g = gates[t * top_k + k];
			for (int64_t j = 0; j < dim; j++)
				o[j] += g * v[j];
		}
	}
}

/* dbuf (all slots, unused ones 0) and dgates (0 for dropped pairs) are overwritten. */
void FN(planrt_k_moe_combine_grad)(const T *dout, const T *buf, const T *gates, const int32_t *idx, int64_t tokens,
				   int64_t top_k, int64_t dim, int64_t slots, T *dbuf, T *dgates)
{
	KLEVEL(planrt_k_moe_combine_grad, (dout, buf, gates, idx, tokens, top_k, dim, slots, dbuf, dgates));
	memset(dbuf, 0, (size_t)(slots * dim) * sizeof(T));
	for (int64_t t = 0; t < tokens; t++) {
		const T *g = dout + t * dim;
		for (int64_t k = 0; k < top_k; k++) {
			int32_t s = idx[t * top_k + k];
			if (s < 0) {
				dgates[t * top_k + k] = 0;
				continue;
			}
			T gate = gates[t * top_k + k];
			T *d = dbuf + (int64_t)s * dim;
			for (int64_t j = 0; j < dim; j++)
				d[j] = gate * g[j];
			dgates[t * top_k + k] = FN(kdot)(g, buf + (int64_t)s * dim, dim);
		}
	}
}

/* gate_k = p[e_k] (/ s, s = sum_i p[e_i], when normalized): dp[e_m] = dg_m (or (dg_m - sum_k dg_k
 * gate_k) / s); then through the softmax, dlogits[j] = p[j] (dp[j] - sum_e p[e] dp[e]). */
void FN(planrt_k_moe_route_grad)(const T *logits, const T *dgates, int64_t tokens, int64_t experts, int64_t top_k,
				 int normalize, T *dlogits)
{
	KLEVEL(planrt_k_moe_route_grad, (logits, dgates, tokens, experts, top_k, normalize, dlogits));
	FN(KMoeScratch) sp;
	FN(kmoe_scratch)(&sp, experts, top_k);
	for (int64_t t = 0; t < tokens; t++) {
		T *d = dlogits + t * experts;
		const T *dg = dgates + t * top_k;
		FN(kmoe_probs)(logits + t * experts, experts, sp.p);
		FN(kmoe_topk)(sp.p, experts, top_k, sp.choice);
		T s = 0, dgsum = 0;
		for (int64_t k = 0; k < top_k; k++)
			s += sp.p[sp.choice[k]];
		for (int64_t k = 0; k < top_k; k++)
			dgsum += dg[k] * sp.p[sp.choice[k]] / s;
		for (int64_t e = 0; e < experts; e++)
			d[e] = 0;
		for (int64_t k = 0; k < top_k; k++)
			d[sp.choice[k]] = normalize ? (dg[k] - dgsum) / s : dg[k]; /* dp */
		T pdp = 0;
		for (int64_t e = 0; e < experts; e++)
			pdp += sp.p[e] * d[e];
		for (int64_t e = 0; e < experts; e++)
			d[e] = sp.p[e] * (d[e] - pdp);
	}
	FN(kmoe_scratch_free)(&sp);
}

/* Per group: f_e (fraction of the group's tokens whose most probable expert is e) into f, the mean
 * probabilities into P. */
static void FN(kmoe_fractions)(const T *logits, int64_t group, int64_t experts, T *p, double *f, double *P)
{
	for (int64_t e = 0; e < experts; e++)
		f[e] = P[e] = 0;
	for (int64_t t = 0; t < group; t++) {
		int64_t first;
		FN(kmoe_probs)(logits + t * experts, experts, p);
		FN(kmoe_topk)(p, experts, 1, &first);
		f[first] += 1;
		for (int64_t e = 0; e < experts; e++)
			P[e] += (double)p[e];
	}
	for (int64_t e = 0; e < experts; e++) {
		f[e] /= (double)group;
		P[e] /= (double)group;
	}
}

/* f and P of up to KSTACK_EXPERTS experts on the stack, else the heap */
#define KMOE_FP_BEGIN(what)                                                                                    \
	double fs[KSTACK_EXPERTS], Ps[KSTACK_EXPERTS];                                                         \
	double *f = experts <= KSTACK_EXPERTS ? fs : malloc((size_t)experts * sizeof(double));                 \
	double *P = experts <= KSTACK_EXPERTS ? Ps : malloc((size_t)experts * sizeof(double));                 \
	if (!f || !P)                                                                                          \
		kfatal(what ": out of memory");                                                                \
	FN(KMoeScratch) sp;                                                                                     \
	FN(kmoe_scratch)(&sp, experts, 1)
#define KMOE_FP_END()                                                                                          \
	FN(kmoe_scratch_free)(&sp);                                                                             \
	if (f != fs) {                                                                                          \
		free(f);                                                                                        \
		free(P);                                                                                        \
	}

double FN(planrt_k_moe_aux_loss)(const T *logits, int64_t tokens, int64_t experts, int64_t group, double scale)
{
	KLEVEL_VALUE(planrt_k_moe_aux_loss, (logits, tokens, experts, group, scale));
	if (tokens <= 0 || experts <= 0 || group <= 0 || tokens % group)
		kfatal("moe_aux_loss: tokens are not a whole number of groups");
	KMOE_FP_BEGIN("moe_aux_loss");
	double loss = 0;
	for (int64_t g0 = 0; g0 < tokens; g0 += group) {
		FN(kmoe_fractions)(logits + g0 * experts, group, experts, sp.p, f, P);
		double l = 0;
		for (int64_t e = 0; e < experts; e++)
			l += f[e] * P[e];
		loss += (double)experts * l;
	}
	KMOE_FP_END();
	return scale * loss;
}

/* d loss / d logits[t, j] = scale (E / G) p[t, j] (f_j - sum_e f_e p[t, e]) with f of t's group;
 * f is piecewise constant. dlogits overwritten. */
void FN(planrt_k_moe_aux_loss_grad)(const T *logits, int64_t tokens, int64_t experts, int64_t group, double dscale,
				    T *dlogits)
{
	KLEVEL(planrt_k_moe_aux_loss_grad, (logits, tokens, experts, group, dscale, dlogits));
	if (tokens <= 0 || experts <= 0 || group <= 0 || tokens % group)
		kfatal("moe_aux_loss_grad: tokens are not a whole number of groups");
	KMOE_FP_BEGIN("moe_aux_loss_grad");
	double c = dscale * (double)experts / (double)group;
	for (int64_t g0 = 0; g0 < tokens; g0 += group) {
		FN(kmoe_fractions)(logits + g0 * experts, group, experts, sp.p, f, P);
		for (int64_t t = g0; t < g0 + group; t++) {
			FN(kmoe_probs)(logits + t * experts, experts, sp.p);
			double fp = 0;
			for (int64_t e = 0; e < experts; e++)
				fp += f[e] * (double)sp.p[e];
			T *d = dlogits + t * experts;
			for (int64_t e = 0; e < experts; e++)
				d[e] = (T)(c * (double)sp.p[e] * (f[e] - fp));
		}
	}
	KMOE_FP_END();
}
#undef KMOE_FP_BEGIN
#undef KMOE_FP_END

/* Router z-loss (ST-MoE, Zoph et al. 2022): scale * sum over tokens of logsumexp(logits)^2. */
static T FN(kmoe_lse)(const T *l, int64_t experts)
{
	T m = FN(kmax)(l, experts), s = 0;
	for (int64_t e = 0; e < experts; e++)
		s += KEXP(l[e] - m);
	return m + KLOG(s);
}

double FN(planrt_k_moe_z_loss)(const T *logits, int64_t tokens, int64_t experts, double scale)
{
	KLEVEL_VALUE(planrt_k_moe_z_loss, (logits, tokens, experts, scale));
	double loss = 0;
	for (int64_t t = 0; t < tokens; t++) {
		double z = (double)FN(kmoe_lse)(logits + t * experts, experts);
		loss += z * z;
	}
	return scale * loss;
}

/* dlogits[t, e] = dscale 2 z_t softmax(logits_t)[e] (overwritten) */
void FN(planrt_k_moe_z_loss_grad)(const T *logits, int64_t tokens, int64_t experts, double dscale, T *dlogits)
{
	KLEVEL(planrt_k_moe_z_loss_grad, (logits, tokens, experts, dscale, dlogits));
	for (int64_t t = 0; t < tokens; t++) {
		const T *l = logits + t * experts;
		T z = FN(kmoe_lse)(l, experts);
		T c = (T)(2 * dscale) * z;
		T *d = dlogits + t * experts;
		for (int64_t e = 0; e < experts; e++)
			d[e] = c * KEXP(l[e] - z);
	}
}

#endif /* !KI_STATS_ONLY */
