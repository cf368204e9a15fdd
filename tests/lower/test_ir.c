/* test_ir.c: the loop-level IR's two contracts with its producers (issue 21), on plans of
 * examples/mlp.plan compiled through planc_core.
 *
 * The kernel table (compiler/lower/kernel_table.h) types every kernel's arguments:
 *   - named access finds the argument the planrt prototype has at that place (KARG);
 *   - the verifier refuses a kernel whose argument does not fit its parameter (a float where the
 *     table has an int64, an i32 buffer where it has const float *), or that has one argument
 *     too few, naming the parameter; and accepts it again once the change is undone.
 * ZeRO and sync have one owner:
 *   - zero.c and sync.c annotate the graph (g->zero, g->sync) and insert nothing that lowering
 *     would have to drop: no op reads a value without a producer (sync.c's old flat bucket
 *     values) or the result of an update (zero.c's old gathers of updated shards);
 *   - the ZeRO stage in effect is 0 when its axis has one rank, and state.c records in the
 *     Lowered program what the annotations say (explain and the later passes read that);
 *   - state.c writes the kernels: a reduce-scatter per ZeRO bucket, the gathers of the updated
 *     shards, and each bucket's kernel says which bucket it reduces.
 * Layers as loops (layer_runs.c, on examples/gpt.plan's single plan, 4 layers):
 *   - the forward is one run of all 4 layers, the backward one of layers 3..1 (layer 0's backward
 *     ends in the embedding's gradient), the optimizer step and checkpoint phases runs of 4;
 *   - a kernel of layer 2 whose integer argument is changed ends the forward run there, and an
 *     activation it reads given another size breaks the run too; mlp (no repeat) has no runs.
 * Transposes are views: the tied embedding's transpose of wte, read by matmuls only (the second
 * through a transpose of it), is not copied by a permute.
 * GEMM epilogues (compiler/target/cuda/epilogues.c): the GPT's six linear layers a layer in bf16 pair
 * each matmul with the loop that adds its bias (gpt350m: and the residual, two a layer); f32 has
 * none; a pair is refused when its loop accumulates, when another kernel reads the product, or
 * when the bias is not broadcast over the rows. gpt350m's two layer norm gradients a layer pair with
 * the add of the residual's gradient after them, past the casts of dw and db, unless one of those
 * reads the loop's output; the small GPT's two dropouts a layer (0.1) pair with the residual add
 * after them; the tied embedding's weight gradient is written transposed by its GEMM; a pair whose
 * output the memory plan puts on an operand of its first kernel is refused.
 * Prints PASS/FAIL lines and `N passed, N failed`; exits 1 on any failure. */
#include "passes.h"
#include "target/target.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../kernels/report.h"

static char err_text[1 << 14];

/* verify_ir with what it prints on stderr captured in err_text */
static bool verify(const Lowered *low)
{
	char path[] = "/tmp/planc-test-ir-XXXXXX";
	int fd = mkstemp(path);
	if (fd < 0)
		return false;
	fflush(stderr);
	int saved = dup(2);
	dup2(fd, 2);
	bool ok = verify_ir(low, "test");
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	ssize_t n = pread(fd, err_text, sizeof err_text - 1, 0);
	err_text[n > 0 ? n : 0] = '\0';
	close(fd);
	remove(path);
	return ok;
}

typedef struct Compiled {
	Graph *g;
	Lowered *low;
} Compiled;

static Compiled compile(Program *p, const char *name)
{
	Compiled c = {0};
	Item *plan = default_plan(p, name);
	PlanSpec *ps = plan ? sema_plan(p, plan) : NULL;
	c.g = ps ? run_passes(ps, NULL, NULL) : NULL;
	c.low = c.g ? run_backend(c.g, NULL, NULL, false) : NULL;
	report(c.low != NULL, "%s compiles", name);
	return c;
}

static Kernel *first_kernel(const Lowered *low, KernelKind kind)
{
	LProg *p = low->progs[0];
	for (int i = 0; i < p->nk; i++)
		if (p->k[i].kind == kind)
			return &p->k[i];
	return NULL;
}

/* the verifier refuses the change made before this call (naming want) */
static void expect_refused(const Lowered *low, const char *what, const char *want)
{
	bool ok = verify(low);
	report(!ok && strstr(err_text, want), "%s: refused, naming '%s'%s%s", what, want, ok ? " (accepted!)" : ": ",
	       ok ? "" : err_text);
}

