/* kernels.c: the kernel table's data (kernel_table.h), and the one rule of what may fill a
 * kernel's parameter.
 *
 * Every fact about a kind is one row of KERNEL_TABLE; this file expands the rows into the arrays
 * the passes and targets read (names, classes, functions, parameter lists, what the CUDA target
 * does with the kind). karg_fits is the contract between the builders and the printers: the
 * builders (lower.c's karg_*) refuse an argument that does not fit the parameter it fills, the
 * verifier checks every kernel against it, and so a printer can print an argument by its
 * parameter's type. The prototypes themselves are checked against planrt's headers at compile
 * time in target/planrt_abi.c. */
#include "lower/lower.h"

#include <string.h>

const char *const kernel_names[K_COUNT] = {
#define X(kind, text, cls, fn, dev, params) text,
#define Y(kind, text, cls) text,
	KERNEL_TABLE(X, Y)
#undef X
#undef Y
};

const char *const kernel_functions[K_COUNT] = {
#define X(kind, text, cls, fn, dev, params) #fn,
#define Y(kind, text, cls) NULL,
	KERNEL_TABLE(X, Y)
#undef X
#undef Y
};

const KernelClass kernel_classes[K_COUNT] = {
#define X(kind, text, cls, fn, dev, params) cls,
#define Y(kind, text, cls) cls,
	KERNEL_TABLE(X, Y)
#undef X
#undef Y
};

const char *const kparam_type_names[KPT_COUNT] = {
#define T(type, abi) #type,
	KPARAM_TYPES(T)
#undef T
};

const KParamAbi kparam_abis[KPT_COUNT] = {
#define T(type, abi) KABI_##abi,
	KPARAM_TYPES(T)
#undef T
};

/* each kind's parameter list, ended by a {KPT_COUNT, NULL} sentinel (no empty arrays in C) */
#define KP(type, name) {KPT_##type, #name},
#define X(kind, text, cls, fn, dev, params) static const KernelParam params_##kind[] = {params {KPT_COUNT, NULL}};
#define Y(kind, text, cls) static const KernelParam params_##kind[] = {{KPT_COUNT, NULL}};
KERNEL_TABLE(X, Y)
#undef X
#undef Y
#undef KP

const KernelParam *const kernel_params[K_COUNT] = {
#define X(kind, text, cls, fn, dev, params) params_##kind,
#define Y(kind, text, cls) params_##kind,
	KERNEL_TABLE(X, Y)
#undef X
#undef Y
};

const int kernel_nparams[K_COUNT] = {
#define X(kind, text, cls, fn, dev, params) KARG_INDEX(kind, count_),
#define Y(kind, text, cls) K_##kind == K_OPAQUE ? -1 : 0,
	KERNEL_TABLE(X, Y)
#undef X
#undef Y
};

/* the device column: KDEV(f), KDEV_NOOP, KDEV_HOST */
const DeviceCall kernel_device[K_COUNT] = {
#define KDEV(f) {KDEV_CALL, #f}
#define KDEV_NOOP {KDEV_NO_OP, NULL}
#define KDEV_HOST {KDEV_HOST_ONLY, NULL}
#define X(kind, text, cls, fn, dev, params) dev,
#define Y(kind, text, cls) {KDEV_HOST_ONLY, NULL},
	KERNEL_TABLE(X, Y)
#undef X
#undef Y
#undef KDEV
#undef KDEV_NOOP
#undef KDEV_HOST
};

const char *karg_kind_name(KArgKind kind)
{
	static const char *const names[] = {[KA_BUF] = "buffer", [KA_NULL] = "null", [KA_BUFS] = "buffer list",
					    [KA_INT] = "integer", [KA_INTS] = "integer list", [KA_F64] = "float",
					    [KA_DTYPE] = "dtype", [KA_AXIS] = "mesh axis", [KA_PAIR] = "pair group",
					    [KA_REQ] = "request", [KA_SLOTREQ] = "slot request", [KA_COORD] = "coordinate",
					    [KA_OFFSET] = "block offset", [KA_SCALAR] = "scalar", [KA_PARAM] = "parameter",
					    [KA_CTX] = "context", [KA_STEP] = "step", [KA_STEP_SEED] = "step seed",
					    [KA_STR] = "string"};
	return (unsigned)kind < sizeof names / sizeof names[0] && names[kind] ? names[kind] : "?";
}

KArg *kernel_arg(const Kernel *k, KernelKind kind, int index)
{
	if (k->kind != kind || index < 0 || index >= k->nargs)
		ICE("argument '%s' of a '%s' kernel asked of a '%s' kernel with %d arguments",
		    index >= 0 && index < kernel_nparams[kind] ? kernel_params[kind][index].name : "?", kernel_names[kind],
		    kernel_names[k->kind], k->nargs);
	return &k->args[index];
}

_Static_assert(KARG_INDEX(MATMUL_BF16, batch) == KARG_INDEX(MATMUL_F16, batch) &&
		       KARG_INDEX(MATMUL_BF16, M) == KARG_INDEX(MATMUL_F16, M) &&
		       KARG_INDEX(MATMUL_BF16, N) == KARG_INDEX(MATMUL_F16, N) &&
		       KARG_INDEX(MATMUL_BF16, K) == KARG_INDEX(MATMUL_F16, K),
	       "the 16-bit GEMMs' sizes at the same places");
