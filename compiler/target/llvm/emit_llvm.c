/* emit_llvm.c: the loop-level IR through the LLVM C API (LLVM 14, typed pointers): the second
 * back end, for `planc run` (ORC LLJIT, in-process), `planc build --backend llvm` (a native
 * object linked with planrt) and `planc emit ptx` (the fused kernels as NVPTX kernels).
 *
 * It builds from the same Lowered program emit_c.c prints and in the same shape: the mesh-axis
 * tables, for every stage the persistent-state pointers and request handles as globals, one
 * function per phase, the action, phase, state and parameter tables, the stage table and the
 * planrt_program_t descriptor, and main() calling planrt_main. Every kernel is a call to the planrt
 * function of its kind (kernel_functions[]) with its arguments in the order emit_c.c prints them,
 * or, for a fused element-wise kernel (K_LOOP), a loop nest specialised to its exact shape. It adds
 * no computation and no communication, and every choice is made per kernel kind or argument kind.
 *
 * Calls into planrt take each function's parameters from the kernel table (kernel_table.h), whose
 * rows target/planrt_abi.c checks at compile time against the runtime's headers, so a changed
 * prototype breaks the build, not a run. The descriptors' layouts are checked at run time: every
 * field's LLVM offset must equal offsetof() in planrt's struct.
 *
 * Numerics: the fused loops repeat emit_c.c's expressions and helpers (planrt_math.h's kexpf and
 * kerff, bf16 rounding) operation for operation. The C back end compiles with gcc's default
 * -ffp-contract=fast, which fuses a multiply into the add or subtract that is its only use where
 * the CPU has FMA; the builder does the same here (llvm.fmuladd: fused where the target has FMA),
 * so that the two back ends round alike. LLVMRunPasses runs default<O3> with the target machine:
 * the host CPU's for planc run and build --native (the loops vectorise as gcc -march=native
 * vectorises the C), the triple's baseline otherwise. Instruction-set levels (planrt_cpu.h): in an
 * object each fused loop is a function per level, marked with the level's target-cpu, called
 * through a table indexed by planrt_cpu_level_ (the C target's PLANRT_CPU_LOOP); planc run builds
 * it once, for the host CPU or for the level PLANRT_ISA forces, so that at every level both back
 * ends and the JIT compute the same bits. LLVM errors (a verifier failure, a missing target, an
 * unresolved symbol) are planc diagnostics, never aborts. */
#include "target/target.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <llvm-c/Analysis.h>
#include <llvm-c/Core.h>
#include <llvm-c/Error.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>

#include "planrt_cpu.h"
#include "planrt_exec.h"
#include "planrt_kernels.h"
#include "planrt_program.h"

/* ------------------------------------------------------------------ planrt's signatures */

/* the calls that make arguments, and the entry point */
_Static_assert(__builtin_types_compatible_p(__typeof__(planrt_mesh_coord), int(int)), "planrt_mesh_coord");
_Static_assert(__builtin_types_compatible_p(__typeof__(planrt_axis_comm), planrt_comm_t(int)), "planrt_axis_comm");
_Static_assert(__builtin_types_compatible_p(__typeof__(planrt_pair), planrt_comm_t(int)), "planrt_pair");
_Static_assert(__builtin_types_compatible_p(__typeof__(planrt_main), int(int, char **, const planrt_program_t *)),
	       "planrt_main");

bool llvm_kernel_known(KernelKind kind)
{
	return kind == K_LOOP || kernel_functions[kind];
}

/* Every kernel the program calls has a signature here (a kind added to KERNEL_TABLE without one
 * is refused by name, before any LLVM work). */
static bool llvm_supported(const Lowered *low)
{
	bool ok = true, seen[K_COUNT] = {0};
	for (int i = 0; i < low->nprogs; i++)
		for (int k = 0; k < low->progs[i]->nk; k++) {
			KernelKind kind = low->progs[i]->k[k].kind;
			if (seen[kind] || llvm_kernel_known(kind))
				continue;
			seen[kind] = true;
			fprintf(stderr, "planc: error: the LLVM back end cannot call '%s' (kernel '%s') yet\n",
				kernel_functions[kind] ? kernel_functions[kind] : "nothing", kernel_names[kind]);
			ok = false;
		}
	if (!ok)
		diag_note_plain("'planc build' without --backend llvm (the C back end) runs this plan");
	return ok;
}

/* ------------------------------------------------------------------ the builder's state */

typedef struct Gen {
	LLVMContextRef c;
	LLVMModuleRef m;
	LLVMBuilderRef b;       /* the running function's code */
	LLVMBuilderRef ab;      /* its entry block: allocas */
	LLVMTargetDataRef td;
	bool gpu;               /* NVPTX: the fused kernels as kernels, nothing else */
	const Lowered *low;
	const LProg *p;         /* the stage being built */
	const char *prefix;     /* its names' prefix: "s0_" with several stages, else "" (as emit_c.c) */
	LLVMTypeRef t_void, t_i8, t_i16, t_i32, t_i64, t_f32, t_f64, t_ptr, t_phase;
	LLVMValueRef fn, ctx;   /* the running function and its context argument */
	LLVMBasicBlockRef entry, body;
	LLVMValueRef *state;    /* [nbuf]: the global holding a state buffer's pointer */
	LLVMValueRef *handles;  /* [nhandles] */
	LLVMValueRef kfn[K_COUNT];
	LLVMTypeRef kty[K_COUNT];
	LLVMValueRef fmuladd, fabs, copysign, tanhf, mesh_coord, axis_comm, pair;
	/* the fused loops' instruction sets (planrt_cpu.h): LOOPS_PER_LEVEL, one function per level
	 * called through loop<k>_at[planrt_cpu_level_]; else one function, for the target machine's
	 * CPU (level < 0) or for one level's */
	int loop_level;
	LLVMValueRef cpu_level; /* the global planrt_cpu_level_ */
	/* layers as loops (below): the stage's runs of identical layers built as one loop over l */
	LayerRun *runs;
	int *run_at;            /* [kernel]: the run it begins, RUN_INSIDE (a later kernel of one), or -1 */
	LayerFamilies fams;     /* the stage's state families (layer_values.c) */
	LLVMValueRef *fam_array; /* [family]: its global array of the members' pointers */
	const LayerRun *run;    /* while building a run's body: the run, */
	int *run_ks;            /* its kernels layer after layer, */
	int run_j;              /* the body's kernel being built, */
	LLVMValueRef l;         /* the layer's index (i64, 0 .. nlayers-1) */
	LLVMBasicBlockRef before; /* the block before the loop: per-layer tables */
	SymTab *loop_fns;       /* the fused loops' functions (LoopFns) by their loop nest (loop_key) */
} Gen;

enum { LOOPS_PER_LEVEL = PLANRT_CPU_LEVELS, LOOPS_FOR_MACHINE = -1 };
enum { RUN_INSIDE = -2 };

/* The CPU and features of each instruction-set level, as function attributes: each function's
 * code is generated for its own (LLVM's per-function subtargets), whatever the target machine's. */
static const struct {
	const char *cpu, *features;
} level_target[PLANRT_CPU_LEVELS] = {
#if defined(__x86_64__)
	{"x86-64", ""}, {"x86-64-v3", ""}, {"x86-64-v4", ""},
#elif defined(__aarch64__)
	{"generic", "+neon"}, {"generic", "+neon,+sve"},
#else
	{"generic", ""},
#endif
};

static LLVMValueRef i32c(Gen *G, long long v)
{
	return LLVMConstInt(G->t_i32, (unsigned long long)v, 1);
}

static LLVMValueRef i64c(Gen *G, long long v)
{
	return LLVMConstInt(G->t_i64, (unsigned long long)v, 1);
}

static LLVMValueRef i8c(Gen *G, long long v)
{
	return LLVMConstInt(G->t_i8, (unsigned long long)v, 0);
}

static void add_attr(Gen *G, LLVMValueRef fn, unsigned index, const char *name)
{
	unsigned kind = LLVMGetEnumAttributeKindForName(name, strlen(name));
	LLVMAddAttributeAtIndex(fn, index, LLVMCreateEnumAttribute(G->c, kind, 0));
}

static LLVMValueRef declare(Gen *G, const char *name, LLVMTypeRef ty)
{
	LLVMValueRef f = LLVMGetNamedFunction(G->m, name);
	if (!f) {
		f = LLVMAddFunction(G->m, name, ty);
		add_attr(G, f, LLVMAttributeFunctionIndex, "nounwind");
	}
	return f;
}

static LLVMValueRef call(Gen *G, LLVMValueRef fn, LLVMValueRef *args, unsigned n)
{
	return LLVMBuildCall2(G->b, LLVMGlobalGetValueType(fn), fn, args, n, "");
}

/* A planrt function's parameter as LLVM sees it at the call: pointers and handles as i8*, enums
 * as i32 (kernel_table.h's ABI class of its type). */
static LLVMTypeRef param_type(Gen *G, KParamType t)
{
	switch (kparam_abis[t]) {
	case KABI_I32:
		return G->t_i32;
	case KABI_I64:
		return G->t_i64;
	case KABI_F64:
		return G->t_f64;
	case KABI_PTR:
		break;
	}
	return G->t_ptr;
}

static LLVMValueRef kernel_decl(Gen *G, KernelKind kind)
{
	if (G->kfn[kind])
		return G->kfn[kind];
	if (!kernel_functions[kind])
		ICE("kernel kind '%s' has no planrt function", kernel_names[kind]);
	LLVMTypeRef params[32];
	unsigned n = (unsigned)kernel_nparams[kind];
	if (n > 32)
		ICE("'%s' has more than 32 parameters", kernel_functions[kind]);
	for (unsigned i = 0; i < n; i++)
		params[i] = param_type(G, kernel_params[kind][i].type);
	G->kty[kind] = LLVMFunctionType(G->t_void, params, n, 0);
	G->kfn[kind] = declare(G, kernel_functions[kind], G->kty[kind]);
	return G->kfn[kind];
}

/* The value converted to the parameter type as C's argument conversions do. */
static LLVMValueRef coerce(Gen *G, LLVMValueRef v, LLVMTypeRef to)
{
	LLVMTypeRef from = LLVMTypeOf(v);
	if (from == to)
		return v;
	LLVMTypeKind fk = LLVMGetTypeKind(from), tk = LLVMGetTypeKind(to);
	bool fint = fk == LLVMIntegerTypeKind, tint = tk == LLVMIntegerTypeKind;
	bool ffp = fk == LLVMFloatTypeKind || fk == LLVMDoubleTypeKind;
	bool tfp = tk == LLVMFloatTypeKind || tk == LLVMDoubleTypeKind;
	if (fk == LLVMPointerTypeKind && tk == LLVMPointerTypeKind)
		return LLVMBuildBitCast(G->b, v, to, "");
	if (fint && tint)
		return LLVMGetIntTypeWidth(from) > LLVMGetIntTypeWidth(to) ? LLVMBuildTrunc(G->b, v, to, "")
									   : LLVMBuildSExt(G->b, v, to, "");
	if (fint && tfp)
		return LLVMBuildSIToFP(G->b, v, to, "");
	if (ffp && tfp)
		return fk == LLVMFloatTypeKind ? LLVMBuildFPExt(G->b, v, to, "") : LLVMBuildFPTrunc(G->b, v, to, "");
	if (ffp && tint)
		return LLVMBuildFPToSI(G->b, v, to, "");
	ICE("emit_llvm.c: cannot pass a value of LLVM type kind %d as kind %d", (int)fk, (int)tk);
}

/* ------------------------------------------------------------------ functions */

static void begin_function(Gen *G, LLVMValueRef fn)
{
	G->fn = fn;
	G->entry = LLVMAppendBasicBlockInContext(G->c, fn, "entry");
	G->body = LLVMAppendBasicBlockInContext(G->c, fn, "body");
	LLVMPositionBuilderAtEnd(G->ab, G->entry);
	LLVMPositionBuilderAtEnd(G->b, G->body);
}

static void end_function(Gen *G)
{
	LLVMBuildRetVoid(G->b);
	LLVMBuildBr(G->ab, G->body);
}

static LLVMValueRef alloca_array(Gen *G, LLVMTypeRef elem, int n)
{
	LLVMValueRef a = LLVMBuildAlloca(G->ab, LLVMArrayType(elem, (unsigned)n), "");
	LLVMSetAlignment(a, 8);
	return a;
}

static void store_element(Gen *G, LLVMValueRef array, LLVMTypeRef elem, int n, int i, LLVMValueRef v)
{
	LLVMValueRef idx[2] = {i64c(G, 0), i64c(G, i)};
	LLVMValueRef at = LLVMBuildInBoundsGEP2(G->b, LLVMArrayType(elem, (unsigned)n), array, idx, 2, "");
	LLVMBuildStore(G->b, v, at);
}

static LLVMValueRef bytes_at(Gen *G, LLVMValueRef base, LLVMValueRef offset)
{
	return LLVMBuildInBoundsGEP2(G->b, G->t_i8, base, &offset, 1, "");
}

/* A field of the phase's planrt_ctx_t, at its C offset. */
static LLVMValueRef ctx_load(Gen *G, size_t offset, LLVMTypeRef t, const char *name)
{
	LLVMValueRef at = bytes_at(G, G->ctx, i64c(G, (long long)offset));
	at = LLVMBuildBitCast(G->b, at, LLVMPointerType(t, 0), "");
	return LLVMBuildLoad2(G->b, t, at, name);
}

static LLVMValueRef mesh_coord(Gen *G, int axis)
{
	LLVMValueRef a = i32c(G, axis);
	return LLVMBuildSExt(G->b, call(G, G->mesh_coord, &a, 1), G->t_i64, "");
}

/* base + coord(axis) * stride (i64), as emit_c.c's coord_expr */
static LLVMValueRef coord(Gen *G, long long base, int axis, long long stride)
{
	if (axis < 0)
		return i64c(G, base);
	LLVMValueRef v = LLVMBuildMul(G->b, mesh_coord(G, axis), i64c(G, stride), "");
	return base ? LLVMBuildAdd(G->b, i64c(G, base), v, "") : v;
}

