/* driver.h: what the files of runtime/driver share. Internal to planrt: generated programs call
 * planrt_main only.
 *
 *   main.c       planrt_main: the run in order (options, world, files, state, data, init or
 *                resume, the steps, the final save, the reports)
 *   options.c    the command line and --help
 *   run_files.c  the paths a run reads and writes, checked before any work
 *   validate.c   the generated tables checked against each other before use
 *   walker.c     the action table walked (pipeline transfers overlapped), evaluation
 *   train.c      the step loop: one step, its log row, NaN stops, checkpoints
 *   policy.c     what each sync mode allows (a table), and fp16 loss scaling's rule
 *   resume.c     a checkpoint's run checked against this one
 *   report.c     the PLANRT_REPORT_* lines and test hooks (stragglers)
 *   start.c      the world started and a stage's memory allocated (planrt_main and --generate)
 *   generate.c   --generate: the decode program continues a prompt (docs/generate.md) */
#ifndef PLANRT_DRIVER_H
#define PLANRT_DRIVER_H

#define PLANRT_INTERNAL
#include "planrt.h"
#include "planrt_program.h"

#include <jansson.h>

#include "../io/planrt_ckpt.h"

enum { PLANRT_DEFAULT_SEED = 1234, PLANRT_MAX_FILES = 64 };

/* ---------------------------------------------------------------- start.c */
/* MPI, the instruction-set level, the world size checked against the program's, the mesh, the device */
void planrt_start_world_(int *argc, char ***argv, const planrt_program_t *program, int *rank, int *world);
/* a stage's state buffers, its arena (a canary in every word) and its slots' request sets */
typedef struct holdings {
	size_t kind_bytes[planrt_state_kinds], state_bytes;
	unsigned char *arena;
	planrt_request_t *reqs;
	unsigned char *own;
} holdings_t;
void planrt_stage_allocate_(const planrt_stage_t *stage, holdings_t *h);
void planrt_stage_release_(const planrt_stage_t *stage, holdings_t *h);

/* ---------------------------------------------------------------- generate.c */
int planrt_generate_wanted_(int argc, char **argv); /* --generate among the options */
int planrt_generate_(int argc, char **argv, const planrt_program_t *train);

/* ---------------------------------------------------------------- options.c */
typedef struct options {
	int64_t steps; /* -1: not given */
	uint64_t seed;
	int seed_given;
	const char *data, *init, *save, *log, *map;
	/* --data FILE or --data W1 FILE1 W2 FILE2 ... (a blend); --eval-data the same */
	int ndata, neval;
	const char *data_files[PLANRT_MAX_FILES], *eval_files[PLANRT_MAX_FILES];
	double data_weights[PLANRT_MAX_FILES], eval_weights[PLANRT_MAX_FILES];
	int blend, eval_blend; /* weights were given */
	int sampling;          /* --sampling: PLANRT_SAMPLE_*, or -1: the default (a resumed run: its own) */
	const char *save_every_dir, *resume, *trace;
	const char *reshard_from, *reshard_to; /* --reshard SRC OUT */
	int nother;                            /* options other than --reshard given */
	int64_t save_every, keep, eval_every, eval_batches, max_skips;
	int max_skips_given;                   /* --max-skips was given (fp16 plans only) */
	double loss_scale_init;                /* --loss-scale-init, or 0: the plan's */
	int help;
	char error[512]; /* the first usage error, reported after planrt_init */
} options_t;
extern const char planrt_usage_line_[];
/* Parses argv without failing: the first error is kept in o->error for after planrt_init, so that
 * --help anywhere is still answered before MPI starts. */