static void kernel_table(const Lowered *low)
{
	report(verify(low), "dp2: the verifier accepts the program");
	Kernel *k = first_kernel(low, K_MATMUL);
	if (!report(k != NULL, "dp2 has a matmul"))
		return;
	/* planrt_k_matmul_f32(batch, M, N, K, A, trans_a, stride_a, B, trans_b, stride_b, C, stride_c, acc) */
	report(KARG(k, MATMUL, A) == &k->args[4] && KARG(k, MATMUL, B) == &k->args[7] &&
		       KARG(k, MATMUL, accumulate) == &k->args[12] && kernel_nparams[K_MATMUL] == 13,
	       "KARG(k, MATMUL, A / B / accumulate) are the prototype's arguments 4, 7 and 12 of 13");
	report(KARG(k, MATMUL, A)->kind == KA_BUF && !strcmp(kernel_params[K_MATMUL][4].name, "A") &&
		       kernel_params[K_MATMUL][4].type == KPT_F32_IN,
	       "the table names and types them: A is a const float * buffer");

	KArg saved = *KARG(k, MATMUL, batch);
	KARG(k, MATMUL, batch)->kind = KA_F64;
	expect_refused(low, "a float as the matmul's batch", "(batch, I64) cannot take a float");
	*KARG(k, MATMUL, batch) = saved;
	report(verify(low), "restored: accepted again");

	Kernel *load = first_kernel(low, K_LOAD_INPUT);
	if (report(load != NULL, "dp2 loads its tokens")) {
		saved = *KARG(k, MATMUL, A);
		KARG(k, MATMUL, A)->buf = KARG(load, LOAD_INPUT, dst)->buf; /* the i32 tokens */
		expect_refused(low, "an i32 buffer as the matmul's A", "(A) is i32 buffer");
		*KARG(k, MATMUL, A) = saved;
		report(verify(low), "restored: accepted again");
	}
	k->nargs--;
	expect_refused(low, "a matmul with 12 arguments", "12 arguments where the kernel table gives 13");
	k->nargs++;
	report(verify(low), "restored: accepted again");
}

/* mlp bf16: lowering gives the embedding, the bias gradients and the cross-entropy their 16-bit
 * variants (lower.c's storage_16_variants), which read and write bf16 as stored, and the verifier
 * holds every such buffer to the kernel's storage type */
static void storage_16(Program *p)
{
	Compiled bf = compile(p, "bf16");
	if (!bf.low)
		return;
	report(verify(bf.low), "mlp bf16: the verifier accepts the program");
	Kernel *embed = first_kernel(bf.low, K_EMBED_16), *ce = first_kernel(bf.low, K_CROSS_ENTROPY_16);
	Kernel *bias = first_kernel(bf.low, K_SUM_TO_ACC_16), *gemm = first_kernel(bf.low, K_MATMUL_BF16);
	report(embed && ce && bias && gemm && !first_kernel(bf.low, K_EMBED) && !first_kernel(bf.low, K_CROSS_ENTROPY),
	       "mlp bf16: embed_16, cross_entropy_16, sum_to_acc_16 and matmul_bf16, and no f32 embedding or loss");
	if (!embed)
		return;
	KArg *st = &embed->args[kernel_storage_param(K_EMBED_16)];
	report(st == KARG(embed, EMBED_16, storage) && st->kind == KA_DTYPE && st->i == DT_BF16,
	       "embed_16's last argument is its storage, bf16");
	st->i = DT_F16;
	expect_refused(bf.low, "embed_16 told its bf16 buffers are f16", "where the storage is f16");
	st->i = DT_F32;
	expect_refused(bf.low, "a 16-bit kernel stored as f32", "a 16-bit kernel stored as f32");
	st->i = DT_BF16;
	report(verify(bf.low), "restored: accepted again");
	/* the bias gradients summed into the bf16 gradients as stored: no f32 copy, no cast around them */
	if (!bias)
		return;
	const LProg *lp = bf.low->progs[0];
	KArg *acc = KARG(bias, SUM_TO_ACC_16, acc), *out = KARG(bias, SUM_TO_ACC_16, out);
	int casts_of_out = 0;
	for (int i = 0; i < lp->nk; i++) {
		const Kernel *c = &lp->k[i];
		for (int u = 0; c->kind == K_CAST && u < c->nuses + c->ndefs; u++)
			casts_of_out += (u < c->nuses ? c->uses[u] : c->defs[u - c->nuses]) == out->buf;
	}
	report(acc->i == DT_BF16 && lp->buf[out->buf].dtype == DT_BF16 && casts_of_out == 0,
	       "mlp bf16: sum_to_acc_16 sums the bias gradient into the bf16 gradient itself (acc bf16, %d casts of it)",
	       casts_of_out);
	acc->i = DT_F32;
	expect_refused(bf.low, "sum_to_acc_16 told its bf16 gradient is f32", "where the acc is f32");
	acc->i = DT_F16;
	expect_refused(bf.low, "a bf16 sum_to_acc_16 summing as f16", "sums its gradients as f16");
	acc->i = DT_BF16;
	report(verify(bf.low), "restored: accepted again");
}

