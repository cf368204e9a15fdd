/* test_attention_tiles.c: the CUDA target's tiled attention (runtime/cuda/planrt_attention_tiles.h,
 * the fast path attention_cuda.cu takes for bf16 / f16 storage) executed on the host: each block's
 * function run by 128 threads with a barrier where the device synchronises, a warp's tensor-core
 * product done by its lane 0 in plain loops with WMMA's layouts, and shared memory filled with NaN
 * before each kernel so that a read of anything a phase did not write shows. Against planrt's CPU
 * kernels (planrt_k_attention_16 / _grad_16, the exact arithmetic on widened values): the row
 * logsumexps within 2e-5 (the scores' products are exact in f32 either way, only their order
 * differs), out, dq, dk and dv within a few units in the last place of the largest value (the
 * tiles round P and dS to the storage type before their products, as FlashAttention does). Odd
 * sizes (rows not a multiple of the 64-row tile, fewer queries than keys), head dims 16 / 64 / 80 /
 * 128, GQA ratios 1 / 4 / 8, causal (with tiles skipped, and queries in two halves apart as
 * a causally balanced sequence split holds them), padding and no mask, dropout (the keep decisions
 * must be the CPU's), both loads (8 elements at a time, one at a time), tiles of fewer than 64 rows
 * (what a load leaves in shared memory past the rows must not reach the products). Prints PASS/FAIL
 * per case; exits 1 on a failure, and is killed by SIGALRM if the threads deadlock (a barrier that
 * some of a block's threads skip). */
#include "planrt.h"
#include "planrt_exec.h"
#include "planrt_kernels.h"
#include "../../runtime/cuda/planrt_attention_tiles.h"
#include "attention_worst.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* one kernel's launch on the host: its kind, grid and arguments */
typedef struct TileLaunch {
	const AttnParams *a;
	int which;
	int64_t blocks;
	const void *q, *k, *v;
	const float *mask;
	void *out;
	float *lse;
	const void *const *in;
	void *d0, *d1;
	unsigned char *smem;
} TileLaunch;

static pthread_barrier_t block_barrier;
static const TileLaunch *launching;

void attn_tiles_host_sync(void)
{
	pthread_barrier_wait(&block_barrier);
}

static void *block_thread(void *arg)
{
	int tid = (int)(intptr_t)arg;
	const TileLaunch *L = launching;
	for (int64_t bid = 0; bid < L->blocks; bid++) {
		if (L->which == ATTN_TILES_FORWARD)
			attn_tile_forward_block(L->a, L->q, L->k, L->v, L->mask, L->out, L->lse, bid, tid, L->smem);
		else if (L->which == ATTN_TILES_DQ)
			attn_tile_dq_block(L->a, L->in, L->mask, L->d0, bid, tid, L->smem);
		else
			attn_tile_dkdv_block(L->a, L->in, L->mask, L->d0, L->d1, bid, tid, L->smem);
		attn_tiles_host_sync(); /* the next block reuses the shared memory */
	}
	return NULL;
}

/* runs every block of L on 128 host threads, shared memory NaN at the start */
static void launch(TileLaunch *L)
{
	AttnTiles t;
	size_t bytes = attn_tiles_carve(&t, NULL, L->a->dh, L->which);
	L->smem = aligned_alloc(128, bytes);
	memset(L->smem, 0xff, bytes);
	launching = L;
	pthread_t th[ATTN_TILE_THREADS];
	pthread_barrier_init(&block_barrier, NULL, ATTN_TILE_THREADS);
	for (int i = 0; i < ATTN_TILE_THREADS; i++)
		pthread_create(&th[i], NULL, block_thread, (void *)(intptr_t)i);
	for (int i = 0; i < ATTN_TILE_THREADS; i++)
		pthread_join(th[i], NULL);
	pthread_barrier_destroy(&block_barrier);
	free(L->smem);
}

