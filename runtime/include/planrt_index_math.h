/* planrt_index_math.h: the index arithmetic of the CUDA target's permute, sum_to, RoPE and dropout
 * kernels
 * (runtime/cuda/kernels_cuda.cu), as functions that compile for the device and for the host
 * (tests/cuda/test_index_math.c runs them against the plain definitions).
 *
 * Why. A GPU has no integer divider: `/` and `%` of 32-bit operands are a sequence of about 20
 * instructions, of 64-bit ones a subroutine of about 70. A permute of a rank-4 tensor that finds each
 * element's source with four `/` and four `%` of its 64-bit index spends about 100 instructions an
 * element against 4 bytes moved: at 16 bits an element on an H200, 3-4 times the time its bytes
 * take. gpt350m runs 193 such permutes and 145 column sums a step.
 *
 * What. A division by a size fixed at launch becomes a multiply-high, an add and a shift
 * (Granlund and Montgomery's method, as CUTLASS's FastDivmod and PyTorch's IntDivider do it):
 * planrt_divmod_make(d) computes the multiplier once on the host, planrt_div / planrt_mod use it, for
 * dividends and divisors below 2^31. A permute is planned on the host first:
 *   - the output's dims of size 1 are dropped, and adjacent output dims that are adjacent in the
 *     input too are merged (a [B, S, H, Dh] -> [B, H, S, Dh] split of heads stays rank 4; a
 *     [B, S, D] -> [B, S, D] copy becomes rank 1);
 *   - where the innermost output dim is contiguous in the input and its run is a multiple of 16
 *     bytes (with both buffers 16-byte aligned), the permute moves 16-byte units instead of
 *     elements: Dh 64 in bf16 is 8 units of 8 elements, and a thread's index math serves 8 of them.
 * A column sum (sum_to) is planned the same way: its kept dims and its reduced dims, each list
 * merged where adjacent dims are adjacent in the input; a reduced run of one dim (the rows of a
 * bias gradient) is then walked with a stride, with no division per element. RoPE (below) takes a
 * thread a position and frequency and walks the heads.
 * Tensors of 2^31 elements or more keep the 64-bit arithmetic (the plan functions return 0). */
#ifndef PLANRT_INDEX_MATH_H
#define PLANRT_INDEX_MATH_H

#include <stdint.h>

#ifdef __CUDACC__
#define PLANRT_IM static inline __host__ __device__
#else
#define PLANRT_IM static inline
#endif

#define PLANRT_IM_MAX_RANK 8
#define PLANRT_IM_LIMIT 2147483648LL /* 2^31: dividends, divisors and offsets stay below it */

/* n / d for 0 <= n < 2^31 and 1 <= d < 2^31: q = (umulhi(n, magic) + n) >> shift */
typedef struct planrt_divmod {
	uint32_t d, magic, shift;
} planrt_divmod_t;

/* the multiplier for d (1 <= d < 2^31): shift = ceil(log2 d), magic = floor(2^32 (2^shift - d) / d) + 1,
 * which is below 2^32 because 2^shift - d < d */
PLANRT_IM planrt_divmod_t planrt_divmod_make(uint32_t d)
{
	uint32_t s = 0;
	while ((1ull << s) < d)
		s++;
	uint64_t m = ((1ull << 32) * ((1ull << s) - d)) / d + 1;
	planrt_divmod_t r = {d, (uint32_t)m, s};
	return r;
}

PLANRT_IM uint32_t planrt_umulhi(uint32_t a, uint32_t b)
{
#ifdef __CUDA_ARCH__
	return __umulhi(a, b);
#else
	return (uint32_t)(((uint64_t)a * b) >> 32);
#endif
}

PLANRT_IM uint32_t planrt_div(planrt_divmod_t dm, uint32_t n)
{
	return (planrt_umulhi(n, dm.magic) + n) >> dm.shift;
}

PLANRT_IM uint32_t planrt_mod(planrt_divmod_t dm, uint32_t n)
{
	return n - planrt_div(dm, n) * dm.d;
}

/* ------------------------------------------------------------------ permute */

/* out[i] = in[src(i)] over units of `vec` elements: the output's dims (innermost last) and the input
 * stride, in units, of each */
typedef struct planrt_permute_plan {
	int rank;
	int vec;    /* elements a unit: 1, or 16 bytes of them */
	uint32_t n; /* units of the output */
	planrt_divmod_t dim[PLANRT_IM_MAX_RANK];
	uint32_t stride[PLANRT_IM_MAX_RANK];
} planrt_permute_plan_t;