/* No op reads a value without a producer, or an update's result. */
static bool nothing_to_drop(const Graph *g)
{
	for (int i = 0; i < g->nops; i++)
		for (int k = 0; k < g->ops[i].nin; k++) {
			int d = g->vals[g->ops[i].in[k]].def;
			if (d < 0 || g->ops[d].kind == OP_OPTIMIZER_STEP)
				return false;
		}
	return true;
}

/* kernels of a kind in a phase (PH_COUNT: any), only those that name a bucket when bucket */
static int count_kernels(const Lowered *low, KernelKind kind, Phase ph, bool bucket)
{
	int n = 0;
	const LProg *p = low->progs[0];
	for (int i = 0; i < p->nk; i++)
		n += p->k[i].kind == kind && (ph == PH_COUNT || p->k[i].phase == ph) && (!bucket || p->k[i].bucket >= 0);
	return n;
}

static void zero_and_sync(Program *p)
{
	Compiled dp2 = compile(p, "dp2");
	if (dp2.low) {
		const GradSync *s = &dp2.g->sync;
		report(dp2.g->zero.stage == 0 && s->mode == SYNC_STRICT && s->axis == 0 && s->replicas && s->overlap &&
			       s->nbuckets == 1 && s->buckets[0].nmembers == 7 && s->buckets[0].coll == OP_ALL_REDUCE,
		       "dp2: sync.c records one all-reduce bucket of the 7 gradients on 'data', overlapped");
		report(nothing_to_drop(dp2.g), "dp2: no op for lowering to drop");
		report(dp2.low->state.sync_axis == 0 && !dp2.low->state.zero.stage && dp2.low->state.overlap,
		       "dp2: state.c's record says the same");
		report(count_kernels(dp2.low, K_ALLREDUCE_INPLACE, PH_BACKWARD, true) == 1,
		       "dp2: the bucket's all-reduce starts in the backward and names its bucket");
		kernel_table(dp2.low);
	}
	Compiled z1 = compile(p, "zero1_dp4");
	if (z1.low) {
		report(z1.g->zero.stage == 1 && z1.g->zero.axis == 0 && z1.g->zero.size == 4 &&
			       z1.low->state.zero.stage == 1 && z1.g->sync.nbuckets >= 1 &&
			       z1.g->sync.buckets[0].coll == OP_REDUCE_SCATTER,
		       "zero1_dp4: ZeRO 1 over data (4 ranks), reduce-scattered buckets, recorded by state.c");
		report(nothing_to_drop(z1.g), "zero1_dp4: no gathers of updated shards in the graph");
		int rs = count_kernels(z1.low, K_REDUCE_SCATTER_INPLACE, PH_COUNT, true); /* started in the backward */
		int ag = count_kernels(z1.low, K_ALLGATHER_INPLACE, PH_STEP, false);
		report(rs == z1.g->sync.nbuckets && ag == z1.g->sync.nbuckets,
		       "zero1_dp4: state.c reduce-scatters each of the %d buckets and gathers its updated shard (%d, %d)",
		       z1.g->sync.nbuckets, rs, ag);
	}
	Compiled z3 = compile(p, "zero3_dp4");
	if (z3.low)
		report(z3.g->zero.stage == 3 && z3.low->state.zero.stage == 3 && nothing_to_drop(z3.g) &&
			       count_kernels(z3.low, K_BUCKET_RS_START, PH_BACKWARD, true) == z3.g->sync.nbuckets &&
			       count_kernels(z3.low, K_BUCKET_RS_FINISH, PH_BACKWARD, true) == z3.g->sync.nbuckets,
		       "zero3_dp4: ZeRO 3, every bucket reduce-scattered each micro-batch by state.c");
	Compiled one = compile(p, "zero1_one_rank");
	if (one.low)
		report(one.g->zero.stage == 0 && one.g->zero.axis == -1 && one.low->state.zero.stage == 0 &&
			       !one.g->sync.replicas,
		       "zero 1 over an axis of one rank: not in effect (stage 0 in the graph and in the record)");
}