/* The global offset of buffer b's block on dim d, as emit_c.c's offset_expr. */
static LLVMValueRef block_offset(Gen *G, int b, int d)
{
	const Buffer *x = &G->p->buf[b];
	LLVMValueRef v = NULL;
	if (block_mirrored(G->low, x, d)) /* the first of two mirrored chunks: coord of 2 |axis| */
		return coord(G, 0, x->split_axis[d], x->ldims[d] / 2);
	if (d < x->rank && x->split_axis[d] >= 0)
		v = coord(G, 0, x->split_axis[d], x->ldims[d]);
	if (d < x->rank && x->split_outer[d] >= 0)
		v = LLVMBuildAdd(G->b, v, coord(G, 0, x->split_outer[d], x->ldims[d] * G->low->ps->axes[x->split_axis[d]].size), "");
	if (d == x->micro_dim) {
		LLVMValueRef micro = ctx_load(G, offsetof(planrt_ctx_t, micro), G->t_i32, "micro");
		LLVMValueRef rows = LLVMBuildMul(G->b, LLVMBuildSExt(G->b, micro, G->t_i64, ""), i64c(G, x->micro_rows), "");
		v = v ? LLVMBuildAdd(G->b, v, rows, "") : rows;
	}
	return v ? v : i64c(G, 0);
}

/* Where the second half of buffer b's block on dim d starts, as emit_c.c's second_half_expr. */
static LLVMValueRef second_half_offset(Gen *G, int b, int d)
{
	const Buffer *x = &G->p->buf[b];
	long long half = d < x->rank ? x->ldims[d] / 2 : 0;
	if (block_mirrored(G->low, x, d))
		return coord(G, (2 * G->low->ps->axes[x->split_axis[d]].size - 1) * half, x->split_axis[d], -half);
	return LLVMBuildAdd(G->b, block_offset(G, b, d), i64c(G, half), "");
}

/* A buffer's address (i8*): state through its global, views from their storage, transient
 * buffers at their offset in the arena, slot or inbox of the phase's context. */
static LLVMValueRef buf_addr(Gen *G, int b)
{
	const Buffer *x = &G->p->buf[b];
	const char *name = arena_printf(G->low->g->arena, "%s%s", G->prefix, x->name);
	switch (x->cls) {
	case BUF_STATE:
		return LLVMBuildLoad2(G->b, G->t_ptr, G->state[b], name);
	case BUF_VIEW: {
		LLVMValueRef base = buf_addr(G, x->view_of);
		LLVMValueRef elems =
			x->view_axis == VIEW_SLOT
				? LLVMBuildAdd(G->b, i64c(G, x->view_off),
					       LLVMBuildMul(G->b, ctx_load(G, offsetof(planrt_ctx_t, slot_index), G->t_i64, "slot_index"),
							    i64c(G, x->view_stride), ""),
					       "")
				: coord(G, x->view_off, x->view_axis, x->view_stride);
		int size = dtype_bytes(G->p->buf[buffer_root(G->p, b)].dtype);
		LLVMValueRef at = bytes_at(G, base, LLVMBuildMul(G->b, elems, i64c(G, size), ""));
		LLVMSetValueName2(at, name, strlen(name));
		return at;
	}
	case BUF_ARENA:
	case BUF_SLOT:
	case BUF_INBOX: {
		size_t field = x->cls == BUF_ARENA  ? offsetof(planrt_ctx_t, arena)
			       : x->cls == BUF_SLOT ? offsetof(planrt_ctx_t, slot)
						    : offsetof(planrt_ctx_t, inbox);
		LLVMValueRef at = bytes_at(G, ctx_load(G, field, G->t_ptr, ""), i64c(G, (long long)x->offset));
		LLVMSetValueName2(at, name, strlen(name));
		return at;
	}
	case BUF_NONE:
		break;
	}
	ICE("buffer '%s' is not on stage %d", x->name, G->p->stage);
}

static LLVMValueRef const_array_global(Gen *G, LLVMTypeRef elem, LLVMValueRef *vals, int n)
{
	LLVMValueRef init = LLVMConstArray(elem, vals, (unsigned)n);
	LLVMValueRef g = LLVMAddGlobal(G->m, LLVMTypeOf(init), "");
	LLVMSetInitializer(g, init);
	LLVMSetGlobalConstant(g, 1);
	LLVMSetLinkage(g, LLVMPrivateLinkage);
	LLVMSetUnnamedAddress(g, LLVMGlobalUnnamedAddr);
	LLVMSetAlignment(g, 8);
	return LLVMConstBitCast(g, G->t_ptr);
}

static planrt_dtype_t rt_dtype(DType t)
{
	switch (t) {
	case DT_BF16:
		return planrt_bf16;
	case DT_F16:
		return planrt_f16;
	case DT_I32:
		return planrt_i32;
	case DT_U8:
		return planrt_u8;
	case DT_F64:
		return planrt_f64;
	default:
		return planrt_f32;
	}
}

/* ------------------------------------------------------------------ layers as loops */

/* A run of identical layers (layer_runs.c) is built as one counted loop over the layer l, as the
 * C target prints it (issue 21): the first layer's kernels once, each value that may differ by
 * layer as what it is across the layers (layer_values.c): the first layer's where it is the same
 * in every layer (or one place under other names); base + l * step for a transient buffer of each
 * layer (saved activations in the slot); first + l * step for an integer (a key, a parameter
 * index); entry at + dir * l of the stage's state family, a global array of the layers' state
 * pointers; else a per-layer table (the layers' addresses computed before the loop, integers and
 * messages as constant arrays). The loop so makes the unrolled program's calls, in its order, with
 * its arguments. A fused loop of the body calls the first layer's loop function: layer_runs.c
 * found the layers' loops of the same dims, expressions and strides, over buffers of one dtype. */

/* A kernel's value slots that name buffers: argument arg (elem: in a list), or a fused loop's
 * output (SLOT_OUT) and its elem-th loaded buffer (SLOT_LOAD). */
enum { SLOT_OUT = -1, SLOT_LOAD = -2 };
static int loop_load(const Kernel *k, int i); /* (fused loops, below) */
static LLVMValueRef cstring(Gen *G, const char *s);

static int slot_buf(const Kernel *k, int arg, int elem)
{
	if (arg == SLOT_OUT)
		return k->out;
	if (arg == SLOT_LOAD)
		return loop_load(k, elem);
	const KArg *a = &k->args[arg];
	return a->kind == KA_BUFS ? a->bufs[elem] : a->buf;
}

/* Slot (arg, elem) of the body's kernel being built, in each layer of the run (v[t]), and what it
 * is across the layers. */
static LayerClass slot_class(Gen *G, int arg, int elem, LayerValue *v)
{
	int n = G->run->nlayers;
	for (int t = 0; t < n; t++) {
		const Kernel *k = &G->p->k[G->run_ks[t * G->run->body + G->run_j]];
		const KArg *a = arg >= 0 ? &k->args[arg] : NULL;
		if (a && (a->kind == KA_INT || a->kind == KA_PARAM))
			v[t] = (LayerValue){.buf = -1, .integer = true, .value = a->i};
		else if (a && a->kind == KA_STR)
			v[t] = (LayerValue){.buf = -1, .text = a->str ? a->str : ""};
		else
			v[t] = (LayerValue){.buf = slot_buf(k, arg, elem)};
	}
	return layer_value_class(G->p, v, n);
}

/* entry l of a per-layer table: an array of n elements of type t */
static LLVMValueRef table_entry(Gen *G, LLVMValueRef array, LLVMTypeRef t, int n)
{
	LLVMValueRef idx[] = {i64c(G, 0), G->l};
	return LLVMBuildLoad2(G->b, t, LLVMBuildInBoundsGEP2(G->b, LLVMArrayType(t, (unsigned)n), array, idx, 2, ""), "");
}

/* a constant per-layer table of n values of type t */
static LLVMValueRef const_table(Gen *G, LLVMTypeRef t, LLVMValueRef *vals, int n)
{
	LLVMValueRef g = LLVMAddGlobal(G->m, LLVMArrayType(t, (unsigned)n), "by_layer");
	LLVMSetInitializer(g, LLVMConstArray(t, vals, (unsigned)n));
	LLVMSetGlobalConstant(g, 1);
	LLVMSetLinkage(g, LLVMPrivateLinkage);
	LLVMSetUnnamedAddress(g, LLVMGlobalUnnamedAddr);
	return g;
}

/* the layers' buffers' addresses, computed before the loop into an array */
static LLVMValueRef address_table(Gen *G, const LayerValue *v, int n)
{
	LLVMBasicBlockRef at = LLVMGetInsertBlock(G->b);
	LLVMValueRef array = alloca_array(G, G->t_ptr, n);
	LLVMPositionBuilderAtEnd(G->b, G->before);
	for (int t = 0; t < n; t++)
		store_element(G, array, G->t_ptr, n, t, buf_addr(G, v[t].buf));
	LLVMPositionBuilderAtEnd(G->b, at);
	return array;
}

/* The address of buffer b, slot (arg, elem) of the kernel being built: in a run, the slot's buffer
 * of layer l. */
static LLVMValueRef slot_addr(Gen *G, int arg, int elem, int b)
{
	if (!G->run)
		return buf_addr(G, b);
	int n = G->run->nlayers, at, dir, f;
	LayerValue *v = arena_alloc(G->low->g->arena, sizeof *v * (size_t)n);
	int *bufs = arena_alloc(G->low->g->arena, sizeof *bufs * (size_t)n);
	LayerClass c = slot_class(G, arg, elem, v);
	for (int t = 0; t < n; t++)
		bufs[t] = v[t].buf;
	switch (c.kind) {
	case LV_SAME:
	case LV_INT_STEP: /* (not a buffer) */
		return buf_addr(G, b);
	case LV_PLACE: /* the first layer's place, and step bytes a layer */
	case LV_VIEW:
		return c.step ? bytes_at(G, buf_addr(G, b), LLVMBuildMul(G->b, G->l, i64c(G, c.step), "")) : buf_addr(G, b);
	case LV_STATE:
		if ((f = layer_family(&G->fams, bufs, n, G->run->step < 0, &at, &dir)) >= 0) {
			LLVMValueRef i = LLVMBuildAdd(G->b, i64c(G, at), LLVMBuildMul(G->b, G->l, i64c(G, dir), ""), "");
			LLVMValueRef idx[] = {i64c(G, 0), i};
			LLVMTypeRef t = LLVMArrayType(G->t_ptr, (unsigned)G->fams.size[f]);
			return LLVMBuildLoad2(G->b, G->t_ptr, LLVMBuildInBoundsGEP2(G->b, t, G->fam_array[f], idx, 2, ""), "");
		}
		break; /* members of other families: a table */
	case LV_TABLE:
		break;
	}
	return table_entry(G, address_table(G, v, n), G->t_ptr, n);
}

/* An integer argument (a key, a parameter index; i64) of the kernel being built: in a run, layer l's. */
static LLVMValueRef slot_int(Gen *G, int arg, long long value)
{
	if (!G->run)
		return i64c(G, value);
	int n = G->run->nlayers;
	LayerValue *v = arena_alloc(G->low->g->arena, sizeof *v * (size_t)n);
	LayerClass c = slot_class(G, arg, 0, v);
	if (c.kind == LV_SAME)
		return i64c(G, value);
	if (c.kind == LV_INT_STEP)
		return LLVMBuildAdd(G->b, i64c(G, value), LLVMBuildMul(G->b, G->l, i64c(G, c.step), ""), "");
	LLVMValueRef *vals = arena_alloc(G->low->g->arena, sizeof *vals * (size_t)n);
	for (int t = 0; t < n; t++)
		vals[t] = i64c(G, v[t].value);
	return table_entry(G, const_table(G, G->t_i64, vals, n), G->t_i64, n);
}

/* A message argument of the kernel being built: in a run, layer l's. */
static LLVMValueRef slot_str(Gen *G, int arg, const char *str)
{
	if (!G->run)
		return LLVMBuildGlobalStringPtr(G->b, str, "");
	int n = G->run->nlayers;
	LayerValue *v = arena_alloc(G->low->g->arena, sizeof *v * (size_t)n);
	if (slot_class(G, arg, 0, v).kind == LV_SAME)
		return LLVMBuildGlobalStringPtr(G->b, str, "");
	LLVMValueRef *vals = arena_alloc(G->low->g->arena, sizeof *vals * (size_t)n);
	for (int t = 0; t < n; t++)
		vals[t] = cstring(G, v[t].text);
	return table_entry(G, const_table(G, G->t_ptr, vals, n), G->t_ptr, n);
}

/* One argument, as emit_c.c's print_arg prints it. */
static LLVMValueRef arg_value(Gen *G, const Kernel *k, int index)
{
	const KArg *a = &k->args[index];
	switch (a->kind) {
	case KA_BUF:
		return slot_addr(G, index, 0, a->buf);
	case KA_NULL:
		return LLVMConstPointerNull(G->t_ptr);
	case KA_BUFS: {
		LLVMValueRef array = alloca_array(G, G->t_ptr, a->n);
		for (int i = 0; i < a->n; i++)
			store_element(G, array, G->t_ptr, a->n, i, slot_addr(G, index, i, a->bufs[i]));
		return array;
	}
	case KA_INT:
	case KA_PARAM:
		return slot_int(G, index, a->i);
	case KA_INTS: {
		LLVMTypeRef t = a->i32 ? G->t_i32 : G->t_i64;
		LLVMValueRef *v = arena_alloc(G->low->g->arena, sizeof *v * (size_t)(a->n ? a->n : 1));
		for (int i = 0; i < a->n; i++)
			v[i] = LLVMConstInt(t, (unsigned long long)a->ints[i], 1);
		return const_array_global(G, t, v, a->n);
	}
	case KA_F64:
		return LLVMConstReal(G->t_f64, a->f);
	case KA_DTYPE:
		return i32c(G, rt_dtype((DType)a->i));
	case KA_AXIS: {
		LLVMValueRef x = i32c(G, a->i);
		return call(G, G->axis_comm, &x, 1);
	}
	case KA_PAIR: {
		LLVMValueRef x = i32c(G, a->i);
		return call(G, G->pair, &x, 1);
	}
	case KA_REQ:
		return LLVMConstBitCast(G->handles[a->i], G->t_ptr);
	case KA_SLOTREQ:
		return bytes_at(G, ctx_load(G, offsetof(planrt_ctx_t, reqs), G->t_ptr, "reqs"),
				i64c(G, a->i * (long long)sizeof(planrt_request_t)));
	case KA_COORD:
		return coord(G, a->i, a->axis, a->stride);
	case KA_OFFSET: {
		if (a->dim >= 0)
			return (a->i ? second_half_offset : block_offset)(G, a->buf, a->dim);
		int rank = G->p->buf[a->buf].rank, n = rank ? 2 * rank : 1;
		LLVMValueRef array = alloca_array(G, G->t_i64, n);
		for (int d = 0; d < 2 * rank; d++)
			store_element(G, array, G->t_i64, n, d,
				      d < rank ? block_offset(G, a->buf, d) : second_half_offset(G, a->buf, d - rank));
		return array;
	}
	case KA_SCALAR: { /* (double)b[0] * f, b[0] of the C type of b's storage */
		DType t = G->p->buf[buffer_root(G->p, a->buf)].dtype;
		LLVMTypeRef et = t == DT_F64 ? G->t_f64 : t == DT_F32 ? G->t_f32 : t == DT_I32 ? G->t_i32
			       : t == DT_U8 ? G->t_i8 : G->t_i16;
		LLVMValueRef at = LLVMBuildBitCast(G->b, slot_addr(G, index, 0, a->buf), LLVMPointerType(et, 0), "");
		LLVMValueRef v = LLVMBuildLoad2(G->b, et, at, "");
		v = t == DT_F64 ? v : t == DT_F32 ? LLVMBuildFPExt(G->b, v, G->t_f64, "")
		    : t == DT_I32 ? LLVMBuildSIToFP(G->b, v, G->t_f64, "") : LLVMBuildUIToFP(G->b, v, G->t_f64, "");
		return LLVMBuildFMul(G->b, v, LLVMConstReal(G->t_f64, a->f), "");
	}
	case KA_CTX:
		return G->ctx;
	case KA_STEP:
		return ctx_load(G, offsetof(planrt_ctx_t, step), G->t_i64, "step");
	case KA_STEP_SEED:
		return ctx_load(G, offsetof(planrt_ctx_t, step_seed), G->t_i64, "step_seed");
	case KA_STR:
		return slot_str(G, index, a->str);
	}
	ICE("argument kind %d", (int)a->kind);
}