/* Plans out = in permuted (out's dim d is in's dim perm[d]) for elements of elem bytes; aligned16:
 * both buffers start at a multiple of 16 bytes. Returns 1 with *p filled, or 0 when the tensor is
 * too large for 32-bit offsets (or its rank is out of range): the caller then keeps 64-bit math. */
PLANRT_IM int planrt_permute_plan(int rank, const int64_t *in_dims, const int *perm, int elem, int aligned16,
				  planrt_permute_plan_t *p)
{
	if (rank < 0 || rank > PLANRT_IM_MAX_RANK)
		return 0;
	int64_t ist[PLANRT_IM_MAX_RANK], s = 1, dims[PLANRT_IM_MAX_RANK], st[PLANRT_IM_MAX_RANK];
	for (int d = rank - 1; d >= 0; d--) {
		if (in_dims[d] < 0)
			return 0;
		ist[d] = s;
		s *= in_dims[d] > 0 ? in_dims[d] : 1;
		if (s >= PLANRT_IM_LIMIT)
			return 0;
	}
	int r = 0;
	int64_t n = 1;
	for (int d = 0; d < rank; d++) {
		if (perm[d] < 0 || perm[d] >= rank)
			return 0;
		n *= in_dims[perm[d]];
	}
	for (int d = 0; d < rank && n > 0; d++) {
		int64_t size = in_dims[perm[d]];
		if (size == 1)
			continue;
		if (r > 0 && st[r - 1] == ist[perm[d]] * size) { /* adjacent in the input too: one dim */
			dims[r - 1] *= size;
			st[r - 1] = ist[perm[d]];
		} else {
			dims[r] = size;
			st[r++] = ist[perm[d]];
		}
	}
	if (r == 0) { /* one element, or none (n = 0: nothing is read) */
		dims[0] = 1;
		st[0] = 1;
		r = 1;
	}
	int vec = 1;
	if (aligned16 && elem > 0 && 16 % elem == 0 && st[r - 1] == 1 && dims[r - 1] * elem % 16 == 0) {
		vec = 16 / elem; /* the other strides are multiples of the run (a guard: never taken) */
		for (int d = 0; d < r - 1; d++)
			if (st[d] % vec)
				vec = 1;
	}
	p->rank = r;
	p->vec = vec;
	p->n = (uint32_t)(n / vec);
	for (int d = 0; d < r; d++) {
		p->dim[d] = planrt_divmod_make((uint32_t)(d == r - 1 ? dims[d] / vec : dims[d]));
		p->stride[d] = (uint32_t)(d == r - 1 && vec > 1 ? 1 : st[d] / vec);
	}
	return 1;
}

/* the input unit output unit i reads */
PLANRT_IM uint32_t planrt_permute_src(const planrt_permute_plan_t *p, uint32_t i)
{
	uint32_t off = 0;
	for (int d = p->rank - 1; d > 0; d--) {
		uint32_t q = planrt_div(p->dim[d], i);
		off += (i - q * p->dim[d].d) * p->stride[d];
		i = q;
	}
	return off + i * p->stride[0];
}

/* ------------------------------------------------------------------ sum_to */

/* out[o] (+)= the sum over the reduced dims of in: the kept dims (out_strides != 0, or of size 1)
 * with their input and output strides, and the reduced dims with their input strides, each list
 * merged where adjacent dims are adjacent in the input (and, for the kept ones, in the output) */
typedef struct planrt_sum_plan {
	int nkept, nred;
	uint32_t out_n, red_n;
	planrt_divmod_t kdim[PLANRT_IM_MAX_RANK];
	uint32_t kin[PLANRT_IM_MAX_RANK], kout[PLANRT_IM_MAX_RANK];
	planrt_divmod_t rdim[PLANRT_IM_MAX_RANK];
	uint32_t rin[PLANRT_IM_MAX_RANK];
} planrt_sum_plan_t;

/* appends a dim (size, input stride, output stride) to a list, merged with the last one where
 * both strides continue it */
PLANRT_IM void planrt_im_append(int64_t *dims, int64_t *in_st, int64_t *out_st, int *n, int64_t size, int64_t ist,
				int64_t ost)
{
	if (*n > 0 && in_st[*n - 1] == ist * size && out_st[*n - 1] == ost * size) {
		dims[*n - 1] *= size;
		in_st[*n - 1] = ist;
		out_st[*n - 1] = ost;
		return;
	}
	dims[*n] = size;
	in_st[*n] = ist;
	out_st[*n] = ost;
	(*n)++;
}

/* Plans sum_to over in of dims[rank] (row-major) into out at out_strides (0: a reduced dim). Returns
 * 1 with *p filled, or 0 when in has 2^31 elements or more, an output offset does not fit, or a dim
 * is 0 (nothing to sum: the caller handles it). */
