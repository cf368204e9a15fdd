/* planrt_ckpt.h: sharded checkpoints (checkpoint.c), the part planrt_main drives and the part
 * `planc reshard` uses without MPI. Generated programs do not include this header: their phase
 * functions call planrt_ckpt_write / _read (planrt_program.h).
 *
 * A checkpoint is a directory DIR/step-<8 digits> (the steps done) holding one safetensors file
 * per rank that holds something, rank-<5 digits>.<token>.safetensors (token: one per save, so a
 * save never writes over the files of the checkpoint it replaces), and manifest.json, written
 * last (temporary file, fsync, rename): a checkpoint without a manifest is one whose save did not
 * finish, and the files a manifest does not name are garbage. The manifest holds the run's
 * position (step, seed, data), the plan's fingerprint and mesh, every file with its size and
 * checksum, and every logical tensor (a parameter, its master weights, its optimizer moments)
 * with its global shape and its pieces: the file and key of each, the block of the global tensor
 * the writing rank held (offsets, block shape) and the range of that block's row-major elements
 * it wrote. Any plan of the model can gather its own pieces from those. The manifest checksums
 * itself ("manifest_checksum": FNV-1a of the compact, key-sorted JSON of everything else), and
 * (format 2) every rank file's header holds the file's part of the manifest (its rank, its pieces
 * and the checksum of the run's fields), which the manifest must agree with. The checksums find
 * accidental damage (a torn write, a flipped bit, a file of another save); FNV-1a is no MAC: they
 * do not authenticate a checkpoint against someone who edits the files deliberately. */
#ifndef PLANRT_CKPT_H
#define PLANRT_CKPT_H

#include <jansson.h>

#include "planrt_program.h"

typedef struct planrt_ckpt planrt_ckpt_t;

/* The logical tensor of a piece kind: "NAME", "master.NAME", "optim.NAME.exp_avg",
 * "optim.NAME.exp_avg_sq", "optim.NAME.momentum_buffer". */
void planrt_ckpt_tensor_name(int kind, const char *param, char *buf, size_t n);

/* ------------------------------------------------------------------ writing
 * One writer per rank: the checkpoint phase adds this rank's pieces (the data is referenced, not
 * copied, until planrt_ckpt_write_rank), then the rank's file is written and described. run: the
 * run's fields the manifest will hold (each file records their checksum, and its own pieces, so a
 * manifest that disagrees with its files is refused: see planrt_ckpt_find). */
planrt_ckpt_t *planrt_ckpt_writer(const char *stepdir, const char *token, json_t *run, int rank);
/* a piece: elements [lo, hi) of the block at offs of shape block of tensor (global shape
 * gdims), data[0, hi - lo) of dtype */
void planrt_ckpt_add_piece(planrt_ckpt_t *c, const char *tensor, int rank, const int64_t *gdims, const int64_t *offs,
			   const int64_t *block, int64_t lo, int64_t hi, planrt_dtype_t dtype, const void *data);
void planrt_ckpt_add_local(planrt_ckpt_t *c, int id, planrt_dtype_t dtype, int64_t n, const void *data);
/* Writes the rank's file (when it holds anything; atomic) and returns its description for the
 * manifest ({"rank", "file", "bytes", "checksum", "pieces": [...], "local": [...]}), or NULL with
 * the cause in err. Frees the writer. */
json_t *planrt_ckpt_write_rank(planrt_ckpt_t *c, char *err, size_t errn);
/* The manifest from the ranks' descriptions and run (the run's fields: step, seed, plan, ...),
 * written last into stepdir; then the files of stepdir it does not name are removed. 0 or -1
 * with the cause in err. Takes the references of ranks and run. */
int planrt_ckpt_commit(const char *stepdir, json_t *run, json_t **ranks, int nranks, char *err, size_t errn);
/* Removes what an interrupted save left in the --save-every directory dir: temporary files,
 * files no manifest names, step directories without a manifest (only names planrt makes are
 * touched). Then, keep > 0: all but the newest keep complete checkpoints. Returns the number of
 * paths removed. */