/* ------------------------------------------------------------------ element-wise arithmetic */

static LLVMValueRef cf(Gen *G, const char *literal) /* a C float literal, rounded once */
{
	return LLVMConstRealOfString(G->t_f32, literal);
}

static LLVMValueRef fmul(Gen *G, LLVMValueRef a, LLVMValueRef b)
{
	return LLVMBuildFMul(G->b, a, b, "");
}

static LLVMValueRef fneg(Gen *G, LLVMValueRef a)
{
	return LLVMBuildFNeg(G->b, a, "");
}

static LLVMValueRef fcmp(Gen *G, LLVMRealPredicate p, LLVMValueRef a, LLVMValueRef b)
{
	return LLVMBuildFCmp(G->b, p, a, b, "");
}

static LLVMValueRef sel(Gen *G, LLVMValueRef c, LLVMValueRef a, LLVMValueRef b)
{
	return LLVMBuildSelect(G->b, c, a, b, "");
}

/* v is x * y (neg: -(x * y)) and nothing uses it yet: a product the add or subtract about to
 * consume may absorb. */
static bool lone_product(LLVMValueRef v, LLVMValueRef *x, LLVMValueRef *y, bool *neg)
{
	if (!LLVMIsAInstruction(v) || LLVMGetFirstUse(v))
		return false;
	*neg = false;
	if (LLVMGetInstructionOpcode(v) == LLVMFNeg) {
		LLVMValueRef in = LLVMGetOperand(v, 0);
		LLVMUseRef use = LLVMGetFirstUse(in);
		if (!LLVMIsAInstruction(in) || !use || LLVMGetNextUse(use))
			return false;
		v = in;
		*neg = true;
	}
	if (LLVMGetInstructionOpcode(v) != LLVMFMul)
		return false;
	*x = LLVMGetOperand(v, 0);
	*y = LLVMGetOperand(v, 1);
	return true;
}

/* a + b, or a - b: a lone product operand is fused into the add as gcc's -ffp-contract=fast does
 * for the C back end, through llvm.fmuladd (one rounding where the target has FMA). Never two:
 * which of two products gcc fuses depends on the shape of its code (the first in statement order
 * of straight-line code, the later one when branches separate them), so the helpers add at most
 * one product and the fused expressions' sums of two products hold the right one apart
 * (emit_loop_sum_of_products: both back ends add 0 to it first). */
static LLVMValueRef fadd_sub(Gen *G, LLVMValueRef a, LLVMValueRef b, bool sub)
{
	LLVMValueRef x, y, x2, y2;
	bool neg, neg2;
	if (lone_product(a, &x, &y, &neg) && lone_product(b, &x2, &y2, &neg2))
		ICE("a fused loop adds two products: the C and LLVM back ends could fuse different ones");
	if (lone_product(a, &x, &y, &neg)) {
		LLVMValueRef args[3] = {neg ? fneg(G, x) : x, y, sub ? fneg(G, b) : b};
		return call(G, G->fmuladd, args, 3);
	}
	if (lone_product(b, &x, &y, &neg)) {
		LLVMValueRef args[3] = {neg != sub ? fneg(G, x) : x, y, a};
		return call(G, G->fmuladd, args, 3);
	}
	return sub ? LLVMBuildFSub(G->b, a, b, "") : LLVMBuildFAdd(G->b, a, b, "");
}

static LLVMValueRef fadd(Gen *G, LLVMValueRef a, LLVMValueRef b)
{
	return fadd_sub(G, a, b, false);
}

static LLVMValueRef fsub(Gen *G, LLVMValueRef a, LLVMValueRef b)
{
	return fadd_sub(G, a, b, true);
}

/* planrt_math.h's kexpf, operation for operation */
static LLVMValueRef kexpf(Gen *G, LLVMValueRef x)
{
	LLVMValueRef hi = cf(G, "88.7228317"), lo = cf(G, "-87.3365479");
	LLVMValueRef xc = sel(G, fcmp(G, LLVMRealOGT, x, hi), hi, sel(G, fcmp(G, LLVMRealOLT, x, lo), lo, x));
	LLVMValueRef k = fadd(G, fmul(G, xc, cf(G, "1.44269504089")), cf(G, "12582912.0"));
	k = fsub(G, k, cf(G, "12582912.0"));
	LLVMValueRef r = fsub(G, xc, fmul(G, k, cf(G, "0.693359375")));
	r = fsub(G, r, fmul(G, k, cf(G, "-2.12194440e-4")));
	LLVMValueRef p = cf(G, "1.9875691500e-4");
	static const char *const coef[] = {"1.3981999507e-3", "8.3334519073e-3", "4.1665795894e-2", "1.6666665459e-1",
					   "5.0000001201e-1"};
	for (int i = 0; i < 5; i++)
		p = fadd(G, fmul(G, p, r), cf(G, coef[i]));
	p = fadd(G, fadd(G, fmul(G, fmul(G, p, r), r), r), cf(G, "1.0"));
	LLVMValueRef ki = LLVMBuildFPToSI(G->b, k, G->t_i32, "");
	LLVMValueRef k1 = LLVMBuildAShr(G->b, ki, i32c(G, 1), ""), k2 = LLVMBuildSub(G->b, ki, k1, "");
	LLVMValueRef s1 = LLVMBuildShl(G->b, LLVMBuildAdd(G->b, k1, i32c(G, 127), ""), i32c(G, 23), "");
	LLVMValueRef s2 = LLVMBuildShl(G->b, LLVMBuildAdd(G->b, k2, i32c(G, 127), ""), i32c(G, 23), "");
	LLVMValueRef y = fmul(G, p, LLVMBuildBitCast(G->b, s1, G->t_f32, ""));
	y = fmul(G, y, LLVMBuildBitCast(G->b, s2, G->t_f32, ""));
	y = sel(G, fcmp(G, LLVMRealOGT, x, hi), cf(G, "inf"), y);
	y = sel(G, fcmp(G, LLVMRealOLT, x, lo), cf(G, "0.0"), y);
	return sel(G, fcmp(G, LLVMRealUNE, x, x), x, y);
}

/* planrt_math.h's kerff */
static LLVMValueRef kerff(Gen *G, LLVMValueRef x)
{
	LLVMValueRef ax = call(G, G->fabs, &x, 1);
	LLVMValueRef t = LLVMBuildFDiv(G->b, cf(G, "1.0"), fadd(G, cf(G, "1.0"), fmul(G, cf(G, "0.3275911"), ax)), "");
	LLVMValueRef p = cf(G, "1.061405429");
	p = fsub(G, fmul(G, p, t), cf(G, "1.453152027"));
	p = fadd(G, fmul(G, p, t), cf(G, "1.421413741"));
	p = fsub(G, fmul(G, p, t), cf(G, "0.284496736"));
	p = fadd(G, fmul(G, p, t), cf(G, "0.254829592"));
	LLVMValueRef pt = fmul(G, p, t);
	LLVMValueRef r = fsub(G, cf(G, "1.0"), fmul(G, pt, kexpf(G, fmul(G, fneg(G, ax), ax))));
	LLVMValueRef args[2] = {r, x};
	return call(G, G->copysign, args, 2);
}

/* tanhf: libm's on the CPU (the C back end calls it); on the GPU, where there is no libm,
 * Cephes' tanhf (within 2 ulp), branch-free */
static LLVMValueRef tanh_f32(Gen *G, LLVMValueRef x)
{
	if (!G->gpu)
		return call(G, G->tanhf, &x, 1);
	LLVMValueRef ax = call(G, G->fabs, &x, 1);
	LLVMValueRef e = kexpf(G, fmul(G, cf(G, "2.0"), ax));
	LLVMValueRef big = fsub(G, cf(G, "1.0"), LLVMBuildFDiv(G->b, cf(G, "2.0"), fadd(G, e, cf(G, "1.0")), ""));
	LLVMValueRef args[2] = {big, x};
	big = call(G, G->copysign, args, 2);
	LLVMValueRef z = fmul(G, x, x), p = cf(G, "-5.70498872745e-3");
	static const char *const coef[] = {"2.06390887954e-2", "-5.37397155531e-2", "1.33314422036e-1", "-3.33332819422e-1"};
	for (int i = 0; i < 4; i++)
		p = fadd(G, fmul(G, p, z), cf(G, coef[i]));
	LLVMValueRef small = fadd(G, fmul(G, fmul(G, p, z), x), x);
	return sel(G, fcmp(G, LLVMRealOGT, ax, cf(G, "0.625")), big, small);
}

/* the helpers emit_c.c prints at the top of prog.c */
static LLVMValueRef gelu_erf(Gen *G, LLVMValueRef x)
{
	LLVMValueRef h = fmul(G, cf(G, "0.5"), x);
	return fmul(G, h, fadd(G, cf(G, "1.0"), kerff(G, fmul(G, x, cf(G, "0.70710678118654752")))));
}

static LLVMValueRef gelu_erf_grad(Gen *G, LLVMValueRef x, LLVMValueRef dy)
{
	LLVMValueRef cdf = fadd(G, cf(G, "0.5"), fmul(G, cf(G, "0.5"), kerff(G, fmul(G, x, cf(G, "0.70710678118654752")))));
	LLVMValueRef pdf = fmul(G, cf(G, "0.39894228040143268"), kexpf(G, fmul(G, fmul(G, cf(G, "-0.5"), x), x)));
	return fmul(G, dy, fadd(G, cdf, fmul(G, x, pdf)));
}

/* 0.79788456080286536f * (x + 0.044715f * x * x * x) */
static LLVMValueRef gelu_tanh_arg(Gen *G, LLVMValueRef x)
{
	LLVMValueRef cube = fmul(G, fmul(G, fmul(G, cf(G, "0.044715"), x), x), x);
	return fmul(G, cf(G, "0.79788456080286536"), fadd(G, x, cube));
}

static LLVMValueRef gelu_tanh(Gen *G, LLVMValueRef x)
{
	LLVMValueRef h = fmul(G, cf(G, "0.5"), x);
	return fmul(G, h, fadd(G, cf(G, "1.0"), tanh_f32(G, gelu_tanh_arg(G, x))));
}

static LLVMValueRef gelu_tanh_grad(Gen *G, LLVMValueRef x, LLVMValueRef dy)
{
	LLVMValueRef t = tanh_f32(G, gelu_tanh_arg(G, x));
	LLVMValueRef c3 = fmul(G, cf(G, "3.0"), cf(G, "0.044715"));
	LLVMValueRef du = fmul(G, cf(G, "0.79788456080286536"), fadd(G, cf(G, "1.0"), fmul(G, fmul(G, c3, x), x)));
	LLVMValueRef a = fadd(G, cf(G, "0.5"), fmul(G, cf(G, "0.5"), t));
	LLVMValueRef b = fmul(G, fmul(G, fmul(G, cf(G, "0.5"), x), fsub(G, cf(G, "1.0"), fmul(G, t, t))), du);
	return fmul(G, dy, fadd(G, a, b));
}

static LLVMValueRef sigmoid_of(Gen *G, LLVMValueRef x) /* 1 + kexpf(-x) */
{
	return fadd(G, cf(G, "1.0"), kexpf(G, fneg(G, x)));
}

static LLVMValueRef silu(Gen *G, LLVMValueRef x)
{
	return LLVMBuildFDiv(G->b, x, sigmoid_of(G, x), "");
}

static LLVMValueRef silu_grad(Gen *G, LLVMValueRef x, LLVMValueRef dy)
{
	LLVMValueRef s = LLVMBuildFDiv(G->b, cf(G, "1.0"), sigmoid_of(G, x), "");
	return fmul(G, fmul(G, dy, s), fadd(G, cf(G, "1.0"), fmul(G, x, fsub(G, cf(G, "1.0"), s))));
}

/* bf16 storage: widen to f32; round to nearest even when stored (emit_c.c's bf and tobf) */
static LLVMValueRef bf_to_f32(Gen *G, LLVMValueRef h)
{
	LLVMValueRef u = LLVMBuildShl(G->b, LLVMBuildZExt(G->b, h, G->t_i32, ""), i32c(G, 16), "");
	return LLVMBuildBitCast(G->b, u, G->t_f32, "");
}

static LLVMValueRef f32_to_bf(Gen *G, LLVMValueRef f)
{
	LLVMValueRef u = LLVMBuildBitCast(G->b, f, G->t_i32, "");
	LLVMValueRef top = LLVMBuildLShr(G->b, u, i32c(G, 16), "");
	LLVMValueRef nan = LLVMBuildICmp(G->b, LLVMIntUGT, LLVMBuildAnd(G->b, u, i32c(G, 0x7fffffff), ""),
					 i32c(G, 0x7f800000), "");
	LLVMValueRef quiet = LLVMBuildOr(G->b, top, i32c(G, 0x40), "");
	LLVMValueRef odd = LLVMBuildAnd(G->b, top, i32c(G, 1), "");
	LLVMValueRef round = LLVMBuildLShr(G->b, LLVMBuildAdd(G->b, LLVMBuildAdd(G->b, u, i32c(G, 0x7fff), ""), odd, ""),
					   i32c(G, 16), "");
	return LLVMBuildTrunc(G->b, sel(G, nan, quiet, round), G->t_i16, "");
}

