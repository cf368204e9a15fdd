/* planrt_abi.c: where the compiler meets planrt's headers. Every target prints calls into planrt
 * with the compiler's numbers for planrt's enums, so the two must agree; this file makes any
 * disagreement a build error and gives the printers planrt's names for those numbers.
 *
 *   prototypes  each kernel table row's parameter list (kernel_table.h), in the C types below,
 *               must be its planrt function's prototype, and (with `int stream` last, a scalar
 *               passed as its buffer and factor) its planrt_cuda function's;
 *   enums       the compiler's DType, OptimizerKind, StateKind, ActionKind, StreamKind, UnaryFn,
 *               InitKind and CkptKind, and "no axis" / "no inbox", are planrt's values;
 *   names       planrt's spelling of each value, which the C and CUDA printers print
 *               (planrt_opt_adamw, PLANRT_CKPT_EXP_AVG, PLANRT_TRANS, ...) instead of a number. */
#include "target/target.h"

#include "planrt_cuda.h"
#include "planrt_exec.h"
#include "planrt_kernels.h"
#include "planrt_offload.h"
#include "planrt_program.h"

/* ------------------------------------------------------------------ prototypes */

/* the C type of each parameter type (kernel_table.h's KPARAM_TYPES), and on the device */
#define CTYPE_I64 int64_t
#define CTYPE_INT int
#define CTYPE_U64 uint64_t
#define CTYPE_F64 double
#define CTYPE_SCALAR double
#define CTYPE_DIMS const int64_t *
#define CTYPE_PERM const int *
#define CTYPE_F32_IN const float *
#define CTYPE_F32_OUT float *
#define CTYPE_I32_IN const int32_t *
#define CTYPE_I32_OUT int32_t *
#define CTYPE_U8_OUT uint8_t *
#define CTYPE_F64_IN const double *
#define CTYPE_BF16_IN const uint16_t *
#define CTYPE_F16_IN const uint16_t *
#define CTYPE_F64_OUT double *
#define CTYPE_IN const void *
#define CTYPE_OUT void *
#define CTYPE_ACC void *
#define CTYPE_BUFS void *const *
#define CTYPE_DTYPE planrt_dtype_t
#define CTYPE_COMM planrt_comm_t
#define CTYPE_REQUEST planrt_request_t *
#define CTYPE_BUCKET planrt_bucket_t *
#define CTYPE_CTX planrt_ctx_t *
#define CTYPE_STEP int64_t
#define CTYPE_STEP_SEED uint64_t
#define CTYPE_TEXT const char *
#define CTYPE_PARAM int
#define CTYPE_AXIS int
#define CTYPE_OPT int
#define CTYPE_CKPT int
#define CTYPE_UNARY_FN int
#define CTYPE_TRANS int
#define CTYPE_ACCUMULATE int
#define CTYPE_FLAG int
/* every type has its C type, of the size its ABI class says */
#define ABI_SIZE_I32 4
#define ABI_SIZE_I64 8
#define ABI_SIZE_F64 8
#define ABI_SIZE_PTR sizeof(void *)
#define T(type, abi) _Static_assert(sizeof(CTYPE_##type) == ABI_SIZE_##abi, "the C type of " #type);
KPARAM_TYPES(T)
#undef T

/* the parameter list with a leading comma, then the comma dropped */
#define DROP_FIRST_(first, ...) __VA_ARGS__
#define DROP_FIRST(...) DROP_FIRST_(__VA_ARGS__)

