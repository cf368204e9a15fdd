/* epilogues.c: the CUDA target's epilogues: a kernel whose output only the fused loop printed after
 * it reads, to add something to it, is printed as one call that adds it before it rounds. The loop
 * would read the output back from memory and write the sum: the pair moves that tensor twice more
 * than the one call, and rounds it twice instead of once. Two kinds of pairs:
 *   - GEMMs: a 16-bit matmul (matmul_bf16, matmul_f16) that overwrites its product C, then a loop
 *     out = C + bias and / or + residual: the linear layers' bias adds (q, k, v, the MLP's first
 *     layer) and the blocks' residual adds where no dropout comes between (the output
 *     projections), forward. Printed as planrt_cu_k_matmul_epilogue_16: cuBLASLt's epilogue adds
 *     the residual (beta C) and the bias to the f32 accumulator (runtime/cuda/gemm_epilogue_cuda.cu).
 *     The bias is a load broadcast over every dim but the last, whose extent is the matmul's N, at
 *     unit stride; the residual another buffer at the output's index; at least one of the two.
 *   - adders (adders[] below): a layer_norm_grad_16 or rms_norm_grad_16, then a loop out = dx + r
 *     (r at the output's index): the residual stream's gradient added to the norm's input gradient,
 *     backward; a dropout_16, then a loop out = y + r: the residual add after a dropout, forward.
 *     Printed as planrt_cu_k_layer_norm_grad_add_16 / rms_norm_grad_add_16 / dropout_add_16, which
 *     add r before they round.
 *   - a transposed product: a 16-bit matmul, then a permute_16 that transposes its product (the
 *     tied embedding's weight gradient): printed as the GEMM of the swapped operands (below).
 * The second kernel (a loop, or the permute) is the first of the phase call after the first kernel
 * that reads its output, within four kernels that read or write no memory it reads or writes (by the
 * memory plan's bytes, not only by buffer) and wait for no event (the kernels between then run
 * after the pair's call). It waits for nothing (the first kernel's waits are printed before the
 * call), runs on the same stream in the same micro-batches and comes from the same layer; a loop is
 * not accumulated, stores out in the 16-bit type, and reads the first kernel's output once at the
 * output's index besides 16-bit operands of that type (an f32 bias too), a GEMM's three adds as
 * (C + bias) + R. The first kernel's output is a transient buffer (the arena, or a micro-batch's
 * activation slot) that no other kernel reads or writes, and nobody waits for the first kernel.
 * The pair's output shares no memory with the first kernel's arguments (but the inputs in `same`
 * below, exactly) nor with the loop's added buffer (overlaps below). For gpt350m in bf16 that is
 * 144 GEMM pairs and 48 norm pairs a step (its transposed product is refused: the memory plan puts
 * the transpose over the logits' gradient the GEMM reads, compiler/lower/inplace.c).
 *
 * The C and LLVM targets keep the pairs: the CPU's numbers do not change. On the GPU the sum is
 * rounded once instead of twice (within the bf16 tolerance the GPU is held to); PLANRT_EPILOGUE=0
 * makes the calls compute the adds' arithmetic as printed, bit for bit (a transposed product is
 * printed as a plain GEMM call and has no such switch). */
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

/* the conditions on kernel l after kernel m that every pair has */
static bool follows(const LProg *p, const Kernel *m, const Kernel *l)
{
	return !m->event && m->stream != STREAM_HOST && kernel_device[m->kind].mode == KDEV_CALL && !l->nwaits &&
	       l->stream == m->stream && l->only_last_micro == m->only_last_micro && layer_of(p, l) == layer_of(p, m);
}

/* and on a loop l after m, storing type t */
static bool loop_after(const LProg *p, const Kernel *m, const Kernel *l, DType t)
{
	return follows(p, m, l) && l->kind == K_LOOP && !l->accumulate && p->buf[l->out].dtype == t;
}

/* whether buffer c, m's output of type t, is transient and read and written by m and its loop alone */
static bool output_alone(const LProg *p, int c, DType t, const int *reads, const int *writes)
{
	return c >= 0 && (p->buf[c].cls == BUF_ARENA || p->buf[c].cls == BUF_SLOT) && p->buf[c].dtype == t &&
	       reads[c] == 1 && writes[c] == 1;
}

