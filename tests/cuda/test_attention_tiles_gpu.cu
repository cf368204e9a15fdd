/* test_attention_tiles_gpu.cu: the tiled attention on the GPU (scripts/gpu-check.sh runs it; CI
 * builds it in cuda_one_process and it skips without a GPU). planrt_cu_k_attention_16 and _grad_16
 * on the device, the tiles unless PLANRT_ATTENTION=exact, against planrt's CPU kernels on the same
 * 16-bit inputs (planrt_k_attention_16 / _grad_16, the exact arithmetic on widened values): the row
 * logsumexps within 2e-5, out, dq, dk and dv within 3 units in the last place of the largest value,
 * the tolerances tests/cuda/test_attention_tiles.c holds the host run of the same blocks to. The
 * backward is given the CPU's out and lse, so its differences are its own. Odd sizes, head dims
 * 16-128, GQA 1/4/8, causal, padding and no mask, dropout (the keep decisions must be the CPU's),
 * bf16 and f16. `--small` runs the first case alone (for compute-sanitizer's memcheck, racecheck
 * and synccheck, which gpu-check.sh runs where the sanitizer works).
 * Prints PASS/FAIL lines; exit status 0 when all passed, 77 without a GPU. */
#define PLANRT_INTERNAL
#include "planrt_cuda.h"
#include "planrt_cuda_internal.h"
#include "planrt_exec.h"
#include "attention_worst.h"
#include "device_copy.h"
#include "tally.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct Case {
	int64_t B, sq, sk, dh, H, Hk;
	int mask; /* 0 none, 1 causal, 2 padding */
	double p;
	planrt_dtype_t t;
	float qscale; /* q in [-qscale, qscale): at 1000 scores pass exp's range */
} Case;