int planrt_ckpt_clean(const char *dir, int keep);

/* ------------------------------------------------------------------ reading */

/* Finds the checkpoint path names (a step directory, or a --save-every directory: its newest
 * checkpoint whose manifest and files check out, with a note on stderr for every newer one that
 * does not) and returns its manifest text (malloc'd) and directory (in dir). NULL with the cause
 * in err. */
char *planrt_ckpt_find(const char *path, char *dir, size_t dirn, char *err, size_t errn);
/* A reader over a manifest (its text, as planrt_ckpt_find returned it) in directory dir; rank is
 * the reading rank (-1: none), exact whether rank-local state is read (the same plan). */
planrt_ckpt_t *planrt_ckpt_reader(const char *dir, const char *manifest_text, int rank, int exact, char *err,
				  size_t errn);
json_t *planrt_ckpt_manifest(planrt_ckpt_t *c); /* borrowed */
/* Elements [lo, lo + n) (row-major, of the block at offs of shape block of tensor, whose global
 * shape must be gdims) into dst as f32: 0, or -1 with the cause in err (a tensor or an element
 * the checkpoint lacks, a shape that differs, a file that does not check out). */
int planrt_ckpt_gather(planrt_ckpt_t *c, const char *tensor, int rank, const int64_t *gdims, const int64_t *offs,
		       const int64_t *block, int64_t lo, int64_t n, float *dst, char *err, size_t errn);
void planrt_ckpt_close(planrt_ckpt_t *c);

/* ------------------------------------------------------------------ planrt_main's side */

/* The lock of a --save-every directory (DIR/.planrt-lock, flock): one run writes there at a time.
 * The descriptor to keep open, or -1 with the cause in err. */
int planrt_ckpt_lock(const char *dir, char *err, size_t errn);
/* Every rank: the checkpoint of the steps done (step), with run's fields in the manifest (a
 * reference is taken); then rank 0 prunes to the newest keep (0: all). Ends the job on failure,
 * after removing what it wrote (the checkpoints before stand). */
void planrt_ckpt_save(planrt_ctx_t *ctx, const planrt_stage_t *stage, const char *dir, int64_t step, json_t *run,
		      int keep);
/* Every rank: rank 0 finds the checkpoint path names, every rank reads its manifest; exact when it
 * was written by this program (fingerprint and world). Ends the job on failure. fresh_ok (path is
 * also the run's --save-every directory): a directory without any step-N entry is no failure but
 * a first run, NULL on every rank (a note), so one job script serves the first run and restarts. */
planrt_ckpt_t *planrt_ckpt_resume_open(const char *path, const planrt_program_t *prog, int fresh_ok);

/* PROG --reshard SRC OUT, planc reshard: the checkpoint SRC (any plan of the model) rewritten into
 * OUT/step-N as this program's plan lays it out, by one process without MPI playing each rank in
 * turn (checkpoint.c). reshardable(mode): whether a sync mode's state can be read by another plan
 * (the driver's policy table); SRC's and this plan's mode must both be. 0, or the process ends
 * with the cause (before anything is written when the modes refuse). */
int planrt_ckpt_reshard(const planrt_program_t *prog, const char *src, const char *out,
			int (*reshardable)(const char *sync_mode));
/* Rank-local state read back only when the checkpoint's plan is this one; else skipped (a note). */
int planrt_ckpt_exact(const planrt_ckpt_t *c);
/* PLANRT_TEST_PAUSE (a test hook): "checkpoint:STEP" pauses every rank of the save of step STEP
 * after its files and before its manifest, "save" the --save after the temporary file has its
 * data and before the rename (tests kill -9 the job there): this call sleeps (600 s) when the
 * setting names what (and step). */
void planrt_test_pause(const char *what, int64_t step);

#endif
