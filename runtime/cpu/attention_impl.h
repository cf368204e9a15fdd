/* attention_impl.h: the fused attention kernels (FlashAttention-2's tiling on the CPU), included
 * by kernels.c after kernels_impl.h, once per element type (T, S, FN, KEXP, KLOG, KLEVEL as
 * there; no include guard).
 *
 * q [.., H, Sq, Dh], k and v [.., Hk, Sk, Dh] (H a multiple of Hk: query head h reads kv head
 * h / (H / Hk), grouped-query attention), out [.., H, Sq, Dh], lse [.., H, Sq]. The forward walks
 * each head's query rows in tiles of ATTN_BQ and the keys in tiles of ATTN_BK with an online
 * softmax (running row maximum m and sum l, the accumulator rescaled by exp(m_old - m_new)), so
 * nothing of size Sq x Sk is ever stored: it keeps the output and each row's logsumexp
 * lse = m + log l. The backward recomputes each score tile from q, k and lse (P = exp(S - lse)),
 * with D = rowsum(dout * out) in place of the softmax's rowsum(dP * P) (equal, dropout or not).
 * Every product of a tile (q k^T, P v, dout v^T, and the three gradient products) is one GEMM
 * through OpenBLAS (KGEMM) on the operands where they lie, so a tile's products run at the GEMM
 * kernel's rate; the softmax and the masks are row loops between them (docs/cpu.md, "Where the
 * step goes").
 *
 * Masks: mask_kind 1 is causal (key j > the query's global row gets no weight; key tiles past a
 * query tile's last row are skipped), 2 adds mask (strides per dim of the local scores, 0 where it
 * broadcasts). Dropout draws its keep mask from the same Philox stream as planrt_k_dropout on the
 * scores' global index (gdims: the scores' global shape, offs: this block's offsets), so the fused
 * and the unfused graphs drop the same probabilities. scratch: ATTN_SCRATCH_FLOATS(Dh) floats,
 * which lower.c sizes by the same formula.
 *
 * Threads (planrt_parallel_for): a call splits over (leading index, kv head); each thread works
 * on its own copy of the call and its own scratch (the call's for the first thread), so the bits
 * are the same at every thread count.
 *
 * Ring attention (context parallelism, compiler/lower/ring.c): planrt_k_ring_attention works on
 * one K/V block of the ring, the block that started on the rank at ring coordinate
 * (coord - step) mod size, so its keys sit at global offset key0 = that coordinate times sk: the
 * causal mask and dropout index the global key. Step 0 overwrites out and lse; later steps merge
 * the block's partial result into them with the online-softmax rule (lse = logaddexp(lse_a,
 * lse_b), out = out_a exp(lse_a - lse) + out_b exp(lse_b - lse)). Its gradient accumulates dq
 * from step 1 on and writes this block's dk and dv (the ring carries their sums). */

#ifndef ATTN_BQ
#define ATTN_BQ 64
#define ATTN_BK 64
/* S or P tile, dP tile, keep mask, room for two Dh x ATTN_BK tiles (unused since the products
 * became GEMMs on k and v in place; lower.c sizes the scratch by this formula), the output
 * accumulator, m l D */
#define ATTN_SCRATCH_FLOATS(dh) (3 * ATTN_BQ * ATTN_BK + 2 * ATTN_BK * (dh) + ATTN_BQ * (dh) + 3 * ATTN_BQ)
#endif

/* One call's shapes, masks and dropout, and where the head being worked on lives. */
typedef struct FN(AttnCall) {
	int rank;
	int64_t heads, kv_heads, sq, sk, dh, nlead;
	const int64_t *ldims, *mstr, *gdims, *offs;
	const T *mask;
	int causal;
	T scale, keep_scale;
	uint64_t thr, seed, key;
	double p;
	int64_t gst[KMAX_RANK];
	/* the head being worked on: its mask and dropout bases, its query rows' global offset */
	int64_t mask_base, drop_base, row0;
	int64_t key0;   /* the keys' global offset (ring attention's block; 0 otherwise) */
	int merge;      /* forward: merge into out and lse (a ring step after the first) */
} FN(AttnCall);

