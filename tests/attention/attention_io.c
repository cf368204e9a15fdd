/* attention_io.c: planrt's CPU fused attention (planrt_k_attention_f32 and _grad_f32) on tensors
 * from a file, for tests/attention/check_torch.py, which writes the inputs from PyTorch and compares
 * the results with PyTorch's attention.
 *   attention_io IN OUT
 * IN: int64 B, H, Hk, S, Dh, mask_kind (0 none, 1 causal, 2 a [B, 1, 1, S] padding mask), then f32
 * q [B, H, S, Dh], k and v [B, Hk, S, Dh], dout [B, H, S, Dh], and with mask_kind 2 mask [B, S].
 * OUT: f32 out, lse [B, H, S], dq, dk, dv. Exit status 1 with a message on a short file. */
#include "planrt_kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static float *read_floats(FILE *f, int64_t n)
{
	float *x = malloc(sizeof(float) * (size_t)(n ? n : 1));
	if (!x || fread(x, sizeof(float), (size_t)n, f) != (size_t)n) {
		fprintf(stderr, "attention_io: the input file is short\n");
		exit(1);
	}
	return x;
}

int main(int argc, char **argv)
{
	FILE *in = argc == 3 ? fopen(argv[1], "rb") : NULL;
	int64_t h[6];
	if (!in || fread(h, sizeof(int64_t), 6, in) != 6) {
		fprintf(stderr, "usage: attention_io IN OUT (IN readable, with its 6-integer header)\n");
		return 1;
	}
	int64_t B = h[0], H = h[1], Hk = h[2], S = h[3], Dh = h[4], kind = h[5];
	int64_t nq = B * H * S * Dh, nk = B * Hk * S * Dh;
	float *q = read_floats(in, nq), *k = read_floats(in, nk), *v = read_floats(in, nk), *dout = read_floats(in, nq);
	float *mask = kind == 2 ? read_floats(in, B * S) : NULL;
	fclose(in);
	int64_t ldims[4] = {B, H, S, Dh}, gdims[4] = {B, H, S, S}, offs[8] = {0, 0, 0, 0, B / 2, H / 2, S / 2, Dh / 2}, mstr[4] = {S, 0, 0, 1};
	float *out = calloc((size_t)nq, sizeof(float)), *lse = calloc((size_t)(B * H * S), sizeof(float));
	float *dq = calloc((size_t)nq, sizeof(float)), *dk = calloc((size_t)nk, sizeof(float));
	float *dv = calloc((size_t)nk, sizeof(float));
	void *scratch = malloc(sizeof(float) * (size_t)(3 * 64 * 64 + 3 * 64 * Dh + 3 * 64));
	double scale = 1 / sqrt((double)Dh);
	planrt_k_attention_f32(q, k, v, mask, mstr, out, lse, 4, ldims, Hk, S, scale, (int)kind, 0, 0, 0, gdims, offs,
			       scratch);
	planrt_k_attention_grad_f32(q, k, v, mask, mstr, out, lse, dout, dq, dk, dv, 4, ldims, Hk, S, scale, (int)kind, 0,
				    0, 0, gdims, offs, scratch);
	FILE *o = fopen(argv[2], "wb");
	if (!o) {
		fprintf(stderr, "attention_io: cannot write %s\n", argv[2]);
		return 1;
	}
	fwrite(out, sizeof(float), (size_t)nq, o);
	fwrite(lse, sizeof(float), (size_t)(B * H * S), o);
	fwrite(dq, sizeof(float), (size_t)nq, o);
	fwrite(dk, sizeof(float), (size_t)nk, o);
	fwrite(dv, sizeof(float), (size_t)nk, o);
	return fclose(o) != 0;
}