/* the first run of phase ph, or NULL */
static const LayerRun *run_of(const LayerRun *runs, int n, Phase ph)
{
	for (int i = 0; i < n; i++)
		if (runs[i].phase == ph)
			return &runs[i];
	return NULL;
}

static int forward_run_length(const LProg *p, LayerRun *runs, int cap)
{
	const LayerRun *r = run_of(runs, layer_runs(p, runs, cap), PH_FORWARD);
	return r ? r->nlayers : 0;
}

/* in the first kernel of phase ph in layer l that has one, an argument of kind ak (not a random
 * stream's key; a buffer: an activation, not state) */
static KArg *layer_arg(LProg *p, Phase ph, int layer, KArgKind ak)
{
	for (int i = 0; i < p->nk; i++) {
		Kernel *k = &p->k[i];
		if (k->phase != ph || k->op < 0 || p->g->ops[k->op].layer != layer)
			continue;
		for (int j = 0; j < k->nargs; j++) {
			const char *name = j < kernel_nparams[k->kind] ? kernel_params[k->kind][j].name : "";
			if (k->args[j].kind == ak && strcmp(name, "key") &&
			    (ak != KA_BUF || p->buf[k->args[j].buf].cls != BUF_STATE))
				return &k->args[j];
		}
	}
	return NULL;
}

/* the matmul / loop pairs epilogues.c prints as one call */
static int epilogue_pairs(const LProg *p)
{
	int *pair = cuda_epilogues(p), n = 0;
	for (int i = 0; i < p->nk; i++)
		n += pair[i] >= 0;
	free(pair);
	return n;
}

/* cuda_epilogues of p with kernel x put after kernel `at` (the kernels from at + 1 on one later) */
static int *epilogues_with(LProg *p, int at, const Kernel *x)
{
	Kernel *k = malloc(sizeof(Kernel) * (size_t)(p->nk + 1)), *was = p->k;
	memcpy(k, was, sizeof(Kernel) * (size_t)(at + 1));
	k[at + 1] = *x;
	memcpy(k + at + 2, was + at + 1, sizeof(Kernel) * (size_t)(p->nk - at - 1));
	p->k = k;
	p->nk++;
	int *pairs = cuda_epilogues(p);
	p->nk--;
	p->k = was;
	free(k);
	return pairs;
}

/* the loads of a loop's tree of adds */
static int add_loads(const LExpr *x, const LExpr **out, int n)
{
	if (x->kind == LX_LOAD) {
		out[n] = x;
		return n + 1;
	}
	return n < 0 || x->kind != LX_BINARY || x->op != OP_ADD ? -1 : add_loads(x->b, out, add_loads(x->a, out, n));
}

/* GEMM epilogues (compiler/target/cuda/epilogues.c) on the GPT in bf16: each layer's q, k and v
 * projections and the MLP's first layer (a bias), the attention's and the MLP's output projections
 * (a bias and the residual); each pair a matmul whose product only its loop reads; and a pair is
 * refused when the loop accumulates, when another kernel reads the product, or when the bias is
 * not broadcast over the rows */
/* whether the tied embedding's weight-gradient transpose (a permute_16 by (1, 0) of the matmul before
 * it) writes memory that matmul reads as its B */
static bool transpose_over_operand(const LProg *p)
{
	for (int i = 1; i < p->nk; i++) {
		const Kernel *t = &p->k[i], *m = &p->k[i - 1];
		if (t->kind != K_PERMUTE_16 || m->kind != K_MATMUL_BF16 ||
		    KARG(t, PERMUTE_16, in)->buf != KARG(m, MATMUL_BF16, C)->buf)
			continue;
		const Buffer *o = &p->buf[buffer_root(p, KARG(t, PERMUTE_16, out)->buf)];
		const Buffer *b = &p->buf[buffer_root(p, KARG(m, MATMUL_BF16, B)->buf)];
		return o->cls == b->cls && buf_class_transient(o->cls) && o->offset < b->offset + b->bytes &&
		       b->offset < o->offset + o->bytes;
	}
	return false;
}