/* Whether buffers a and b may share memory: the same storage, or storages of one transient region
 * (the arena, the activation slots, the inboxes) whose byte ranges overlap. The memory plan may give
 * the loop's output the bytes of an input of the first kernel that dies there (their lives do not
 * overlap in the unfused program); the pair's one call reads those inputs while it writes the
 * output, so such a pair is refused. */
static bool overlaps(const LProg *p, int a, int b)
{
	int sa = cuda_storage_of(p, a), sb = cuda_storage_of(p, b);
	if (sa == sb)
		return true;
	const Buffer *x = &p->buf[sa], *y = &p->buf[sb];
	if (x->cls != y->cls || (x->cls != BUF_ARENA && x->cls != BUF_SLOT && x->cls != BUF_INBOX))
		return false;
	return x->offset < y->offset + y->bytes && y->offset < x->offset + x->bytes;
}

/* whether a and b are the same memory, byte for byte (the same buffer, or two of one region at the
 * same offset and of the same size) */
static bool coincide(const LProg *p, int a, int b)
{
	const Buffer *x = &p->buf[a], *y = &p->buf[b];
	return a == b || (x->cls == y->cls && x->cls != BUF_VIEW && x->offset == y->offset && x->bytes == y->bytes);
}

/* whether out shares memory with none of kernel m's buffer arguments but skip (its output) and those
 * in `same` (arguments it may be exactly: the call reads and writes them element for element, or
 * reads them before it writes), and the loop's added buffer r (-1: none) is apart from it. (r may
 * not be out itself: the fused kernels would manage, but their unfused paths, PLANRT_EPILOGUE=0 and
 * a GEMM cuBLASLt has no algorithm for, write the output before they read r.) */
static bool apart(const LProg *p, const Kernel *m, int skip, const int *same, int nsame, int out, int r)
{
	for (int i = 0; i < m->nargs; i++) {
		if (i == skip || m->args[i].kind != KA_BUF || !overlaps(p, out, m->args[i].buf))
			continue;
		bool allowed = false;
		for (int j = 0; j < nsame; j++)
			allowed |= same[j] == i && coincide(p, out, m->args[i].buf);
		if (!allowed)
			return false;
	}
	return r < 0 || !overlaps(p, out, r);
}

static long long loop_elems(const Kernel *l)
{
	long long elems = 1;
	for (int d = 0; d < l->rank; d++)
		elems *= l->dims[d];
	return elems;
}

/* whether x is a load of buffer b */
static bool loads(const LExpr *x, int b)
{
	return x->kind == LX_LOAD && x->buf == b;
}

/* whether e is (C + bias) + R, in either order of each add: what the call's unfused path computes
 * (gemm_epilogue_cuda.cu), so that PLANRT_EPILOGUE=0 keeps the loop's rounding */
static bool adds_bias_first(const LExpr *e, int c, int bias, int resid)
{
	if (e->kind != LX_BINARY || e->op != OP_ADD || (!loads(e->a, resid) && !loads(e->b, resid)))
		return false;
	const LExpr *s = loads(e->a, resid) ? e->b : e->a;
	return s->kind == LX_BINARY && s->op == OP_ADD &&
	       ((loads(s->a, c) && loads(s->b, bias)) || (loads(s->a, bias) && loads(s->b, c)));
}

/* Whether loop l is out = C + bias and / or + residual for product c of type t and N columns: its
 * *bias and *resid (-1: none). The GEMM pair's test, and what its call prints. */
static bool gemm_loads(const LProg *p, const Kernel *l, int c, DType t, long long N, int *bias, int *resid)
{
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
	return n >= 2 && product == 1 && (*bias >= 0 || *resid >= 0) &&
	       (n == 2 || adds_bias_first(l->expr, c, *bias, *resid));
}