/* f16 storage: IEEE half widened exactly, rounded to nearest even when stored. On the host both
 * back ends call the runtime's conversions (emit_c.c's hf and tohf, planrt_cast's), so the bits
 * agree by construction; a GPU module converts with the hardware's, which round the same way. */
static LLVMValueRef hf_to_f32(Gen *G, LLVMValueRef h)
{
	LLVMTypeRef half = LLVMHalfTypeInContext(LLVMGetTypeContext(G->t_f32));
	if (G->gpu)
		return LLVMBuildFPExt(G->b, LLVMBuildBitCast(G->b, h, half, ""), G->t_f32, "");
	LLVMTypeRef params[] = {G->t_i16};
	LLVMValueRef fn = declare(G, "planrt_f16_to_f32", LLVMFunctionType(G->t_f32, params, 1, 0));
	return call(G, fn, &h, 1);
}

static LLVMValueRef f32_to_hf(Gen *G, LLVMValueRef f)
{
	LLVMTypeRef half = LLVMHalfTypeInContext(LLVMGetTypeContext(G->t_f32));
	if (G->gpu)
		return LLVMBuildBitCast(G->b, LLVMBuildFPTrunc(G->b, f, half, ""), G->t_i16, "");
	LLVMTypeRef params[] = {G->t_f32};
	LLVMValueRef fn = declare(G, "planrt_f32_to_f16", LLVMFunctionType(G->t_i16, params, 1, 0));
	return call(G, fn, &f, 1);
}

/* a stored element widened to f32 for arithmetic (bf16 and f16; other dtypes as they are) */
static LLVMValueRef widen(Gen *G, DType t, LLVMValueRef v)
{
	return t == DT_BF16 ? bf_to_f32(G, v) : t == DT_F16 ? hf_to_f32(G, v) : v;
}

/* ------------------------------------------------------------------ fused loops */

/* The loop nest of a K_LOOP: its dims with the size-1 ones dropped and neighbours merged where
 * every load walks them as one (the whole nest becomes one loop for contiguous operands). */
typedef struct Nest {
	int n;
	long long size[MAX_DIMS];
	int inner[MAX_DIMS];         /* the innermost original dim of merged dim e (its load strides) */
	long long out_stride[MAX_DIMS];
	LLVMValueRef idx[MAX_DIMS];
	int nbuf;                    /* the distinct buffers loaded, in order of first load */
	int bufs[64];
	LLVMValueRef ptr[64];        /* their typed pointers (the loop function's parameters) */
	LLVMValueRef out;
} Nest;

static bool strides_merge(const LExpr *x, int outer, int inner, long long inner_size)
{
	if (!x)
		return true;
	if (x->kind == LX_LOAD && x->stride[outer] != x->stride[inner] * inner_size)
		return false;
	return strides_merge(x->a, outer, inner, inner_size) && strides_merge(x->b, outer, inner, inner_size);
}

static void plan_nest(const Kernel *k, Nest *ns)
{
	long long out_stride = 1;
	ns->n = 0;
	int e = MAX_DIMS; /* filled from the back, innermost first */
	for (int d = k->rank - 1; d >= 0; d--) {
		if (k->dims[d] == 1)
			continue;
		if (e < MAX_DIMS && strides_merge(k->expr, d, ns->inner[e], ns->size[e])) {
			ns->size[e] *= k->dims[d];
		} else {
			e--;
			ns->size[e] = k->dims[d];
			ns->inner[e] = d;
			ns->out_stride[e] = out_stride;
		}
		out_stride *= k->dims[d];
	}
	ns->n = MAX_DIMS - e;
	memmove(ns->size, ns->size + e, sizeof ns->size[0] * (size_t)ns->n);
	memmove(ns->inner, ns->inner + e, sizeof ns->inner[0] * (size_t)ns->n);
	memmove(ns->out_stride, ns->out_stride + e, sizeof ns->out_stride[0] * (size_t)ns->n);
}

static int nest_buffer(Nest *ns, int buf)
{
	for (int i = 0; i < ns->nbuf; i++)
		if (ns->bufs[i] == buf)
			return i;
	if (ns->nbuf == 64)
		ICE("a fused loop reads more than 64 buffers");
	ns->bufs[ns->nbuf] = buf;
	return ns->nbuf++;
}

static void nest_loads(Nest *ns, const LExpr *x)
{
	for (; x; x = x->b) {
		if (x->kind == LX_LOAD)
			nest_buffer(ns, x->buf);
		nest_loads(ns, x->a);
	}
}

/* fused loop k's i-th loaded buffer, in order of first load */
static int loop_load(const Kernel *k, int i)
{
	Nest ns = {0};
	nest_loads(&ns, k->expr);
	if (i >= ns.nbuf)
		ICE("a fused loop loads %d buffers, not %d", ns.nbuf, i + 1);
	return ns.bufs[i];
}

/* the element type of a buffer's storage, as emit_c.c's ctype */
static LLVMTypeRef elem_type(Gen *G, const LProg *p, int b)
{
	switch (p->buf[buffer_root(p, b)].dtype) {
	case DT_I32:
		return G->t_i32;
	case DT_U8:
		return G->t_i8;
	case DT_F64:
		return G->t_f64;
	case DT_BF16:
	case DT_F16:
		return G->t_i16;
	default:
		return G->t_f32;
	}
}

/* sum over the nest's dims of index * stride */
static LLVMValueRef nest_offset(Gen *G, const Nest *ns, const long long *stride_of_dim, bool by_inner)
{
	LLVMValueRef off = NULL;
	for (int e = 0; e < ns->n; e++) {
		long long s = by_inner ? stride_of_dim[ns->inner[e]] : stride_of_dim[e];
		if (!s)
			continue;
		LLVMValueRef t = s == 1 ? ns->idx[e] : LLVMBuildNUWMul(G->b, ns->idx[e], i64c(G, s), "");
		off = off ? LLVMBuildNUWAdd(G->b, off, t, "") : t;
	}
	return off ? off : i64c(G, 0);
}

static LLVMValueRef as_f32(Gen *G, LLVMValueRef v)
{
	LLVMTypeRef t = LLVMTypeOf(v);
	if (t == G->t_f32)
		return v;
	if (t == G->t_i8 || t == G->t_i16) /* uint8_t / uint16_t values in C arithmetic */
		return LLVMBuildUIToFP(G->b, v, G->t_f32, "");
	ICE("a fused loop computes on a value the LLVM back end has no f32 conversion for");
}

static LLVMValueRef loop_expr(Gen *G, const Nest *ns, const LExpr *x)
{
	switch (x->kind) {
	case LX_LOAD: {
		int i = 0;
		while (ns->bufs[i] != x->buf)
			i++;
		LLVMTypeRef et = elem_type(G, G->p, x->buf);
		LLVMValueRef off = nest_offset(G, ns, x->stride, true);
		LLVMValueRef v = LLVMBuildLoad2(G->b, et, LLVMBuildInBoundsGEP2(G->b, et, ns->ptr[i], &off, 1, ""), "");
		return widen(G, G->p->buf[buffer_root(G->p, x->buf)].dtype, v);
	}
	case LX_CONST:
		return LLVMConstReal(G->t_f32, x->f);
	case LX_UNARY: {
		LLVMValueRef a = as_f32(G, loop_expr(G, ns, x->a));
		switch (x->op) {
		case OP_SCALE:
			return fmul(G, a, LLVMConstReal(G->t_f32, x->f));
		case OP_NEG:
			return fneg(G, a);
		case OP_GELU:
			return x->s && !strcmp(x->s, "tanh") ? gelu_tanh(G, a) : gelu_erf(G, a);
		case OP_RELU:
			return sel(G, fcmp(G, LLVMRealOGT, a, cf(G, "0.0")), a, cf(G, "0.0"));
		case OP_SILU:
			return silu(G, a);
		default:
			ICE("unary op %s in a loop", op_names[x->op]);
		}
	}
	case LX_BINARY: {
		LLVMValueRef a = loop_expr(G, ns, x->a);
		if (x->op == OP_DROPOUT_GRAD) { /* keep ? dy * scale : 0, keep a uint8_t */
			if (LLVMTypeOf(a) != G->t_i8)
				a = LLVMBuildFPToUI(G->b, as_f32(G, a), G->t_i8, "");
			LLVMValueRef keep = LLVMBuildICmp(G->b, LLVMIntNE, a, i8c(G, 0), "");
			LLVMValueRef dy = as_f32(G, loop_expr(G, ns, x->b));
			LLVMValueRef scaled = fmul(G, dy, LLVMConstReal(G->t_f32, 1.0 / (1.0 - x->f)));
			return sel(G, keep, scaled, cf(G, "0.0"));
		}
		a = as_f32(G, a);
		LLVMValueRef b = as_f32(G, loop_expr(G, ns, x->b));
		if (emit_loop_sum_of_products(x)) /* as emit_c.c prints it: a + (b + 0) */
			b = fadd(G, b, cf(G, "0.0"));
		switch (x->op) {
		case OP_ADD:
			return fadd(G, a, b);
		case OP_SUB:
			return fsub(G, a, b);
		case OP_MUL:
			return fmul(G, a, b);
		case OP_DIV:
			return LLVMBuildFDiv(G->b, a, b, "");
		case OP_GELU_GRAD:
			return x->s && !strcmp(x->s, "tanh") ? gelu_tanh_grad(G, a, b) : gelu_erf_grad(G, a, b);
		case OP_RELU_GRAD:
			return sel(G, fcmp(G, LLVMRealOGT, a, cf(G, "0.0")), b, cf(G, "0.0"));
		case OP_SILU_GRAD:
			return silu_grad(G, a, b);
		default:
			ICE("binary op %s in a loop", op_names[x->op]);
		}
	}
	}
	ICE("loop expression kind %d", (int)x->kind);
}

/* out (+)= expr at the nest's current indices */
static void loop_element(Gen *G, const Kernel *k, const Nest *ns)
{
	DType t = G->p->buf[buffer_root(G->p, k->out)].dtype;
	if (t != DT_F32 && t != DT_BF16 && t != DT_F16)
		ICE("a fused loop writes %s; the back ends write f32, bf16 and f16", dtype_name(t));
	LLVMTypeRef et = elem_type(G, G->p, k->out);
	LLVMValueRef off = nest_offset(G, ns, ns->out_stride, false);
	LLVMValueRef at = LLVMBuildInBoundsGEP2(G->b, et, ns->out, &off, 1, "");
	LLVMValueRef old = NULL;
	if (k->accumulate) {
		old = LLVMBuildLoad2(G->b, et, at, "");
		old = widen(G, t, old);
	}
	LLVMValueRef v = as_f32(G, loop_expr(G, ns, k->expr));
	if (old)
		v = fadd(G, old, v);
	LLVMBuildStore(G->b, t == DT_BF16 ? f32_to_bf(G, v) : t == DT_F16 ? f32_to_hf(G, v) : v, at);
}

/* The function of a fused loop: (out, then every buffer it loads), out noalias as the C
 * back end's restrict. Internal on the CPU (the phase function calls it; O3 inlines it), a
 * kernel on the GPU. */
static LLVMValueRef loop_function(Gen *G, const Kernel *k, Nest *ns, const char *name)
{
	memset(ns, 0, sizeof *ns);
	plan_nest(k, ns);
	nest_loads(ns, k->expr);
	LLVMTypeRef params[65];
	params[0] = LLVMPointerType(elem_type(G, G->p, k->out), 0);
	for (int i = 0; i < ns->nbuf; i++)
		params[i + 1] = LLVMPointerType(elem_type(G, G->p, ns->bufs[i]), 0);
	LLVMValueRef fn = LLVMAddFunction(G->m, name, LLVMFunctionType(G->t_void, params, (unsigned)ns->nbuf + 1, 0));
	add_attr(G, fn, LLVMAttributeFunctionIndex, "nounwind");
	add_attr(G, fn, 1, "noalias");
	if (!G->gpu)
		LLVMSetLinkage(fn, LLVMInternalLinkage);
	ns->out = LLVMGetParam(fn, 0);
	LLVMSetValueName2(ns->out, "out", 3);
	for (int i = 0; i < ns->nbuf; i++) {
		ns->ptr[i] = LLVMGetParam(fn, (unsigned)i + 1);
		const char *v = arena_printf(G->low->g->arena, "v%d", ns->bufs[i]);
		LLVMSetValueName2(ns->ptr[i], v, strlen(v));
	}
	return fn;
}

/* CPU: a counted loop per nest dim (do-while: every size is at least 2) */
static void cpu_loop(Gen *G, const Kernel *k, Nest *ns)
{
	LLVMBasicBlockRef head[MAX_DIMS];
	for (int e = 0; e < ns->n; e++) {
		LLVMBasicBlockRef from = LLVMGetInsertBlock(G->b);
		head[e] = LLVMAppendBasicBlockInContext(G->c, G->fn, "loop");
		LLVMBuildBr(G->b, head[e]);
		LLVMPositionBuilderAtEnd(G->b, head[e]);
		ns->idx[e] = LLVMBuildPhi(G->b, G->t_i64, "i");
		LLVMValueRef zero = i64c(G, 0);
		LLVMAddIncoming(ns->idx[e], &zero, &from, 1);
	}
	loop_element(G, k, ns);
	for (int e = ns->n - 1; e >= 0; e--) {
		LLVMValueRef next = LLVMBuildNUWAdd(G->b, ns->idx[e], i64c(G, 1), "");
		LLVMBasicBlockRef latch = LLVMGetInsertBlock(G->b);
		LLVMAddIncoming(ns->idx[e], &next, &latch, 1);
		LLVMBasicBlockRef after = LLVMAppendBasicBlockInContext(G->c, G->fn, "done");
		LLVMBuildCondBr(G->b, LLVMBuildICmp(G->b, LLVMIntULT, next, i64c(G, ns->size[e]), ""), head[e], after);
		LLVMPositionBuilderAtEnd(G->b, after);
	}
}