static void epilogues_gpt(LProg *p, int layers, int resid_layers, bool want_transpose, const char *name)
{
	int *pair = cuda_epilogues(p), n = 0, biased = 0, resid = 0, first = -1, first_loop = -1, norms = 0, norm = -1;
	int drops = 0, transposes = 0;
	bool sound = true;
	for (int i = 0; i < p->nk; i++) {
		if (pair[i] >= 0 && p->k[pair[i]].kind == K_PERMUTE_16) { /* the matmul written transposed */
			const Kernel *t = &p->k[pair[i]];
			sound &= p->k[i].kind == K_MATMUL_BF16 &&
				 KARG(t, PERMUTE_16, in)->buf == KARG(&p->k[i], MATMUL_BF16, C)->buf &&
				 KARG(&p->k[i], MATMUL_BF16, batch)->i == 1;
			transposes++;
			continue;
		}
		if (pair[i] >= 0 && p->k[i].kind == K_DROPOUT_16) { /* out = the dropped x + the residual */
			const Kernel *l = &p->k[pair[i]];
			const LExpr *loads[3];
			int y = KARG(&p->k[i], DROPOUT_16, y)->buf;
			sound &= l->kind == K_LOOP && add_loads(l->expr, loads, 0) == 2 &&
				 (loads[0]->buf == y) != (loads[1]->buf == y);
			drops++;
			continue;
		}
		if (pair[i] >= 0 && p->k[i].kind == K_LAYER_NORM_GRAD_16) { /* out = dx + the residual's gradient */
			const Kernel *l = &p->k[pair[i]];
			const LExpr *loads[3];
			int dx = KARG(&p->k[i], LAYER_NORM_GRAD_16, dx)->buf;
			sound &= l->kind == K_LOOP && add_loads(l->expr, loads, 0) == 2 &&
				 (loads[0]->buf == dx) != (loads[1]->buf == dx);
			norms++;
			norm = norm < 0 ? i : norm;
			continue;
		}
		if (pair[i] < 0)
			continue;
		const Kernel *m = &p->k[i], *l = &p->k[pair[i]];
		if (first < 0) {
			first = i;
			first_loop = pair[i];
		}
		n++;
		int c = m->args[KARG_INDEX(MATMUL_BF16, C)].buf, reads = 0;
		for (int k = 0; k < p->nk; k++)
			for (int u = 0; u < p->k[k].nuses; u++)
				reads += p->k[k].uses[u] == c;
		const LExpr *loads[4];
		int nl = l->kind == K_LOOP ? add_loads(l->expr, loads, 0) : -1, products = 0;
		for (int j = 0; j < nl; j++) {
			products += loads[j]->buf == c;
			biased += loads[j]->buf != c && loads[j]->stride[0] == 0 && loads[j]->stride[l->rank - 1] == 1;
		}
		resid += nl == 3;
		sound &= m->kind == K_MATMUL_BF16 && pair[pair[i]] == CUDA_EPI_MEMBER && reads == 1 && products == 1 &&
			 (nl == 2 || nl == 3);
	}
	free(pair);
	report(n == 6 * layers && sound, "%s: %d GEMM epilogues (6 a layer: q, k, v, the MLP's first layer, the two "
	       "output projections), each a matmul whose product only its loop reads, C + bias (+ residual)", name, n);
	report(biased == 6 * layers && resid == 2 * resid_layers, "%s: %d with a bias, %d with a residual (%d expected)", name,
	       biased, resid, 2 * resid_layers);
	report(norms > 0 && norms <= 2 * layers + 1,
	       "%s: %d layer norm gradients with the residual gradient's add after them (at most two a layer: where the "
	       "output shares no memory with an input)", name, norms);
	report(drops == 2 * (layers - resid_layers), "%s: %d dropouts with the residual add after them (%d expected)", name,
	       drops, 2 * (layers - resid_layers));
	if (want_transpose)
		report(transposes == 1 && sound, "%s: the tied embedding's weight gradient written transposed by its GEMM (%d)",
		       name, transposes);
	else /* the transpose's output lies on the GEMM's operand: the fused call would write what it reads */
		report(transposes == 0 && sound && transpose_over_operand(p),
		       "%s: the tied embedding's transposed GEMM refused: the memory plan puts the transpose over the "
		       "logits' gradient (the logits' memory, inplace.c) that the GEMM reads", name);
	if (norm >= 0) { /* a kernel put between the norm and its loop that reads the loop's output: refused */
		int *pr = cuda_epilogues(p), l = pr[norm];
		free(pr);
		const Kernel *fill = NULL;
		for (int i = 0; i < p->nk && !fill; i++)
			fill = p->k[i].kind == K_FILL && p->k[i].ndefs == 1 ? &p->k[i] : NULL;
		Kernel x = *fill;
		x.phase = p->k[norm].phase;
		x.chunk = p->k[norm].chunk;
		x.nwaits = 0;
		int reads_out = p->k[l].out;
		x.uses = &reads_out;
		x.nuses = 1;
		x.ndefs = 0;
		int *with = epilogues_with(p, norm, &x), blocked = 0, total = n + norms + drops + transposes;
		for (int i = 0; i <= p->nk; i++)
			blocked += with[i] >= 0;
		report(with[norm] == CUDA_EPI_NONE && blocked == total - 1, "%s: a norm's pair refused when a kernel between "
		       "reads the loop's output (%d of %d pairs left)", name, blocked, total);
		free(with);
		/* the loop's output over the norm's rstd (an argument the call reads while it writes; dw and db
		 * are the gradients themselves now, state memory no arena buffer can lie on) */
		Buffer *o = &p->buf[p->k[l].out], kept = *o;
		const Buffer *rstd = &p->buf[KARG(&p->k[norm], LAYER_NORM_GRAD_16, rstd)->buf];
		o->cls = rstd->cls;
		o->offset = rstd->offset;
		int *over = cuda_epilogues(p), refused = over[norm] == CUDA_EPI_NONE, left = 0;
		for (int i = 0; i < p->nk; i++)
			left += over[i] >= 0;
		free(over);
		*o = kept;
		report(buf_class_transient(rstd->cls) && refused, "%s: a norm's pair refused when its output lies over the norm's "
		       "rstd (%d of %d pairs left)", name, left, total);
		/* a kernel between that writes memory the loop's output lies on: the loop may not move before it */
		Buffer *w = &p->buf[fill->defs[0]], wkept = *w;
		w->cls = o->cls;
		w->offset = o->offset;
		x.nuses = 0;
		x.ndefs = 1;
		x.defs = fill->defs;
		int *moved = epilogues_with(p, norm, &x), blocked_by_write = moved[norm] == CUDA_EPI_NONE;
		free(moved);
		*w = wkept;
		int *alone = epilogues_with(p, norm, &x), kept_apart = alone[norm] == l + 1;
		free(alone);
		report(blocked_by_write && kept_apart, "%s: a norm's pair refused when a kernel between writes memory the "
		       "loop's output lies on (and kept when that kernel's memory is elsewhere)", name);
	}
	if (first >= 0) { /* the loop's output given the memory of the matmul's A: refused */
		Buffer *o = &p->buf[p->k[first_loop].out];
		const Buffer *in = &p->buf[KARG(&p->k[first], MATMUL_BF16, A)->buf];
		Buffer was = *o;
		o->cls = in->cls;
		o->offset = in->offset;
		int aliased = epilogue_pairs(p);
		*o = was;
		report(in->cls != BUF_STATE && aliased == n + norms + drops + transposes - 1,
		       "%s: a GEMM pair refused when the memory plan gives its output the bytes of the product's "
		       "operand (%d of %d pairs left)", name, aliased, n + norms + drops + transposes);
	}
	for (int i = 0, done = 0; i < p->nk && resid_layers && !done; i++) {
		/* a GEMM pair whose loop adds the residual, its output given the residual's own memory: refused
		 * (the call's unfused path writes the product over it before it adds it) */
		int *pr = cuda_epilogues(p), l = pr[i];
		free(pr);
		if (l < 0 || p->k[i].kind != K_MATMUL_BF16)
			continue;
		const LExpr *loads[4];
		int c = KARG(&p->k[i], MATMUL_BF16, C)->buf, r = -1;
		for (int j = 0, nl = add_loads(p->k[l].expr, loads, 0); j < nl; j++)
			if (loads[j]->buf != c && loads[j]->stride[0] != 0)
				r = loads[j]->buf;
		if (r < 0)
			continue;
		Buffer *o = &p->buf[p->k[l].out], was = *o;
		const Buffer *rb = &p->buf[buffer_root(p, r)];
		o->cls = rb->cls;
		o->offset = rb->offset;
		o->bytes = rb->bytes;
		int *over = cuda_epilogues(p);
		bool refused = over[i] == CUDA_EPI_NONE;
		free(over);
		*o = was;
		report(buf_class_transient(rb->cls) && refused, "%s: a GEMM pair refused when its output is the residual's "
		       "own memory", name);
		done = 1;
	}
	if (first < 0 || resid_layers)
		return;
	Kernel *loop = &p->k[first_loop], *other = &p->k[first_loop + 1];
	loop->accumulate = true;
	int accumulated = epilogue_pairs(p);
	loop->accumulate = false;
	/* another kernel reads the product */
	int c = p->k[first].args[KARG_INDEX(MATMUL_BF16, C)].buf, *was = other->uses;
	int *more = malloc(sizeof(int) * (size_t)(other->nuses + 1));
	memcpy(more, was, sizeof(int) * (size_t)other->nuses);
	more[other->nuses++] = c;
	other->uses = more;
	int second_reader = epilogue_pairs(p);
	other->nuses--;
	other->uses = was;
	free(more);
	/* the bias read along the rows too */
	LExpr *bias = loop->expr->a->buf == c ? loop->expr->b : loop->expr->a;
	long long stride0 = bias->stride[0];
	bias->stride[0] = 1;
	int not_broadcast = epilogue_pairs(p);
	bias->stride[0] = stride0;
	int all = n + norms + drops + transposes;
	report(accumulated == all - 1 && second_reader == all - 1 && not_broadcast == all - 1 && epilogue_pairs(p) == all,
	       "gpt bf16: a pair refused when its loop accumulates (%d), when another kernel reads the product (%d), when "
	       "the bias is not broadcast over the rows (%d); %d pairs again when undone",
	       all - accumulated, all - second_reader, all - not_broadcast, epilogue_pairs(p));
}

