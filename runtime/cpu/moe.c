/* moe.c: the mixture-of-experts pieces of a training step that are not compute kernels
 * (planrt_kernels.h has those): the routing losses written into their scalar, and the step's
 * routing metrics for the log. docs/moe.md describes the routing. */
#define PLANRT_INTERNAL
#include "planrt_exec.h"
#include "planrt_kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void planrt_moe_aux_loss_f32(const float *logits, int64_t tokens, int64_t experts, int64_t group, double scale,
			     float *loss)
{
	*loss = (float)planrt_k_moe_aux_loss_f32(logits, tokens, experts, group, scale);
}

void planrt_moe_z_loss_f32(const float *logits, int64_t tokens, int64_t experts, double scale, float *loss)
{
	*loss = (float)planrt_k_moe_z_loss_f32(logits, tokens, experts, scale);
}

void planrt_moe_metrics(const double *stats, int layers, const int64_t *experts)
{
	size_t cap = 64, at = 0;
	for (int l = 0; l < layers; l++)
		cap += 24 * (size_t)(experts[l] + 2);
	char *text = malloc(cap);
	if (!text)
		return; /* the log line goes without the metrics */
	const double *x = stats;
	at += (size_t)snprintf(text + at, cap - at, "\"moe_dropped\":[");
	for (int l = 0; l < layers; l++) {
		at += (size_t)snprintf(text + at, cap - at, "%s%.0f", l ? "," : "", x[0]);
		x += 1 + experts[l];
	}
	at += (size_t)snprintf(text + at, cap - at, "],\"moe_load\":[");
	x = stats;
	for (int l = 0; l < layers; l++) {
		at += (size_t)snprintf(text + at, cap - at, "%s[", l ? "," : "");
		for (int64_t e = 0; e < experts[l]; e++)
			at += (size_t)snprintf(text + at, cap - at, "%s%.0f", e ? "," : "", x[1 + e]);
		at += (size_t)snprintf(text + at, cap - at, "]");
		x += 1 + experts[l];
	}
	snprintf(text + at, cap - at, "]");
	planrt_log_fields(text);
	free(text);
}

/* Dropless expert parallelism: the rows of a dispatched buffer between the token side (each rank
 * [E, slots, dim], expert e's rows packed from its row 0; the counts come from idx, whose entries
 * e * slots + row name them) and the expert side (each rank [E / n, n * slots, dim], expert e's
 * rows from every rank packed in rank order). First the counts: every rank sends each member the
 * counts of that member's experts (an all-to-all of E int32 in all); then only the rows that exist
 * travel (an alltoallv). The side written is zero past its rows. scratch: twice the buffer's bytes
 * and 8 (4 n + E) more. */
void planrt_moe_exchange(const void *in, void *out, int to_experts, const int32_t *idx, int64_t pairs, int64_t experts,
			 int64_t slots, int64_t dim, planrt_dtype_t t, planrt_comm_t c, void *scratch)
{
	int n = planrt_comm_size(c);
	int64_t el = experts / n, es = (int64_t)planrt_dtype_size(t), row = dim * es;
	int64_t rows = experts * slots; /* the buffer's rows, on either side */
	char *send = scratch, *recv = send + rows * row;
	int64_t *sc = (int64_t *)(recv + rows * row), *sd = sc + n, *rc = sd + n, *rd = rc + n;
	int32_t *mine = (int32_t *)(rd + n), *theirs = mine + experts; /* [E]: mine, [n, el]: theirs */
	for (int64_t e = 0; e < experts; e++)
		mine[e] = 0;
	for (int64_t i = 0; i < pairs; i++)
		if (idx[i] >= 0)
			mine[idx[i] / slots]++;
	planrt_alltoall_dim(mine, theirs, 2, (const int64_t[]){n, el}, 1, 0, planrt_i32, c, send);
	/* rows per member each way: to member r its experts' rows of mine; from member r its rows of mine */
	int64_t at = 0, from = 0;
	for (int r = 0; r < n; r++) {
		int64_t a = 0, b = 0;
		for (int64_t e = 0; e < el; e++) {
			a += mine[r * el + e];
			b += theirs[r * el + e];
		}
		int64_t s = to_experts ? a : b, v = to_experts ? b : a;
		sc[r] = s * dim;
		sd[r] = at * dim;
		rc[r] = v * dim;
		rd[r] = from * dim;
		at += s;
		from += v;
	}
	/* pack: token side, expert by expert; expert side, member by member then expert by expert */
	char *p = send;
	for (int r = 0; r < n; r++)
		for (int64_t e = 0; e < el; e++) {
			int64_t k = to_experts ? mine[r * el + e] : theirs[r * el + e], start = 0;
			if (!to_experts)
				for (int q = 0; q < r; q++)
					start += theirs[q * el + e];
			const char *src = to_experts ? (const char *)in + ((r * el + e) * slots) * row
						     : (const char *)in + (e * n * slots + start) * row;
			memcpy(p, src, (size_t)(k * row));
			p += k * row;
		}
	PLANRT_CHECK(planrt_alltoallv(send, sc, sd, recv, rc, rd, t, c));
	memset(out, 0, (size_t)(rows * row));
	p = recv;
	for (int r = 0; r < n; r++)
		for (int64_t e = 0; e < el; e++) {
			int64_t k = to_experts ? theirs[r * el + e] : mine[r * el + e], start = 0;
			if (to_experts)
				for (int q = 0; q < r; q++)
					start += theirs[q * el + e];
			char *dst = to_experts ? (char *)out + (e * n * slots + start) * row
					       : (char *)out + ((r * el + e) * slots) * row;
			memcpy(dst, p, (size_t)(k * row));
			p += k * row;
		}
}