/* The loads of a GEMM pair: kernel m (a 16-bit matmul) and loop l; *bias and *resid (-1: none) */
static bool gemm_pair(const LProg *p, const Kernel *m, const Kernel *l, const int *reads, const int *writes, int *bias,
		      int *resid)
{
	if ((m->kind != K_MATMUL_BF16 && m->kind != K_MATMUL_F16) || mm_int(m, MM(accumulate)))
		return false;
	int c = buf_of(m, MM(C));
	DType t = m->kind == K_MATMUL_BF16 ? DT_BF16 : DT_F16;
	long long N = mm_int(m, MM(N));
	if (!loop_after(p, m, l, t) || (DType)mm_int(m, MM(c_type)) != t || !output_alone(p, c, t, reads, writes) ||
	    loop_elems(l) != mm_int(m, MM(batch)) * mm_int(m, MM(M)) * N ||
	    (mm_int(m, MM(batch)) > 1 && mm_int(m, MM(stride_c)) != mm_int(m, MM(M)) * N))
		return false; /* the call writes batch x M x N elements end to end */
	return gemm_loads(p, l, c, t, N, bias, resid) && apart(p, m, MM(C), NULL, 0, l->out, *resid) &&
	       (*bias < 0 || !overlaps(p, l->out, *bias));
}

/* A transposed product: kernel m, a 16-bit matmul of one GEMM that overwrites C [M, N], and kernel t
 * after it, a permute_16 of C by (1, 0) (the tied embedding's weight gradient, 1024 x 50304 in
 * gpt350m, read with a stride of a row an element): printed as the matmul of the swapped operands,
 * C^T = op(B)^T op(A)^T, written where the permute wrote. The same products, summed by another GEMM
 * kernel's tiling (so in another order: within the bf16 tolerance). */
static bool transpose_pair(const LProg *p, const Kernel *m, const Kernel *t, const int *reads, const int *writes)
{
	if ((m->kind != K_MATMUL_BF16 && m->kind != K_MATMUL_F16) || mm_int(m, MM(accumulate)) || mm_int(m, MM(batch)) != 1 ||
	    t->kind != K_PERMUTE_16 || !follows(p, m, t))
		return false;
	DType dt = m->kind == K_MATMUL_BF16 ? DT_BF16 : DT_F16;
	int c = buf_of(m, MM(C)), out = buf_of(t, KARG_INDEX(PERMUTE_16, out));
	const KArg *dims = &t->args[KARG_INDEX(PERMUTE_16, in_dims)], *perm = &t->args[KARG_INDEX(PERMUTE_16, perm)];
	return (DType)mm_int(m, MM(c_type)) == dt && output_alone(p, c, dt, reads, writes) &&
	       buf_of(t, KARG_INDEX(PERMUTE_16, in)) == c && out >= 0 && p->buf[out].dtype == dt &&
	       t->args[KARG_INDEX(PERMUTE_16, rank)].i == 2 && dims->kind == KA_INTS && dims->n == 2 &&
	       dims->ints[0] == mm_int(m, MM(M)) && dims->ints[1] == mm_int(m, MM(N)) && perm->kind == KA_INTS &&
	       perm->n == 2 && perm->ints[0] == 1 && perm->ints[1] == 0 && apart(p, m, MM(C), NULL, 0, out, -1);
}

/* The kernels whose output a loop may add a buffer to (out = output + r): the argument of the output,
 * of the storage type, the one the added buffer is printed after, and the call that adds it. */