PLANRT_IM int planrt_sum_plan(int rank, const int64_t *dims, const int64_t *out_strides, planrt_sum_plan_t *p)
{
	if (rank < 0 || rank > PLANRT_IM_MAX_RANK)
		return 0;
	int64_t ist[PLANRT_IM_MAX_RANK], s = 1, out_last = 0;
	for (int d = rank - 1; d >= 0; d--) {
		if (dims[d] <= 0 || out_strides[d] < 0)
			return 0;
		ist[d] = s;
		s *= dims[d];
		out_last += (dims[d] - 1) * out_strides[d];
		if (s >= PLANRT_IM_LIMIT || out_last >= PLANRT_IM_LIMIT)
			return 0;
	}
	int64_t kd[PLANRT_IM_MAX_RANK], ki[PLANRT_IM_MAX_RANK], ko[PLANRT_IM_MAX_RANK];
	int64_t rd[PLANRT_IM_MAX_RANK], ri[PLANRT_IM_MAX_RANK], ro[PLANRT_IM_MAX_RANK];
	int nk = 0, nr = 0;
	int64_t out_n = 1, red_n = 1;
	for (int d = 0; d < rank; d++) {
		if (dims[d] == 1)
			continue;
		if (out_strides[d] != 0) {
			planrt_im_append(kd, ki, ko, &nk, dims[d], ist[d], out_strides[d]);
			out_n *= dims[d];
		} else {
			planrt_im_append(rd, ri, ro, &nr, dims[d], ist[d], 0);
			red_n *= dims[d];
		}
	}
	p->nkept = nk;
	p->nred = nr;
	p->out_n = (uint32_t)out_n;
	p->red_n = (uint32_t)red_n;
	for (int d = 0; d < nk; d++) {
		p->kdim[d] = planrt_divmod_make((uint32_t)kd[d]);
		p->kin[d] = (uint32_t)ki[d];
		p->kout[d] = (uint32_t)ko[d];
	}
	for (int d = 0; d < nr; d++) {
		p->rdim[d] = planrt_divmod_make((uint32_t)rd[d]);
		p->rin[d] = (uint32_t)ri[d];
	}
	return 1;
}

/* output element o: where its inputs start (*base) and where it is stored (*at) */
PLANRT_IM void planrt_sum_kept(const planrt_sum_plan_t *p, uint32_t o, uint32_t *base, uint32_t *at)
{
	uint32_t b = 0, a = 0;
	for (int d = p->nkept - 1; d >= 0; d--) {
		uint32_t q = d ? planrt_div(p->kdim[d], o) : 0, c = o - q * p->kdim[d].d;
		b += c * p->kin[d];
		a += c * p->kout[d];
		o = q;
	}
	*base = b;
	*at = a;
}

/* the offset from an output element's base of its reduced element r (0 <= r < red_n) */
PLANRT_IM uint32_t planrt_sum_red(const planrt_sum_plan_t *p, uint32_t r)
{
	if (p->nred == 1)
		return r * p->rin[0];
	uint32_t off = 0;
	for (int d = p->nred - 1; d >= 0; d--) {
		uint32_t q = d ? planrt_div(p->rdim[d], r) : 0, c = r - q * p->rdim[d].d;
		off += c * p->rin[d];
		r = q;
	}
	return off;
}

/* ------------------------------------------------------------------ dropout
 * Dropout keys each element's random number on its index in the global tensor: a local block's
 * coordinate c of dim d sits at global first[d] + c in the block's first half of that dim and at
 * second[d] + c - half in its second (a balanced ring's block holds two halves apart; elsewhere
 * second = first + half). The local coordinates come from the local index, a division a dim. */
typedef struct planrt_dropout_plan {
	int rank;
	uint32_t n; /* the local block's elements */
	planrt_divmod_t ldim[PLANRT_IM_MAX_RANK];
	uint32_t half[PLANRT_IM_MAX_RANK];
	int64_t first[PLANRT_IM_MAX_RANK], second[PLANRT_IM_MAX_RANK], gst[PLANRT_IM_MAX_RANK];
} planrt_dropout_plan_t;

/* Plans the keys of a local block ldims of gdims whose halves start at offs[0..rank) and
 * offs[rank..2 rank). Returns 1 with *p filled, or 0 when the block has 2^31 elements or more, a dim
 * is not positive or the rank is out of range (the caller keeps its 64-bit kernel). */
