/* train.c: the step loop. Each step runs the stage's step_begin, walks its action table and runs
 * step_end (the update); then its loss and gradient norm are checked (a value that is not finite
 * stops the run before anything is written from that state), fp16 loss scaling's verdict is
 * applied, the held-out loss is computed every --eval-every steps, rank 0 logs the step and prints
 * progress, and every --save-every steps a sharded checkpoint is written.
 *
 * Local SGD logs a step's loss when its replicas average: the log's rows wait in a window until
 * the loss of their step is known. */
#include "driver.h"
#include "../io/planrt_dataset.h"
#include "planrt_cpu.h"
#include "planrt_device.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* a pending log row (ROW_EVAL NaN: no evaluation; ROW_ACCURACY NaN: none, or not a classification) */
enum { ROW_LR, ROW_NORM, ROW_SECONDS, ROW_EVAL, ROW_ACCURACY, ROW };

typedef struct log_rows {
	int window;      /* steps whose loss one average makes known (1: every step) */
	double *pending; /* [window][ROW] */
	double *kept;    /* the window's losses, kept across an evaluation */
	double shown;    /* the loss the progress line shows */
} log_rows_t;

/* The async master's versions for the log: "versions":[...],"staleness":max. */
static void log_versions(const planrt_stage_t *stage)
{
	if (!stage->versions || !*stage->versions || stage->nversions < 1)
		return;
	const double *v = *stage->versions;
	char text[1024];
	int at = snprintf(text, sizeof text, "\"versions\":[");
	double worst = 0;
	for (int i = 0; i < stage->nversions && at < (int)sizeof text - 64; i++) {
		at += snprintf(text + at, sizeof text - (size_t)at, "%s%.0f", i ? "," : "", v[i]);
		if (v[0] - v[i] > worst)
			worst = v[0] - v[i];
	}
	snprintf(text + at, sizeof text - (size_t)at, "],\"staleness\":%.0f", worst);
	planrt_log_fields(text);
}

/* One step's phases; the seconds it took and, of them, those outside the walk (the update). */
static double run_step(run_t *r, int64_t step, double *update_s)
{
	planrt_ctx_t *ctx = r->ctx;
	const planrt_stage_t *stage = r->stage;
	double t0 = planrt_now();
	ctx->loss_scale = planrt_loss_scaler_scale_(&r->scaler);
	ctx->step_skipped = 0;
	planrt_straggle_(getenv("PLANRT_STRAGGLER"), r->rank, r->world, r->seed, step);
	ctx->step = step;
	ctx->step_seed = r->seed * 0x9E3779B97F4A7C15ull + (uint64_t)step;
	planrt_clear_action_(ctx);
	planrt_where_(step, "step_begin", -1, -1);
	planrt_trace_phase_("step", step);
	if (stage->step_begin)
		stage->step_begin(ctx);
	double t_walk = planrt_now();
	planrt_walk_(&r->walker);
	double t_end = planrt_now();
	planrt_where_(step, "update", -1, -1);
	if (planrt_tracing_)
		planrt_trace_begin_("update", "compute");
	if (stage->step_end)
		stage->step_end(ctx);
	planrt_trace_end_(NULL);
	planrt_trace_end_(NULL); /* the step */
	*update_s = planrt_now() - t_end + (t_walk - t0);
	return planrt_now() - t0;
}

/* --eval-every: the held-out loss after step (NaN when not evaluated), and a classification's
 * accuracy into *accuracy. The held-out forward passes compute their loss where the step's is: the
 * step's is kept for the log. */
static double evaluate(run_t *r, walker_t *evaluator, log_rows_t *rows, int64_t step, double *accuracy)
{
	const planrt_stage_t *stage = r->stage;
	*accuracy = NAN;
	if (!r->opt->eval_every || (step + 1) % r->opt->eval_every != 0)
		return NAN;
	int nkept = stage->loss && *stage->loss ? rows->window : 0;
	for (int i = 0; i < nkept; i++)
		rows->kept[i] = (*stage->loss)[i];
	planrt_trace_phase_("evaluation", step);
	double eval = planrt_evaluate_(evaluator, stage, r->ctx, r->opt->eval_batches, step, accuracy);
	planrt_trace_end_(NULL);
	for (int i = 0; i < nkept; i++)
		(*stage->loss)[i] = rows->kept[i];
	return eval;
}