/* inplace.c: the cross-entropy's gradient is a view of the logits (their memory), and inplace.c
 * keeps them apart when a kernel after the gradient reads the logits (run again on the buffers made
 * transient and separate) */
static void inplace_gpt(Lowered *low, const char *name)
{
	LProg *p = low->progs[0];
	Kernel *k = first_kernel(low, K_CE_GRAD);
	if (!report(k != NULL, "%s: a cross_entropy_grad", name))
		return;
	int x = KARG(k, CE_GRAD, logits)->buf, y = KARG(k, CE_GRAD, dlogits)->buf, at = (int)(k - p->k);
	Buffer *bx = &p->buf[x], *by = &p->buf[y], kx = *bx, ky = *by;
	report(by->cls == BUF_VIEW && by->view_of == x && by->view_off == 0,
	       "%s: the logits' gradient is the logits' memory (a view at offset 0)", name);
	bx->cls = by->cls = BUF_ARENA;
	by->view_of = -1;
	plan_inplace(low);
	bool again = by->cls == BUF_VIEW && by->view_of == x;
	by->cls = BUF_ARENA;
	by->view_of = -1;
	Kernel *after = at + 1 < p->nk ? &p->k[at + 1] : NULL;
	bool kept = false;
	if (after) {
		int *was = after->uses, *more = malloc(sizeof(int) * (size_t)(after->nuses + 1));
		memcpy(more, was, sizeof(int) * (size_t)after->nuses);
		more[after->nuses++] = x;
		after->uses = more;
		plan_inplace(low);
		kept = by->cls == BUF_ARENA;
		after->nuses--;
		after->uses = was;
		free(more);
	}
	*bx = kx;
	*by = ky;
	report(again && kept, "%s: inplace.c makes it a view again, and keeps the two apart when a kernel after the "
	       "gradient reads the logits", name);
}