PLANRT_IM int planrt_dropout_plan(int rank, const int64_t *gdims, const int64_t *ldims, const int64_t *offs,
				  planrt_dropout_plan_t *p)
{
	if (rank < 1 || rank > PLANRT_IM_MAX_RANK)
		return 0;
	int64_t n = 1, s = 1;
	for (int d = 0; d < rank; d++) {
		if (ldims[d] <= 0 || gdims[d] <= 0 || ldims[d] >= PLANRT_IM_LIMIT / n)
			return 0;
		n *= ldims[d];
	}
	for (int d = rank - 1; d >= 0; d--) {
		p->gst[d] = s;
		s *= gdims[d];
		p->ldim[d] = planrt_divmod_make((uint32_t)ldims[d]);
		p->half[d] = (uint32_t)(ldims[d] / 2);
		p->first[d] = offs[d];
		p->second[d] = offs[rank + d];
	}
	p->rank = rank;
	p->n = (uint32_t)n;
	return 1;
}

/* the global index element i of the local block keys its random number on */
PLANRT_IM uint64_t planrt_dropout_key(const planrt_dropout_plan_t *p, uint32_t i)
{
	uint64_t g = 0;
	for (int d = p->rank - 1; d >= 0; d--) {
		uint32_t q = d ? planrt_div(p->ldim[d], i) : 0, c = i - q * p->ldim[d].d;
		g += (uint64_t)((c < p->half[d] ? p->first[d] + c : p->second[d] + c - p->half[d]) * p->gst[d]);
		i = q;
	}
	return g;
}

/* ------------------------------------------------------------------ rotary embeddings
 * RoPE rotates each row (b, head, s) of head_dim elements: pair (i, i + h) by the angle of position s
 * and frequency i for i < h = rot_dim / 2; the dims past rot_dim pass through. The angle, its cosine
 * and sine depend on (b, s, i), not on the head, so a thread takes one (b, s, j) for j < h + the
 * passed dims, and walks the heads: 1 / heads of the sines and cosines, two divisions a thread, and
 * the rows of one head still contiguous across a warp's threads. Rows run [b][head][s] with the heads
 * first, else [b][s][head]. */
typedef struct planrt_rope_plan {
	uint32_t n; /* threads: batch x seq x (h + head_dim - rot_dim) */
	planrt_divmod_t per_pos, seq; /* h + the passed dims; seq */
	uint32_t heads, head_dim, rot_dim, h;
	int heads_first;
} planrt_rope_plan_t;

/* Plans RoPE over [batch, seq, heads, head_dim] (heads_first: [batch, heads, seq, head_dim]). Returns
 * 1 with *p filled, or 0 when an element's offset does not fit in 31 bits or a size is not positive
 * (the caller keeps its 64-bit kernel). */
PLANRT_IM int planrt_rope_plan(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, int64_t rot_dim,
			       int heads_first, planrt_rope_plan_t *p)
{
	if (batch <= 0 || seq <= 0 || heads <= 0 || head_dim <= 0 || rot_dim < 0 || rot_dim % 2 || rot_dim > head_dim)
		return 0;
	int64_t per_pos = rot_dim / 2 + head_dim - rot_dim;
	if (batch >= PLANRT_IM_LIMIT / seq || batch * seq >= PLANRT_IM_LIMIT / heads ||
	    batch * seq * heads >= PLANRT_IM_LIMIT / head_dim)
		return 0; /* every element's offset below 2^31, and so every thread's index */
	p->n = (uint32_t)(batch * seq * per_pos);
	p->per_pos = planrt_divmod_make((uint32_t)per_pos);
	p->seq = planrt_divmod_make((uint32_t)seq);
	p->heads = (uint32_t)heads;
	p->head_dim = (uint32_t)head_dim;
	p->rot_dim = (uint32_t)rot_dim;
	p->h = (uint32_t)(rot_dim / 2);
	p->heads_first = heads_first;
	return 1;
}

/* thread t's sample *b, position *s and index *j (j < h: the pair (j, j + h); else the element
 * rot_dim + j - h, passed through) */
PLANRT_IM void planrt_rope_where(const planrt_rope_plan_t *p, uint32_t t, uint32_t *b, uint32_t *s, uint32_t *j)
{
	uint32_t bs = planrt_div(p->per_pos, t), q = planrt_div(p->seq, bs);
	*j = t - bs * p->per_pos.d;
	*s = bs - q * p->seq.d;
	*b = q;
}

/* where row (b, head, s) starts */
PLANRT_IM uint32_t planrt_rope_row(const planrt_rope_plan_t *p, uint32_t b, uint32_t s, uint32_t head)
{
	uint32_t row = p->heads_first ? (b * p->heads + head) * p->seq.d + s : (b * p->seq.d + s) * p->heads + head;
	return row * p->head_dim;
}

#endif