static void FN(attn_setup)(FN(AttnCall) *c, int rank, const int64_t *ldims, int64_t kv_heads, int64_t sk,
			   double scale, int mask_kind, const T *mask, const int64_t *mstr, double p,
			   uint64_t seed, uint64_t key, const int64_t *gdims, const int64_t *offs)
{
	if (rank < 3 || rank > KMAX_RANK)
		kfatal("attention rank out of range");
	if (planrt_evaluating_)
		p = 0;
	*c = (FN(AttnCall)){.rank = rank, .heads = ldims[rank - 3], .kv_heads = kv_heads, .sq = ldims[rank - 2],
			    .sk = sk, .dh = ldims[rank - 1], .nlead = 1, .ldims = ldims, .mstr = mstr,
			    .gdims = gdims, .offs = offs, .mask = mask_kind == 2 ? mask : NULL,
			    .causal = mask_kind == 1, .scale = (T)scale, .keep_scale = FN(kdropout_scale)(p),
			    .thr = dropout_threshold(p), .seed = seed, .key = key, .p = p};
	if (kv_heads <= 0 || c->heads % kv_heads)
		kfatal("attention: the query heads are not a multiple of the key/value heads");
	for (int d = 0; d < rank - 3; d++)
		c->nlead *= ldims[d];
	kstrides(rank, gdims, c->gst);
}

/* Points c at head (b, h): b the flat index over the leading dims. */
static void FN(attn_head)(FN(AttnCall) *c, int64_t b, int64_t h)
{
	int r = c->rank;
	int64_t rest = b, mb = 0, gb = 0;
	for (int d = r - 4; d >= 0; d--) {
		int64_t i = rest % c->ldims[d];
		rest /= c->ldims[d];
		mb += i * (c->mstr ? c->mstr[d] : 0);
		gb += (i + c->offs[d]) * c->gst[d];
	}
	c->mask_base = mb + h * (c->mstr ? c->mstr[r - 3] : 0);
	c->drop_base = gb + (h + c->offs[r - 3]) * c->gst[r - 3] + c->offs[r - 2] * c->gst[r - 2];
	c->row0 = c->offs[r - 2];
}

/* The scores of query rows [i0, i0 + nq) against keys [j0, j0 + nk), scaled and masked, into
 * s[nq][ATTN_BK]: one GEMM (q_tile k_tile^T, OpenBLAS), then the masks; masked entries are -inf. */
static void FN(attn_scores)(const FN(AttnCall) *c, const T *qh, const T *kh, int64_t i0, int64_t nq, int64_t j0,
			    int64_t nk, T *s)
{
	KGEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nq, (int)nk, (int)c->dh, c->scale, qh + i0 * c->dh,
	      (int)c->dh, kh + j0 * c->dh, (int)c->dh, 0, s, ATTN_BK);
	for (int64_t i = 0; i < nq; i++) {
		T *si = s + i * ATTN_BK;
		if (c->mask) {
			const T *mi = c->mask + c->mask_base + (i0 + i) * c->mstr[c->rank - 2];
			int64_t ms = c->mstr[c->rank - 1];
			for (int64_t j = 0; j < nk; j++)
				si[j] += mi[(j0 + j) * ms];
		}
		if (c->causal)
			for (int64_t j = 0; j < nk; j++)
				if (c->key0 + j0 + j > c->row0 + i0 + i)
					si[j] = -INFINITY;
	}
}

/* The dropout keep mask of the tile (1: kept), as planrt_k_dropout draws it. */
static void FN(attn_keep)(const FN(AttnCall) *c, int64_t i0, int64_t nq, int64_t j0, int64_t nk, uint8_t *keep)
{
	for (int64_t i = 0; i < nq; i++)
		dropout_mask_row(keep + i * ATTN_BK, nk,
				 (uint64_t)(c->drop_base + (i0 + i) * c->gst[c->rank - 2] + c->key0 + j0), 1,
				 c->thr, c->seed, c->key);
}

/* the last key a query tile [i0, i0 + nq) attends to, plus one */
static int64_t FN(attn_key_end)(const FN(AttnCall) *c, int64_t i0, int64_t nq)
{
	if (!c->causal)
		return c->sk;
	int64_t end = c->row0 + i0 + nq - c->key0;
	return end < 0 ? 0 : end < c->sk ? end : c->sk;
}