static void layer_runs_gpt(void)
{
	Arena *a = arena_new();
	Program *gp = load_program(a, "examples/gpt.plan");
	if (!gp || !sema_check(gp)) {
		report(false, "examples/gpt.plan compiles");
		return;
	}
	Compiled c = compile(gp, "single");
	if (!c.low) {
		arena_free(a);
		return;
	}
	LProg *p = c.low->progs[0];
	int cap = p->nk + 1, L = c.g->nlayers;
	LayerRun *runs = malloc(sizeof(LayerRun) * (size_t)cap);
	int n = layer_runs(p, runs, cap);
	const LayerRun *f = run_of(runs, n, PH_FORWARD), *b = run_of(runs, n, PH_BACKWARD), *st = run_of(runs, n, PH_STEP);
	const LayerRun *ck = run_of(runs, n, PH_CHECKPOINT);
	report(L == 4 && f && f->first_layer == 0 && f->nlayers == L && f->step == 1,
	       "gpt single: the forward is one run of all %d layers (%d)", L, f ? f->nlayers : 0);
	report(b && b->first_layer == L - 1 && b->nlayers == L - 1 && b->step == -1,
	       "gpt single: the backward is one run of layers %d..1, descending", L - 1);
	report(st && st->nlayers == L && ck && ck->nlayers == L, "gpt single: the step and checkpoint phases are runs of %d",
	       L);
	KArg *x = layer_arg(p, PH_FORWARD, 2, KA_INT), *y = layer_arg(p, PH_FORWARD, 2, KA_BUF);
	report(x && y, "gpt single: layer 2's forward has an integer argument and an activation");
	if (x) {
		long long was = x->i;
		x->i += 1;
		int len = forward_run_length(p, runs, cap);
		x->i = was;
		report(len == 2, "gpt single: an integer changed in layer 2 ends the forward run at layer 1 (%d layers)", len);
	}
	if (y) {
		long long was = p->buf[y->buf].elems;
		p->buf[y->buf].elems = was + 1;
		int len = forward_run_length(p, runs, cap);
		p->buf[y->buf].elems = was;
		report(len < L, "gpt single: an activation layer 2 reads, of another size, breaks the forward run (%d layers)",
		       len);
	}
	report(forward_run_length(p, runs, cap) == L, "gpt single: undone, the run is whole again");
	free(runs);
	/* the tied embedding: the classifier's matmul reads wte through its transpose flag, and so does
	 * the backward's input gradient (a transpose of that transpose); no kernel copies a parameter */
	int param_permutes = 0;
	for (int i = 0; i < p->nk; i++) {
		if (p->k[i].kind != K_PERMUTE)
			continue;
		const Buffer *in = &p->buf[KARG(&p->k[i], PERMUTE, in)->buf];
		param_permutes += in->cls == BUF_STATE && in->state == SC_PARAM;
	}
	report(param_permutes == 0, "gpt single: no permute of a parameter (the tied embedding's transpose is a view: %d)",
	       param_permutes);
	inplace_gpt(c.low, "gpt single");
	/* bf16 with dropout 0.1: dropout reads and writes bf16 as stored (dropout_16), no f32 dropout */
	Compiled bf = compile(gp, "bf16");
	if (bf.low) {
		Kernel *d = first_kernel(bf.low, K_DROPOUT_16);
		report(d && !first_kernel(bf.low, K_DROPOUT) && KARG(d, DROPOUT_16, storage)->i == DT_BF16 && verify(bf.low),
		       "gpt bf16: dropout_16 on bf16 storage, no f32 dropout, the verifier accepts it");
		epilogues_gpt(bf.low->progs[0], L, 0, true, "gpt bf16 (dropout: the residual adds come after it)");
	}
	/* f32: the CUDA target's GEMMs stay cuBLAS's, with no epilogue */
	int *none = cuda_epilogues(p);
	int f32_pairs = 0;
	for (int i = 0; i < p->nk; i++)
		f32_pairs += none[i] >= 0;
	free(none);
	report(f32_pairs == 0, "gpt single (f32): no GEMM epilogue (%d)", f32_pairs);
	arena_free(a);
	/* gpt350m in bf16: no dropout, so the output projections take the residual too */
	Arena *a3 = arena_new();
	Program *g3 = load_program(a3, "bench/gpu/gpt350m.plan");
	Compiled c3 = g3 && sema_check(g3) ? compile(g3, "bf16") : (Compiled){0};
	if (c3.low)
		epilogues_gpt(c3.low->progs[0], c3.g->nlayers, c3.g->nlayers, false, "gpt350m bf16");
	else
		report(false, "bench/gpu/gpt350m.plan compiles");
	arena_free(a3);
}

