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
 * broadcasts; its key columns are every key of the sequence, read at the global key: the ring's
 * blocks index the whole mask each rank holds, shard.c keeps an additive mask's key dim whole). Dropout draws its keep mask from the same Philox stream as planrt_k_dropout on the
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
 * s = (coord - step) mod size, so its keys sit at global offset s sk: the causal mask and dropout
 * index the global key. Under causal load balancing (`mirrored`) every block is two mirrored
 * chunks, the chunks s and 2 size - 1 - s of 2 size (the queries' two halves come with their block
 * offset list, planrt_block_split_dim): queries and keys are walked piece by piece (a tile never
 * straddles two chunks), each piece at its global rows, so every rank has the same unmasked tiles. Step 0 overwrites out and lse; later steps merge
 * the block's partial result into them with the online-softmax rule (lse = logaddexp(lse_a,
 * lse_b), out = out_a exp(lse_a - lse) + out_b exp(lse_b - lse)). Its gradient accumulates dq
 * from step 1 on and writes this block's dk and dv (the ring carries their sums). */

#ifndef ATTN_BQ
#define ATTN_BQ PLANRT_ATTN_TILE
#define ATTN_BK PLANRT_ATTN_TILE
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
	/* the head being worked on: its mask and dropout bases */
	int64_t mask_base, drop_base;
	/* the query rows and the keys in pieces (two: a balanced ring's mirrored chunks): piece i's local
	 * rows [first, first + len), global row = local row + shift; qshift: the piece being walked */
	int nqp, nkp;
	int64_t qfirst[2], qlen[2], qs[2], kfirst[2], klen[2], kshift[2], qshift;
	int merge;      /* forward: merge into out and lse (a ring step after the first) */
	int64_t tiles, scores; /* query tile x key tile products done and their scores (planrt_attention_tiles_) */
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
	int64_t half = c->sq / 2;
	c->nqp = offs[2 * rank - 2] != offs[rank - 2] + half ? 2 : 1; /* mirrored query rows */
	c->qfirst[0] = 0;
	c->qlen[0] = c->nqp == 2 ? half : c->sq;
	c->qs[0] = offs[rank - 2];
	c->qfirst[1] = half;
	c->qlen[1] = c->sq - half;
	c->qs[1] = offs[2 * rank - 2] - half;
	c->nkp = 1; /* every key, at global 0 (a ring step sets its block's) */
	c->kfirst[0] = 0;
	c->klen[0] = sk;
	c->kshift[0] = 0;
}

/* the ring's block: it started on coordinate s = (coord - step) mod size; mirrored (causal load
 * balancing) its chunks s and 2 size - 1 - s of 2 size, else block s */
static void FN(attn_ring_keys)(FN(AttnCall) *c, int64_t coord, int step, int size, int mirrored)
{
	if (size <= 0 || coord < 0 || coord >= size || step < 0 || step >= size)
		kfatal("ring attention: step or coordinate out of range");
	int64_t s = (coord - step + size) % size, half = c->sk / 2;
	if (mirrored) { /* the queries in their two chunks even where they meet (chunks size - 1, size) */
		c->nqp = 2;
		c->qlen[0] = c->sq / 2;
	}
	if (!mirrored) {
		c->kshift[0] = s * c->sk;
		return;
	}
	c->nkp = 2;
	c->klen[0] = half;
	c->kshift[0] = s * half;
	c->kfirst[1] = half;
	c->klen[1] = c->sk - half;
	c->kshift[1] = (2 * size - 1 - s) * half - half;
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
	c->drop_base = gb + (h + c->offs[r - 3]) * c->gst[r - 3];
}

/* The scores of query rows [i0, i0 + nq) against keys [j0, j0 + nk) (of the key piece whose global
 * key is local + kshift), scaled and masked, into s[nq][ATTN_BK]: one GEMM (q_tile k_tile^T,
 * OpenBLAS), then the masks; masked entries are -inf. */
static void FN(attn_scores)(const FN(AttnCall) *c, const T *qh, const T *kh, int64_t i0, int64_t nq, int64_t j0,
			    int64_t nk, int64_t kshift, T *s)
{
	KGEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nq, (int)nk, (int)c->dh, c->scale, qh + i0 * c->dh,
	      (int)c->dh, kh + j0 * c->dh, (int)c->dh, 0, s, ATTN_BK);
	for (int64_t i = 0; i < nq; i++) {
		T *si = s + i * ATTN_BK;
		if (c->mask) { /* its key columns at the global key (kshift: 0 but on the ring) */
			const T *mi = c->mask + c->mask_base + (i0 + i) * c->mstr[c->rank - 2];
			int64_t ms = c->mstr[c->rank - 1];
			for (int64_t j = 0; j < nk; j++)
				si[j] += mi[(kshift + j0 + j) * ms];
		}
		if (c->causal)
			for (int64_t j = 0; j < nk; j++)
				if (kshift + j0 + j > c->qshift + i0 + i)
					si[j] = -INFINITY;
	}
}