/* One query tile of one head: the online softmax over its key tiles; the scores and P v are GEMMs
 * (OpenBLAS) on the tile, the softmax's rescaling is row by row between them. */
static void FN(attn_forward_tile)(const FN(AttnCall) *c, const T *qh, const T *kh, const T *vh, int64_t i0,
				  int64_t nq, T *oh, T *lh, T *work)
{
	int64_t dh = c->dh;
	T *s = work, *acc = s + 3 * ATTN_BQ * ATTN_BK + 2 * ATTN_BK * dh, *m = acc + ATTN_BQ * dh, *l = m + ATTN_BQ;
	uint8_t *keep = (uint8_t *)(s + 2 * ATTN_BQ * ATTN_BK);
	for (int64_t i = 0; i < nq; i++) {
		m[i] = -INFINITY;
		l[i] = 0;
	}
	for (int64_t i = 0; i < nq * dh; i++)
		acc[i] = 0;
	int64_t jend = FN(attn_key_end)(c, i0, nq);
	for (int64_t j0 = 0; j0 < jend; j0 += ATTN_BK) {
		int64_t nk = jend - j0 < ATTN_BK ? jend - j0 : ATTN_BK;
		FN(attn_scores)(c, qh, kh, i0, nq, j0, nk, s);
		if (c->p > 0)
			FN(attn_keep)(c, i0, nq, j0, nk, keep);
		for (int64_t i = 0; i < nq; i++) {
			T *si = s + i * ATTN_BK, *ai = acc + i * dh;
			T mt = FN(kmax)(si, nk), mnew = mt > m[i] ? mt : m[i];
			if (mnew == -INFINITY) { /* every key so far masked: no weight */
				for (int64_t j = 0; j < nk; j++)
					si[j] = 0;
				continue;
			}
			T corr = KEXP(m[i] - mnew);
			for (int64_t j = 0; j < nk; j++)
				si[j] = KEXP(si[j] - mnew);
			l[i] = l[i] * corr + FN(ksum)(si, nk);
			m[i] = mnew;
			for (int64_t d = 0; d < dh; d++)
				ai[d] *= corr;
			if (c->p > 0) /* the dropped probabilities weigh v; l sums the kept and dropped alike */
				for (int64_t j = 0; j < nk; j++)
					si[j] = keep[i * ATTN_BK + j] ? si[j] * c->keep_scale : 0;
		}
		KGEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nq, (int)dh, (int)nk, 1, s, ATTN_BK, vh + j0 * dh,
		      (int)dh, 1, acc, (int)dh);
	}
	for (int64_t i = 0; i < nq; i++) {
		T inv = l[i] > 0 ? 1 / l[i] : 0, lse = l[i] > 0 ? m[i] + KLOG(l[i]) : -INFINITY;
		T *oi = oh + (i0 + i) * dh, old = c->merge ? lh[i0 + i] : -INFINITY;
		if (c->merge && lse == -INFINITY)
			continue; /* every key of this block masked: out and lse stay */
		if (old == -INFINITY) {
			for (int64_t d = 0; d < dh; d++)
				oi[d] = acc[i * dh + d] * inv;
			lh[i0 + i] = lse;
			continue;
		}
		T hi = old > lse ? old : lse, merged = hi + KLOG(KEXP(old - hi) + KEXP(lse - hi));
		T wa = KEXP(old - merged), wb = KEXP(lse - merged) * inv;
		for (int64_t d = 0; d < dh; d++)
			oi[d] = oi[d] * wa + acc[i * dh + d] * wb;
		lh[i0 + i] = merged;
	}
}

/* A call split over the threads (planrt_parallel_for) by unit u = (leading index u / kv_heads, kv
 * head u % kv_heads): the unit's query heads (its group), one after the other as in one thread, so
 * that a kv head's dk and dv sum its query heads in the same order at every thread count. */
typedef struct FN(AttnJob) FN(AttnJob);
struct FN(AttnJob) {
	const FN(AttnCall) *c;
	const T *const *in; /* forward: q k v; backward: q k v out lse dout */
	T *const *out;      /* forward: out lse; backward: dq dk dv */
	void *scratch;      /* the call's own: thread 0's */
	/* every query tile of query head qi (flat) of unit u, c pointed at the head */
	void (*head)(const FN(AttnCall) *c, const FN(AttnJob) *j, int64_t qi, int64_t u, T *work);
};

