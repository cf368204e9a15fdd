/* emit_cuda.c: the CUDA target. The loop-level IR printed for a GPU, as three files:
 *
 *   prog.c      the host program, in the C target's shape (emit_c.c prints the buffers, the phase
 *               functions, the tables and the descriptor, and each run of identical layers as one
 *               loop over the stage's state families, as in the C target; this file prints the
 *               kernels, with what may differ by layer through emit_name, emit_int and
 *               emit_comment, so that the walker can fold them): each
 *               kernel is a call into planrt_cuda (runtime/planrt_cuda.h) on the stream streams.c
 *               gave it, after the waits it planned and before the event others wait for; a
 *               fused loop is a launch of its kernel in kernels.cu; what runs on the host
 *               (offloaded optimizer state, disk I/O) is the C target's call. main() calls
 *               planrt_cuda_main, which runs planrt_main on the CUDA device layer: every state
 *               buffer and the arena are device memory (the arena one allocation of exactly the
 *               planned bytes), offloaded state pinned host memory.
 *   kernels.cu  every distinct fused loop as a __global__ function walking its output with a grid
 *               stride, and an extern "C" launcher; loops with the same element function (the
 *               same shape, expression and dtypes: most of a model's layers) share one kernel.
 *   loops.h     the element functions: out[i] from the flat output index i, split into the loop
 *               indices (i_d = i / stride_d % dim_d) and the loads' offsets as the C target prints
 *               them (emit_c.c's expression printer). Plain C that also compiles for the device,
 *               so tests/cuda runs each one on the CPU against the C target's loop nest.
 *
 * The printer adds no computation and no communication; the choices it makes are per kernel kind,
 * from the kernel table's device column (kernel_table.h: the planrt_cuda function, nothing to do,
 * or host only; bf16 GEMMs are kinds of their own), and per stream. A kind planrt_cuda has no
 * implementation of is refused by name (cuda_executable). The streams and events are
 * streams.c's data, printed as calls: planrt_cu_wait(STREAM, &event) before a kernel,
 * planrt_cu_record(&event, STREAM) after it, planrt_cu_wait_entry at a side stream's first use in
 * a phase call, and the joins at the call's end; the generated file shows the schedule. */
#include "target/target.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* the most experts a token is routed to on the device (runtime/planrt_moe_math.h's
 * PLANRT_MOE_MAX_TOP_K: the device's routing gradient keeps a token's choices in registers) */
enum { MOE_MAX_TOP_K = 32 };

/* what the host can run itself (the C target's function on host memory) */
static bool host_kind(KernelKind k)
{
	return k == K_LOOP || kernel_classes[k] == KC_COMPUTE || kernel_classes[k] == KC_IO;
}

/* ------------------------------------------------------------------ the fused loops */

typedef struct Loop {
	char *key;  /* the element function's text with "@" for its name: loops with the same share it */
	int id;
	DType out;  /* its output's element type, and its loads' in order */
	DType *in;
	int nin;
	const LProg *p; /* the first kernel that runs it */
	const Kernel *k;
} Loop;

typedef struct Cuda {
	const Lowered *low;
	Loop *loops;     /* distinct element functions */
	int nloops, caploops;
	int **loop_of;   /* [program][kernel]: the loop id of a device fused loop, -1 otherwise */
	int **event_of;  /* [program][kernel]: its slot in the stage's event table, -1: none */
	int *nevents;    /* [program] */
	int **optim_group; /* [program][kernel]: optim_groups.c's runs of optimizer kernels */
	int **epilogue;    /* [program][kernel]: epilogues.c's matmul and loop pairs */
	const char **prefixes; /* [program]: its names' prefix, as emit_c.c printed it */
} Cuda;

static char *memtext(FILE *f, char **buf)
{
	fclose(f);
	return *buf;
}