/* rank 0: the step's row, logged with the rows before it once its loss is known; the progress line */
static void log_step(run_t *r, log_rows_t *rows, int64_t step, const double *row, int known, double step_scale,
		     int skipped)
{
	const planrt_stage_t *stage = r->stage;
	/* a data set's samples are not token windows: its throughput is samples/s */
	int64_t samples = r->program->batch, tokens = planrt_data_set(r->ctx->data) ? 0 : samples * r->program->seq;
	int window = rows->window;
	double *mine = rows->pending + (step % window) * ROW;
	for (int k = 0; k < ROW; k++)
		mine[k] = row[k];
	if (known || r->stopped >= 0) {
		/* (a resumed run logs from where it resumed; the window's earlier rows were logged) */
		for (int64_t s = step - step % window > r->first_step ? step - step % window : r->first_step; s <= step; s++) {
			const double *w = rows->pending + (s % window) * ROW;
			rows->shown = stage->loss && *stage->loss ? (*stage->loss)[s % window] : NAN;
			log_versions(stage);
			if (r->scaler.scaled) { /* fp16 runs are strict: the window is this one step */
				char f[96];
				snprintf(f, sizeof f, "\"loss_scale\":%.9g,\"skipped\":%s", step_scale, skipped ? "true" : "false");
				planrt_log_fields(f);
			}
			if (!isnan(w[ROW_EVAL])) {
				char f[96];
				int n = snprintf(f, sizeof f, "\"eval_loss\":%.9g", w[ROW_EVAL]);
				if (!isnan(w[ROW_ACCURACY]))
					snprintf(f + n, sizeof f - (size_t)n, ",\"eval_accuracy\":%.9g", w[ROW_ACCURACY]);
				planrt_log_fields(f);
			}
			planrt_log_step_(s, rows->shown, w[ROW_LR], w[ROW_NORM], tokens, samples, w[ROW_SECONDS] * 1e3);
		}
	}
	double step_s = row[ROW_SECONDS];
	double per_step = tokens ? (double)tokens : (double)samples;
	planrt_progress_(step + 1, r->opt->steps, rows->shown, step_s > 0 ? per_step / step_s : 0,
			 tokens ? "tok/s" : "samples/s", planrt_now() - r->start);
	if (!isnan(row[ROW_EVAL]) && !isnan(row[ROW_ACCURACY]))
		fprintf(stderr, "eval after step %lld: held-out loss %.4f, accuracy %.2f%% (%lld batches)\n", (long long)step + 1,
			row[ROW_EVAL], 100 * row[ROW_ACCURACY], (long long)r->opt->eval_batches);
	else if (!isnan(row[ROW_EVAL]))
		fprintf(stderr, "eval after step %lld: held-out loss %.4f (%lld batches)\n", (long long)step + 1, row[ROW_EVAL],
			(long long)r->opt->eval_batches);
}

/* --save-every: the checkpoint of the steps done */
static void checkpoint(run_t *r, int64_t done)
{
	planrt_clear_action_(r->ctx);
	json_t *run = planrt_run_info_(r->program, r->opt, done, r->seed, r->ctx->data, r->train_tokens);
	if (r->scaler.scaled && json_object_set_new(run, "loss_scaling", planrt_loss_scaler_state_(&r->scaler)))
		planrt_fatal("out of memory describing a checkpoint");
	planrt_trace_phase_("checkpoint", done);
	planrt_ckpt_save(r->ctx, r->stage, r->opt->save_every_dir, done, run, (int)r->opt->keep);
	planrt_trace_end_(NULL);
	json_decref(run);
	r->saved_step = done;
}

/* rank 0: why the run stopped, and that nothing was written from that state */
static void report_stop(const run_t *r)
{
	const options_t *o = r->opt;
	const planrt_stage_t *stage = r->stage;
	if (r->scaling_gave_up)
		fprintf(stderr,
			"planrt: rank 0: step %lld: %lld steps in a row skipped by loss scaling (--max-skips %lld): the "
			"gradients overflow at every scale tried, down to %g; training stopped: nothing is written from "
			"this state; lower the learning rate, clip the gradients or use bf16 precision\n",
			(long long)r->stopped, (long long)r->scaler.skips_in_row, (long long)o->max_skips,
			r->scaler.dynamic ? r->scaler.scale * 2 : r->scaler.scale);
	else
		fprintf(stderr,
			"planrt: rank 0: step %lld: the loss is %g and the gradient norm %g; training stopped: nothing is written "
			"from this state (%s%s%s%s%s); lower the learning rate, clip the gradients (clip = 1.0) or resume from "
			"the last checkpoint\n",
			(long long)r->stopped, stage->loss && *stage->loss ? **stage->loss : NAN,
			stage->grad_norm && *stage->grad_norm ? **stage->grad_norm : NAN, o->save ? "--save '" : "no --save",
			o->save ? o->save : "", o->save ? "' is left as it was" : "",
			o->save_every_dir ? "; the checkpoints keep the last good state" : "",
			o->save_every_dir && r->saved_step > 0 ? ", the newest of it" : "");
}

