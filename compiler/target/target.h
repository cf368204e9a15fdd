/* target.h: the targets that print the loop-level IR: C (target/c/emit_c.c), CUDA C
 * (target/cuda/emit_cuda.c, on emit_c.c's walker) and LLVM (target/llvm/emit_llvm.c: JIT,
 * objects, PTX). A target adds no computation and no communication. */
#ifndef PLANC_TARGET_H
#define PLANC_TARGET_H

#include "lower/lower.h"

/* ---------------------------------------------------------------- planrt_abi.c */
/* planrt's names for the values of the compiler's enums it shares (the printers print these):
 * planrt_f32, planrt_state_param, PLANRT_FORWARD, PLANRT_INIT_NORMAL, PLANRT_STREAM_COMPUTE (a
 * pipeline channel's stream: PLANRT_STREAM_P2P, plus its offset); planrt_int_name: an integer
 * argument of an enum parameter type (planrt_opt_adamw, PLANRT_CKPT_EXP_AVG without the
 * PLANRT_CKPT_COPY bit, PLANRT_TRANS), NULL for the other types. */
const char *planrt_dtype_name(DType t);
const char *planrt_state_kind_name(StateKind s);
const char *planrt_action_row_name(ActionKind a); /* the schedule row's macro: PLANRT_F, PLANRT_B */
const char *planrt_init_kind_name(InitKind k);
const char *planrt_stream_name(int stream);
const char *planrt_int_name(KParamType t, long long v);

/* ---------------------------------------------------------------- emit_c.c */
/* Writes the program as C into dir/prog.c; false on I/O errors. layer_loops: each run of identical
 * layers (layer_runs.c) as one loop over per-layer tables (planc's default); false: unrolled. */
bool emit_c(const Lowered *low, const char *dir, const char *source_path, bool layer_loops);
/* The same file for another target (the CUDA target: emit_cuda.c): emit_c.c prints the program's
 * structure (buffers, phase functions, tables, descriptor) and the target prints every kernel, its
 * declarations per stage, what begins and ends a phase function, and its includes; main() calls
 * main_fn. With layer_loops, the runs of identical layers are loops as in the C target: the walker
 * prints each layer through the target's kernel printer and folds the run when every layer prints
 * alike around what the target printed with emit_name, emit_int and emit_comment (the values that
 * may differ by layer); loopable (NULL: every kernel) says which kernels may be in a loop at all. */
typedef struct Emit Emit;
typedef struct EmitTarget {
	void (*prelude)(Emit *e);
	void (*stage_decls)(Emit *e);
	void (*phase_begin)(Emit *e, Phase ph, int chunk);
	void (*kernel)(Emit *e, const Kernel *k);
	void (*phase_end)(Emit *e, Phase ph, int chunk);
	void (*epilogue)(Emit *e); /* after main() */
	bool (*loopable)(Emit *e, const Kernel *k);
	const char *main_fn;
	void *data;
} EmitTarget;
bool emit_c_with(const Lowered *low, const char *dir, const char *source_path, const EmitTarget *target,
		 bool layer_loops);
FILE *emit_file(const Emit *e);
const LProg *emit_prog(const Emit *e);      /* the stage program being printed */
const char *emit_prefix(const Emit *e);     /* its names' prefix */
const EmitTarget *emit_target(const Emit *e);
int emit_stage(const Emit *e);              /* the stage being printed: low->progs[emit_stage(e)] */
void emit_arg(Emit *e, const Kernel *k, int i); /* k's argument i as the C target prints it */
void emit_name(Emit *e, int b);             /* buffer b as the C target names it (a family's entry) */
void emit_int(Emit *e, const char *label, long long v); /* an integer that may differ by layer */
void emit_comment(Emit *e, const char *text); /* " / * text * /", which may name the layer */
void emit_double(Emit *e, double x);        /* the shortest decimal that reads back as x */
void emit_c_kernel(Emit *e, const Kernel *k); /* a kernel as the C target prints it (a call or a loop nest) */
const char *emit_ctype(DType t);            /* the C type of an element */
/* A fused loop: the buffers it reads in order of first read (returns how many), whether every load
 * walks the output's index (flat), and its expression with the load of buffer b printed as
 * v<load_slot[b]>. emit_c_loop_to prints the C target's loop nest for it (the tests compare it). */
int emit_loop_loads(const Kernel *k, int *loads, int cap);
bool emit_loop_flat(const Kernel *k);
void emit_loop_expr_to(FILE *f, const LProg *p, const Kernel *k, bool flat, const int *load_slot);
void emit_c_loop_to(FILE *f, const Lowered *low, const LProg *p, const Kernel *k);
/* x adds (or subtracts) two products, a * b + c * d: gcc's -ffp-contract=fast may fuse either one
 * into the add, depending on the shape of its code, so every target prints it a * b + (c * d + 0),
 * the right product rounded on its own (+0 turns a -0 product into +0, on every target alike) and
 * the left one fused where the instruction set has FMA. */