/* The dropout keep mask of the tile (1: kept), as planrt_k_dropout draws it. */
static void FN(attn_keep)(const FN(AttnCall) *c, int64_t i0, int64_t nq, int64_t j0, int64_t nk, int64_t kshift,
			  uint8_t *keep)
{
	for (int64_t i = 0; i < nq; i++)
		dropout_mask_row(keep + i * ATTN_BK, nk,
				 (uint64_t)(c->drop_base + (c->qshift + i0 + i) * c->gst[c->rank - 2] + kshift + j0), 1,
				 c->thr, c->seed, c->key);
}

/* the last key of key piece kp a query tile [i0, i0 + nq) attends to, plus one (its first key when
 * it attends to none) */
static int64_t FN(attn_key_end)(const FN(AttnCall) *c, int kp, int64_t i0, int64_t nq)
{
	int64_t first = c->kfirst[kp], end = first + c->klen[kp];
	if (!c->causal)
		return end;
	int64_t last = c->qshift + i0 + nq - c->kshift[kp]; /* the causal bound in local keys */
	return last < first ? first : last < end ? last : end;
}

/* One query tile of one head: the online softmax over its key tiles; the scores and P v are GEMMs
 * (OpenBLAS) on the tile, the softmax's rescaling is row by row between them. */
static void FN(attn_forward_tile)(FN(AttnCall) *c, const T *qh, const T *kh, const T *vh, int64_t i0,
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
	for (int kp = 0; kp < c->nkp; kp++)
	for (int64_t j0 = c->kfirst[kp], jend = FN(attn_key_end)(c, kp, i0, nq); j0 < jend; j0 += ATTN_BK) {
		int64_t nk = jend - j0 < ATTN_BK ? jend - j0 : ATTN_BK;
		c->tiles++;
		c->scores += nq * nk;
		FN(attn_scores)(c, qh, kh, i0, nq, j0, nk, c->kshift[kp], s);
		if (c->p > 0)
			FN(attn_keep)(c, i0, nq, j0, nk, c->kshift[kp], keep);
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
	void (*head)(FN(AttnCall) *c, const FN(AttnJob) *j, int64_t qi, int64_t u, T *work);
	int phase; /* 0 forward, 1 backward: which of planrt_attention_tiles_/scores_ the counts go to */
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
			planrt_comm_progress_(); /* a transfer in flight moves between heads (planrt.h) */
			FN(attn_head)(&c, b, h);
			j->head(&c, j, b * c.heads + h, u, work);
		}
	}
	__atomic_add_fetch(&planrt_attention_tiles_[j->phase], c.tiles, __ATOMIC_RELAXED);
	__atomic_add_fetch(&planrt_attention_scores_[j->phase], c.scores, __ATOMIC_RELAXED);
}

/* Every query tile of head qi, piece by piece (a mirrored ring block holds two pieces of rows). */
static void FN(attn_forward_head)(FN(AttnCall) *c, const FN(AttnJob) *j, int64_t qi, int64_t u, T *work)
{
	int64_t dh = c->dh, sk = c->sk;
	for (int qp = 0; qp < c->nqp; qp++) {
		int64_t end = c->qfirst[qp] + c->qlen[qp];
		c->qshift = c->qs[qp];
		for (int64_t i0 = c->qfirst[qp]; i0 < end; i0 += ATTN_BQ)
			FN(attn_forward_tile)(c, j->in[0] + qi * c->sq * dh, j->in[1] + u * sk * dh,
					      j->in[2] + u * sk * dh, i0, end - i0 < ATTN_BQ ? end - i0 : ATTN_BQ,
					      j->out[0] + qi * c->sq * dh, j->out[1] + qi * c->sq, work);
	}
}

/* Every query tile of every head of a call set up in c. */
static void FN(attn_forward)(FN(AttnCall) *c, const T *q, const T *k, const T *v, T *out, T *lse, void *scratch)
{
	const T *in[3] = {q, k, v};
	T *outs[2] = {out, lse};
	FN(AttnJob) job = {c, in, outs, scratch, FN(attn_forward_head), 0};
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
	double t0 = planrt_now();
	FN(attn_setup)(&c, rank, ldims, kv_heads, sk, scale, mask_kind, mask, mask_strides, p, seed, key, gdims, offs);
	FN(attn_forward)(&c, q, k, v, out, lse, scratch);
	planrt_attention_s_ += planrt_now() - t0;
}