_Static_assert(KARG_INDEX(MATMUL_BF16, C) == KARG_INDEX(MATMUL_F16, C) &&
		       KARG_INDEX(MATMUL_BF16, c_type) == KARG_INDEX(MATMUL_F16, c_type),
	       "the 16-bit GEMMs' C and c_type at the same places (verify.c)");

bool kernel_is_gemm(const Kernel *k)
{
	return k->kind == K_MATMUL || k->kind == K_MATMUL_BF16 || k->kind == K_MATMUL_F16;
}

/* a GEMM kernel's batch, M, N and K (false for any other kernel); the 16-bit kinds keep theirs at
 * the same places */
static bool gemm_sizes(const Kernel *k, double *batch, double *m, double *n, double *kk)
{
	if (k->kind == K_MATMUL) {
		*batch = (double)KARG(k, MATMUL, batch)->i, *m = (double)KARG(k, MATMUL, M)->i;
		*n = (double)KARG(k, MATMUL, N)->i, *kk = (double)KARG(k, MATMUL, K)->i;
		return true;
	}
	if (k->kind == K_MATMUL_BF16 || k->kind == K_MATMUL_F16) {
		const KArg *a = k->args;
		*batch = (double)a[KARG_INDEX(MATMUL_BF16, batch)].i, *m = (double)a[KARG_INDEX(MATMUL_BF16, M)].i;
		*n = (double)a[KARG_INDEX(MATMUL_BF16, N)].i, *kk = (double)a[KARG_INDEX(MATMUL_BF16, K)].i;
		return true;
	}
	return false;
}

double kernel_gemm_flops(const Kernel *k)
{
	double batch, m, n, kk;
	return gemm_sizes(k, &batch, &m, &n, &kk) ? 2.0 * batch * m * n * kk : 0;
}

double kernel_gemm_operand_bytes(const Kernel *k)
{
	double batch, m, n, kk;
	return gemm_sizes(k, &batch, &m, &n, &kk) ? batch * (m * kk + kk * n + m * n) * (k->kind == K_MATMUL ? 4.0 : 2.0)
						  : 0;
}

static int dtype_param(KernelKind kind, const char *name)
{
	for (int i = 0; i < kernel_nparams[kind]; i++)
		if (kernel_params[kind][i].type == KPT_DTYPE && strcmp(kernel_params[kind][i].name, name) == 0)
			return i;
	return -1;
}

/* a 16-bit variant's `storage` and `acc` parameters (lower.h) */
int kernel_storage_param(KernelKind kind)
{
	return dtype_param(kind, "storage");
}

int kernel_acc_param(KernelKind kind)
{
	return dtype_param(kind, "acc");
}

/* What may fill a parameter of each type. */
bool karg_fits(KernelKind kind, int index, const KArg *a)
{
	if (kernel_nparams[kind] < 0) /* an opaque op's buffers */
		return a->kind == KA_BUF;
	if (index < 0 || index >= kernel_nparams[kind])
		return false;
	switch (kernel_params[kind][index].type) {
	case KPT_I64:
		return a->kind == KA_INT || a->kind == KA_COORD || (a->kind == KA_OFFSET && a->dim >= 0);
	case KPT_INT:
	case KPT_U64:
	case KPT_AXIS:
	case KPT_OPT:
	case KPT_CKPT:
	case KPT_UNARY_FN:
	case KPT_TRANS:
	case KPT_ACCUMULATE:
		return a->kind == KA_INT;
	case KPT_FLAG:
		return a->kind == KA_INT && (a->i == 0 || a->i == 1);
	case KPT_F64:
		return a->kind == KA_F64;
	case KPT_SCALAR:
		return a->kind == KA_SCALAR;
	case KPT_DIMS:
		return (a->kind == KA_INTS && !a->i32) || (a->kind == KA_OFFSET && a->dim < 0);
	case KPT_PERM:
		return a->kind == KA_INTS && a->i32;
	case KPT_F32_IN:
	case KPT_F32_OUT:
	case KPT_I32_IN:
	case KPT_I32_OUT:
	case KPT_U8_OUT:
	case KPT_F64_IN:
	case KPT_BF16_IN:
	case KPT_F16_IN:
	case KPT_F64_OUT:
	case KPT_IN:
	case KPT_OUT:
	case KPT_ACC:
		return a->kind == KA_BUF || a->kind == KA_NULL;
	case KPT_BUFS:
		return a->kind == KA_BUFS;
	case KPT_DTYPE:
		return a->kind == KA_DTYPE;
	case KPT_COMM:
		return a->kind == KA_AXIS || a->kind == KA_PAIR || a->kind == KA_NULL;
	case KPT_REQUEST:
		return a->kind == KA_REQ || a->kind == KA_SLOTREQ || a->kind == KA_NULL;
	case KPT_BUCKET:
		return a->kind == KA_REQ;
	case KPT_CTX:
		return a->kind == KA_CTX;
	case KPT_STEP:
		return a->kind == KA_STEP;
	case KPT_STEP_SEED:
		return a->kind == KA_STEP_SEED;
	case KPT_TEXT:
		return a->kind == KA_STR;
	case KPT_PARAM:
		return a->kind == KA_PARAM;
	case KPT_COUNT:
		break;
	}
	return false;
}
