/* cpu_table.h: planrt's CPU kernels per instruction-set level (planrt_cpu.h), internal to cpu/.
 *
 * kernels.c and optim.c are compiled once for the baseline (the public names) and once more per
 * level above it (runtime/CMakeLists.txt: -march=x86-64-v3 and -march=x86-64-v4, or +sve, with
 * PLANRT_CPU_VARIANT=avx2 / avx512 / sve), where every f32 kernel is named with the level as a
 * further suffix (planrt_k_softmax_f32_avx2) and the level's object fills one planrt_cpu_table_t.
 * planrt_cpu_select points planrt_cpu_table_ at the running level's table (NULL: the baseline),
 * and every public function of the list below starts with PLANRT_CPU_DISPATCH(name, (arguments)),
 * which hands the call to the table's function when there is one. One test of a global per kernel call; no kernel is
 * selected per call. */
#ifndef PLANRT_CPU_TABLE_H
#define PLANRT_CPU_TABLE_H

#include "planrt.h"
#include "planrt_cpu.h"
#include "planrt_kernels.h"

/* the f32 kernels of kernels_impl.h, by their names without the _f32 suffix */
#define PLANRT_CPU_KERNELS(X)                                                                                  \
	X(planrt_k_bmm) X(planrt_k_matmul) X(planrt_k_binary) X(planrt_k_sum_to) X(planrt_k_sum_to_acc)         \
	X(planrt_k_scale) X(planrt_k_gelu) X(planrt_k_gelu_grad) X(planrt_k_relu) X(planrt_k_relu_grad)         \
	X(planrt_k_silu) X(planrt_k_silu_grad) X(planrt_k_unary) X(planrt_k_unary_grad) X(planrt_k_dropout)     \
	X(planrt_k_dropout_grad) X(planrt_k_causal_mask) X(planrt_k_softmax) X(planrt_k_softmax_grad)           \
	X(planrt_k_layer_norm) X(planrt_k_layer_norm_grad) X(planrt_k_rms_norm) X(planrt_k_rms_norm_grad)       \
	X(planrt_k_ce_max) X(planrt_k_ce_sumexp) X(planrt_k_ce_target) X(planrt_k_ce_loss) X(planrt_k_ce_grad)  \
	X(planrt_k_cross_entropy) X(planrt_k_cross_entropy_grad) X(planrt_k_embed) X(planrt_k_embed_grad)       \
	X(planrt_k_permute) X(planrt_k_sum_dim) X(planrt_k_sum_dim_grad) X(planrt_k_max_dim)                    \
	X(planrt_k_max_dim_grad) X(planrt_k_slice) X(planrt_k_slice_grad) X(planrt_k_concat)                    \
	X(planrt_k_concat_grad) X(planrt_k_repeat_kv) X(planrt_k_repeat_kv_grad) X(planrt_k_rope)               \
	X(planrt_k_rope_grad) X(planrt_k_mse_loss) X(planrt_k_mse_loss_grad) X(planrt_k_l1_loss)                \
	X(planrt_k_l1_loss_grad) X(planrt_k_moe_route) X(planrt_k_moe_dispatch) X(planrt_k_moe_dispatch_grad)   \
	X(planrt_k_moe_combine) X(planrt_k_moe_combine_grad) X(planrt_k_moe_route_grad)                         \
	X(planrt_k_moe_aux_loss) X(planrt_k_moe_aux_loss_grad) X(planrt_k_moe_z_loss) X(planrt_k_moe_z_loss_grad)  \
	X(planrt_k_attention) X(planrt_k_attention_grad)   \
	X(planrt_k_ring_attention) X(planrt_k_ring_attention_grad)

/* the other functions compiled per level (optim.c), by their full names */
#define PLANRT_CPU_FUNCTIONS(X) X(planrt_opt_step) X(planrt_sum_squares)

typedef struct planrt_cpu_table {
#define PLANRT_CPU_KERNEL_PTR_(name) __typeof__(name##_f32) *name;
#define PLANRT_CPU_FUNCTION_PTR_(name) __typeof__(name) *name;
	PLANRT_CPU_KERNELS(PLANRT_CPU_KERNEL_PTR_)
	PLANRT_CPU_FUNCTIONS(PLANRT_CPU_FUNCTION_PTR_)
#undef PLANRT_CPU_KERNEL_PTR_
#undef PLANRT_CPU_FUNCTION_PTR_
} planrt_cpu_table_t;

/* the running level's kernels; NULL: the baseline's (the public functions themselves) */
extern const planrt_cpu_table_t *planrt_cpu_table_;

/* A level's table, defined by its build of kernels.c (PLANRT_CPU_VARIANT); the CMake build says
 * which exist (PLANRT_CPU_HAVE_AVX2, ...). */
extern const planrt_cpu_table_t planrt_cpu_table_avx2, planrt_cpu_table_avx512, planrt_cpu_table_sve;

/* a level's build names its functions name_<level> */
#define PLANRT_CPU_NAME_(a, b) a##_##b
#define PLANRT_CPU_NAME(a, b) PLANRT_CPU_NAME_(a, b)

#ifdef PLANRT_CPU_VARIANT /* a level's build: its functions' prototypes */
#define PLANRT_CPU_DECLARE_KERNEL_(name) __typeof__(name##_f32) PLANRT_CPU_NAME(name##_f32, PLANRT_CPU_VARIANT);
#define PLANRT_CPU_DECLARE_FUNCTION_(name) __typeof__(name) PLANRT_CPU_NAME(name, PLANRT_CPU_VARIANT);
PLANRT_CPU_KERNELS(PLANRT_CPU_DECLARE_KERNEL_)
PLANRT_CPU_FUNCTIONS(PLANRT_CPU_DECLARE_FUNCTION_)
#undef PLANRT_CPU_DECLARE_KERNEL_
#undef PLANRT_CPU_DECLARE_FUNCTION_
#endif

/* The first statement of a public function that a level's build replaces: the call goes to the
 * running level's function when there is one (args: the parameters in parentheses). Defined away
 * in a level's own build and where a function has no per-level versions (the _f64 kernels). */
#define PLANRT_CPU_DISPATCH(name, args)                                                                        \
	do {                                                                                                   \
		if (planrt_cpu_table_) {                                                                       \
			planrt_cpu_table_->name args;                                                          \
			return;                                                                                \
		}                                                                                              \
	} while (0)
#define PLANRT_CPU_DISPATCH_VALUE(name, args)                                                                  \
	do {                                                                                                   \
		if (planrt_cpu_table_)                                                                         \
			return planrt_cpu_table_->name args;                                                   \
	} while (0)

#endif