void planrt_train_(run_t *r)
{
	const options_t *o = r->opt;
	const planrt_stage_t *stage = r->stage;
	planrt_ctx_t *ctx = r->ctx;
	log_rows_t rows = {.window = stage->loss_window > 1 ? stage->loss_window : 1, .shown = NAN};
	rows.pending = calloc((size_t)rows.window * ROW, sizeof(double));
	rows.kept = calloc((size_t)rows.window, sizeof(double));
	if (!rows.pending || !rows.kept)
		planrt_fatal("out of memory for %d log rows", rows.window);
	planrt_stage_t fwd = o->eval_every ? planrt_forward_stage_(stage) : *stage;
	walker_t evaluator = {&fwd, ctx, r->walker.reqs, r->walker.own, 0};
	r->stopped = -1;
	r->saved_step = r->first_step;
	r->start = planrt_now();
	char cpu_members[128]; /* the first line of the log names rank 0's instruction-set level */
	planrt_cpu_log_members(cpu_members, sizeof cpu_members);
	planrt_log_fields(cpu_members);
	for (int64_t step = r->first_step; step < o->steps; step++) {
		/* waits: the host's (CPU collectives, pipeline finishes) and a GPU's compute stream's */
		double wait0 = ctx->wait_s + planrt_device_comm_wait_s(), update_s;
		double step_scale = planrt_loss_scaler_scale_(&r->scaler);
		double step_s = run_step(r, step, &update_s);
		if (step > r->first_step || o->steps == r->first_step + 1) { /* the first step warms up */
			r->timed_s += step_s;
			r->timed_wait_s += ctx->wait_s + planrt_device_comm_wait_s() - wait0;
			r->timed_update_s += update_s;
			r->timed_steps++;
		}
		/* a loss or gradient norm that is not finite: stop before anything is written from this
		 * state (the loss is known when the step's row is: local SGD knows it at averages) */
		int known = rows.window == 1 || (step + 1) % rows.window == 0 || step == o->steps - 1;
		double loss_now = known && stage->loss && *stage->loss ? (*stage->loss)[step % rows.window] : 0;
		double norm = stage->grad_norm && *stage->grad_norm ? **stage->grad_norm : NAN;
		double norm_now = stage->grad_norm && *stage->grad_norm ? norm : 0;
		int skipped = r->scaler.scaled && ctx->step_skipped; /* the same verdict on every rank */
		if (planrt_loss_scaler_update_(&r->scaler, skipped)) {
			r->scaling_gave_up = 1;
			r->stopped = step;
		}
		if (!skipped && (!isfinite(loss_now) || !isfinite(norm_now))) {
			if (!r->sync->replicas_agree) /* each replica has its own: this one's verdict ends the job */
				planrt_fatal("step %lld: the loss is %g and the gradient norm %g on this replica; training stopped "
					     "before writing anything from this state; lower the learning rate or clip the gradients",
					     (long long)step, loss_now, norm_now);
			r->stopped = step; /* every rank sees the same reduced values and stops here */
			r->scaling_gave_up = 0;
		}
		double accuracy = NAN, eval = r->stopped < 0 ? evaluate(r, &evaluator, &rows, step, &accuracy) : NAN;
		if (r->rank == 0) {
			const planrt_program_t *p = r->program;
			double row[ROW] = {planrt_lr_at(p->lr, step, p->warmup, p->total_steps, p->min_lr), norm, step_s, eval,
					   accuracy};
			log_step(r, &rows, step, row, known, step_scale, skipped);
		}
		if (r->stopped >= 0)
			break;
		if (o->save_every_dir && ((step + 1) % o->save_every == 0 || step == o->steps - 1))
			checkpoint(r, step + 1);
	}
	free(rows.pending);
	free(rows.kept);
	if (fwd.actions != stage->actions)
		free((void *)fwd.actions);
	if (r->stopped >= 0 && r->rank == 0)
		report_stop(r);
}