/* The element function of loop k: out[i] = expr with loads of buffer b as v<slot>. */
void emit_cuda_loop_body(FILE *f, const LProg *p, const Kernel *k, const char *fname)
{
	int loads[64];
	int n = emit_loop_loads(k, loads, 64);
	int *slot = calloc((size_t)p->nbuf, sizeof(int));
	if (!slot)
		ICE("out of memory");
	for (int i = 0; i < n; i++)
		slot[loads[i]] = i;
	DType ot = p->buf[buffer_root(p, k->out)].dtype;
	fprintf(f, "PLANRT_LOOP void %s(int64_t i, %s *PLANRT_RESTRICT out", fname, emit_ctype(ot));
	for (int i = 0; i < n; i++)
		fprintf(f, ", const %s *PLANRT_RESTRICT v%d", emit_ctype(p->buf[buffer_root(p, loads[i])].dtype), i);
	fprintf(f, ")\n{\n");
	bool flat = emit_loop_flat(k);
	if (!flat) {
		/* the loop indices the loads use, from the output's row-major index */
		bool used[MAX_DIMS] = {false};
		long long stride[MAX_DIMS], total = 1;
		for (int d = k->rank - 1; d >= 0; d--) {
			stride[d] = total;
			total *= k->dims[d];
		}
		struct Walk {
			const LExpr *x;
		} stack[128];
		int top = 0;
		stack[top++].x = k->expr;
		while (top) {
			const LExpr *x = stack[--top].x;
			if (!x)
				continue;
			if (x->kind == LX_LOAD)
				for (int d = 0; d < k->rank; d++)
					used[d] |= x->stride[d] != 0;
			if (top + 2 > 128)
				ICE("a fused loop's expression is deeper than 128");
			stack[top++].x = x->a;
			stack[top++].x = x->b;
		}
		for (int d = 0; d < k->rank; d++) {
			if (!used[d])
				continue;
			fprintf(f, "\tconst int64_t i%d = i", d);
			if (stride[d] != 1)
				fprintf(f, " / %lld", stride[d]);
			if (d > 0)
				fprintf(f, " %% %lld", k->dims[d]);
			fprintf(f, ";\n");
		}
	}
	fprintf(f, "\t");
	bool half = ot == DT_BF16 || ot == DT_F16;
	if (half)
		fprintf(f, "out[i] = %s(%s", ot == DT_F16 ? "tohf" : "tobf",
			k->accumulate ? (ot == DT_F16 ? "hf(out[i]) + " : "bf(out[i]) + ") : "");
	else
		fprintf(f, "out[i] %s ", k->accumulate ? "+=" : "=");
	emit_loop_expr_to(f, p, k, flat, slot);
	fprintf(f, half ? ");\n}\n" : ";\n}\n");
	free(slot);
}

static int loop_id(Cuda *c, const LProg *p, const Kernel *k)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	if (!f)
		ICE("out of memory");
	emit_cuda_loop_body(f, p, k, "@");
	char *key = memtext(f, &buf);
	for (int i = 0; i < c->nloops; i++)
		if (!strcmp(c->loops[i].key, key)) {
			free(key);
			return c->loops[i].id;
		}
	if (c->nloops == c->caploops) {
		c->caploops = c->caploops ? 2 * c->caploops : 64;
		c->loops = realloc(c->loops, sizeof *c->loops * (size_t)c->caploops);
		if (!c->loops)
			ICE("out of memory");
	}
	Loop *l = &c->loops[c->nloops];
	int loads[64];
	l->key = key;
	l->id = c->nloops;
	l->p = p;
	l->k = k;
	l->out = p->buf[buffer_root(p, k->out)].dtype;
	l->nin = emit_loop_loads(k, loads, 64);
	l->in = arena_alloc(p->g->arena, sizeof(DType) * (size_t)(l->nin ? l->nin : 1));
	for (int i = 0; i < l->nin; i++)
		l->in[i] = p->buf[buffer_root(p, loads[i])].dtype;
	return c->nloops++;
}

/* the loop's parameter list as the launcher and the kernel take it (restrict_: with PLANRT_RESTRICT,
 * which loops.h defines; else without, for prog.c's C declarations): the output's elements, the
 * output and the loads, as its element function takes them */
static void loop_params(FILE *f, const Loop *l, bool restrict_)
{
	const char *r = restrict_ ? "PLANRT_RESTRICT " : "";
	fprintf(f, "int64_t n, %s *%sout", emit_ctype(l->out), r);
	for (int i = 0; i < l->nin; i++)
		fprintf(f, ", const %s *%sv%d", emit_ctype(l->in[i]), r, i);
}

/* the parameter names of a loop's list: "out, v0, v1" */
static void loop_names(FILE *f, const Loop *l)
{
	fprintf(f, "out");
	for (int i = 0; i < l->nin; i++)
		fprintf(f, ", v%d", i);
}