void FN(planrt_k_ring_attention)(const T *q, const T *k, const T *v, const T *mask, const int64_t *mask_strides,
				 T *out, T *lse, int rank, const int64_t *ldims, int64_t kv_heads, int64_t sk,
				 double scale, int mask_kind, double p, uint64_t seed, uint64_t key,
				 const int64_t *gdims, const int64_t *offs, void *scratch, int64_t coord, int step,
				 int size, int mirrored)
{
	KLEVEL(planrt_k_ring_attention, (q, k, v, mask, mask_strides, out, lse, rank, ldims, kv_heads, sk, scale,
					 mask_kind, p, seed, key, gdims, offs, scratch, coord, step, size, mirrored));
	FN(AttnCall) c;
	double t0 = planrt_now();
	FN(attn_setup)(&c, rank, ldims, kv_heads, sk, scale, mask_kind, mask, mask_strides, p, seed, key, gdims, offs);
	FN(attn_ring_keys)(&c, coord, step, size, mirrored);
	c.merge = step > 0;
	FN(attn_forward)(&c, q, k, v, out, lse, scratch);
	planrt_attention_s_ += planrt_now() - t0;
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
static void FN(attn_backward_tile)(FN(AttnCall) *c, const T *const *in, T *const *grad, int64_t i0,
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
	for (int kp = 0; kp < c->nkp; kp++)
	for (int64_t j0 = c->kfirst[kp], jend = FN(attn_key_end)(c, kp, i0, nq); j0 < jend; j0 += ATTN_BK) {
		int64_t nk = jend - j0 < ATTN_BK ? jend - j0 : ATTN_BK;
		c->tiles++;
		c->scores += nq * nk;
		FN(attn_scores)(c, qh, kh, i0, nq, j0, nk, c->kshift[kp], s);
		if (c->p > 0)
			FN(attn_keep)(c, i0, nq, j0, nk, c->kshift[kp], keep);
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

static void FN(attn_backward_head)(FN(AttnCall) *c, const FN(AttnJob) *j, int64_t qi, int64_t u, T *work)
{
	const T *const *t = j->in;
	int64_t dh = c->dh, sk = c->sk;
	const T *in[6] = {t[0] + qi * c->sq * dh, t[1] + u * sk * dh, t[2] + u * sk * dh,
			  t[3] + qi * c->sq * dh, t[4] + qi * c->sq, t[5] + qi * c->sq * dh};
	T *grad[3] = {j->out[0] + qi * c->sq * dh, j->out[1] + u * sk * dh, j->out[2] + u * sk * dh};
	for (int qp = 0; qp < c->nqp; qp++) {
		int64_t end = c->qfirst[qp] + c->qlen[qp];
		c->qshift = c->qs[qp];
		for (int64_t i0 = c->qfirst[qp]; i0 < end; i0 += ATTN_BQ)
			FN(attn_backward_tile)(c, in, grad, i0, end - i0 < ATTN_BQ ? end - i0 : ATTN_BQ, work);
	}
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
	FN(AttnJob) job = {c, t, grads, scratch, FN(attn_backward_head), 1};
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
	double t0 = planrt_now();
	FN(attn_setup)(&c, rank, ldims, kv_heads, sk, scale, mask_kind, mask, mask_strides, p, seed, key, gdims, offs);
	const T *t[6] = {q, k, v, out, lse, dout};
	FN(attn_backward)(&c, t, dq, dk, dv, 0, scratch);
	planrt_attention_s_ += planrt_now() - t0;
}

void FN(planrt_k_ring_attention_grad)(const T *q, const T *k, const T *v, const T *mask,
				      const int64_t *mask_strides, const T *out, const T *lse, const T *dout, T *dq,
				      T *dk, T *dv, int rank, const int64_t *ldims, int64_t kv_heads, int64_t sk,
				      double scale, int mask_kind, double p, uint64_t seed, uint64_t key,
				      const int64_t *gdims, const int64_t *offs, void *scratch, int64_t coord, int step,
				      int size, int mirrored)
{
	KLEVEL(planrt_k_ring_attention_grad, (q, k, v, mask, mask_strides, out, lse, dout, dq, dk, dv, rank, ldims,
					      kv_heads, sk, scale, mask_kind, p, seed, key, gdims, offs, scratch, coord,
					      step, size, mirrored));
	FN(AttnCall) c;
	double t0 = planrt_now();
	FN(attn_setup)(&c, rank, ldims, kv_heads, sk, scale, mask_kind, mask, mask_strides, p, seed, key, gdims, offs);
	FN(attn_ring_keys)(&c, coord, step, size, mirrored);
	const T *t[6] = {q, k, v, out, lse, dout};
	FN(attn_backward)(&c, t, dq, dk, dv, step > 0, scratch);
	planrt_attention_s_ += planrt_now() - t0;
}