static LLVMValueRef sreg(Gen *G, const char *name)
{
	LLVMValueRef f = declare(G, name, LLVMFunctionType(G->t_i32, NULL, 0, 0));
	return LLVMBuildZExt(G->b, call(G, f, NULL, 0), G->t_i64, "");
}

/* GPU: a grid-stride loop over the output's elements, each thread's indices by division */
static void gpu_loop(Gen *G, const Kernel *k, Nest *ns, long long total)
{
	LLVMValueRef first = LLVMBuildAdd(G->b, LLVMBuildMul(G->b, sreg(G, "llvm.nvvm.read.ptx.sreg.ctaid.x"),
							       sreg(G, "llvm.nvvm.read.ptx.sreg.ntid.x"), ""),
					  sreg(G, "llvm.nvvm.read.ptx.sreg.tid.x"), "");
	LLVMValueRef step = LLVMBuildMul(G->b, sreg(G, "llvm.nvvm.read.ptx.sreg.ntid.x"),
					 sreg(G, "llvm.nvvm.read.ptx.sreg.nctaid.x"), "");
	LLVMBasicBlockRef from = LLVMGetInsertBlock(G->b);
	LLVMBasicBlockRef loop = LLVMAppendBasicBlockInContext(G->c, G->fn, "loop");
	LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(G->c, G->fn, "done");
	LLVMValueRef total_v = i64c(G, total);
	LLVMBuildCondBr(G->b, LLVMBuildICmp(G->b, LLVMIntULT, first, total_v, ""), loop, done);
	LLVMPositionBuilderAtEnd(G->b, loop);
	LLVMValueRef i = LLVMBuildPhi(G->b, G->t_i64, "i");
	LLVMAddIncoming(i, &first, &from, 1);
	LLVMValueRef rest = i;
	for (int e = ns->n - 1; e >= 0; e--) {
		if (e == 0) {
			ns->idx[e] = rest;
			break;
		}
		LLVMValueRef size = i64c(G, ns->size[e]);
		ns->idx[e] = LLVMBuildURem(G->b, rest, size, "");
		rest = LLVMBuildUDiv(G->b, rest, size, "");
	}
	loop_element(G, k, ns);
	LLVMValueRef next = LLVMBuildAdd(G->b, i, step, "");
	LLVMBasicBlockRef latch = LLVMGetInsertBlock(G->b);
	LLVMAddIncoming(i, &next, &latch, 1);
	LLVMBuildCondBr(G->b, LLVMBuildICmp(G->b, LLVMIntULT, next, total_v, ""), loop, done);
	LLVMPositionBuilderAtEnd(G->b, done);
}

static long long loop_elements(const Kernel *k)
{
	long long total = 1;
	for (int d = 0; d < k->rank; d++)
		total *= k->dims[d];
	return total;
}

/* Builds the function of fused loop k (name) with its whole loop in it. */
static LLVMValueRef build_loop(Gen *G, const Kernel *k, const char *name, Nest *ns)
{
	LLVMValueRef outer_fn = G->fn;
	LLVMBasicBlockRef outer_entry = G->entry, outer_body = G->body, outer_at = LLVMGetInsertBlock(G->b);
	LLVMValueRef fn = loop_function(G, k, ns, name);
	begin_function(G, fn);
	long long total = loop_elements(k);
	if (total > 0) {
		if (G->gpu)
			gpu_loop(G, k, ns, total);
		else
			cpu_loop(G, k, ns);
	}
	end_function(G);
	G->fn = outer_fn;
	G->entry = outer_entry;
	G->body = outer_body;
	LLVMPositionBuilderAtEnd(G->b, outer_at);
	LLVMPositionBuilderAtEnd(G->ab, outer_entry);
	return fn;
}

/* ------------------------------------------------------------------ kernels and phases */

/* Marks fn's code as the instruction set of level. */
static void set_level(Gen *G, LLVMValueRef fn, int level)
{
	const char *kv[][2] = {{"target-cpu", level_target[level].cpu}, {"target-features", level_target[level].features}};
	for (int i = 0; i < 2; i++)
		LLVMAddAttributeAtIndex(fn, LLVMAttributeFunctionIndex,
					LLVMCreateStringAttribute(G->c, kv[i][0], (unsigned)strlen(kv[i][0]), kv[i][1],
								  (unsigned)strlen(kv[i][1])));
}

/* A fused loop's functions: one, or (LOOPS_PER_LEVEL) one a level and their table loop<k>_at. */
typedef struct LoopFns {
	LLVMValueRef fns[PLANRT_CPU_LEVELS];
	LLVMValueRef at; /* the table, or NULL */
} LoopFns;

static void loop_key_expr(FILE *f, Gen *G, const Kernel *k, const LExpr *x, const Nest *ns)
{
	if (!x) {
		fputc('-', f);
		return;
	}
	fprintf(f, "(%d %d %a %s", (int)x->kind, (int)x->op, x->f, x->s ? x->s : "");
	if (x->kind == LX_LOAD) {
		int i = 0;
		while (ns->bufs[i] != x->buf)
			i++;
		fprintf(f, " v%d:%d", i, (int)G->p->buf[buffer_root(G->p, x->buf)].dtype);
		for (int d = 0; d < k->rank; d++)
			fprintf(f, ",%lld", x->stride[d]);
	}
	loop_key_expr(f, G, k, x->a, ns);
	loop_key_expr(f, G, k, x->b, ns);
	fputc(')', f);
}

/* What fused loop k's functions are built from (its dims, output, expression with each load as
 * its place among the loads, strides and element types): kernels of one key have the same loop
 * nest, so the module builds it once (every pipeline stage runs the same layers' loops). */
static const char *loop_key(Gen *G, const Kernel *k)
{
	Nest ns = {0};
	nest_loads(&ns, k->expr);
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	if (!f)
		ICE("out of memory");
	fprintf(f, "%d %d %d", k->rank, (int)k->accumulate, (int)G->p->buf[buffer_root(G->p, k->out)].dtype);
	for (int d = 0; d < k->rank; d++)
		fprintf(f, " %lld", k->dims[d]);
	for (int i = 0; i < ns.nbuf; i++)
		if (ns.bufs[i] == k->out)
			fprintf(f, " out=v%d", i);
	fputc(' ', f);
	loop_key_expr(f, G, k, k->expr, &ns);
	if (fclose(f) != 0)
		ICE("out of memory");
	const char *key = arena_strdup(G->low->g->arena, text);
	free(text);
	return key;
}

/* Fused loop k's functions (kernel index: their name), built for the target machine or one level,
 * or (LOOPS_PER_LEVEL) one a level with their table; once a loop nest (loop_key). */
static const LoopFns *loop_functions(Gen *G, const Kernel *k, int index)
{
	const char *key = loop_key(G, k);
	LoopFns *lf = symtab_get(G->loop_fns, key);
	if (lf)
		return lf;
	lf = arena_alloc(G->low->g->arena, sizeof *lf);
	Nest ns;
	const char *name = arena_printf(G->low->g->arena, "%sloop%d", G->prefix, index);
	int versions = G->loop_level == LOOPS_PER_LEVEL ? PLANRT_CPU_LEVELS : 1;
	for (int l = 0; l < versions; l++) {
		lf->fns[l] = build_loop(G, k, versions > 1 ? arena_printf(G->low->g->arena, "%s_l%d", name, l) : name, &ns);
		if (versions > 1 || G->loop_level >= 0)
			set_level(G, lf->fns[l], versions > 1 ? l : G->loop_level);
		if (versions == 1 && G->loop_level >= 0) /* (a phase for the machine would inline it) */
			add_attr(G, lf->fns[l], LLVMAttributeFunctionIndex, "noinline");
	}
	if (versions > 1) {
		LLVMTypeRef pty = LLVMPointerType(LLVMGlobalGetValueType(lf->fns[0]), 0);
		lf->at = LLVMAddGlobal(G->m, LLVMArrayType(pty, (unsigned)versions), arena_printf(G->low->g->arena, "%s_at", name));
		LLVMSetInitializer(lf->at, LLVMConstArray(pty, lf->fns, (unsigned)versions));
		LLVMSetGlobalConstant(lf->at, 1);
		LLVMSetLinkage(lf->at, LLVMInternalLinkage);
	}
	symtab_put(G->loop_fns, key, lf);
	return lf;
}

/* The call of fused loop k (kernel index): its function, or the running level's from the table
 * (indexed by planrt_cpu_level_, as emit_c.c's PLANRT_CPU_LOOP), with k's output and loads. */
static void build_loop_call(Gen *G, const Kernel *k, int index)
{
	const LoopFns *lf = loop_functions(G, k, index);
	Nest ns = {0};
	nest_loads(&ns, k->expr);
	LLVMValueRef fn = lf->fns[0];
	LLVMTypeRef fty = LLVMGlobalGetValueType(fn);
	if (lf->at) {
		LLVMTypeRef pty = LLVMPointerType(fty, 0), aty = LLVMGlobalGetValueType(lf->at);
		LLVMValueRef level = LLVMBuildZExt(G->b, LLVMBuildLoad2(G->b, G->t_i32, G->cpu_level, "level"), G->t_i64, "");
		LLVMValueRef idx[] = {i64c(G, 0), level};
		fn = LLVMBuildLoad2(G->b, pty, LLVMBuildInBoundsGEP2(G->b, aty, lf->at, idx, 2, ""), "");
	}
	LLVMValueRef args[65];
	args[0] = LLVMBuildBitCast(G->b, slot_addr(G, SLOT_OUT, 0, k->out), LLVMTypeOf(LLVMGetParam(lf->fns[0], 0)), "");
	for (int i = 0; i < ns.nbuf; i++)
		args[i + 1] = LLVMBuildBitCast(G->b, slot_addr(G, SLOT_LOAD, i, ns.bufs[i]),
					       LLVMTypeOf(LLVMGetParam(lf->fns[0], (unsigned)i + 1)), "");
	LLVMBuildCall2(G->b, fty, fn, args, (unsigned)ns.nbuf + 1, "");
}

static void build_kernel(Gen *G, const Kernel *k, int index)
{
	LLVMBasicBlockRef skip = NULL;
	if (k->only_last_micro) {
		int micro = G->low->ps->micro_batches > 0 ? G->low->ps->micro_batches : 1;
		LLVMValueRef m = ctx_load(G, offsetof(planrt_ctx_t, micro), G->t_i32, "micro");
		LLVMBasicBlockRef run = LLVMAppendBasicBlockInContext(G->c, G->fn, "last_micro");
		skip = LLVMAppendBasicBlockInContext(G->c, G->fn, "");
		LLVMBuildCondBr(G->b, LLVMBuildICmp(G->b, LLVMIntEQ, m, i32c(G, micro - 1), ""), run, skip);
		LLVMPositionBuilderAtEnd(G->b, run);
	}
	if (k->kind == K_LOOP) {
		build_loop_call(G, k, index);
	} else {
		if (!kernel_functions[k->kind])
			ICE("kernel kind '%s' has no planrt function (planc should have refused the plan)", kernel_names[k->kind]);
		LLVMValueRef fn = kernel_decl(G, k->kind);
		LLVMTypeRef ty = G->kty[k->kind];
		unsigned n = LLVMCountParamTypes(ty);
		if ((unsigned)k->nargs != n)
			ICE("kernel '%s' has %d arguments but %s takes %u", kernel_names[k->kind], k->nargs, kernel_functions[k->kind], n);
		LLVMTypeRef params[32];
		LLVMGetParamTypes(ty, params);
		LLVMValueRef args[32];
		for (int i = 0; i < k->nargs; i++)
			args[i] = coerce(G, arg_value(G, k, i), params[i]);
		LLVMBuildCall2(G->b, ty, fn, args, n, "");
	}
	if (skip) {
		LLVMBuildBr(G->b, skip);
		LLVMPositionBuilderAtEnd(G->b, skip);
	}
}

/* Whether buffers a and b have one block layout (a KA_OFFSET argument's offsets are the first
 * layer's buffer's in every layer) */
static bool same_layout(const Lowered *low, const Buffer *a, const Buffer *b)
{
	if (a->rank != b->rank || a->micro_dim != b->micro_dim || a->micro_rows != b->micro_rows)
		return false;
	for (int d = 0; d < a->rank; d++)
		if (a->split_axis[d] != b->split_axis[d] || a->split_outer[d] != b->split_outer[d] ||
		    a->ldims[d] != b->ldims[d] || block_mirrored(low, a, d) != block_mirrored(low, b, d))
			return false;
	return true;
}

/* Whether the builder can run run r as a loop (everything else layer_runs.c compared) */
static bool run_buildable(Gen *G, const LayerRun *r, const int *ks)
{
	const LProg *p = G->p;
	for (int t = 1; t < r->nlayers; t++)
		for (int j = 0; j < r->body; j++) {
			const Kernel *k0 = &p->k[ks[j]], *k = &p->k[ks[t * r->body + j]];
			for (int i = 0; i < k->nargs; i++)
				if (k->args[i].kind == KA_OFFSET &&
				    !same_layout(G->low, &p->buf[k0->args[i].buf], &p->buf[k->args[i].buf]))
					return false;
		}
	return true;
}

/* Kernel k's buffer slots (arg, elem), at most cap; their count. */
static int buffer_slots(const Kernel *k, int (*slots)[2], int cap)
{
	int n = 0;
	if (k->kind == K_LOOP) {
		Nest ns = {0};
		nest_loads(&ns, k->expr);
		slots[n][0] = SLOT_OUT, slots[n++][1] = 0;
		for (int i = 0; i < ns.nbuf && n < cap; i++)
			slots[n][0] = SLOT_LOAD, slots[n++][1] = i;
	}
	for (int i = 0; i < k->nargs; i++) {
		const KArg *a = &k->args[i];
		for (int e = 0; e < (a->kind == KA_BUFS ? a->n : 1) && n < cap; e++)
			if (a->kind == KA_BUFS || ((a->kind == KA_BUF || a->kind == KA_SCALAR) && a->buf >= 0))
				slots[n][0] = i, slots[n++][1] = e;
	}
	return n;
}

/* The stage's runs built as loops (run_at), and its state families: from the runs' state slots,
 * the longest runs first, so that a shorter run (a stage's forward without its first and last
 * layer) indexes into the family of every layer the stage holds. */