/* ------------------------------------------------------------------ printing kernels */

/* the stream's name in prog.c */
static void stream_text(char *buf, size_t size, int stream)
{
	static const char *const names[] = {"PLANRT_STREAM_COMPUTE", "PLANRT_STREAM_COMM", "PLANRT_STREAM_COPY",
					    "PLANRT_STREAM_HOST"};
	if (stream < STREAM_P2P)
		snprintf(buf, size, "%s", names[stream]);
	else
		snprintf(buf, size, "PLANRT_STREAM_P2P + %d", stream - STREAM_P2P);
}

static void stream_const(FILE *f, int stream)
{
	char name[64];
	stream_text(name, sizeof name, stream);
	fprintf(f, "%s", name);
}

static Cuda *cuda_of(Emit *e)
{
	return emit_target(e)->data;
}

static int kernel_index(const LProg *p, const Kernel *k)
{
	return (int)(k - p->k);
}

static void event_ref(Emit *e, int kernel)
{
	int slot = cuda_of(e)->event_of[emit_stage(e)][kernel];
	internal_assert(slot >= 0);
	fprintf(emit_file(e), "&%sevents[", emit_prefix(e));
	emit_int(e, "event", slot); /* a layer's events are its own */
	fprintf(emit_file(e), "]");
}

static void device_call(Emit *e, const Kernel *k)
{
	FILE *f = emit_file(e);
	const LProg *p = emit_prog(e);
	Cuda *c = cuda_of(e);
	if (k->kind == K_LOOP) {
		long long total = 1;
		for (int d = 0; d < k->rank; d++)
			total *= k->dims[d];
		int loads[64];
		int n = emit_loop_loads(k, loads, 64);
		fprintf(f, "loop%d_launch(%lld, ", c->loop_of[emit_stage(e)][kernel_index(p, k)], total);
		emit_name(e, k->out);
		for (int i = 0; i < n; i++) {
			fprintf(f, ", ");
			emit_name(e, loads[i]);
		}
		fprintf(f, ", ");
		stream_const(f, k->stream);
		fprintf(f, ");");
		emit_comment(e, arena_printf(p->g->arena, "%s, %d op%s fused", k->note ? k->note : "loop", k->nfused,
					     k->nfused == 1 ? "" : "s"));
		return;
	}
	const DeviceCall *dev = &kernel_device[k->kind];
	const char *fn = dev->function;
	internal_assert(dev->mode == KDEV_CALL && fn);
	fprintf(f, "%s(", fn);
	for (int i = 0; i < k->nargs; i++) {
		const KArg *a = &k->args[i];
		if (i)
			fprintf(f, ", ");
		if (a->kind == KA_SCALAR) { /* read on the device: the buffer and its factor */
			emit_name(e, a->buf);
			fprintf(f, ", ");
			emit_double(e, a->f);
		} else {
			emit_arg(e, k, i);
		}
	}
	fprintf(f, "%s", k->nargs ? ", " : "");
	stream_const(f, k->stream);
	fprintf(f, ");");
	if (k->note)
		emit_comment(e, k->note);
}