static float *rnd(int64_t n, unsigned *s)
{
	float *x = malloc(sizeof(float) * (size_t)n);
	for (int64_t i = 0; i < n; i++) {
		*s = *s * 1103515245u + 12345u;
		x[i] = (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
	}
	return x;
}

static uint16_t *stored(const float *x, int64_t n, planrt_dtype_t t)
{
	uint16_t *h = malloc(sizeof(uint16_t) * (size_t)n);
	planrt_cast(x, planrt_f32, h, t, n);
	return h;
}

typedef struct Case {
	int64_t sq, sk, dh, H, Hk;
	int mask;  /* 0 none, 1 causal, 2 padding */
	double p;  /* dropout */
	int64_t q2; /* > 0: query rows from sq / 2 on start at global row q2 (two halves apart) */
	planrt_dtype_t t;
	int vec;
	float qscale; /* q in [-qscale, qscale): at 1000 scores pass exp's range, a row's maximum must be right */
} Case;

static int run_case(const Case *c)
{
	unsigned seed = (unsigned)(c->sq * 31 + c->sk * 7 + c->dh + c->H * 5 + c->mask + (c->p > 0) + c->vec);
	int64_t B = 2, sq = c->sq, sk = c->sk, dh = c->dh, nq = B * c->H * sq * dh, nk = B * c->Hk * sk * dh;
	int64_t nl = B * c->H * sq;
	int64_t ldims[4] = {B, c->H, sq, dh}, gdims[4] = {B, c->H, sk, sk};
	int64_t offs[8] = {0, 0, 0, 0, 0, 0, c->q2 > 0 ? c->q2 : sq / 2, 0};
	int64_t mstr[4] = {sk, 0, 0, 1}; /* a [B, 1, 1, sk] key padding mask */
	float *qf = rnd(nq, &seed), *kf = rnd(nk, &seed), *vf = rnd(nk, &seed), *gf = rnd(nq, &seed);
	for (int64_t i = 0; i < nq; i++)
		qf[i] *= c->qscale; /* scores large enough that the softmax is not flat */
	uint16_t *q = stored(qf, nq, c->t), *k = stored(kf, nk, c->t), *v = stored(vf, nk, c->t);
	uint16_t *dout = stored(gf, nq, c->t);
	float *mask = calloc((size_t)(B * sk), sizeof(float)), *lse[2];
	for (int64_t b = 0; b < B; b++)
		for (int64_t j = sk - 1 - b * (sk / 3); j < sk; j++)
			mask[b * sk + j] = -1e9f; /* the last keys of each sample padded */
	uint16_t *o[2], *g[2][3];
	for (int w = 0; w < 2; w++) {
		o[w] = calloc((size_t)nq, 2);
		lse[w] = calloc((size_t)nl, sizeof(float));
		g[w][0] = calloc((size_t)nq, 2);
		g[w][1] = calloc((size_t)nk, 2);
		g[w][2] = calloc((size_t)nk, 2);
	}
	double scale = 1 / sqrt((double)dh);
	uint8_t *scratch = malloc(sizeof(float) * (size_t)(3 * 64 * 64 + 3 * 64 * dh + 3 * 64));
	planrt_k_attention_16(q, k, v, mask, mstr, o[0], lse[0], 4, ldims, c->Hk, sk, scale, c->mask, c->p, 77, 5, gdims,
			      offs, scratch, c->t);
	planrt_k_attention_grad_16(q, k, v, mask, mstr, o[0], lse[0], dout, g[0][0], g[0][1], g[0][2], 4, ldims, c->Hk,
				   sk, scale, c->mask, c->p, 77, 5, gdims, offs, scratch, c->t);
	AttnParams a;
	if (!attn_params(&a, 4, ldims, c->Hk, sk, scale, c->mask, mstr, c->p, 77, 5, gdims, offs))
		return 1;
	a.storage = c->t == planrt_bf16 ? ATTN_BF16 : ATTN_F16;
	a.tile_vec = c->vec;
	if (!attn_tiles_take(&a)) {
		printf("FAIL: the tiles do not take head dim %lld\n", (long long)dh);
		return 1;
	}
	int64_t ntq = (sq + ATTN_TILE - 1) / ATTN_TILE, ntk = (sk + ATTN_TILE - 1) / ATTN_TILE;
	TileLaunch fwd = {&a, ATTN_TILES_FORWARD, ntq * B * c->H, q, k, v, mask, o[1], lse[1], NULL, NULL, NULL, NULL};
	launch(&fwd);
	/* the backward from the CPU's forward, so that its differences are the backward's alone */
	const void *in[6] = {q, k, v, o[0], lse[0], dout};
	TileLaunch dq = {&a, ATTN_TILES_DQ, ntq * B * c->H, NULL, NULL, NULL, mask, NULL, NULL, in, g[1][0], NULL, NULL};
	TileLaunch dkdv = {&a, ATTN_TILES_DKDV, ntk * B * c->Hk, NULL, NULL, NULL, mask, NULL, NULL, in, g[1][1], g[1][2],
			   NULL};
	launch(&dq);
	launch(&dkdv);
	double e[5] = {attention_worst(o[0], o[1], nq, c->t), attention_worst(lse[0], lse[1], nl, planrt_f32),
		       attention_worst(g[0][0], g[1][0], nq, c->t), attention_worst(g[0][1], g[1][1], nk, c->t),
		       attention_worst(g[0][2], g[1][2], nk, c->t)};
	double ulp = c->t == planrt_bf16 ? 1.0 / 128 : 1.0 / 1024, m = 0; /* of a value in [1, 2) */
	for (int i = 0; i < 5; i++)
		if (i != 1)
			m = e[i] / ulp > m ? e[i] / ulp : m;
	int ok = m <= 3 && e[1] <= 2e-5;
	static const char *const masks[] = {"none", "causal", "padding"};
	printf("%s: %s, queries %lld (second half at %lld) keys %lld, head dim %lld, heads %lld / kv %lld, mask %s, "
	       "dropout %g, %s loads: out %.2f dq %.2f dk %.2f dv %.2f units in the last place of the largest value "
	       "(at most 3), lse %.1e (at most 2e-5)\n",
	       ok ? "PASS" : "FAIL", c->t == planrt_bf16 ? "bf16" : "f16", (long long)sq, (long long)a.qoff2,
	       (long long)sk, (long long)dh, (long long)c->H, (long long)c->Hk, masks[c->mask], c->p,
	       c->vec ? "16-byte" : "2-byte", e[0] / ulp, e[2] / ulp, e[3] / ulp, e[4] / ulp, e[1]);
	void *all[] = {scratch, qf, kf, vf, gf, q, k, v, dout, mask, o[0], o[1], lse[0], lse[1], g[0][0], g[0][1], g[0][2],
		       g[1][0], g[1][1], g[1][2]};
	for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
		free(all[i]);
	return !ok;
}

int main(void)
{
	static const Case cases[] = {
		{67, 67, 64, 2, 2, 1, 0, 0, planrt_bf16, 1, 2},
		{130, 130, 128, 4, 1, 2, 0.1, 0, planrt_bf16, 1, 2},
		{97, 97, 80, 8, 1, 0, 0, 0, planrt_f16, 0, 2},
		{64, 64, 16, 2, 2, 1, 0.2, 0, planrt_f16, 1, 2},
		{70, 150, 64, 4, 4, 2, 0, 0, planrt_bf16, 0, 2},
		{128, 256, 64, 2, 1, 1, 0, 192, planrt_bf16, 1, 2},
		{150, 150, 128, 2, 2, 1, 0, 0, planrt_f16, 1, 2},
		{65, 65, 32, 2, 1, 1, 0, 0, planrt_bf16, 0, 2},
		{50, 50, 32, 4, 2, 1, 0.1, 0, planrt_bf16, 0, 2},
		{40, 40, 64, 2, 2, 0, 0, 0, planrt_f16, 1, 2},
		{100, 100, 64, 2, 2, 1, 0.1, 0, planrt_bf16, 1, 1000}, /* scores to about +-500: past exp's range */
	};
	int failed = 0, n = (int)(sizeof cases / sizeof cases[0]);
	alarm(300); /* a block whose threads miss each other's barrier hangs: that fails the test too */
	for (int i = 0; i < n; i++)
		failed += run_case(&cases[i]);
	printf("attention tiles: %d passed, %d failed\n", n - failed, failed);
	return failed != 0;
}