/* units [lo, hi) on one thread: its own copy of the call, pointed at each head in turn, and its
 * own scratch */
static void FN(attn_units)(void *ctx, int64_t lo, int64_t hi, int thread)
{
	const FN(AttnJob) *j = ctx;
	FN(AttnCall) c = *j->c;
	T *work = thread == 0 ? (T *)j->scratch
			      : (T *)planrt_thread_scratch(thread, sizeof(T) * (size_t)ATTN_SCRATCH_FLOATS(c.dh));
	int64_t group = c.heads / c.kv_heads;
	for (int64_t u = lo; u < hi; u++) {
		int64_t b = u / c.kv_heads, h0 = u % c.kv_heads * group;
		for (int64_t h = h0; h < h0 + group; h++) {
			FN(attn_head)(&c, b, h);
			j->head(&c, j, b * c.heads + h, u, work);
		}
	}
}

static void FN(attn_forward_head)(const FN(AttnCall) *c, const FN(AttnJob) *j, int64_t qi, int64_t u, T *work)
{
	int64_t dh = c->dh, sk = c->sk;
	for (int64_t i0 = 0; i0 < c->sq; i0 += ATTN_BQ)
		FN(attn_forward_tile)(c, j->in[0] + qi * c->sq * dh, j->in[1] + u * sk * dh, j->in[2] + u * sk * dh, i0,
				      c->sq - i0 < ATTN_BQ ? c->sq - i0 : ATTN_BQ, j->out[0] + qi * c->sq * dh,
				      j->out[1] + qi * c->sq, work);
}

/* Every query tile of every head of a call set up in c. */
static void FN(attn_forward)(FN(AttnCall) *c, const T *q, const T *k, const T *v, T *out, T *lse, void *scratch)
{
	const T *in[3] = {q, k, v};
	T *outs[2] = {out, lse};
	FN(AttnJob) job = {c, in, outs, scratch, FN(attn_forward_head)};
	planrt_parallel_for(c->nlead * c->kv_heads, FN(attn_units), &job);
}

void FN(planrt_k_attention)(const T *q, const T *k, const T *v, const T *mask, const int64_t *mask_strides, T *out,
			    T *lse, int rank, const int64_t *ldims, int64_t kv_heads, int64_t sk, double scale,
			    int mask_kind, double p, uint64_t seed, uint64_t key, const int64_t *gdims,
			    const int64_t *offs, void *scratch)
{
	KLEVEL(planrt_k_attention, (q, k, v, mask, mask_strides, out, lse, rank, ldims, kv_heads, sk, scale, mask_kind,
				    p, seed, key, gdims, offs, scratch));
	FN(AttnCall) c;
	FN(attn_setup)(&c, rank, ldims, kv_heads, sk, scale, mask_kind, mask, mask_strides, p, seed, key, gdims, offs);
	FN(attn_forward)(&c, q, k, v, out, lse, scratch);
}

/* the ring block's global key offset: the block started on coordinate (coord - step) mod size */
static int64_t FN(attn_ring_key0)(int64_t coord, int step, int size, int64_t sk)
{
	if (size <= 0 || coord < 0 || coord >= size || step < 0 || step >= size)
		kfatal("ring attention: step or coordinate out of range");
	return (int64_t)((coord - step + size) % size) * sk;
}

void FN(planrt_k_ring_attention)(const T *q, const T *k, const T *v, const T *mask, const int64_t *mask_strides,
				 T *out, T *lse, int rank, const int64_t *ldims, int64_t kv_heads, int64_t sk,
				 double scale, int mask_kind, double p, uint64_t seed, uint64_t key,
				 const int64_t *gdims, const int64_t *offs, void *scratch, int64_t coord, int step,
				 int size)
{
	KLEVEL(planrt_k_ring_attention, (q, k, v, mask, mask_strides, out, lse, rank, ldims, kv_heads, sk, scale,
					 mask_kind, p, seed, key, gdims, offs, scratch, coord, step, size));
	FN(AttnCall) c;
	FN(attn_setup)(&c, rank, ldims, kv_heads, sk, scale, mask_kind, mask, mask_strides, p, seed, key, gdims, offs);
	c.key0 = FN(attn_ring_key0)(coord, step, size, sk);
	c.merge = step > 0;
	FN(attn_forward)(&c, q, k, v, out, lse, scratch);
}