bool emit_loop_sum_of_products(const LExpr *x);

/* ---------------------------------------------------------------- emit_cuda.c */
/* The CUDA target: DIR/prog.c (the host program: emit_c.c's structure, each kernel a call into
 * planrt_cuda on its stream with the events streams.c planned, or a launch of a fused loop),
 * DIR/kernels.cu (every distinct fused loop as a __global__ function and its launcher) and
 * DIR/loops.h (the loops' element functions, C that compiles for the host and the device). */
bool emit_cuda(const Lowered *low, const char *dir, const char *source_path, bool layer_loops);
/* Whether the CUDA target can run the program; reports the first reason when report. */
bool cuda_executable(const Lowered *low, bool report);
/* A fused loop's element function as loops.h prints it (static, named fname), for the tests. */
void emit_cuda_loop_body(FILE *f, const LProg *p, const Kernel *k, const char *fname);

/* ---------------------------------------------------------------- cuda/optim_groups.c */
/* The multi-tensor optimizer: runs of a phase's optimizer kernels (and the casts to their
 * lower-precision parameters) printed as one planrt_cu_optimizer_multi launch, and runs of sums of
 * squares as one planrt_cu_sum_squares_multi. group[k] is the
 * index of the run's last kernel where k starts a run, CUDA_OPT_MEMBER for its other kernels
 * (printed by the first), CUDA_OPT_ALONE otherwise; the caller frees it. */
enum { CUDA_OPT_ALONE = -1, CUDA_OPT_MEMBER = -2 };
int *cuda_optim_groups(const LProg *p);
/* the run that starts at kernel first, as a block of prog.c on the named stream */
void cuda_print_optim_group(Emit *e, const int *group, int first, const char *stream);
/* the storage a buffer is a window of (b itself unless it is a view) */
int cuda_storage_of(const LProg *p, int b);

/* ---------------------------------------------------------------- cuda/epilogues.c */
/* GEMM epilogues: a 16-bit matmul and the fused loop after it that adds a bias and / or a residual
 * to its product, printed as one planrt_cu_k_matmul_epilogue_16. pair_of[k] is the loop's index
 * where k is such a matmul, CUDA_EPI_MEMBER for the loop (printed with the matmul), CUDA_EPI_NONE
 * otherwise; the caller frees it. */
enum { CUDA_EPI_NONE = -1, CUDA_EPI_MEMBER = -2 };
int *cuda_epilogues(const LProg *p);
/* matmul m and its loop l as one call on the named stream (no indent, no newline) */
void cuda_print_epilogue(Emit *e, const Kernel *m, const Kernel *l, const char *stream);

/* ---------------------------------------------------------------- emit_llvm.c */
/* The LLVM back end (LLVM 14 C API): the program emit_c.c prints, built as LLVM IR and optimised
 * with default<O3> for the host CPU; the fused loops also as NVPTX kernels. LLVM's errors (a
 * verifier failure, a missing target, an unresolved symbol) are reported as planc diagnostics. */
struct LLVMOpaqueContext;
struct LLVMOpaqueModule;
struct LLVMOpaqueTargetMachine;
/* DIR/prog.ll: the verified module before optimisation (also printed to dump when not NULL) */
bool emit_llvm_ir(const Lowered *low, const char *dir, const char *source_path, FILE *dump);
/* PATH: a native object of the optimised module, whose main() calls planrt_main (planc build
 * --backend llvm links it with planrt); verify: also verify the optimised module; native: for
 * this machine's CPU, else for its triple's baseline with the fused loops once per
 * instruction-set level (planrt_cpu.h) */
bool emit_llvm_object(const Lowered *low, const char *path, const char *source_path, bool verify, bool native);
/* planc run: compiles the program with ORC LLJIT in this process for this machine's CPU (the
 * fused loops for the level PLANRT_ISA forces, if any; planrt resolved from planc itself) and runs
 * main(argc, argv); the program's exit status, or -1 after a diagnostic */
int llvm_run(const Lowered *low, const char *source_path, int argc, char **argv, bool verify);
/* DIR/kernels.ptx: every fused loop as an sm_80 NVPTX kernel, named as in the CPU module
 * (s<stage>_loop<kernel index>), a grid-stride loop over its output's elements */
bool emit_ptx(const Lowered *low, const char *dir, FILE *dump);
/* For tests: the unoptimised module in context c for target machine tm (gpu: the NVPTX kernels
 * only; the CPU's fused loops once per instruction-set level, as in an object), and
 * LLVMVerifyModule reported as a planc diagnostic (false if broken). */
struct LLVMOpaqueModule *llvm_build_module(const Lowered *low, struct LLVMOpaqueContext *c,
					   struct LLVMOpaqueTargetMachine *tm, bool gpu, const char *source_path);
bool llvm_verify(struct LLVMOpaqueModule *m, const char *what);
/* whether the LLVM back end can call kernels of this kind (K_LOOP: it builds them) */
bool llvm_kernel_known(KernelKind kind);

#endif