static void plan_layer_loops(Gen *G)
{
	const LProg *p = G->p;
	Arena *a = G->low->g->arena;
	G->runs = arena_alloc(a, sizeof(LayerRun) * (size_t)(p->nk + 1));
	G->run_at = arena_alloc(a, sizeof(int) * (size_t)(p->nk + 1));
	int nruns = layer_runs(p, G->runs, p->nk + 1), **ks = arena_alloc(a, sizeof(int *) * (size_t)(nruns + 1));
	for (int i = 0; i < p->nk; i++)
		G->run_at[i] = -1;
	int longest = 0;
	layer_families_init(&G->fams, p);
	for (int r = 0; r < nruns; r++) {
		longest = G->runs[r].nlayers > longest ? G->runs[r].nlayers : longest;
		ks[r] = layer_run_kernels(p, &G->runs[r], a);
		if (!run_buildable(G, &G->runs[r], ks[r]))
			continue;
		for (int i = 0; i < G->runs[r].nlayers * G->runs[r].body; i++)
			G->run_at[ks[r][i]] = i ? RUN_INSIDE : r;
	}
	for (int len = longest; len > 1; len--)
		for (int r = 0; r < nruns; r++) {
			if (G->runs[r].nlayers != len || G->run_at[ks[r][0]] != r)
				continue;
			G->run = &G->runs[r];
			G->run_ks = ks[r];
			LayerValue *v = arena_alloc(a, sizeof *v * (size_t)len);
			int *bufs = arena_alloc(a, sizeof *bufs * (size_t)len), slots[72][2], at, dir;
			for (G->run_j = 0; G->run_j < G->run->body; G->run_j++) {
				int ns = buffer_slots(&p->k[ks[r][G->run_j]], slots, 72);
				for (int i = 0; i < ns; i++) {
					if (slot_class(G, slots[i][0], slots[i][1], v).kind != LV_STATE)
						continue;
					for (int t = 0; t < len; t++)
						bufs[t] = v[t].buf;
					layer_family(&G->fams, bufs, len, G->run->step < 0, &at, &dir);
				}
			}
		}
	G->run = NULL;
	G->fams.fixed = true;
}

/* Run r (at its first kernel) as a loop over its layers: the first layer's kernels, what differs
 * by layer indexed by l. */
static void build_run(Gen *G, const LayerRun *r)
{
	G->run = r;
	G->run_ks = layer_run_kernels(G->p, r, G->low->g->arena);
	G->before = LLVMGetInsertBlock(G->b);
	LLVMBasicBlockRef head = LLVMAppendBasicBlockInContext(G->c, G->fn, "layers");
	LLVMBasicBlockRef after = LLVMAppendBasicBlockInContext(G->c, G->fn, "layers_done");
	LLVMPositionBuilderAtEnd(G->b, head);
	G->l = LLVMBuildPhi(G->b, G->t_i64, "l");
	for (G->run_j = 0; G->run_j < r->body; G->run_j++)
		build_kernel(G, &G->p->k[G->run_ks[G->run_j]], G->run_ks[G->run_j]);
	LLVMValueRef next = LLVMBuildNUWAdd(G->b, G->l, i64c(G, 1), ""), zero = i64c(G, 0);
	LLVMBasicBlockRef latch = LLVMGetInsertBlock(G->b);
	LLVMBuildCondBr(G->b, LLVMBuildICmp(G->b, LLVMIntULT, next, i64c(G, r->nlayers), ""), head, after);
	LLVMAddIncoming(G->l, &zero, &G->before, 1);
	LLVMAddIncoming(G->l, &next, &latch, 1);
	LLVMPositionBuilderAtEnd(G->b, G->before); /* (its per-layer tables are built) */
	LLVMBuildBr(G->b, head);
	LLVMPositionBuilderAtEnd(G->b, after);
	G->run = NULL;
}

static bool has_phase(const LProg *p, Phase ph, int chunk)
{
	for (int i = 0; i < p->nk; i++)
		if (p->k[i].phase == ph && p->k[i].chunk == chunk)
			return true;
	return false;
}

/* One phase function (emit_c.c's print_phase): every kernel of the phase (and chunk) in order. */
static LLVMValueRef build_phase(Gen *G, Phase ph, int chunk, bool per_chunk)
{
	const char *name = per_chunk ? arena_printf(G->low->g->arena, "%s%s_c%d", G->prefix, phase_names[ph], chunk)
				     : arena_printf(G->low->g->arena, "%s%s", G->prefix, phase_names[ph]);
	LLVMValueRef fn = LLVMAddFunction(G->m, name, G->t_phase);
	LLVMSetLinkage(fn, LLVMInternalLinkage);
	add_attr(G, fn, LLVMAttributeFunctionIndex, "nounwind");
	G->ctx = LLVMGetParam(fn, 0);
	LLVMSetValueName2(G->ctx, "ctx", 3);
	begin_function(G, fn);
	for (int i = 0; i < G->p->nk; i++) {
		if (G->p->k[i].phase != ph || (per_chunk && G->p->k[i].chunk != chunk) || G->run_at[i] == RUN_INSIDE)
			continue;
		if (G->run_at[i] >= 0)
			build_run(G, &G->runs[G->run_at[i]]);
		else
			build_kernel(G, &G->p->k[i], i);
	}
	end_function(G);
	return fn;
}

/* ------------------------------------------------------------------ tables and the descriptor */

typedef struct Field {
	LLVMTypeRef t;
	size_t offset;
} Field;

/* A named struct with planrt's layout: every field's offset and the size are checked against
 * the C definition's (offsetof, sizeof). */
static LLVMTypeRef c_struct(Gen *G, const char *name, const Field *f, int n, size_t size)
{
	LLVMTypeRef types[48];
	if (n > 48)
		ICE("%s has %d fields", name, n);
	for (int i = 0; i < n; i++)
		types[i] = f[i].t;
	LLVMTypeRef t = LLVMStructCreateNamed(G->c, name);
	LLVMStructSetBody(t, types, (unsigned)n, 0);
	for (int i = 0; i < n; i++)
		if (LLVMOffsetOfElement(G->td, t, (unsigned)i) != f[i].offset)
			ICE("%s field %d is at byte %llu in LLVM's layout but %zu in planrt's", name, i,
			    LLVMOffsetOfElement(G->td, t, (unsigned)i), f[i].offset);
	if (LLVMABISizeOfType(G->td, t) != size)
		ICE("%s is %llu bytes in LLVM's layout but %zu in planrt's", name, LLVMABISizeOfType(G->td, t), size);
	return t;
}

typedef struct Tables {
	LLVMTypeRef action, state, family, param, stage, program;
} Tables;

static void table_types(Gen *G, Tables *T)
{
	LLVMTypeRef p = G->t_ptr, i8 = G->t_i8, i16 = G->t_i16, i32 = G->t_i32, i64 = G->t_i64, f64 = G->t_f64;
	LLVMTypeRef dims = LLVMArrayType(i64, 8), axes = LLVMArrayType(i8, 8);
#define F(S, m, t) {t, offsetof(S, m)}
	Field action[] = {F(planrt_action_t, kind, i8), F(planrt_action_t, chunk, i8), F(planrt_action_t, slot, i16),
			  F(planrt_action_t, inbox, i16), F(planrt_action_t, micro, i32)};
	Field state[] = {F(planrt_state_buf_t, name, p), F(planrt_state_buf_t, kind, i8), F(planrt_state_buf_t, bytes, i64),
			 F(planrt_state_buf_t, ptr, p)};
	Field family[] = {F(planrt_state_family_t, name, p), F(planrt_state_family_t, kind, i8),
			  F(planrt_state_family_t, bytes, i64), F(planrt_state_family_t, ptrs, p),
			  F(planrt_state_family_t, count, i32), F(planrt_state_family_t, stride, i32),
			  F(planrt_state_family_t, offset, i64)};
	Field param[] = {F(planrt_param_t, name, p),        F(planrt_param_t, rank, i32),      F(planrt_param_t, gdims, dims),
			 F(planrt_param_t, ldims, dims),    F(planrt_param_t, split_axis, axes), F(planrt_param_t, init_kind, i8),
			 F(planrt_param_t, saved, i8),      F(planrt_param_t, a, f64),         F(planrt_param_t, b, f64)};
	Field stage[] = {F(planrt_stage_t, init, p),          F(planrt_stage_t, step_begin, p),
			 F(planrt_stage_t, step_end, p),      F(planrt_stage_t, save, p),
			 F(planrt_stage_t, nchunks, i32),     F(planrt_stage_t, forward, p),
			 F(planrt_stage_t, backward, p),      F(planrt_stage_t, prepare_forward, p),
			 F(planrt_stage_t, prepare_backward, p), F(planrt_stage_t, actions, p),
			 F(planrt_stage_t, nactions, i32),    F(planrt_stage_t, arena_bytes, i64),
			 F(planrt_stage_t, slot_offset, i64), F(planrt_stage_t, slot_bytes, i64),
			 F(planrt_stage_t, inbox_offset, i64), F(planrt_stage_t, inbox_bytes, i64),
			 F(planrt_stage_t, nslots, i32),      F(planrt_stage_t, ninbox, i32),
			 F(planrt_stage_t, nreqs, i32),       F(planrt_stage_t, state, p),
			 F(planrt_stage_t, nstate, i32),      F(planrt_stage_t, loss, p),
			 F(planrt_stage_t, grad_norm, p),     F(planrt_stage_t, loss_window, i32),
			 F(planrt_stage_t, versions, p),      F(planrt_stage_t, nversions, i32),
			 F(planrt_stage_t, checkpoint, p),    F(planrt_stage_t, resume, p),
			 F(planrt_stage_t, eval_begin, p),    F(planrt_stage_t, eval_end, p),
			 F(planrt_stage_t, eval_loss, p),     F(planrt_stage_t, eval_accuracy, p),
			 F(planrt_stage_t, families, p),      F(planrt_stage_t, nfamilies, i32),
			 F(planrt_stage_t, layers, p)};
	Field program[] = {F(planrt_program_t, plan, p),          F(planrt_program_t, model, p),
			   F(planrt_program_t, source, p),        F(planrt_program_t, world, i32),
			   F(planrt_program_t, naxes, i32),       F(planrt_program_t, pipe_axis, i32),
			   F(planrt_program_t, axis_sizes, p),    F(planrt_program_t, axis_names, p),
			   F(planrt_program_t, nstages, i32),     F(planrt_program_t, stages, p),
			   F(planrt_program_t, params, p),        F(planrt_program_t, nparams, i32),
			   F(planrt_program_t, micro_batches, i32), F(planrt_program_t, batch, i64),
			   F(planrt_program_t, seq, i64),         F(planrt_program_t, vocab, i64),
			   F(planrt_program_t, lr, f64),          F(planrt_program_t, min_lr, f64),
			   F(planrt_program_t, warmup, i64),      F(planrt_program_t, total_steps, i64),
			   F(planrt_program_t, nroles, i32),      F(planrt_program_t, role_axis, i32),
			   F(planrt_program_t, fingerprint, p),   F(planrt_program_t, sync, p),
			   F(planrt_program_t, loss_scale, f64), F(planrt_program_t, optimizer, p),
			   F(planrt_program_t, decode, p),        F(planrt_program_t, ring_axes, i32)};
#undef F
#define N(a) (int)(sizeof a / sizeof a[0])
	T->action = c_struct(G, "planrt_action_t", action, N(action), sizeof(planrt_action_t));
	T->state = c_struct(G, "planrt_state_buf_t", state, N(state), sizeof(planrt_state_buf_t));
	T->family = c_struct(G, "planrt_state_family_t", family, N(family), sizeof(planrt_state_family_t));
	T->param = c_struct(G, "planrt_param_t", param, N(param), sizeof(planrt_param_t));
	T->stage = c_struct(G, "planrt_stage_t", stage, N(stage), sizeof(planrt_stage_t));
	T->program = c_struct(G, "planrt_program_t", program, N(program), sizeof(planrt_program_t));
#undef N
}

static LLVMValueRef cstring(Gen *G, const char *s)
{
	LLVMValueRef init = LLVMConstStringInContext(G->c, s, (unsigned)strlen(s), 0);
	LLVMValueRef g = LLVMAddGlobal(G->m, LLVMTypeOf(init), ".str");
	LLVMSetInitializer(g, init);
	LLVMSetGlobalConstant(g, 1);
	LLVMSetLinkage(g, LLVMPrivateLinkage);
	LLVMSetUnnamedAddress(g, LLVMGlobalUnnamedAddr);
	return LLVMConstBitCast(g, G->t_ptr);
}

/* a private constant global (a table), as i8* */
static LLVMValueRef table(Gen *G, const char *name, LLVMTypeRef elem, LLVMValueRef *vals, int n)
{
	LLVMValueRef init = LLVMConstArray(elem, vals, (unsigned)n);
	LLVMValueRef g = LLVMAddGlobal(G->m, LLVMTypeOf(init), name);
	LLVMSetInitializer(g, init);
	LLVMSetGlobalConstant(g, 1);
	LLVMSetLinkage(g, LLVMInternalLinkage);
	return LLVMConstBitCast(g, G->t_ptr);
}

static LLVMValueRef fn_ptr(Gen *G, LLVMValueRef fn)
{
	return fn ? LLVMConstBitCast(fn, G->t_ptr) : LLVMConstPointerNull(G->t_ptr);
}

/* The stage's state families (plan_layer_loops): each a global array of its members' pointers,
 * which are its entries (G->state), and its entry of the stage's families table (returned):
 * planrt allocates each member as a state buffer of its own, as the unrolled program's. */
static LLVMValueRef *build_families(Gen *G, const Tables *T)
{
	const LProg *p = G->p;
	Arena *a = G->low->g->arena;
	LLVMValueRef *entries = arena_alloc(a, sizeof *entries * (size_t)(G->fams.n + 1));
	G->fam_array = arena_alloc(a, sizeof *G->fam_array * (size_t)(G->fams.n + 1));
	for (int f = 0; f < G->fams.n; f++) {
		const Buffer *x = &p->buf[G->fams.members[f][0]];
		const char *name = arena_printf(a, "%s_by_layer", x->name);
		LLVMTypeRef t = LLVMArrayType(G->t_ptr, (unsigned)G->fams.size[f]);
		LLVMValueRef g = LLVMAddGlobal(G->m, t, arena_printf(a, "%s%s", G->prefix, name));
		LLVMSetInitializer(g, LLVMConstNull(t));
		LLVMSetLinkage(g, LLVMInternalLinkage);
		G->fam_array[f] = g;
		for (int i = 0; i < G->fams.size[f]; i++) {
			LLVMValueRef idx[] = {i64c(G, 0), i64c(G, i)};
			G->state[G->fams.members[f][i]] = LLVMConstInBoundsGEP2(t, g, idx, 2);
		}
		LLVMValueRef fields[] = {cstring(G, name), i8c(G, x->state), i64c(G, (long long)x->bytes),
					 LLVMConstBitCast(g, G->t_ptr), i32c(G, G->fams.size[f]), i32c(G, 1), i64c(G, 0)};
		entries[f] = LLVMConstNamedStruct(T->family, fields, 7);
	}
	return entries;
}