static void print_kernel(Emit *e, const Kernel *k)
{
	FILE *f = emit_file(e);
	const LProg *p = emit_prog(e);
	const int *group = cuda_of(e)->optim_group[emit_stage(e)];
	int run_last = group[kernel_index(p, k)];
	int pair = cuda_of(e)->epilogue[emit_stage(e)][kernel_index(p, k)];
	if (run_last == CUDA_OPT_MEMBER || pair == CUDA_EPI_MEMBER) /* printed with its run's first kernel */
		return;
	if (kernel_device[k->kind].mode == KDEV_NO_OP) {
		fprintf(f, "\t/* %s: NCCL progresses its operations on their own stream */\n", kernel_names[k->kind]);
		return;
	}
	const char *in = "\t";
	if (k->only_last_micro) {
		fprintf(f, "\tif (ctx->micro == MICRO_BATCHES - 1) {\n");
		in = "\t\t";
	}
	for (int w = 0; w < k->nwaits; w++) {
		fprintf(f, "%splanrt_cu_wait%s(", in, k->waits[w] < 0 ? "_entry" : "");
		stream_const(f, k->stream);
		if (k->waits[w] >= 0) {
			fprintf(f, ", ");
			event_ref(e, k->waits[w]);
			fprintf(f, ");");
			emit_comment(e, arena_printf(p->g->arena, "after %d: %s", k->waits[w], kernel_names[p->k[k->waits[w]].kind]));
			fprintf(f, "\n");
		} else {
			fprintf(f, "); /* after the compute stream's work before this call */\n");
		}
	}
	if (k->stream == STREAM_HOST) {
		if (k->kind == K_LOOP)
			fprintf(f, "%s/* on the host: */\n", in);
		emit_c_kernel(e, k); /* the C target's call or loop nest, on host memory */
	} else if (run_last >= 0) {
		char stream[64];
		stream_text(stream, sizeof stream, k->stream);
		cuda_print_optim_group(e, group, kernel_index(p, k), stream);
		k = &p->k[run_last]; /* the run's last kernel records the event others wait for */
	} else if (pair >= 0) {
		char stream[64];
		stream_text(stream, sizeof stream, k->stream);
		fprintf(f, "%s", in);
		cuda_print_epilogue(e, k, &p->k[pair], stream);
		fprintf(f, "\n");
		k = &p->k[pair]; /* the loop records the event others wait for */
	} else {
		fprintf(f, "%s", in);
		device_call(e, k);
		fprintf(f, "\n");
	}
	if (k->event) {
		fprintf(f, "%splanrt_cu_record(", in);
		event_ref(e, kernel_index(p, k));
		fprintf(f, ", ");
		stream_const(f, k->stream);
		fprintf(f, ");\n");
	}
	if (k->only_last_micro)
		fprintf(f, "\t}\n");
}

/* Whether k may be printed in a loop over layers: not a kernel of a multi-tensor optimizer run,
 * whose launch keeps its uploaded table in a static of its call site (one per layer needed). */
static bool loopable(Emit *e, const Kernel *k)
{
	return cuda_of(e)->optim_group[emit_stage(e)][kernel_index(emit_prog(e), k)] == CUDA_OPT_ALONE;
}

static bool in_call(const Kernel *k, Phase ph, int chunk)
{
	if (k->phase != ph)
		return false;
	return (ph != PH_PREPARE_F && ph != PH_FORWARD && ph != PH_PREPARE_B && ph != PH_BACKWARD) || k->chunk == chunk;
}

static void phase_begin(Emit *e, Phase ph, int chunk)
{
	const LProg *p = emit_prog(e);
	for (int i = 0; i < p->nk; i++)
		if (in_call(&p->k[i], ph, chunk))
			for (int w = 0; w < p->k[i].nwaits; w++)
				if (p->k[i].waits[w] < 0) {
					fprintf(emit_file(e), "\tplanrt_cu_record_entry(); /* side streams start after it */\n");
					return;
				}
}

static void phase_end(Emit *e, Phase ph, int chunk)
{
	const LProg *p = emit_prog(e);
	FILE *f = emit_file(e);
	for (int i = 0; i < p->nk; i++) {
		const Kernel *k = &p->k[i];
		if (!in_call(k, ph, chunk) || !k->join)
			continue;
		fprintf(f, "\tplanrt_cu_wait(PLANRT_STREAM_COMPUTE, ");
		event_ref(e, i);
		fprintf(f, "); /* join %d: %s */\n", i, kernel_names[k->kind]);
	}
	/* the host reads what these phases leave (the step's metrics, an evaluation's loss) or goes on
	 * to I/O: they end when the device is done */
	if (ph != PH_STEP_BEGIN && ph != PH_PREPARE_F && ph != PH_FORWARD && ph != PH_PREPARE_B && ph != PH_BACKWARD &&
	    ph != PH_EVAL_BEGIN)
		fprintf(f, "\tplanrt_cu_synchronize(); /* the host reads this phase's results */\n");
}

static void stage_decls(Emit *e)
{
	Cuda *c = cuda_of(e);
	const LProg *p = emit_prog(e);
	c->prefixes[emit_stage(e)] = emit_prefix(e);
	int n = c->nevents[emit_stage(e)];
	FILE *f = emit_file(e);
	fprintf(f, "static planrt_cu_event_t %sevents[%d]; /* the events streams.c planned */\n", emit_prefix(e), n ? n : 1);
	fprintf(f, "/* offloaded state: pinned host memory */\nstatic void **const %shost_state[] = {", emit_prefix(e));
	for (int b = 0; b < p->nbuf; b++)
		if (p->buf[b].cls == BUF_STATE && p->buf[b].place == PLACE_HOST) {
			fprintf(f, "(void **)&");
			emit_name(e, b); /* a family's entry: its array's */
			fprintf(f, ", ");
		}
	fprintf(f, "NULL};\n");
}