static const struct Adder {
	KernelKind kind;
	int out, storage, after;
	const char *call;
	int same[2]; /* inputs the output may be exactly (-1: none): the call reads them for a row, or an
		      * element, before it writes that row or element, and the norms' dw / db come first */
} adders[] = {
	{K_LAYER_NORM_GRAD_16, KARG_INDEX(LAYER_NORM_GRAD_16, dx), KARG_INDEX(LAYER_NORM_GRAD_16, storage),
	 KARG_INDEX(LAYER_NORM_GRAD_16, dy), "planrt_cu_k_layer_norm_grad_add_16",
	 {KARG_INDEX(LAYER_NORM_GRAD_16, x), KARG_INDEX(LAYER_NORM_GRAD_16, dy)}},
	{K_RMS_NORM_GRAD_16, KARG_INDEX(RMS_NORM_GRAD_16, dx), KARG_INDEX(RMS_NORM_GRAD_16, storage),
	 KARG_INDEX(RMS_NORM_GRAD_16, dy), "planrt_cu_k_rms_norm_grad_add_16",
	 {KARG_INDEX(RMS_NORM_GRAD_16, x), KARG_INDEX(RMS_NORM_GRAD_16, dy)}},
	{K_DROPOUT_16, KARG_INDEX(DROPOUT_16, y), KARG_INDEX(DROPOUT_16, storage), KARG_INDEX(DROPOUT_16, x),
	 "planrt_cu_k_dropout_add_16", {KARG_INDEX(DROPOUT_16, x), -1}},
};

static const struct Adder *adder_of(const Kernel *k)
{
	for (size_t i = 0; i < sizeof adders / sizeof adders[0]; i++)
		if (adders[i].kind == k->kind)
			return &adders[i];
	return NULL;
}

/* The added buffer of an adder pair: kernel m (adders[]) and loop l out = m's output + *resid */
static bool adder_pair(const LProg *p, const Kernel *m, const Kernel *l, const int *reads, const int *writes,
		       int *resid)
{
	const struct Adder *a = adder_of(m);
	if (!a)
		return false;
	DType t = (DType)m->args[a->storage].i;
	int o = buf_of(m, a->out);
	if (!loop_after(p, m, l, t) || !output_alone(p, o, t, reads, writes) || loop_elems(l) != p->buf[o].elems)
		return false;
	const LExpr *leaves[3];
	if (add_leaves(l->expr, leaves, 0, 3) != 2)
		return false;
	const LExpr *d = leaves[0]->buf == o ? leaves[0] : leaves[1], *r = d == leaves[0] ? leaves[1] : leaves[0];
	*resid = r->buf;
	return d->buf == o && r->buf != o && at_output_index(l, d) && at_output_index(l, r) && p->buf[r->buf].dtype == t &&
	       apart(p, m, a->out, a->same, 2, l->out, r->buf);
}

/* whether kernel k reads or writes storage s */
static bool touches(const LProg *p, const Kernel *k, int s)
{
	for (int u = 0; u < k->nuses; u++)
		if (cuda_storage_of(p, k->uses[u]) == s)
			return true;
	for (int d = 0; d < k->ndefs; d++)
		if (cuda_storage_of(p, k->defs[d]) == s)
			return true;
	return false;
}

/* whether a buffer kernel a reads or writes may share memory with one kernel b reads or writes */
static bool shares_memory(const LProg *p, const Kernel *a, const Kernel *b)
{
	for (int u = 0; u < a->nuses + a->ndefs; u++)
		for (int v = 0; v < b->nuses + b->ndefs; v++)
			if (overlaps(p, u < a->nuses ? a->uses[u] : a->defs[u - a->nuses],
				     v < b->nuses ? b->uses[v] : b->defs[v - b->nuses]))
				return true;
	return false;
}

/* The kernel of kernel i's phase call that first reads buffer b after it, if it comes within 4
 * kernels of that call and none of the kernels between reads or writes memory it reads or writes
 * (the memory plan may put the buffers of both on the same bytes); the second kernel then runs in
 * the pair's call, before them (the norm gradients' casts of dw and db come between); else -1 */