/* A stage: its globals, phase functions and tables; returns its planrt_stage_t entry. */
static LLVMValueRef build_stage(Gen *G, const Tables *T)
{
	const LProg *p = G->p;
	Arena *a = G->low->g->arena;
	G->state = arena_alloc(a, sizeof *G->state * (size_t)(p->nbuf ? p->nbuf : 1));
	G->handles = arena_alloc(a, sizeof *G->handles * (size_t)(p->nhandles ? p->nhandles : 1));
	LLVMValueRef *state = arena_alloc(a, sizeof *state * (size_t)(p->nbuf ? p->nbuf : 1));
	int nstate = 0;
	plan_layer_loops(G);
	LLVMValueRef *families = build_families(G, T);
	for (int b = 0; b < p->nbuf; b++) {
		const Buffer *x = &p->buf[b];
		if (x->cls != BUF_STATE || G->fams.family_of[b] >= 0) /* (a family's member: its table's) */
			continue;
		LLVMValueRef g = LLVMAddGlobal(G->m, G->t_ptr, arena_printf(a, "%s%s", G->prefix, x->name));
		LLVMSetInitializer(g, LLVMConstPointerNull(G->t_ptr));
		LLVMSetLinkage(g, LLVMInternalLinkage);
		G->state[b] = g;
		LLVMValueRef f[] = {cstring(G, x->name), i8c(G, x->state), i64c(G, (long long)x->bytes),
				    LLVMConstBitCast(g, G->t_ptr)};
		state[nstate++] = LLVMConstNamedStruct(T->state, f, 4);
	}
	for (int h = 0; h < p->nhandles; h++) {
		size_t bytes = p->handles[h].type == HANDLE_BUCKET ? sizeof(planrt_bucket_t) : sizeof(planrt_request_t);
		LLVMTypeRef t = LLVMArrayType(G->t_i8, (unsigned)bytes);
		LLVMValueRef g = LLVMAddGlobal(G->m, t, arena_printf(a, "%s%s", G->prefix, p->handles[h].name));
		LLVMSetInitializer(g, LLVMConstNull(t));
		LLVMSetLinkage(g, LLVMInternalLinkage);
		LLVMSetAlignment(g, 8);
		G->handles[h] = g;
	}
	LLVMValueRef init = build_phase(G, PH_INIT, 0, false), begin = build_phase(G, PH_STEP_BEGIN, 0, false);
	LLVMValueRef *fns[4];
	static const Phase phases[] = {PH_FORWARD, PH_BACKWARD, PH_PREPARE_F, PH_PREPARE_B};
	for (int t = 0; t < 4; t++) {
		fns[t] = arena_alloc(a, sizeof *fns[t] * (size_t)p->nchunks);
		for (int c = 0; c < p->nchunks; c++)
			fns[t][c] = fn_ptr(G, t < 2 || has_phase(p, phases[t], c) ? build_phase(G, phases[t], c, true) : NULL);
	}
	LLVMValueRef step = build_phase(G, PH_STEP, 0, false), save = build_phase(G, PH_SAVE, 0, false);
	LLVMValueRef extra[PH_EVAL_END - PH_CHECKPOINT + 1]; /* checkpoint, resume, eval_begin, eval_end */
	for (Phase ph = PH_CHECKPOINT; ph <= PH_EVAL_END; ph++)
		extra[ph - PH_CHECKPOINT] = fn_ptr(G, has_phase(p, ph, 0) ? build_phase(G, ph, 0, false) : NULL);
	LLVMValueRef *acts = arena_alloc(a, sizeof *acts * (size_t)(p->nactions ? p->nactions : 1));
	for (int i = 0; i < p->nactions; i++) {
		const SlotAction *x = &p->actions[i];
		LLVMValueRef f[] = {i8c(G, x->kind == ACT_FORWARD ? PLANRT_FORWARD : PLANRT_BACKWARD), i8c(G, x->chunk),
				    LLVMConstInt(G->t_i16, (unsigned long long)x->slot, 0),
				    LLVMConstInt(G->t_i16, x->inbox >= 0 ? (unsigned long long)x->inbox : 0xffff, 0),
				    LLVMConstInt(G->t_i32, (unsigned long long)x->micro, 0)};
		acts[i] = LLVMConstNamedStruct(T->action, f, 5);
	}
	static const char *const names[] = {"forward", "backward", "prepare_forward", "prepare_backward"};
	LLVMValueRef tabs[4];
	for (int t = 0; t < 4; t++)
		tabs[t] = table(G, arena_printf(a, "%s%s", G->prefix, names[t]), G->t_ptr, fns[t], p->nchunks);
	int loss = p->loss_history >= 0 ? p->loss_history : p->loss_metric; /* (sync strategies: state.c) */
	if (!G->state[loss] || !G->state[p->norm_metric] || (p->versions_metric >= 0 && !G->state[p->versions_metric]))
		ICE("stage %d's metrics are not persistent state", p->stage);
	LLVMValueRef f[] = {fn_ptr(G, init),
			    fn_ptr(G, begin),
			    fn_ptr(G, step),
			    fn_ptr(G, save),
			    i32c(G, p->nchunks),
			    tabs[0],
			    tabs[1],
			    tabs[2],
			    tabs[3],
			    table(G, arena_printf(a, "%sactions", G->prefix), T->action, acts, p->nactions),
			    i32c(G, p->nactions),
			    i64c(G, (long long)p->arena_bytes),
			    i64c(G, (long long)p->slot_offset),
			    i64c(G, (long long)p->slot_bytes),
			    i64c(G, (long long)p->inbox_offset),
			    i64c(G, (long long)p->inbox_bytes),
			    i32c(G, p->nslots),
			    i32c(G, p->ninbox),
			    i32c(G, p->nslotreqs),
			    table(G, arena_printf(a, "%sstate", G->prefix), T->state, state, nstate),
			    i32c(G, nstate),
			    LLVMConstBitCast(G->state[loss], G->t_ptr),
			    LLVMConstBitCast(G->state[p->norm_metric], G->t_ptr),
			    i32c(G, p->loss_window),
			    p->versions_metric >= 0 ? LLVMConstBitCast(G->state[p->versions_metric], G->t_ptr)
						    : LLVMConstPointerNull(G->t_ptr),
			    i32c(G, p->versions_metric >= 0 ? (int)p->buf[p->versions_metric].elems : 0),
			    extra[0],
			    extra[1],
			    extra[2],
			    extra[3],
			    LLVMConstBitCast(G->state[p->loss_metric], G->t_ptr),
			    p->accuracy_metric >= 0 ? LLVMConstBitCast(G->state[p->accuracy_metric], G->t_ptr)
						    : LLVMConstPointerNull(G->t_ptr),
			    table(G, arena_printf(a, "%sfamilies", G->prefix), T->family, families, G->fams.n),
			    i32c(G, G->fams.n),
			    LLVMConstPointerNull(G->t_ptr)}; /* layers: the families' ptrs are packed arrays */
	layer_families_free(&G->fams);
	return LLVMConstNamedStruct(T->stage, f, sizeof f / sizeof f[0]);
}

static void set_prefix(Gen *G, const LProg *p)
{
	G->p = p;
	if (G->low->nroles > 1) /* async roles (as emit_c.c names them) */
		G->prefix = arena_printf(G->low->g->arena, "s%d_%s_", p->stage, p->role == RANKROLE_MASTER ? "master" : "worker");
	else
		G->prefix = G->low->nprogs > 1 ? arena_printf(G->low->g->arena, "s%d_", p->stage) : "";
}

/* The whole program: every stage, the parameter and stage tables, the descriptor and main. */
static void build_program(Gen *G, const char *source_path)
{
	const Lowered *low = G->low;
	const PlanSpec *ps = low->ps;
	Arena *a = low->g->arena;
	Tables T;
	table_types(G, &T);
	LLVMValueRef *stages = arena_alloc(a, sizeof *stages * (size_t)low->nprogs);
	for (int i = 0; i < low->nprogs; i++) {
		set_prefix(G, low->progs[i]);
		stages[i] = build_stage(G, &T);
	}
	LLVMValueRef *params = arena_alloc(a, sizeof *params * (size_t)(low->nparams ? low->nparams : 1));
	for (int i = 0; i < low->nparams; i++) {
		const ParamEntry *pe = &low->params[i];
		LLVMValueRef g[8], l[8], s[8];
		for (int d = 0; d < 8; d++) {
			g[d] = i64c(G, d < pe->rank ? pe->gdims[d] : 0);
			l[d] = i64c(G, d < pe->rank ? pe->ldims[d] : 0);
			s[d] = i8c(G, d < pe->rank ? pe->split_axis[d] : 0);
		}
		LLVMValueRef f[] = {cstring(G, pe->name), i32c(G, pe->rank), LLVMConstArray(G->t_i64, g, 8),
				    LLVMConstArray(G->t_i64, l, 8), LLVMConstArray(G->t_i8, s, 8), i8c(G, pe->init_kind),
				    i8c(G, pe->saved), LLVMConstReal(G->t_f64, pe->init_a), LLVMConstReal(G->t_f64, pe->init_b)};
		params[i] = LLVMConstNamedStruct(T.param, f, 9);
	}
	LLVMValueRef sizes[64], names[64];
	for (int x = 0; x < ps->naxes; x++) {
		sizes[x] = i32c(G, ps->axes[x].size);
		names[x] = cstring(G, ps->axes[x].name);
	}
	ProgramDesc d = program_desc(low, source_path);
	LLVMValueRef f[] = {cstring(G, d.plan),
			    cstring(G, d.model),
			    cstring(G, d.source),
			    i32c(G, d.world),
			    i32c(G, d.naxes),
			    i32c(G, d.pipe_axis),
			    table(G, "axis_sizes", G->t_i32, sizes, ps->naxes),
			    table(G, "axis_names", G->t_ptr, names, ps->naxes),
			    i32c(G, d.nstages),
			    table(G, "stages", T.stage, stages, low->nprogs),
			    table(G, "params", T.param, params, low->nparams),
			    i32c(G, d.nparams),
			    i32c(G, d.micro_batches),
			    i64c(G, d.batch),
			    i64c(G, d.seq),
			    i64c(G, d.vocab),
			    LLVMConstReal(G->t_f64, d.lr),
			    LLVMConstReal(G->t_f64, d.min_lr),
			    i64c(G, d.warmup),
			    i64c(G, d.total_steps),
			    i32c(G, d.nroles),
			    i32c(G, d.role_axis),
			    cstring(G, d.fingerprint),
			    cstring(G, d.sync),
			    LLVMConstReal(G->t_f64, d.loss_scale),
			    cstring(G, d.optimizer),
			    LLVMConstNull(G->t_ptr), /* no decode program: --generate is the C back end's */
			    i32c(G, (int)d.ring_axes)};
	LLVMValueRef program = LLVMAddGlobal(G->m, T.program, "program");
	LLVMSetInitializer(program, LLVMConstNamedStruct(T.program, f, sizeof f / sizeof f[0]));
	LLVMSetGlobalConstant(program, 1);
	LLVMSetLinkage(program, LLVMInternalLinkage);
	/* int main(int argc, char **argv) { return planrt_main(argc, argv, &program); } */
	LLVMTypeRef argv_t = LLVMPointerType(G->t_ptr, 0);
	LLVMTypeRef main_params[] = {G->t_i32, argv_t}, rt_params[] = {G->t_i32, argv_t, G->t_ptr};
	LLVMValueRef rt_main = declare(G, "planrt_main", LLVMFunctionType(G->t_i32, rt_params, 3, 0));
	LLVMValueRef main_fn = LLVMAddFunction(G->m, "main", LLVMFunctionType(G->t_i32, main_params, 2, 0));
	add_attr(G, main_fn, LLVMAttributeFunctionIndex, "nounwind");
	LLVMPositionBuilderAtEnd(G->b, LLVMAppendBasicBlockInContext(G->c, main_fn, "entry"));
	LLVMValueRef args[] = {LLVMGetParam(main_fn, 0), LLVMGetParam(main_fn, 1), LLVMConstBitCast(program, G->t_ptr)};
	LLVMBuildRet(G->b, call(G, rt_main, args, 3));
}

/* The GPU module: every fused loop of every stage as a kernel (grid-stride over its elements). */
static void build_kernels(Gen *G)
{
	for (int i = 0; i < G->low->nprogs; i++) {
		set_prefix(G, G->low->progs[i]);
		for (int k = 0; k < G->p->nk; k++) {
			const Kernel *kk = &G->p->k[k];
			if (kk->kind != K_LOOP)
				continue;
			Nest ns;
			LLVMValueRef fn = build_loop(G, kk, arena_printf(G->low->g->arena, "%sloop%d", G->prefix, k), &ns);
			LLVMValueRef md[] = {fn, LLVMMDStringInContext(G->c, "kernel", 6), i32c(G, 1)};
			LLVMAddNamedMetadataOperand(G->m, "nvvm.annotations", LLVMMDNodeInContext(G->c, md, 3));
		}
	}
}

/* ------------------------------------------------------------------ modules */