static void epilogue(Emit *e)
{
	Cuda *c = cuda_of(e);
	FILE *f = emit_file(e);
	fprintf(f, "\nstatic int cuda_main(int argc, char **argv, const planrt_program_t *prog)\n{\n");
	for (int i = 0; i < c->low->nprogs; i++) {
		const char *prefix = c->prefixes[i];
		fprintf(f, "\tplanrt_cu_host_state(%shost_state);\n", prefix);
	}
	fprintf(f, "\treturn planrt_cuda_main(argc, argv, prog);\n}\n");
}

static void prelude(Emit *e)
{
	Cuda *c = cuda_of(e);
	FILE *f = emit_file(e);
	fprintf(f, "/* The CUDA target: every kernel runs on the device stream planc's schedule gave it\n"
		   " * (compute, comm, copy, a pipeline channel's; host: on the CPU), after the events it waits\n"
		   " * for; the fused loops are the launchers of kernels.cu. */\n");
	fprintf(f, "#include \"planrt_cuda.h\"\n\n");
	fprintf(f, "static int cuda_main(int argc, char **argv, const planrt_program_t *prog);\n");
	fprintf(f, "/* kernels.cu: the fused loops */\n");
	for (int i = 0; i < c->nloops; i++) {
		fprintf(f, "void loop%d_launch(", i);
		loop_params(f, &c->loops[i], false);
		fprintf(f, ", int stream);\n");
	}
	fprintf(f, "\n");
}

/* ------------------------------------------------------------------ the files */

