/* epilogues.c: the CUDA target's GEMM epilogues. A linear layer's forward is a matmul whose product
 * a fused loop reads once to add the bias (q, k, v, the MLP's first layer) or the bias and the
 * block's residual (the attention's and the MLP's output projections): for gpt350m 120 loops a step
 * that read the product back from memory and write the sum, 5.4 GB. Here such a pair is printed as
 * one call, planrt_cu_k_matmul_epilogue_16, whose GEMM adds the residual and the bias to its f32
 * accumulator and rounds once (cuBLASLt's epilogue: runtime/cuda/gemm_epilogue_cuda.cu); the
 * product's buffer is then never written.
 *
 * A pair is a 16-bit matmul (matmul_bf16, matmul_f16) that overwrites its product C and the kernel
 * printed right after it in its phase call, a fused loop on the same stream that
 *   - waits for nothing (the matmul's waits are printed before the call) and is not accumulated,
 *   - computes out = a sum of loads: C read once at the output's index, at most one bias (a load
 *     broadcast over every dim but the last, whose extent is the matmul's N, read at unit stride)
 *     and at most one residual (another buffer read at the output's index), at least one of the
 *     two,
 *   - stores out in the product's type, the residual of that type, the bias of that type or f32;
 * the product is a transient buffer (the arena, or a micro-batch's activation slot) that no other
 * kernel reads or writes, nobody waits for the matmul
 * and both come from the same layer. The C and LLVM targets keep the pair: the CPU's numbers do not
 * change. On the GPU the sum is rounded once instead of twice (after the product, after the sum);
 * PLANRT_EPILOGUE=0 makes the runtime compute the pair's arithmetic as printed, bit for bit. */
#include "target/target.h"

#include <stdlib.h>
#include <string.h>

/* a 16-bit matmul's argument (matmul_bf16 and matmul_f16 have their parameters at the same places) */
#define MM(name) KARG_INDEX(MATMUL_BF16, name)
#define SAME(name) (KARG_INDEX(MATMUL_BF16, name) == KARG_INDEX(MATMUL_F16, name))
_Static_assert(SAME(batch) && SAME(M) && SAME(N) && SAME(K) && SAME(A) && SAME(trans_a) && SAME(stride_a) && SAME(B) &&
		       SAME(trans_b) && SAME(stride_b) && SAME(C) && SAME(c_type) && SAME(stride_c) && SAME(accumulate),
	       "matmul_bf16 and matmul_f16 take their arguments at the same places");

static long long mm_int(const Kernel *m, int index)
{
	return m->args[index].i;
}

/* the loads of a tree of adds, or -1 when another node is in it */
static int add_leaves(const LExpr *x, const LExpr **leaves, int n, int cap)
{
	if (n < 0 || !x)
		return -1;
	if (x->kind == LX_LOAD)
		return n < cap ? (leaves[n] = x, n + 1) : -1;
	if (x->kind != LX_BINARY || x->op != OP_ADD)
		return -1;
	return add_leaves(x->b, leaves, add_leaves(x->a, leaves, n, cap), cap);
}

/* whether load x walks the loop's output index (row-major over its dims) */
static bool at_output_index(const Kernel *loop, const LExpr *x)
{
	long long s = 1;
	for (int d = loop->rank - 1; d >= 0; d--) {
		if (loop->dims[d] != 1 && x->stride[d] != s)
			return false;
		s *= loop->dims[d];
	}
	return true;
}

/* whether load x is a bias of n elements: unit stride on the last dim (of extent n), 0 on the rest */
static bool bias_load(const Kernel *loop, const LExpr *x, long long n)
{
	if (loop->rank < 1 || loop->dims[loop->rank - 1] != n || x->stride[loop->rank - 1] != 1)
		return false;
	for (int d = 0; d < loop->rank - 1; d++)
		if (x->stride[d] != 0 && loop->dims[d] != 1)
			return false;
	return true;
}

static int layer_of(const LProg *p, const Kernel *k)
{
	return k->op >= 0 ? p->g->ops[k->op].layer : -1;
}

static int buf_of(const Kernel *k, int index)
{
	const KArg *a = &k->args[index];
	return a->kind == KA_BUF ? a->buf : -1;
}

/* The pair's loads when kernel m (a matmul) and l (the kernel after it) are a pair: *bias and *resid
 * (-1: none) */
