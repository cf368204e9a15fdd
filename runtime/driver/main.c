/* main.c: planrt_main, the part of every generated program that is the same for all of them.
 *
 * A generated program is tables (mesh, parameters, state buffers, the arena layout, one action
 * table per pipeline stage) and phase functions; planrt_main(argc, argv, &PROGRAM) does the rest
 * in one place, so that flag parsing, the world-size check, allocation, --init / --save, the data
 * file, the step loop, progress, metrics and the measurement hooks the tests rely on are written
 * once instead of printed into every program:
 *
 *   1. --help is answered before MPI starts (a single process without mpirun works); --reshard
 *      runs without MPI; then planrt_init, the world size against the plan, the mesh, the
 *      options' errors and what the plan's sync mode allows (policy.c);
 *   2. the paths the run reads and writes are checked and --save probed before anything
 *      expensive (run_files.c), --log and --trace opened;
 *   3. this rank's stage (its pipe coordinate) gets its state buffers (zeroed, 64-byte aligned,
 *      counted per kind), its arena (every word set to a canary, whose highest overwritten word
 *      is the measured high-water mark) and its slots' request sets;
 *   4. data, --init or the checkpoint resumed, stage->init;
 *   5. the steps (train.c);
 *   6. --save (io/save.c), the PLANRT_REPORT_* lines (report.c), planrt_finalize; the exit status
 *      is 1 when the run stopped early or an output (--log, --trace) could not be written. */
#include "driver.h"
#include "planrt_kernels.h"

#include "../io/planrt_namemap.h"
#include "../io/planrt_save.h"
#include "planrt_outfile.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* What this rank holds for the run: its state buffers (by kind) and the arena's request sets. */

/* 1. the options' errors and what the plan's sync mode allows, after planrt_init (every rank
 * reports the same) */
static void check_options(options_t *o, const planrt_program_t *p, const sync_policy_t *sync, const char *prog_name)
{
	if (!o->error[0] && p->loss_scale == 0 && (o->max_skips_given || o->loss_scale_init > 0))
		planrt_option_error_(o, "%s applies to fp16 plans with loss scaling (plan %s has none); leave it out",
				     o->max_skips_given ? "--max-skips" : "--loss-scale-init", p->plan);
	if (o->error[0])
		planrt_fatal("%s; usage: %s %s (--help explains)", o->error, prog_name, planrt_usage_line_);
	if (!sync->checkpoints && (o->save_every_dir || o->resume))
		planrt_fatal("sync %s plans cannot checkpoint: their workers' gradients and parameter versions are in "
			     "flight at every step boundary; use --save for the final weights, or sync strict / local_sgd",
			     sync->name);
	if (!sync->evaluates && o->eval_every)
		planrt_fatal("--eval-every: sync %s plans do not evaluate (their replicas hold parameter versions of "
			     "different ages); evaluate the saved weights with a strict plan",
			     sync->name);
	if (o->map && !o->init && !o->save)
		planrt_fatal("--map applies to --init and --save; pass one of them, or drop --map");
}

/* 2. the run's files: rank 0 checks every path, cleans what killed runs left and locks the
 * checkpoint directory (the descriptor to keep open, or -1); --log and --trace are opened */
static int open_run_files(const options_t *o, int rank)
{
	int ckpt_lock = -1;
	planrt_on_signal_(planrt_outfile_stop);
	if (rank == 0) {
		planrt_check_run_files_(o);
		if (o->save)
			planrt_outfile_remove_stale(o->save);
		if (o->save_every_dir) {
			char err[1024];
			if ((ckpt_lock = planrt_ckpt_lock(o->save_every_dir, err, sizeof err)) < 0)
				planrt_fatal("%s", err);
			planrt_ckpt_clean(o->save_every_dir, (int)o->keep);
		}
	}
	if (o->log && rank == 0)
		PLANRT_CHECK(planrt_log_open_(o->log, o->resume != NULL));
	if (o->trace) /* every rank (the origin of its clock is agreed on) */
		planrt_trace_open_(o->trace);
	return ckpt_lock;
}

/* 4. the data, then the weights: --init (or drawn from the seed) through stage->init, then the
 * checkpoint --resume names read over them; sets the run's seed, first step and loss scaling */