static bool write_kernels(const Cuda *c, const char *dir, const char *source_path)
{
	const PlanSpec *ps = c->low->ps;
	const char *hpath = arena_printf(c->low->g->arena, "%s/loops.h", dir);
	FILE *h = fopen(hpath, "w");
	if (!h) {
		fprintf(stderr, "planc: error: cannot write '%s': %s\n", hpath, strerror(errno));
		return false;
	}
	fprintf(h, "/* loops.h: generated by planc %s from %s, plan %s. Do not edit.\n", PLANC_VERSION, source_path,
		ps->plan->name);
	fprintf(h, " * The element functions of the plan's fused loops: out[i] for the output's flat index i. C that\n"
		   " * compiles for the host and, included by kernels.cu, for the device. */\n");
	fprintf(h, "#ifndef PLANC_LOOPS_H\n#define PLANC_LOOPS_H\n#include <stdint.h>\n#include <string.h>\n#include <math.h>\n\n"
		   "#include \"planrt_math.h\"\n#include \"planrt_sync_math.h\"\n\n");
	fprintf(h, "#ifdef __CUDACC__\n#define PLANRT_LOOP static __host__ __device__ __forceinline__\n"
		   "#define PLANRT_RESTRICT __restrict__\n#else\n#define PLANRT_LOOP static inline\n"
		   "#define PLANRT_RESTRICT restrict\n#endif\n\n");
	fprintf(h, "PLANRT_LOOP float relu(float x) { return x > 0 ? x : 0; }\n"
		   "PLANRT_LOOP float relu_grad(float y, float dy) { return y > 0 ? dy : 0; }\n"
		   "PLANRT_LOOP float gelu_erf(float x) { return planrt_gelu_erf(x); }\n"
		   "PLANRT_LOOP float gelu_erf_grad(float x, float dy) { return planrt_gelu_erf_grad(x, dy); }\n"
		   "PLANRT_LOOP float gelu_tanh(float x)\n{\n"
		   "\treturn 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));\n}\n"
		   "PLANRT_LOOP float gelu_tanh_grad(float x, float dy)\n{\n"
		   "\tfloat u = 0.79788456080286536f * (x + 0.044715f * x * x * x), t = tanhf(u);\n"
		   "\tfloat du = 0.79788456080286536f * (1.0f + 3.0f * 0.044715f * x * x);\n"
		   "\treturn dy * (0.5f + 0.5f * t + 0.5f * x * (1.0f - t * t) * du);\n}\n"
		   "PLANRT_LOOP float silu(float x) { return planrt_silu(x); }\n"
		   "PLANRT_LOOP float silu_grad(float x, float dy) { return planrt_silu_grad(x, dy); }\n"
		   "PLANRT_LOOP float dropout_grad(uint8_t keep, float dy, float scale) { return keep ? dy * scale : 0; }\n"
		   "/* bf16 storage: widen to f32 for arithmetic, round to nearest even when stored */\n"
		   "PLANRT_LOOP float bf(uint16_t x)\n{\n\tuint32_t u = (uint32_t)x << 16;\n"
		   "#ifdef __CUDA_ARCH__\n\treturn __uint_as_float(u);\n#else\n\tfloat f;\n\tmemcpy(&f, &u, 4);\n\treturn f;\n#endif\n}\n"
		   "PLANRT_LOOP uint16_t tobf(float f)\n{\n"
		   "#ifdef __CUDA_ARCH__\n\tuint32_t u = __float_as_uint(f);\n#else\n\tuint32_t u;\n\tmemcpy(&u, &f, 4);\n#endif\n"
		   "\tif ((u & 0x7fffffffu) > 0x7f800000u)\n\t\treturn (uint16_t)((u >> 16) | 0x40);\n"
		   "\treturn (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);\n}\n"
		   "/* f16 storage: IEEE half, widened exactly, rounded to nearest even when stored: the C target's\n"
		   " * planrt_f16_to_f32 and planrt_f32_to_f16 (planrt_sync_math.h; tests/cuda/test_sync_math.c) */\n"
		   "PLANRT_LOOP float hf(uint16_t x) { return sm_widen(x, PLANRT_SM_F16); }\n"
		   "PLANRT_LOOP uint16_t tohf(float f) { return sm_narrow(f, PLANRT_SM_F16); }\n\n");
	for (int i = 0; i < c->nloops; i++) {
		emit_cuda_loop_body(h, c->loops[i].p, c->loops[i].k, arena_printf(c->low->g->arena, "loop%d", i));
		fprintf(h, "\n");
	}
	fprintf(h, "#endif\n");
	bool ok = !ferror(h);
	if (fclose(h) != 0 || !ok) {
		fprintf(stderr, "planc: error: writing '%s' failed\n", hpath);
		return false;
	}

	const char *path = arena_printf(c->low->g->arena, "%s/kernels.cu", dir);
	FILE *f = fopen(path, "w");
	if (!f) {
		fprintf(stderr, "planc: error: cannot write '%s': %s\n", path, strerror(errno));
		return false;
	}
	fprintf(f, "/* kernels.cu: generated by planc %s from %s, plan %s. Do not edit.\n", PLANC_VERSION, source_path,
		ps->plan->name);
	fprintf(f, " * The plan's %d distinct fused loops as CUDA kernels (a grid-stride walk of the output) and\n"
		   " * their launchers, which prog.c calls on the stream planc's schedule gave each loop. */\n",
		c->nloops);
	fprintf(f, "#include \"planrt_cuda.h\"\n#include \"loops.h\"\n\n");
	for (int i = 0; i < c->nloops; i++) {
		const Loop *l = &c->loops[i];
		fprintf(f, "__global__ void loop%d_kernel(", i);
		loop_params(f, l, true);
		fprintf(f, ")\n{\n\tfor (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; "
			   "i += (int64_t)gridDim.x * blockDim.x)\n\t\tloop%d(i, ",
			i);
		loop_names(f, l);
		fprintf(f, ");\n}\n\nextern \"C\" void loop%d_launch(", i);
		loop_params(f, l, true);
		fprintf(f, ", int stream)\n{\n\tif (n <= 0)\n\t\treturn;\n"
			   "\tloop%d_kernel<<<planrt_cu_grid(n), PLANRT_CU_BLOCK, 0, planrt_cu_stream(stream)>>>(n, ",
			i);
		loop_names(f, l);
		fprintf(f, ");\n\tplanrt_cu_check_launch(\"loop%d\");\n}\n\n", i);
	}
	ok = !ferror(f);
	if (fclose(f) != 0 || !ok) {
		fprintf(stderr, "planc: error: writing '%s' failed\n", path);
		return false;
	}
	return true;
}