static bool pair(const LProg *p, const Kernel *m, const Kernel *l, const int *reads, const int *writes, int *bias,
		 int *resid)
{
	if ((m->kind != K_MATMUL_BF16 && m->kind != K_MATMUL_F16) || mm_int(m, MM(accumulate)) ||
	    m->event || m->stream == STREAM_HOST || kernel_device[m->kind].mode != KDEV_CALL)
		return false;
	if (l->kind != K_LOOP || l->accumulate || l->nwaits || l->stream != m->stream ||
	    l->only_last_micro != m->only_last_micro || layer_of(p, l) != layer_of(p, m))
		return false;
	int c = buf_of(m, MM(C));
	DType t = m->kind == K_MATMUL_BF16 ? DT_BF16 : DT_F16;
	if (c < 0 || (p->buf[c].cls != BUF_ARENA && p->buf[c].cls != BUF_SLOT) || (DType)mm_int(m, MM(c_type)) != t || p->buf[c].dtype != t ||
	    reads[c] != 1 || writes[c] != 1 || p->buf[l->out].dtype != t)
		return false;
	long long batch = mm_int(m, MM(batch)), M = mm_int(m, MM(M)), N = mm_int(m, MM(N));
	long long elems = 1;
	for (int d = 0; d < l->rank; d++)
		elems *= l->dims[d];
	if (elems != batch * M * N)
		return false;
	const LExpr *leaves[4];
	int n = add_leaves(l->expr, leaves, 0, 4), product = 0;
	*bias = *resid = -1;
	for (int i = 0; i < n; i++) {
		const LExpr *x = leaves[i];
		if (x->buf == c && at_output_index(l, x) && !product++)
			continue;
		if (x->buf != c && *bias < 0 && bias_load(l, x, N) &&
		    (p->buf[x->buf].dtype == t || p->buf[x->buf].dtype == DT_F32))
			*bias = x->buf;
		else if (x->buf != c && *resid < 0 && at_output_index(l, x) && p->buf[x->buf].dtype == t)
			*resid = x->buf;
		else
			return false;
	}
	return n >= 2 && product == 1 && (*bias >= 0 || *resid >= 0);
}

int *cuda_epilogues(const LProg *p)
{
	int *pair_of = malloc(sizeof(int) * (size_t)(p->nk ? p->nk : 1));
	int *reads = calloc((size_t)(p->nbuf ? p->nbuf : 1), sizeof(int));
	int *writes = calloc((size_t)(p->nbuf ? p->nbuf : 1), sizeof(int));
	if (!pair_of || !reads || !writes)
		ICE("out of memory");
	for (int i = 0; i < p->nk; i++) {
		pair_of[i] = CUDA_EPI_NONE;
		for (int u = 0; u < p->k[i].nuses; u++)
			reads[cuda_storage_of(p, p->k[i].uses[u])]++;
		for (int d = 0; d < p->k[i].ndefs; d++)
			writes[cuda_storage_of(p, p->k[i].defs[d])]++;
	}
	for (int i = 0; i < p->nk; i++) {
		const Kernel *m = &p->k[i];
		int next = i + 1;
		while (next < p->nk && (p->k[next].phase != m->phase || p->k[next].chunk != m->chunk))
			next++; /* printed in another phase call */
		int bias, resid;
		if (next < p->nk && pair_of[i] == CUDA_EPI_NONE && pair(p, m, &p->k[next], reads, writes, &bias, &resid)) {
			pair_of[i] = next;
			pair_of[next] = CUDA_EPI_MEMBER;
		}
	}
	free(reads);
	free(writes);
	return pair_of;
}

void cuda_print_epilogue(Emit *e, const Kernel *m, const Kernel *l, const char *stream)
{
	FILE *f = emit_file(e);
	const LProg *p = emit_prog(e);
	int bias = -1, resid = -1;
	const LExpr *leaves[4];
	int n = add_leaves(l->expr, leaves, 0, 4), c = buf_of(m, MM(C));
	for (int i = 0; i < n; i++)
		if (leaves[i]->buf != c && bias < 0 && bias_load(l, leaves[i], mm_int(m, MM(N))))
			bias = leaves[i]->buf;
		else if (leaves[i]->buf != c)
			resid = leaves[i]->buf;
	static const int args[] = {MM(batch), MM(M),	    MM(N),	 MM(K),	      MM(A),
				   MM(trans_a), MM(stride_a), MM(B), MM(trans_b), MM(stride_b)};
	fprintf(f, "planrt_cu_k_matmul_epilogue_16(");
	for (size_t i = 0; i < sizeof args / sizeof args[0]; i++) {
		emit_arg(e, m, args[i]);
		fprintf(f, ", ");
	}
	fprintf(f, "%s, ", planrt_dtype_name(m->kind == K_MATMUL_BF16 ? DT_BF16 : DT_F16));
	emit_name(e, l->out);
	fprintf(f, ", ");
	emit_arg(e, m, MM(stride_c));
	fprintf(f, ", ");
	if (resid >= 0)
		emit_name(e, resid);
	else
		fprintf(f, "NULL");
	fprintf(f, ", ");
	if (bias >= 0)
		emit_name(e, bias);
	else
		fprintf(f, "NULL");
	fprintf(f, ", %s, %s);", planrt_dtype_name(bias >= 0 ? p->buf[bias].dtype : DT_F32), stream);
	emit_comment(e, arena_printf(p->g->arena, "%s, with the add after it (epilogues.c)", m->note ? m->note : "matmul"));
}