void planrt_parse_options_(int argc, char **argv, options_t *o);
void planrt_option_error_(options_t *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int planrt_launcher_rank0_(void); /* under mpirun, whether this is the first rank (no MPI call) */
void planrt_print_help_(const char *prog_name, const planrt_program_t *p);

/* ---------------------------------------------------------------- run_files.c */
/* rank 0, before any work: inputs that would block, outputs that are inputs or each other, and
 * every output probed; ends the job with the cause */
void planrt_check_run_files_(const options_t *o);

/* ---------------------------------------------------------------- validate.c */
/* the generated tables of the stage this rank runs, against each other; an inconsistency is
 * planc's bug, reported before it corrupts memory */
void planrt_check_program_(const planrt_program_t *p, int stage_index);

/* ---------------------------------------------------------------- walker.c */
typedef struct walker {
	const planrt_stage_t *stage;
	planrt_ctx_t *ctx;
	planrt_request_t *reqs; /* nslots * nreqs */
	unsigned char *own;     /* nslots * nreqs: started by the prepare of the forward that is next */
	int deferred;           /* the next forward's slot still ran the previous action: drain at its run */
} walker_t;
/* The action table of w->stage for one step (or one held-out batch), each action's receives
 * posted one action ahead; every slot drained at the end. */
void planrt_walk_(walker_t *w);
void planrt_clear_action_(planrt_ctx_t *ctx); /* outside actions: no micro-batch, no slot */
void planrt_trace_phase_(const char *name, int64_t step); /* --trace: a run phase as an event */
/* --eval-every: the mean loss of batches held-out batches through w (a forward-only stage), and
 * their accuracy into *accuracy (NaN: the loss is not a classification) */
double planrt_evaluate_(walker_t *w, const planrt_stage_t *stage, planrt_ctx_t *ctx, int64_t batches, int64_t step,
			double *accuracy);
/* the stage with its forward actions only (evaluation); free its actions when they differ */
planrt_stage_t planrt_forward_stage_(const planrt_stage_t *s);

/* ---------------------------------------------------------------- policy.c */
/* What a sync mode (the program descriptor's name) allows and how its runs behave. */
typedef struct sync_policy {
	const char *name;
	int replicas_agree;  /* every rank sees the same reduced loss: a NaN stops all of them together
			      * (else the replica that sees it ends the job) */
	int reshardable;     /* its checkpoints can be read by another plan of the model */
	int checkpoints;     /* --save-every / --resume */
	int evaluates;       /* --eval-every */
} sync_policy_t;
const sync_policy_t *planrt_sync_policy_(const planrt_program_t *p); /* ends the job on an unknown mode */
int planrt_sync_reshardable_(const char *mode); /* a checkpoint of the mode is read by another plan */

/* fp16 loss scaling (GradScaler's rule): a step whose gradients overflow is skipped and a dynamic
 * scale halves; after growth_interval good steps in a row it doubles; max_skips skipped steps in
 * a row stop the run. */
typedef struct loss_scaler {
	int scaled, dynamic;
	double scale;
	int64_t good_steps, skips_in_row, max_skips;
} loss_scaler_t;
/* From the plan, --loss-scale-init (0: the plan's) and --max-skips, then the state a resumed
 * checkpoint's manifest holds ("loss_scaling", or NULL). */
void planrt_loss_scaler_init_(loss_scaler_t *s, const planrt_program_t *p, const options_t *o, json_t *resumed);
double planrt_loss_scaler_scale_(const loss_scaler_t *s); /* this step's scale (1 when not scaled) */
/* After a step: skipped or not; returns 1 when max_skips steps in a row were skipped (stop). */
int planrt_loss_scaler_update_(loss_scaler_t *s, int skipped);
json_t *planrt_loss_scaler_state_(const loss_scaler_t *s); /* for a checkpoint's manifest */

/* ---------------------------------------------------------------- resume.c */
/* The run's position for a checkpoint's manifest (planrt_ckpt.h). */
json_t *planrt_run_info_(const planrt_program_t *p, const options_t *o, int64_t step, uint64_t seed, planrt_data_t data,
			 int64_t train_tokens);
/* the sampling rule of the run: the checkpoint's when resuming (random for checkpoints made before
 * epochs), else --sampling or epochs */
int planrt_resume_sampling_(planrt_ckpt_t *c, const options_t *o);
/* --resume: the checkpoint's run against this one; sets the seed and returns the first step. */
int64_t planrt_check_resume_(planrt_ckpt_t *c, const planrt_program_t *p, const options_t *o, planrt_data_t data,
			     int64_t train_tokens, uint64_t *seed, int rank);

/* ---------------------------------------------------------------- report.c */
/* The arena every word of which holds a canary at start: the highest word changed is the measured
 * high-water mark. */
#define PLANRT_ARENA_CANARY 0x5A17C0DE5A17C0DEull
void planrt_report_run_(int rank, int stage_index, const planrt_program_t *p, const planrt_stage_t *stage,
			const size_t *kind_bytes, size_t state_bytes, long long timed_steps, double timed_s, double wait_s,
			double update_s);
/* PLANRT_STRAGGLER=RANK:MS or random:MS: sleeps that long at the start of step when this rank is
 * the straggler */
void planrt_straggle_(const char *setting, int rank, int world, uint64_t seed, int64_t step);
/* --trace: each rank named by its coordinates; 0, or -1 on every rank when the file was not written */
int planrt_trace_close_ranks_(const planrt_program_t *p);

/* ---------------------------------------------------------------- train.c */
/* The run as planrt_main set it up, and what the step loop leaves. */
typedef struct run {
	const planrt_program_t *program;
	const planrt_stage_t *stage;
	const options_t *opt;
	const sync_policy_t *sync;
	planrt_ctx_t *ctx;
	int rank, world;
	uint64_t seed;
	int64_t first_step, train_tokens;
	loss_scaler_t scaler;
	walker_t walker;
	double start;         /* when the steps began (the progress line's ETA) */
	/* outcomes */
	int64_t stopped;      /* the step that stopped the run (a NaN, or loss scaling gave up), -1: none */
	int scaling_gave_up;  /* stopped by --max-skips */
	int64_t saved_step;   /* the newest checkpoint's step */
	long long timed_steps; /* steps after the first (the first warms up), and their seconds */
	double timed_s, timed_wait_s, timed_update_s;
} run_t;
void planrt_train_(run_t *r);

#endif