/* One score row of the backward, in place: s (the scores) becomes the dropped probabilities
 * Pd = P z and dp (dP) becomes dS = P (dP z - D) scale, with P = exp(s - lse) and z the keep
 * scale or 0 (keep NULL: no dropout, z = 1). Branch-free loops per case, so each vectorises. */
static void FN(attn_ds_row)(const FN(AttnCall) *c, T lse, T d, const uint8_t *keep, int64_t nk, T *s, T *dp)
{
	if (lse == -INFINITY) { /* every key masked: no probability, no gradient */
		for (int64_t j = 0; j < nk; j++)
			s[j] = dp[j] = 0;
		return;
	}
	for (int64_t j = 0; j < nk; j++)
		s[j] = KEXP(s[j] - lse);
	if (!keep) {
		for (int64_t j = 0; j < nk; j++)
			dp[j] = s[j] * (dp[j] - d) * c->scale;
		return;
	}
	for (int64_t j = 0; j < nk; j++) {
		T z = keep[j] ? c->keep_scale : 0, pj = s[j];
		s[j] = pj * z;
		dp[j] = pj * (dp[j] * z - d) * c->scale;
	}
}

/* One query tile of one head's backward: dq of its rows, its share of dk and dv. Per key tile, five
 * GEMMs (OpenBLAS) on the tile: S = q k^T (P recomputed from lse), dP = dout v^T, then with the
 * dropped probabilities Pd and dS = P (dP - D) scale: dv += Pd^T dout, dk += dS^T q, dq += dS k. */
static void FN(attn_backward_tile)(const FN(AttnCall) *c, const T *const *in, T *const *grad, int64_t i0,
				   int64_t nq, T *work)
{
	const T *qh = in[0], *kh = in[1], *vh = in[2], *oh = in[3], *lh = in[4], *doh = in[5];
	T *dq = grad[0], *dk = grad[1], *dv = grad[2];
	int dh = (int)c->dh;
	T *s = work, *dp = s + ATTN_BQ * ATTN_BK, *dd = s + 3 * ATTN_BQ * ATTN_BK + 2 * ATTN_BK * dh + ATTN_BQ * dh;
	uint8_t *keep = (uint8_t *)(s + 2 * ATTN_BQ * ATTN_BK);
	const T *qt = qh + i0 * dh, *dot = doh + i0 * dh;
	for (int64_t i = 0; i < nq; i++)
		dd[i] = FN(kdot)(dot + i * dh, oh + (i0 + i) * dh, dh);
	int64_t jend = FN(attn_key_end)(c, i0, nq);
	for (int64_t j0 = 0; j0 < jend; j0 += ATTN_BK) {
		int64_t nk = jend - j0 < ATTN_BK ? jend - j0 : ATTN_BK;
		FN(attn_scores)(c, qh, kh, i0, nq, j0, nk, s);
		if (c->p > 0)
			FN(attn_keep)(c, i0, nq, j0, nk, keep);
		/* dP (of the dropped probabilities) = dout v^T */
		KGEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nq, (int)nk, dh, 1, dot, dh, vh + j0 * dh, dh, 0, dp,
		      ATTN_BK);
		for (int64_t i = 0; i < nq; i++)
			FN(attn_ds_row)(c, lh[i0 + i], dd[i], c->p > 0 ? keep + i * ATTN_BK : NULL, nk, s + i * ATTN_BK,
					dp + i * ATTN_BK);
		KGEMM(CblasRowMajor, CblasTrans, CblasNoTrans, (int)nk, dh, (int)nq, 1, s, ATTN_BK, dot, dh, 1,
		      dv + j0 * dh, dh);
		KGEMM(CblasRowMajor, CblasTrans, CblasNoTrans, (int)nk, dh, (int)nq, 1, dp, ATTN_BK, qt, dh, 1,
		      dk + j0 * dh, dh);
		KGEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nq, dh, (int)nk, 1, dp, ATTN_BK, kh + j0 * dh, dh,
		      1, dq + i0 * dh, dh);
	}
}