static int reader_after(const LProg *p, int i, int b)
{
	const Kernel *m = &p->k[i];
	int between[4], n = 0;
	for (int j = i + 1; j < p->nk; j++) {
		const Kernel *k = &p->k[j];
		if (k->phase != m->phase || k->chunk != m->chunk)
			continue; /* printed in another phase call */
		if (!touches(p, k, b)) {
			if (n == 4 || k->nwaits) /* a wait may be what orders the loop after another stream's reader */
				return -1;
			between[n++] = j;
			continue;
		}
		for (int x = 0; x < n; x++)
			if (shares_memory(p, &p->k[between[x]], k))
				return -1;
		return j;
	}
	return -1;
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
		const struct Adder *a = adder_of(m);
		int out = a				     ? buf_of(m, a->out)
			  : m->kind == K_MATMUL_BF16 || m->kind == K_MATMUL_F16 ? buf_of(m, MM(C))
										: -1;
		int next = out >= 0 && pair_of[i] == CUDA_EPI_NONE ? reader_after(p, i, out) : -1;
		int bias, resid;
		if (next >= 0 && (gemm_pair(p, m, &p->k[next], reads, writes, &bias, &resid) ||
				  adder_pair(p, m, &p->k[next], reads, writes, &resid) ||
				  transpose_pair(p, m, &p->k[next], reads, writes))) {
			pair_of[i] = next;
			pair_of[next] = CUDA_EPI_MEMBER;
		}
	}
	free(reads);
	free(writes);
	return pair_of;
}

/* adder m (adders[]) and its loop l: m's call with its output the loop's and the added buffer after
 * the argument the table names */
static void print_adder_pair(Emit *e, const struct Adder *a, const Kernel *m, const Kernel *l, const char *stream)
{
	FILE *f = emit_file(e);
	const LProg *p = emit_prog(e);
	const LExpr *leaves[3];
	add_leaves(l->expr, leaves, 0, 3);
	int o = buf_of(m, a->out), resid = leaves[0]->buf == o ? leaves[1]->buf : leaves[0]->buf;
	fprintf(f, "%s(", a->call);
	for (int i = 0; i < m->nargs; i++) {
		if (i == a->out)
			emit_name(e, l->out);
		else
			emit_arg(e, m, i);
		fprintf(f, ", ");
		if (i == a->after) {
			emit_name(e, resid);
			fprintf(f, ", ");
		}
	}
	fprintf(f, "%s);", stream);
	emit_comment(e, arena_printf(p->g->arena, "%s, with the add after it (epilogues.c)",
				      m->note ? m->note : kernel_names[m->kind]));
}

/* matmul m and its transpose t as the matmul of the swapped operands */
static void print_transposed(Emit *e, const Kernel *m, const Kernel *t, const char *stream)
{
	FILE *f = emit_file(e);
	const LProg *p = emit_prog(e);
	fprintf(f, "%s(1, ", m->kind == K_MATMUL_BF16 ? "planrt_cu_k_matmul_bf16" : "planrt_cu_k_matmul_f16");
	emit_arg(e, m, MM(N));
	fprintf(f, ", ");
	emit_arg(e, m, MM(M));
	fprintf(f, ", ");
	emit_arg(e, m, MM(K));
	fprintf(f, ", ");
	emit_arg(e, m, MM(B));
	fprintf(f, ", %s, 0, ", planrt_int_name(KPT_TRANS, !mm_int(m, MM(trans_b))));
	emit_arg(e, m, MM(A));
	fprintf(f, ", %s, 0, ", planrt_int_name(KPT_TRANS, !mm_int(m, MM(trans_a))));
	emit_name(e, buf_of(t, KARG_INDEX(PERMUTE_16, out)));
	fprintf(f, ", %s, 0, %s, %s);", planrt_dtype_name(m->kind == K_MATMUL_BF16 ? DT_BF16 : DT_F16),
		planrt_int_name(KPT_ACCUMULATE, 0), stream);
	emit_comment(e, arena_printf(p->g->arena, "%s, written transposed (epilogues.c)", m->note ? m->note : "matmul"));
}

void cuda_print_epilogue(Emit *e, const Kernel *m, const Kernel *l, const char *stream)
{
	if (l->kind == K_PERMUTE_16) {
		print_transposed(e, m, l, stream);
		return;
	}
	const struct Adder *a = adder_of(m);
	if (a) {
		print_adder_pair(e, a, m, l, stream);
		return;
	}
	FILE *f = emit_file(e);
	const LProg *p = emit_prog(e);
	int bias, resid;
	gemm_loads(p, l, buf_of(m, MM(C)), m->kind == K_MATMUL_BF16 ? DT_BF16 : DT_F16, mm_int(m, MM(N)), &bias, &resid);
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