static float *rnd(int64_t n, unsigned *s, float scale)
{
	float *x = (float *)malloc(sizeof(float) * (size_t)n);
	for (int64_t i = 0; i < n; i++) {
		*s = *s * 1103515245u + 12345u;
		x[i] = ((float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f) * scale;
	}
	return x;
}

static void *stored(const float *x, int64_t n, planrt_dtype_t t)
{
	void *h = malloc(2 * (size_t)n);
	planrt_cast(x, planrt_f32, h, t, n);
	return h;
}

static void run_case(const Case *c)
{
	unsigned seed = (unsigned)(c->sq * 31 + c->dh + c->H * 5 + c->mask);
	int64_t B = c->B, sq = c->sq, sk = c->sk, dh = c->dh, nq = B * c->H * sq * dh, nk = B * c->Hk * sk * dh;
	int64_t nl = B * c->H * sq;
	int64_t ldims[4] = {B, c->H, sq, dh}, gdims[4] = {B, c->H, sk, sk}, offs[8] = {0, 0, 0, 0, 0, 0, sq / 2, 0};
	int64_t mstr[4] = {sk, 0, 0, 1};
	float *qf = rnd(nq, &seed, c->qscale), *kf = rnd(nk, &seed, 1), *vf = rnd(nk, &seed, 1), *gf = rnd(nq, &seed, 1);
	void *q = stored(qf, nq, c->t), *k = stored(kf, nk, c->t), *v = stored(vf, nk, c->t), *dout = stored(gf, nq, c->t);
	float *mask = (float *)calloc((size_t)(B * sk), sizeof(float));
	for (int64_t b = 0; b < B; b++)
		for (int64_t j = sk - 1 - b * (sk / 3); j < sk && j >= 0; j++)
			mask[b * sk + j] = -1e9f;
	double scale = 1 / sqrt((double)dh);
	/* the CPU */
	void *o = calloc((size_t)nq, 2), *dq = calloc((size_t)nq, 2), *dk = calloc((size_t)nk, 2), *dv = calloc((size_t)nk, 2);
	float *lse = (float *)calloc((size_t)nl, sizeof(float));
	uint8_t *scratch = (uint8_t *)malloc(sizeof(float) * (size_t)(3 * 64 * 64 + 3 * 64 * dh + 3 * 64));
	planrt_k_attention_16(q, k, v, mask, mstr, o, lse, 4, ldims, c->Hk, sk, scale, c->mask, c->p, 77, 5, gdims, offs,
			      scratch, c->t);
	planrt_k_attention_grad_16(q, k, v, mask, mstr, o, lse, dout, dq, dk, dv, 4, ldims, c->Hk, sk, scale, c->mask,
				   c->p, 77, 5, gdims, offs, scratch, c->t);
	/* the GPU: the forward from the inputs, the backward from the CPU's out and lse */
	void *d_q = to_device(q, 2 * nq), *d_k = to_device(k, 2 * nk), *d_v = to_device(v, 2 * nk);
	void *d_dout = to_device(dout, 2 * nq), *d_o = to_device(o, 2 * nq), *d_lse = to_device(lse, 4 * nl);
	float *d_mask = (float *)to_device(mask, sizeof(float) * (size_t)(B * sk));
	void *d_out = to_device(dq, 2 * nq), *d_lse2 = to_device(lse, 4 * nl); /* overwritten */
	void *d_dq = to_device(dq, 2 * nq), *d_dk = to_device(dk, 2 * nk), *d_dv = to_device(dv, 2 * nk);
	cudaMemset(d_out, 0xff, 2 * nq);
	cudaMemset(d_lse2, 0xff, 4 * nl);
	cudaMemset(d_dq, 0xff, 2 * nq);
	cudaMemset(d_dk, 0xff, 2 * nk);
	cudaMemset(d_dv, 0xff, 2 * nk);
	const float *m = c->mask == 2 ? d_mask : NULL;
	planrt_cu_k_attention_16(d_q, d_k, d_v, m, mstr, d_out, (float *)d_lse2, 4, ldims, c->Hk, sk, scale, c->mask, c->p,
				 77, 5, gdims, offs, NULL, c->t, PLANRT_STREAM_COMPUTE);
	planrt_cu_k_attention_grad_16(d_q, d_k, d_v, m, mstr, d_o, (const float *)d_lse, d_dout, d_dq, d_dk, d_dv, 4, ldims,
				      c->Hk, sk, scale, c->mask, c->p, 77, 5, gdims, offs, NULL, c->t,
				      PLANRT_STREAM_COMPUTE);
	cudaError_t e = cudaDeviceSynchronize();
	CHECK(e == cudaSuccess, "the kernels: %s", cudaGetErrorString(e));
	void *g_out = to_host(d_out, 2 * nq), *g_lse = to_host(d_lse2, 4 * nl), *g_dq = to_host(d_dq, 2 * nq);
	void *g_dk = to_host(d_dk, 2 * nk), *g_dv = to_host(d_dv, 2 * nk);
	double ulp = c->t == planrt_bf16 ? 1.0 / 128 : 1.0 / 1024;
	double eo = attention_worst(o, g_out, nq, c->t) / ulp, el = attention_worst(lse, g_lse, nl, planrt_f32);
	double eq = attention_worst(dq, g_dq, nq, c->t) / ulp, ek = attention_worst(dk, g_dk, nk, c->t) / ulp;
	double ev = attention_worst(dv, g_dv, nk, c->t) / ulp;
	static const char *const masks[] = {"none", "causal", "padding"};
	const char *tn = c->t == planrt_bf16 ? "bf16" : "f16";
	CHECK(eo <= 3 && el <= 2e-5 && eq <= 3 && ek <= 3 && ev <= 3,
	      "%s B %lld S %lld / %lld, head dim %lld, heads %lld / %lld, mask %s, dropout %g", tn, (long long)B,
	      (long long)sq, (long long)sk, (long long)dh, (long long)c->H, (long long)c->Hk, masks[c->mask], c->p);
	printf("  %s B %lld S %lld / %lld, head dim %lld, heads %lld / kv %lld, mask %s, dropout %g: out %.2f dq %.2f dk %.2f "
	       "dv %.2f units in the last place of the largest value (at most 3), lse %.1e (at most 2e-5)\n",
	       tn, (long long)B, (long long)sq, (long long)sk, (long long)dh,
	       (long long)c->H, (long long)c->Hk, masks[c->mask], c->p, eo, eq, ek, ev, el);
	void *host[] = {qf, kf, vf, gf, q, k, v, dout, mask, o, dq, dk, dv, lse, scratch, g_out, g_lse, g_dq, g_dk, g_dv};
	for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
		free(host[i]);
	void *dev[] = {d_q, d_k, d_v, d_dout, d_o, d_lse, d_mask, d_out, d_lse2, d_dq, d_dk, d_dv};
	for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
		cudaFree(dev[i]);
}

int main(int argc, char **argv)
{
	int count = 0;
	if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) {
		printf("skip: no CUDA GPU here (this test runs on the GPU machine: scripts/gpu-check.sh)\n");
		return 77;
	}
	static const Case cases[] = {
		{2, 67, 67, 64, 2, 2, 1, 0.0, planrt_bf16, 2},
		{2, 130, 130, 128, 4, 1, 2, 0.1, planrt_bf16, 2},
		{2, 97, 97, 80, 8, 1, 0, 0.0, planrt_f16, 2},
		{2, 64, 64, 16, 2, 2, 1, 0.2, planrt_f16, 2},
		{2, 70, 150, 64, 4, 4, 2, 0.0, planrt_bf16, 2},
		{1, 1000, 1000, 128, 8, 2, 1, 0.0, planrt_bf16, 2},
		{4, 333, 333, 64, 4, 4, 1, 0.1, planrt_bf16, 2},
		{1, 520, 520, 96, 4, 1, 2, 0.0, planrt_f16, 2},
		{2, 100, 100, 64, 2, 2, 1, 0.1, planrt_bf16, 1000},
	};
	int small = argc > 1 && !strcmp(argv[1], "--small");
	const char *mode = getenv("PLANRT_ATTENTION");
	printf("planrt_cu_k_attention_16 / _grad_16 (%s) against the CPU's attention_16:\n",
	       mode && !strcmp(mode, "exact") ? "the exact kernels" : "the tiles");
	int n = small ? 1 : (int)(sizeof cases / sizeof cases[0]);
	for (int i = 0; i < n; i++)
		run_case(&cases[i]);
	return tally_report("the tiled attention on the GPU");
}