#define KP(type, name) , CTYPE_##type
#define X(kind, text, cls, fn, dev, params)                                                                \
	_Static_assert(__builtin_types_compatible_p(__typeof__(fn), void(DROP_FIRST(params))),             \
		       #fn " must have the parameters its row of kernel_table.h gives it");
#define Y(kind, text, cls)
KERNEL_TABLE(X, Y)
#undef X
#undef KP

/* planrt_cuda: the same parameters, a scalar as its device buffer and factor, and the stream */
#define CTYPE_DEVICE_SCALAR const float *, double
#define KP(type, name) , CTYPE_DEVICE_##type
#define CTYPE_DEVICE_I64 CTYPE_I64
#define CTYPE_DEVICE_INT CTYPE_INT
#define CTYPE_DEVICE_U64 CTYPE_U64
#define CTYPE_DEVICE_F64 CTYPE_F64
#define CTYPE_DEVICE_DIMS CTYPE_DIMS
#define CTYPE_DEVICE_PERM CTYPE_PERM
#define CTYPE_DEVICE_F32_IN CTYPE_F32_IN
#define CTYPE_DEVICE_F32_OUT CTYPE_F32_OUT
#define CTYPE_DEVICE_I32_IN CTYPE_I32_IN
#define CTYPE_DEVICE_I32_OUT CTYPE_I32_OUT
#define CTYPE_DEVICE_U8_OUT CTYPE_U8_OUT
#define CTYPE_DEVICE_F64_IN CTYPE_F64_IN
#define CTYPE_DEVICE_BF16_IN CTYPE_BF16_IN
#define CTYPE_DEVICE_F16_IN CTYPE_F16_IN
#define CTYPE_DEVICE_F64_OUT CTYPE_F64_OUT
#define CTYPE_DEVICE_IN CTYPE_IN
#define CTYPE_DEVICE_OUT CTYPE_OUT
#define CTYPE_DEVICE_ACC CTYPE_ACC
#define CTYPE_DEVICE_BUFS CTYPE_BUFS
#define CTYPE_DEVICE_DTYPE CTYPE_DTYPE
#define CTYPE_DEVICE_COMM CTYPE_COMM
#define CTYPE_DEVICE_REQUEST CTYPE_REQUEST
#define CTYPE_DEVICE_BUCKET CTYPE_BUCKET
#define CTYPE_DEVICE_CTX CTYPE_CTX
#define CTYPE_DEVICE_STEP CTYPE_STEP
#define CTYPE_DEVICE_STEP_SEED CTYPE_STEP_SEED
#define CTYPE_DEVICE_TEXT CTYPE_TEXT
#define CTYPE_DEVICE_PARAM CTYPE_PARAM
#define CTYPE_DEVICE_AXIS CTYPE_AXIS
#define CTYPE_DEVICE_OPT CTYPE_OPT
#define CTYPE_DEVICE_CKPT CTYPE_CKPT
#define CTYPE_DEVICE_UNARY_FN CTYPE_UNARY_FN
#define CTYPE_DEVICE_TRANS CTYPE_TRANS
#define CTYPE_DEVICE_ACCUMULATE CTYPE_ACCUMULATE
#define CTYPE_DEVICE_FLAG CTYPE_FLAG
/* a row's device function (for KDEV_NOOP and KDEV_HOST: none, a stand-in that passes the check) */
void planrt_abi_no_device_function_(void);
#define DEVICE_CHECK(f, ...)                                                                               \
	_Static_assert(__builtin_types_compatible_p(__typeof__(f), void(void)) ||                          \
			       __builtin_types_compatible_p(__typeof__(f), void(DROP_FIRST(__VA_ARGS__, int))),   \
		       #f " must have its kernel's parameters and the stream");
#define X(kind, text, cls, fn, dev, params) DEVICE_CHECK(dev, params)
#define KDEV(f) f
#define KDEV_NOOP planrt_abi_no_device_function_
#define KDEV_HOST planrt_abi_no_device_function_
KERNEL_TABLE(X, Y)
#undef KDEV
#undef KDEV_NOOP
#undef KDEV_HOST
#undef X
#undef Y
#undef KP

/* ------------------------------------------------------------------ enums and their names */

/* X(the compiler's value, planrt's name for it): each pair is checked equal, and the name is what
 * the printers print for the value. */
#define DTYPES(X)                                                                                          \
	X(DT_F32, planrt_f32) X(DT_BF16, planrt_bf16) X(DT_F16, planrt_f16) X(DT_I32, planrt_i32)           \
	X(DT_U8, planrt_u8) X(DT_F64, planrt_f64)
#define OPTIMIZERS(X)                                                                                      \
	X(OPT_SGD, planrt_opt_sgd) X(OPT_MOMENTUM, planrt_opt_momentum) X(OPT_ADAM, planrt_opt_adam)        \
	X(OPT_ADAMW, planrt_opt_adamw)
#define STATE_KINDS(X)                                                                                     \
	X(SC_PARAM, planrt_state_param) X(SC_GRAD, planrt_state_grad) X(SC_OPTIM, planrt_state_optim)       \
	X(SC_MASTER, planrt_state_master) X(SC_BUFFER, planrt_state_buffer) X(SC_METRIC, planrt_state_metric) \
	X(SC_OFFLOAD, planrt_state_offload)
#define ACTIONS(X) X(ACT_FORWARD, PLANRT_FORWARD) X(ACT_BACKWARD, PLANRT_BACKWARD)
#define ACTION_ROWS(X) X(ACT_FORWARD, PLANRT_F) X(ACT_BACKWARD, PLANRT_B) /* macros: no value to assert */
#define STREAMS(X)                                                                                         \
	X(STREAM_COMPUTE, PLANRT_STREAM_COMPUTE) X(STREAM_COMM, PLANRT_STREAM_COMM)                         \
	X(STREAM_COPY, PLANRT_STREAM_COPY) X(STREAM_HOST, PLANRT_STREAM_HOST) X(STREAM_P2P, PLANRT_STREAM_P2P)
#define UNARY_FNS(X)                                                                                       \
	X(UNARY_SIN, PLANRT_SIN) X(UNARY_COS, PLANRT_COS) X(UNARY_EXP, PLANRT_EXP) X(UNARY_LOG, PLANRT_LOG) \
	X(UNARY_TANH, PLANRT_TANH) X(UNARY_SIGMOID, PLANRT_SIGMOID)
#define INIT_KINDS(X)                                                                                      \
	X(INIT_NORMAL, PLANRT_INIT_NORMAL) X(INIT_UNIFORM, PLANRT_INIT_UNIFORM) X(INIT_ZEROS, PLANRT_INIT_ZEROS) \
	X(INIT_ONES, PLANRT_INIT_ONES) X(INIT_ARANGE, PLANRT_INIT_ARANGE) X(INIT_ROPE_COS, PLANRT_INIT_ROPE_COS) \
	X(INIT_ROPE_SIN, PLANRT_INIT_ROPE_SIN) X(INIT_LOAD, PLANRT_INIT_LOAD)
#define CKPT_KINDS(X)                                                                                      \
	X(CKPT_PARAM, PLANRT_CKPT_PARAM) X(CKPT_MASTER, PLANRT_CKPT_MASTER) X(CKPT_EXP_AVG, PLANRT_CKPT_EXP_AVG) \
	X(CKPT_EXP_AVG_SQ, PLANRT_CKPT_EXP_AVG_SQ) X(CKPT_MOMENTUM, PLANRT_CKPT_MOMENTUM)
#define TRANS_FLAGS(X) X(0, PLANRT_NO_TRANS) X(1, PLANRT_TRANS)
#define ACCUMULATE_FLAGS(X) X(0, PLANRT_OVERWRITE) X(1, PLANRT_ACCUMULATE)

#define X(ours, theirs) _Static_assert((long long)(ours) == (long long)(theirs), #ours " must be planrt's " #theirs);
DTYPES(X)
OPTIMIZERS(X)
STATE_KINDS(X)
ACTIONS(X)
STREAMS(X)
UNARY_FNS(X)
INIT_KINDS(X)
CKPT_KINDS(X)
TRANS_FLAGS(X)
ACCUMULATE_FLAGS(X)
#undef X
_Static_assert((int)CKPT_COPY == (int)PLANRT_CKPT_COPY, "CKPT_COPY must be planrt's PLANRT_CKPT_COPY");
_Static_assert((int)SC_COUNT == (int)planrt_state_kinds, "every planrt state kind has a StateKind");
_Static_assert((int)CKPT_MOMENTUM + 1 == (int)PLANRT_CKPT_KINDS, "every planrt checkpoint kind has a CkptKind");
/* "none": the compiler's -1 is planrt's PLANRT_NO_AXIS; the action table prints PLANRT_NO_INBOX */
_Static_assert(PLANRT_NO_AXIS == -1, "PLANRT_NO_AXIS");
_Static_assert(PLANRT_NO_INBOX == UINT16_MAX, "PLANRT_NO_INBOX is the largest inbox index planrt_action_t holds");
/* the parameter table's dims and the mesh */
_Static_assert(MAX_DIMS <= sizeof(((planrt_param_t *)0)->gdims) / sizeof(int64_t), "planrt_param_t holds MAX_DIMS dims");

#define NAMES(list, type, count)                                                                            \
	static const char *const list##_names[count] = {list(NAME)};                                         \
	_Static_assert(sizeof list##_names / sizeof list##_names[0] == count, #list)
#define NAME(ours, theirs) [ours] = #theirs,
NAMES(DTYPES, DType, DT_F64 + 1);
NAMES(OPTIMIZERS, OptimizerKind, OPT_ADAMW + 1);
NAMES(STATE_KINDS, StateKind, SC_COUNT);
NAMES(ACTION_ROWS, ActionKind, ACT_BACKWARD + 1);
NAMES(STREAMS, StreamKind, STREAM_P2P + 1);
NAMES(UNARY_FNS, UnaryFn, UNARY_SIGMOID + 1);
NAMES(INIT_KINDS, InitKind, INIT_LOAD + 1);
NAMES(CKPT_KINDS, CkptKind, CKPT_MOMENTUM + 1);
NAMES(TRANS_FLAGS, int, 2);
NAMES(ACCUMULATE_FLAGS, int, 2);
#undef NAME
#undef NAMES

/* the name of v in a table of n names, or ICE */
static const char *named(const char *const *names, int n, long long v, const char *what)
{
	if (v < 0 || v >= n || !names[v])
		ICE("%lld is no %s planrt knows", v, what);
	return names[v];
}
#define NAMED(list, v, what) named(list##_names, (int)(sizeof list##_names / sizeof list##_names[0]), (v), (what))

const char *planrt_dtype_name(DType t)
{
	return NAMED(DTYPES, t, "dtype");
}

const char *planrt_state_kind_name(StateKind s)
{
	return NAMED(STATE_KINDS, s, "state kind");
}

const char *planrt_action_row_name(ActionKind a)
{
	return NAMED(ACTION_ROWS, a, "action kind");
}

const char *planrt_init_kind_name(InitKind k)
{
	return NAMED(INIT_KINDS, k, "initialisation");
}

const char *planrt_stream_name(int stream)
{
	return NAMED(STREAMS, stream < STREAM_P2P ? stream : STREAM_P2P, "stream");
}

const char *planrt_int_name(KParamType t, long long v)
{
	switch (t) {
	case KPT_OPT:
		return NAMED(OPTIMIZERS, v, "optimizer");
	case KPT_UNARY_FN:
		return NAMED(UNARY_FNS, v, "unary function");
	case KPT_TRANS:
		return NAMED(TRANS_FLAGS, v, "trans flag");
	case KPT_ACCUMULATE:
		return NAMED(ACCUMULATE_FLAGS, v, "accumulate flag");
	case KPT_CKPT:
		return NAMED(CKPT_KINDS, v & ~(long long)CKPT_COPY, "checkpoint kind");
	default:
		return NULL;
	}
}