static void start(run_t *r)
{
	const options_t *o = r->opt;
	const planrt_program_t *program = r->program;
	const planrt_stage_t *stage = r->stage;
	planrt_ctx_t *ctx = r->ctx;
	struct stat resume_st, every_st;
	int fresh_ok = o->resume && o->save_every_dir && stat(o->resume, &resume_st) == 0 &&
		       stat(o->save_every_dir, &every_st) == 0 && resume_st.st_dev == every_st.st_dev &&
		       resume_st.st_ino == every_st.st_ino; /* --resume DIR --save-every N DIR: a first run too */
	planrt_ckpt_t *resume = o->resume ? planrt_ckpt_resume_open(o->resume, program, fresh_ok) : NULL;
	planrt_data_config_t data = {.nfiles = o->ndata, .files = o->data_files, .weights = o->blend ? o->data_weights : NULL,
				     .neval = o->neval, .eval_files = o->eval_files,
				     .eval_weights = o->eval_blend ? o->eval_weights : NULL, .vocab = program->vocab,
				     .seq = program->seq, .batch = program->batch,
				     .sampling = planrt_resume_sampling_(resume, o), .evaluate = o->eval_every > 0};
	PLANRT_CHECK(planrt_data_open_run_(&data, &ctx->data));
	r->train_tokens = planrt_data_train_samples_(ctx->data);
	json_t *scaling = NULL; /* fp16 loss scaling's state as the checkpoint left it */
	r->first_step = 0;
	if (resume) {
		r->first_step = planrt_check_resume_(resume, program, o, ctx->data, r->train_tokens, &ctx->seed, r->rank);
		scaling = json_object_get(planrt_ckpt_manifest(resume), "loss_scaling");
	}
	if (o->log && r->rank == 0)
		PLANRT_CHECK(planrt_log_truncate_(r->first_step));
	planrt_loss_scaler_init_(&r->scaler, program, o, scaling);
	r->seed = ctx->seed;
	if (o->init)
		PLANRT_CHECK(planrt_st_open(o->init, &ctx->init_file));
	if (ctx->name_map && ctx->init_file)
		PLANRT_CHECK(planrt_namemap_check_file(ctx->name_map, ctx->init_file, o->init));
	planrt_where_(-1, "init", -1, -1);
	planrt_trace_phase_("init", -1);
	if (stage->init)
		stage->init(ctx);
	planrt_trace_end_(NULL);
	planrt_st_close(ctx->init_file);
	ctx->init_file = NULL;
	if (resume) {
		planrt_where_(-1, "resume", -1, -1);
		ctx->ckpt = resume;
		planrt_trace_phase_("resume", r->first_step);
		if (stage->resume)
			stage->resume(ctx);
		planrt_trace_end_(NULL);
		ctx->ckpt = NULL;
		planrt_ckpt_close(resume);
		if (r->rank == 0)
			fprintf(stderr, "planrt: resumed at step %lld from '%s'\n", (long long)r->first_step, o->resume);
	}
}

int planrt_main(int argc, char **argv, const planrt_program_t *program)
{
	if (planrt_generate_wanted_(argc, argv)) /* --generate: the decode program continues a prompt */
		return planrt_generate_(argc, argv, program);
	options_t opt;
	planrt_parse_options_(argc, argv, &opt);
	const char *prog_name = argc > 0 && argv[0] ? argv[0] : "prog";
	if (opt.help) {
		if (planrt_launcher_rank0_())
			planrt_print_help_(prog_name, program);
		return 0;
	}
	/* --reshard: one process, no MPI (the ranks are played in turn) */
	if (opt.reshard_from && opt.error[0])
		planrt_fatal("%s; usage: %s --reshard CHECKPOINT OUT_DIR", opt.error, prog_name);
	if (opt.reshard_from && !planrt_sync_policy_(program)->checkpoints)
		planrt_fatal("--reshard: plan %s is sync %s, whose runs cannot checkpoint; reshard into a strict plan",
			     program->plan, planrt_sync_policy_(program)->name);
	if (opt.reshard_from)
		return planrt_ckpt_reshard(program, opt.reshard_from, opt.reshard_to, planrt_sync_reshardable_);

	/* 1. the world and the mesh */
	int rank, world;
	planrt_start_world_(&argc, &argv, program, &rank, &world); /* start.c */
	const sync_policy_t *sync = planrt_sync_policy_(program);
	check_options(&opt, program, sync, prog_name);

	/* 2. the paths the run reads and writes, before any work */
	int ckpt_lock = open_run_files(&opt, rank);
	planrt_ctx_t ctx = {.seed = opt.seed, .steps = opt.steps, .eval_batch = -1, .loss_scale = 1.0, .program = program};
	if (opt.map)
		PLANRT_CHECK(planrt_namemap_open(opt.map, program, &ctx.name_map));

	/* 3. this rank's stage and role, its state and its arena */
	int stage_index = program->pipe_axis >= 0 ? planrt_mesh_coord(program->pipe_axis) : 0;
	int nroles = program->nroles > 1 ? program->nroles : 1;
	int role = nroles > 1 && planrt_mesh_coord(program->role_axis) != 0 ? 1 : 0; /* 0: the async master */
	planrt_check_program_(program, stage_index * nroles + role);
	const planrt_stage_t *stage = &program->stages[stage_index * nroles + role];
	holdings_t held = {.state_bytes = 0};
	planrt_stage_allocate_(stage, &held);
	ctx.arena = held.arena;

	/* 4. data, initial weights (or the checkpoint resumed); 5. the steps */
	run_t run = {.program = program, .stage = stage, .opt = &opt, .sync = sync, .ctx = &ctx, .rank = rank,
		     .world = world, .walker = {stage, &ctx, held.reqs, held.own, 0}};
	start(&run);
	planrt_train_(&run);

	/* 6. the weights and the reports */
	planrt_clear_action_(&ctx);
	planrt_where_(-1, "save", -1, -1);
	if (opt.save && run.stopped < 0) {
		planrt_trace_phase_("save", opt.steps);
		planrt_save_weights_(&ctx, stage, opt.save, opt.map, rank);
		planrt_trace_end_(NULL);
	}
	planrt_namemap_close(ctx.name_map);
	ctx.name_map = NULL;
	int outputs_lost = opt.trace && planrt_trace_close_ranks_(program) != 0; /* the causes are printed */
	planrt_report_run_(rank, stage_index, program, stage, held.kind_bytes, held.state_bytes, run.timed_steps, run.timed_s,
			   run.timed_wait_s, run.timed_update_s);
	outputs_lost |= planrt_log_close() != 0;
	planrt_data_close(ctx.data);
	planrt_input_release_();
	planrt_stage_release_(stage, &held);
	planrt_where_(-1, "finalize", -1, -1);
	PLANRT_CHECK(planrt_finalize());
	if (ckpt_lock >= 0)
		close(ckpt_lock);
	return run.stopped >= 0 || outputs_lost ? 1 : 0;
}