static void FN(attn_backward_head)(const FN(AttnCall) *c, const FN(AttnJob) *j, int64_t qi, int64_t u, T *work)
{
	const T *const *t = j->in;
	int64_t dh = c->dh, sk = c->sk;
	const T *in[6] = {t[0] + qi * c->sq * dh, t[1] + u * sk * dh, t[2] + u * sk * dh,
			  t[3] + qi * c->sq * dh, t[4] + qi * c->sq, t[5] + qi * c->sq * dh};
	T *grad[3] = {j->out[0] + qi * c->sq * dh, j->out[1] + u * sk * dh, j->out[2] + u * sk * dh};
	for (int64_t i0 = 0; i0 < c->sq; i0 += ATTN_BQ)
		FN(attn_backward_tile)(c, in, grad, i0, c->sq - i0 < ATTN_BQ ? c->sq - i0 : ATTN_BQ, work);
}

/* The backward of a call set up in c: dq (+)= and dk, dv = (accumulate_dq: dq keeps its sum). */
static void FN(attn_backward)(FN(AttnCall) *c, const T *const *t, T *dq, T *dk, T *dv, int accumulate_dq,
			      void *scratch)
{
	int64_t dh = c->dh, sk = c->sk;
	if (!accumulate_dq)
		memset(dq, 0, sizeof(T) * (size_t)(c->nlead * c->heads * c->sq * dh));
	memset(dk, 0, sizeof(T) * (size_t)(c->nlead * c->kv_heads * sk * dh));
	memset(dv, 0, sizeof(T) * (size_t)(c->nlead * c->kv_heads * sk * dh));
	T *grads[3] = {dq, dk, dv};
	FN(AttnJob) job = {c, t, grads, scratch, FN(attn_backward_head)};
	planrt_parallel_for(c->nlead * c->kv_heads, FN(attn_units), &job);
}

void FN(planrt_k_attention_grad)(const T *q, const T *k, const T *v, const T *mask, const int64_t *mask_strides,
				 const T *out, const T *lse, const T *dout, T *dq, T *dk, T *dv, int rank,
				 const int64_t *ldims, int64_t kv_heads, int64_t sk, double scale, int mask_kind,
				 double p, uint64_t seed, uint64_t key, const int64_t *gdims, const int64_t *offs,
				 void *scratch)
{
	KLEVEL(planrt_k_attention_grad, (q, k, v, mask, mask_strides, out, lse, dout, dq, dk, dv, rank, ldims, kv_heads,
					 sk, scale, mask_kind, p, seed, key, gdims, offs, scratch));
	FN(AttnCall) c;
	FN(attn_setup)(&c, rank, ldims, kv_heads, sk, scale, mask_kind, mask, mask_strides, p, seed, key, gdims, offs);
	const T *t[6] = {q, k, v, out, lse, dout};
	FN(attn_backward)(&c, t, dq, dk, dv, 0, scratch);
}

void FN(planrt_k_ring_attention_grad)(const T *q, const T *k, const T *v, const T *mask,
				      const int64_t *mask_strides, const T *out, const T *lse, const T *dout, T *dq,
				      T *dk, T *dv, int rank, const int64_t *ldims, int64_t kv_heads, int64_t sk,
				      double scale, int mask_kind, double p, uint64_t seed, uint64_t key,
				      const int64_t *gdims, const int64_t *offs, void *scratch, int64_t coord, int step,
				      int size)
{
	KLEVEL(planrt_k_ring_attention_grad, (q, k, v, mask, mask_strides, out, lse, dout, dq, dk, dv, rank, ldims,
					      kv_heads, sk, scale, mask_kind, p, seed, key, gdims, offs, scratch, coord,
					      step, size));
	FN(AttnCall) c;
	FN(attn_setup)(&c, rank, ldims, kv_heads, sk, scale, mask_kind, mask, mask_strides, p, seed, key, gdims, offs);
	c.key0 = FN(attn_ring_key0)(coord, step, size, sk);
	const T *t[6] = {q, k, v, out, lse, dout};
	FN(attn_backward)(&c, t, dq, dk, dv, step > 0, scratch);
}
