/* cblas.h (runtime/standalone): the two BLAS calls planrt makes (cblas_sgemm, cblas_dgemm, row
 * major), for planrt built where there is no OpenBLAS (the GPU check machine: scripts/gpu-check.sh,
 * where GEMMs run in cuBLAS and the host multiplies nothing on the training path). Plain loops,
 * each output element summed in k order in the element type: correct and slow; a CPU program built
 * for speed links OpenBLAS. */
#ifndef PLANRT_STANDALONE_CBLAS_H
#define PLANRT_STANDALONE_CBLAS_H

enum CBLAS_ORDER { CblasRowMajor = 101, CblasColMajor = 102 };
enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112, CblasConjTrans = 113 };
typedef int blasint;

#define PLANRT_ONE_GEMM(name, T)                                                                                \
	static inline void name(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb,      \
				blasint M, blasint N, blasint K, T alpha, const T *A, blasint lda, const T *B,  \
				blasint ldb, T beta, T *C, blasint ldc)                                         \
	{                                                                                                      \
		(void)order; /* row major: planrt calls no other */                                            \
		for (blasint i = 0; i < M; i++)                                                                \
			for (blasint j = 0; j < N; j++) {                                                      \
				T s = 0;                                                                       \
				for (blasint k = 0; k < K; k++)                                                \
					s += (ta == CblasNoTrans ? A[(long)i * lda + k] : A[(long)k * lda + i]) * \
					     (tb == CblasNoTrans ? B[(long)k * ldb + j] : B[(long)j * ldb + k]); \
				T *c = &C[(long)i * ldc + j];                                                  \
				*c = beta == 0 ? alpha * s : alpha * s + beta * *c;                            \
			}                                                                                      \
	}
PLANRT_ONE_GEMM(cblas_sgemm, float)
PLANRT_ONE_GEMM(cblas_dgemm, double)
#undef PLANRT_ONE_GEMM
#endif
