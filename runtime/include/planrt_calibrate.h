/* planrt_calibrate.h: what `planc calibrate` measures on the machine it runs on (issue 20), with
 * the kernels and collectives the generated programs call (driver/calibrate.c). Every rank of the
 * launch measures at once, so a rate is what one rank gets while the others work too (on a
 * machine with more ranks than cores, the share of a core a rank gets), and each figure is the
 * slowest rank's. planc turns the measurements into a device file (compiler/explain/calibrate.c)
 * that explain and search read with --device=FILE. */
#ifndef PLANRT_CALIBRATE_H
#define PLANRT_CALIBRATE_H

#include <stdint.h>

enum { PLANRT_CALIB_GEMMS = 8, PLANRT_CALIB_SIZES = 16 };

/* One link's collectives (MPI, through planrt's collectives): all-reduce time by message size,
 * the all-reduce's bus bandwidth at its best size, and the other kinds' at the largest size (nccl-tests' busbw: the algorithm bandwidth
 * times 2 (n - 1) / n for an all-reduce, (n - 1) / n for a gather or scatter, 1 for a send). */
typedef struct planrt_calib_link {
	int ranks;                                 /* the group measured; 0: not measured */
	int nsizes;
	double bytes[PLANRT_CALIB_SIZES];          /* all-reduce message sizes */
	double allreduce_s[PLANRT_CALIB_SIZES];    /* seconds per all-reduce of that size */
	double latency;                            /* seconds of an all-reduce of one element */
	double allreduce_busbw, reduce_scatter_busbw, allgather_busbw, sendrecv_busbw; /* bytes/s */
} planrt_calib_link_t;

typedef struct planrt_calibration {
	int ranks, node_ranks, nodes;
	char host[64];
	double load;                               /* the one-minute load average at the start */
	int64_t gemm_mnk[PLANRT_CALIB_GEMMS][3];   /* the f32 GEMM shapes measured */
	double gemm_rate[PLANRT_CALIB_GEMMS];      /* FLOP/s (2 M N K per product) */
	int ngemms;
	double memory_bw;                          /* bytes/s of y = a x + y (3 floats per element) */
	double attention_rate;                     /* FLOP/s of the fused attention's products, forward and
						      backward, over the scores it computes (causal: every
						      tile holding an unmasked score, whole) */
	double attention_score[2];                 /* seconds per computed score beyond its products, forward
						      and backward (the softmax's row work, mask, scale) */
	int attention_tile;                        /* the query and key tile (PLANRT_ATTN_TILE) */
	double launch;                             /* seconds per call of a tiny kernel (a GEMM of 8 x 8 x 8 and
						      an add of 64 floats, the mean): a kernel's fixed cost */
	double dropout_rate;                       /* dropout mask elements per second (planrt's dropout over an
						      array the caches hold: its Philox draws, not its bytes) */
	double capacity;                           /* bytes of this node's memory per rank */
	planrt_calib_link_t node, net;             /* within a node; between nodes */
} planrt_calibration_t;

/* Starts MPI (a process started without mpirun is a world of one), checks on rank 0 that
 * out_path may be written (planrt_outfile_check: nothing is measured when it may not), measures
 * (quick: small sizes, for tests) and fills *c on every rank. Returns this rank (0 writes the
 * file), or -1 with a one-line cause in why; call planrt_calibrate_end either way. */
int planrt_calibrate(planrt_calibration_t *c, const char *out_path, int quick, char *why, int nwhy);
void planrt_calibrate_end(void);

#endif