int main(void)
{
	/* examples/mlp.plan and one plan whose ZeRO axis has one rank */
	char path[] = "/tmp/planc-test-ir-plan-XXXXXX";
	int fd = mkstemp(path);
	FILE *in = fopen("examples/mlp.plan", "r"), *out = fd >= 0 ? fdopen(fd, "w") : NULL;
	if (!in || !out) {
		perror("test_ir: examples/mlp.plan (run from the repository root)");
		return 2;
	}
	char buf[4096];
	size_t n;
	while ((n = fread(buf, 1, sizeof buf, in)) > 0)
		fwrite(buf, 1, n, out);
	fputs("\nplan zero1_one_rank for mlp {\n  mesh data = 1\n  batch B = 32\n  shard B -> data\n  zero 1 over data\n"
	      "  optimizer adamw(lr = 1e-3, betas = (0.9, 0.999), weight_decay = 0.01)\n}\n",
	      out);
	fclose(in);
	fclose(out);
	Arena *a = arena_new();
	Program *p = load_program(a, path);
	if (!p || !sema_check(p)) {
		fprintf(stderr, "test_ir: the plans do not compile\n");
		remove(path);
		return 2;
	}
	zero_and_sync(p);
	storage_16(p);
	Compiled mlp = compile(p, "single");
	if (mlp.low) {
		LayerRun none[4];
		report(layer_runs(mlp.low->progs[0], none, 4) == 0, "mlp single (no repeat): no runs of layers");
	}
	arena_free(a);
	layer_runs_gpt();
	remove(path);
	printf("%d passed, %d failed\n", npass, nfail);
	return nfail ? 1 : 0;
}