bool emit_cuda(const Lowered *low, const char *dir, const char *source_path, bool layer_loops)
{
	Cuda c = {.low = low};
	Arena *a = low->g->arena;
	c.loop_of = arena_alloc(a, sizeof(int *) * (size_t)low->nprogs);
	c.event_of = arena_alloc(a, sizeof(int *) * (size_t)low->nprogs);
	c.nevents = arena_alloc(a, sizeof(int) * (size_t)low->nprogs);
	c.prefixes = arena_alloc(a, sizeof(char *) * (size_t)low->nprogs);
	c.optim_group = arena_alloc(a, sizeof(int *) * (size_t)low->nprogs);
	c.epilogue = arena_alloc(a, sizeof(int *) * (size_t)low->nprogs);
	for (int i = 0; i < low->nprogs; i++) {
		const LProg *p = low->progs[i];
		c.loop_of[i] = arena_alloc(a, sizeof(int) * (size_t)(p->nk ? p->nk : 1));
		c.event_of[i] = arena_alloc(a, sizeof(int) * (size_t)(p->nk ? p->nk : 1));
		c.optim_group[i] = cuda_optim_groups(p);
		c.epilogue[i] = cuda_epilogues(p);
		for (int k = 0; k < p->nk; k++) {
			const Kernel *x = &p->k[k];
			bool device_loop = x->kind == K_LOOP && x->stream != STREAM_HOST && c.epilogue[i][k] != CUDA_EPI_MEMBER;
			c.loop_of[i][k] = device_loop ? loop_id(&c, p, x) : -1;
			c.event_of[i][k] = x->event ? c.nevents[i]++ : -1;
		}
	}
	EmitTarget t = {.prelude = prelude,
			.stage_decls = stage_decls,
			.phase_begin = phase_begin,
			.kernel = print_kernel,
			.phase_end = phase_end,
			.epilogue = epilogue,
			.loopable = loopable,
			.main_fn = "cuda_main",
			.data = &c};
	bool ok = emit_c_with(low, dir, source_path, &t, layer_loops) && write_kernels(&c, dir, source_path);
	for (int i = 0; i < low->nprogs; i++) {
		free(c.optim_group[i]);
		free(c.epilogue[i]);
	}
	for (int i = 0; i < c.nloops; i++)
		free(c.loops[i].key);
	free(c.loops);
	return ok;
}

/* ------------------------------------------------------------------ what the CUDA target runs */

bool cuda_executable(const Lowered *low, bool report)
{
	if (!lowered_executable_on(low, report, true))
		return false;
	for (int i = 0; i < low->nprogs; i++) {
		const LProg *p = low->progs[i];
		for (int k = 0; k < p->nk; k++) {
			const Kernel *x = &p->k[k];
			bool ok = x->stream == STREAM_HOST ? host_kind(x->kind)
							   : x->kind == K_LOOP || kernel_device[x->kind].mode != KDEV_HOST_ONLY;
			long long top_k = x->kind == K_MOE_ROUTE	       ? KARG(x, MOE_ROUTE, top_k)->i
					  : x->kind == K_MOE_ROUTE_GRAD ? KARG(x, MOE_ROUTE_GRAD, top_k)->i
									: 0;
			if (ok && top_k > MOE_MAX_TOP_K) {
				if (report) {
					const Op *op = x->op >= 0 ? &low->g->ops[x->op] : NULL;
					diag_error(op && op->src ? op->src : low->ps->src,
						   op && op->src ? op->loc : low->ps->plan->name_loc,
						   "planc build --target cuda routes a token to at most %d experts (top_k = %lld)",
						   MOE_MAX_TOP_K, top_k);
					diag_note_plain("choose a smaller top_k, or build it for the CPU (planc build without --target)");
				}
				return false;
			}
			if (ok)
				continue;
			if (report) {
				const Op *op = x->op >= 0 ? &low->g->ops[x->op] : NULL;
				const Source *src = low->ps->src;
				Loc loc = op && op->src ? op->loc : low->ps->plan->name_loc;
				diag_error(op && op->src ? op->src : src, loc,
					   "planc build --target cuda cannot execute kernel '%s' yet (the CPU target can)",
					   kernel_names[x->kind]);
				diag_note_plain("build it for the CPU (planc build without --target), or choose a plan without it");
			}
			return false;
		}
	}
	return true;
}