static void gen_init(Gen *G, const Lowered *low, LLVMContextRef c, LLVMTargetMachineRef tm, bool gpu, int loop_level)
{
	memset(G, 0, sizeof *G);
	G->c = c;
	G->low = low;
	G->gpu = gpu;
	G->loop_level = loop_level;
	G->m = LLVMModuleCreateWithNameInContext(gpu ? "kernels" : "prog", c);
	G->loop_fns = symtab_new(low->g->arena);
	char *triple = LLVMGetTargetMachineTriple(tm);
	LLVMSetTarget(G->m, triple);
	LLVMDisposeMessage(triple);
	G->td = LLVMCreateTargetDataLayout(tm);
	LLVMSetModuleDataLayout(G->m, G->td);
	G->b = LLVMCreateBuilderInContext(c);
	G->ab = LLVMCreateBuilderInContext(c);
	G->t_void = LLVMVoidTypeInContext(c);
	G->t_i8 = LLVMInt8TypeInContext(c);
	G->t_i16 = LLVMInt16TypeInContext(c);
	G->t_i32 = LLVMInt32TypeInContext(c);
	G->t_i64 = LLVMInt64TypeInContext(c);
	G->t_f32 = LLVMFloatTypeInContext(c);
	G->t_f64 = LLVMDoubleTypeInContext(c);
	G->t_ptr = LLVMPointerType(G->t_i8, 0);
	G->t_phase = LLVMFunctionType(G->t_void, &G->t_ptr, 1, 0);
	LLVMTypeRef f3[] = {G->t_f32, G->t_f32, G->t_f32};
	G->fmuladd = declare(G, "llvm.fmuladd.f32", LLVMFunctionType(G->t_f32, f3, 3, 0));
	G->fabs = declare(G, "llvm.fabs.f32", LLVMFunctionType(G->t_f32, f3, 1, 0));
	G->copysign = declare(G, "llvm.copysign.f32", LLVMFunctionType(G->t_f32, f3, 2, 0));
	if (gpu)
		return;
	G->tanhf = declare(G, "tanhf", LLVMFunctionType(G->t_f32, f3, 1, 0));
	LLVMTypeRef i32 = G->t_i32;
	G->mesh_coord = declare(G, "planrt_mesh_coord", LLVMFunctionType(G->t_i32, &i32, 1, 0));
	G->axis_comm = declare(G, "planrt_axis_comm", LLVMFunctionType(G->t_ptr, &i32, 1, 0));
	G->pair = declare(G, "planrt_pair", LLVMFunctionType(G->t_ptr, &i32, 1, 0));
	G->cpu_level = LLVMAddGlobal(G->m, G->t_i32, "planrt_cpu_level_");
}

static void gen_done(Gen *G)
{
	LLVMDisposeBuilder(G->b);
	LLVMDisposeBuilder(G->ab);
	LLVMDisposeTargetData(G->td);
}

/* The module; the fused loops per loop_level (LOOPS_PER_LEVEL, LOOPS_FOR_MACHINE or a level). */
static LLVMModuleRef build_module(const Lowered *low, LLVMContextRef c, LLVMTargetMachineRef tm, bool gpu,
				  const char *source_path, int loop_level)
{
	Gen G;
	gen_init(&G, low, c, tm, gpu, gpu ? LOOPS_FOR_MACHINE : loop_level);
	if (gpu)
		build_kernels(&G);
	else
		build_program(&G, source_path);
	gen_done(&G);
	return G.m;
}

LLVMModuleRef llvm_build_module(const Lowered *low, LLVMContextRef c, LLVMTargetMachineRef tm, bool gpu,
				const char *source_path)
{
	return build_module(low, c, tm, gpu, source_path, LOOPS_PER_LEVEL);
}

static void report_llvm(const char *what, char *msg)
{
	const char *text = msg ? msg : "no detail";
	const char *nl = strchr(text, '\n');
	fprintf(stderr, "planc: error: %s: %.*s\n", what, nl ? (int)(nl - text) : (int)strlen(text), text);
	for (int lines = 0; nl && nl[1] && lines < 8; lines++) {
		const char *next = strchr(nl + 1, '\n');
		fprintf(stderr, "note: %.*s\n", next ? (int)(next - nl - 1) : (int)strlen(nl + 1), nl + 1);
		nl = next;
	}
}

static bool report_error(const char *what, LLVMErrorRef e)
{
	if (!e)
		return true;
	char *msg = LLVMGetErrorMessage(e);
	report_llvm(what, msg);
	LLVMDisposeErrorMessage(msg);
	return false;
}

bool llvm_verify(LLVMModuleRef m, const char *what)
{
	char *msg = NULL;
	bool broken = LLVMVerifyModule(m, LLVMReturnStatusAction, &msg);
	if (broken) {
		char head[256];
		snprintf(head, sizeof head, "%s is invalid", what);
		report_llvm(head, msg);
		diag_note_plain("this is a bug in planc's LLVM back end; 'planc build' without --backend llvm runs the plan");
	}
	LLVMDisposeMessage(msg);
	return !broken;
}

/* default<O3> with the module's target machine: vectorises for it */
static bool optimise(LLVMModuleRef m, LLVMTargetMachineRef tm)
{
	LLVMPassBuilderOptionsRef o = LLVMCreatePassBuilderOptions();
	LLVMPassBuilderOptionsSetLoopVectorization(o, 1);
	LLVMPassBuilderOptionsSetSLPVectorization(o, 1);
	LLVMPassBuilderOptionsSetLoopInterleaving(o, 1);
	LLVMPassBuilderOptionsSetLoopUnrolling(o, 1);
	LLVMErrorRef e = LLVMRunPasses(m, "default<O3>", tm, o);
	LLVMDisposePassBuilderOptions(o);
	return report_error("LLVM's optimiser failed", e);
}

/* A target machine for triple, or NULL after a diagnostic. triple NULL: this machine's, for its
 * CPU and features when cpu is NULL, else for cpu ("generic": the triple's baseline). */
static LLVMTargetMachineRef target_machine(const char *triple, const char *cpu, const char *features,
					   LLVMRelocMode reloc, LLVMCodeModel model)
{
	char *host_triple = NULL, *host_cpu = NULL, *host_features = NULL;
	if (!triple) {
		if (LLVMInitializeNativeTarget() || LLVMInitializeNativeAsmPrinter()) {
			fprintf(stderr, "planc: error: this LLVM was built without a target for this machine\n");
			return NULL;
		}
		triple = host_triple = LLVMGetDefaultTargetTriple();
		if (!cpu) {
			cpu = host_cpu = LLVMGetHostCPUName();
			features = host_features = LLVMGetHostCPUFeatures();
		}
	} else {
		LLVMInitializeAllTargetInfos();
		LLVMInitializeAllTargets();
		LLVMInitializeAllTargetMCs();
		LLVMInitializeAllAsmPrinters();
	}
	LLVMTargetRef t;
	char *err = NULL;
	LLVMTargetMachineRef tm = NULL;
	if (LLVMGetTargetFromTriple(triple, &t, &err)) {
		fprintf(stderr, "planc: error: LLVM has no target for '%s': %s\n", triple, err ? err : "unknown");
		diag_note_plain("planc needs an LLVM 14 built with this target (Debian's llvm-14 has X86 and NVPTX)");
	} else {
		tm = LLVMCreateTargetMachine(t, triple, cpu, features, LLVMCodeGenLevelAggressive, reloc, model);
		if (!tm)
			fprintf(stderr, "planc: error: LLVM cannot make a target machine for '%s' (%s)\n", triple, cpu);
	}
	LLVMDisposeMessage(err);
	LLVMDisposeMessage(host_triple);
	LLVMDisposeMessage(host_cpu);
	LLVMDisposeMessage(host_features);
	return tm;
}

static bool make_dir(const char *dir)
{
	if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
		fprintf(stderr, "planc: error: cannot create directory '%s': %s\n", dir, strerror(errno));
		return false;
	}
	return true;
}

/* Verifies the module as built; optimised when opt (and verified again when verify_after). */
static bool prepare(LLVMModuleRef m, LLVMTargetMachineRef tm, bool opt, bool verify_after)
{
	return llvm_verify(m, "the generated LLVM module") &&
	       (!opt || (optimise(m, tm) && (!verify_after || llvm_verify(m, "the optimised LLVM module"))));
}

typedef enum { OUT_IR, OUT_OBJECT, OUT_PTX } Output;

/* Builds the module for tm (OUT_PTX: the NVPTX kernels; the CPU's fused loops per loop_level),
 * prepares it (OUT_IR: not optimised) and writes it to path, also to dump when not NULL; disposes
 * of tm. */
static bool write_module(const Lowered *low, LLVMTargetMachineRef tm, Output out, const char *path,
			 const char *source_path, bool verify_after, FILE *dump, int loop_level)
{
	if (!tm)
		return false;
	LLVMContextRef c = LLVMContextCreate();
	LLVMModuleRef m = build_module(low, c, tm, out == OUT_PTX, source_path, loop_level);
	bool ok = prepare(m, tm, out != OUT_IR, verify_after);
	char *err = NULL;
	if (ok && (out == OUT_IR ? LLVMPrintModuleToFile(m, path, &err)
				 : LLVMTargetMachineEmitToFile(tm, m, (char *)path,
							       out == OUT_PTX ? LLVMAssemblyFile : LLVMObjectFile, &err))) {
		fprintf(stderr, "planc: error: LLVM cannot write '%s': %s\n", path, err ? err : "unknown");
		ok = false;
	}
	LLVMDisposeMessage(err);
	LLVMDisposeModule(m);
	LLVMContextDispose(c);
	LLVMDisposeTargetMachine(tm);
	FILE *f = ok && dump ? fopen(path, "r") : NULL;
	if (f) {
		char buf[65536];
		size_t n;
		fprintf(dump, "%s %s after emit (%s)\n", out == OUT_PTX ? "//" : ";", out == OUT_PTX ? "PTX" : "LLVM IR", path);
		while ((n = fread(buf, 1, sizeof buf, f)) > 0)
			fwrite(buf, 1, n, dump);
		fclose(f);
	}
	return ok;
}

/* This machine's triple: for its own CPU when native (vectorised for its widest units, as gcc
 * -march=native), else for the triple's baseline, as the C path compiles without --native. */
static LLVMTargetMachineRef host_machine(LLVMRelocMode reloc, LLVMCodeModel model, bool native)
{
	return native ? target_machine(NULL, NULL, NULL, reloc, model) : target_machine(NULL, "generic", "", reloc, model);
}

bool emit_llvm_ir(const Lowered *low, const char *dir, const char *source_path, FILE *dump)
{
	return llvm_supported(low) && make_dir(dir) &&
	       write_module(low, host_machine(LLVMRelocPIC, LLVMCodeModelDefault, false), OUT_IR,
			    arena_printf(low->g->arena, "%s/prog.ll", dir), source_path, false, dump, LOOPS_PER_LEVEL);
}

bool emit_llvm_object(const Lowered *low, const char *path, const char *source_path, bool verify, bool native)
{
	return llvm_supported(low) && write_module(low, host_machine(LLVMRelocPIC, LLVMCodeModelDefault, native), OUT_OBJECT,
						   path, source_path, verify, NULL, native ? LOOPS_FOR_MACHINE : LOOPS_PER_LEVEL);
}

bool emit_ptx(const Lowered *low, const char *dir, FILE *dump)
{
	if (!make_dir(dir))
		return false;
	LLVMTargetMachineRef tm =
		target_machine("nvptx64-nvidia-cuda", "sm_80", "+ptx70", LLVMRelocDefault, LLVMCodeModelDefault);
	return write_module(low, tm, OUT_PTX, arena_printf(low->g->arena, "%s/kernels.ptx", dir), NULL, false, dump,
			    LOOPS_FOR_MACHINE);
}

/* The instruction-set level planrt will run at in this process (planrt_cpu_select, resolved from
 * planc itself through the JIT): LOOPS_FOR_MACHINE when it is the best this CPU runs (the JIT
 * compiles for the host CPU), else the level PLANRT_ISA forces, which the fused loops are then
 * built for, so that planc run computes what a built program does at that level. An unknown or
 * unavailable PLANRT_ISA is left to the program's own check (planrt_main reports it). */
static int jit_loop_level(LLVMOrcLLJITRef jit)
{
	LLVMOrcExecutorAddress select = 0, best = 0, level = 0;
	if (!report_error("LLVM's JIT cannot find planrt_cpu_select", LLVMOrcLLJITLookup(jit, &select, "planrt_cpu_select")) ||
	    !report_error("LLVM's JIT cannot find planrt_cpu_best", LLVMOrcLLJITLookup(jit, &best, "planrt_cpu_best")) ||
	    !report_error("LLVM's JIT cannot find planrt_cpu_level_", LLVMOrcLLJITLookup(jit, &level, "planrt_cpu_level_")))
		return LOOPS_FOR_MACHINE;
	if (((planrt_result_t(*)(void))(uintptr_t)select)() != planrt_success)
		return LOOPS_FOR_MACHINE;
	int running = *(const int *)(uintptr_t)level;
	return running == ((int (*)(void))(uintptr_t)best)() ? LOOPS_FOR_MACHINE : running;
}

int llvm_run(const Lowered *low, const char *source_path, int argc, char **argv, bool verify)
{
	if (!llvm_supported(low))
		return -1;
	LLVMOrcLLJITRef jit = NULL;
	LLVMOrcThreadSafeContextRef tsc = LLVMOrcCreateNewThreadSafeContext();
	LLVMOrcDefinitionGeneratorRef process = NULL;
	LLVMModuleRef m = NULL;
	LLVMTargetMachineRef tm = NULL;
	int status = -1;
	LLVMOrcExecutorAddress entry = 0;
	if (!(tm = host_machine(LLVMRelocDefault, LLVMCodeModelJITDefault, true)) || /* (registers the target) */
	    !report_error("LLVM cannot start its JIT", LLVMOrcCreateLLJIT(&jit, LLVMOrcCreateLLJITBuilder())))
		goto out;
	/* planrt_*, libm and libc come from this process (planc links planrt whole and exports it) */
	if (!report_error("LLVM's JIT cannot search this process for symbols",
			  LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(&process, LLVMOrcLLJITGetGlobalPrefix(jit),
									       NULL, NULL)))
		goto out;
	LLVMOrcJITDylibAddGenerator(LLVMOrcLLJITGetMainJITDylib(jit), process);
	int loop_level = jit_loop_level(jit);
	m = build_module(low, LLVMOrcThreadSafeContextGetContext(tsc), tm, false, source_path, loop_level);
	if (!prepare(m, tm, true, verify))
		goto out;
	LLVMSetDataLayout(m, LLVMOrcLLJITGetDataLayoutStr(jit));
	LLVMOrcThreadSafeModuleRef tsm = LLVMOrcCreateNewThreadSafeModule(m, tsc);
	m = NULL;
	if (!report_error("LLVM's JIT refused the module",
			  LLVMOrcLLJITAddLLVMIRModule(jit, LLVMOrcLLJITGetMainJITDylib(jit), tsm)) ||
	    !report_error("LLVM's JIT cannot compile the program", LLVMOrcLLJITLookup(jit, &entry, "main")))
		goto out;
	int (*main_fn)(int, char **) = (int (*)(int, char **))(uintptr_t)entry;
	status = main_fn(argc, argv);
out:
	if (m)
		LLVMDisposeModule(m);
	if (tm)
		LLVMDisposeTargetMachine(tm);
	if (jit)
		LLVMOrcDisposeLLJIT(jit);
	LLVMOrcDisposeThreadSafeContext(tsc);
	return status;
}
