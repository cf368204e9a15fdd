/* report.c: what a run reports besides its log. The PLANRT_REPORT_* lines, one per rank on stderr
 * (memory: the arena's measured high-water mark against its plan, the state by kind, peak RSS;
 * timing: busy, waiting and update seconds; comm: calls and bytes per collective kind and mesh
 * axis), which the tests hold against planc explain; the PLANRT_STRAGGLER test hook; and the
 * --trace file's process names. */
#include "driver.h"
#include "planrt_device.h"
#include "planrt_offload.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static size_t arena_high_water(const unsigned char *arena, size_t bytes)
{
	size_t high = bytes / 8;
	while (high > 0) {
		uint64_t w;
		memcpy(&w, arena + 8 * (high - 1), 8);
		if (w != PLANRT_ARENA_CANARY)
			break;
		high--;
	}
	return 8 * high;
}

static void report_comm(int rank, const planrt_program_t *p)
{
	for (int k = 0; k < planrt_coll_kinds; k++)
		for (int gi = 0; gi < p->naxes + 2; gi++) {
			int group = gi < p->naxes ? gi : gi == p->naxes ? PLANRT_GROUP_PAIR : PLANRT_GROUP_WORLD;
			uint64_t calls = planrt_calls_by((planrt_coll_t)k, group);
			if (!calls)
				continue;
			const char *name = group == PLANRT_GROUP_PAIR	 ? "pair"
					   : group == PLANRT_GROUP_WORLD ? "world"
					   : p->axis_names && p->axis_names[group] ? p->axis_names[group]
										    : "?";
			fprintf(stderr, "planrt: rank %d: comm kind=%s group=%s calls=%llu bytes=%llu\n", rank,
				planrt_coll_name((planrt_coll_t)k), name, (unsigned long long)calls,
				(unsigned long long)planrt_bytes_sent_by((planrt_coll_t)k, group));
		}
}

/* PLANRT_STRAGGLER=RANK:MS or random:MS: the delay (seconds) this rank sleeps at the start of
 * step; random picks one rank per step from (seed, step). */
static double straggler_delay(const char *setting, int rank, int world, uint64_t seed, int64_t step)
{
	if (!setting || !*setting)
		return 0;
	const char *colon = strchr(setting, ':');
	char *end = NULL;
	double ms = colon ? strtod(colon + 1, &end) : -1;
	int random = colon && !strncmp(setting, "random", (size_t)(colon - setting)) && colon - setting == 6;
	long who = random ? -1 : colon ? strtol(setting, &end, 10) : -1;
	if (!colon || ms < 0 || (!random && (who < 0 || who >= world || end != colon)))
		planrt_fatal("PLANRT_STRAGGLER='%s': expected RANK:MS (a rank below %d) or random:MS", setting, world);
	if (random) {
		uint32_t r[4];
		planrt_philox(seed, 0x5374726167676c65ull /* "Straggle" */, (uint64_t)step, r);
		who = (long)(r[0] % (uint32_t)world);
	}
	return who == rank ? ms * 1e-3 : 0;
}

static void sleep_s(double s)
{
	struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
	while (s > 0 && nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

void planrt_report_run_(int rank, int stage_index, const planrt_program_t *p, const planrt_stage_t *stage,
			const size_t *kind_bytes, size_t state_bytes, long long timed_steps, double timed_s, double wait_s,
			double update_s)
{
	if (getenv("PLANRT_REPORT_MEMORY"))
		fprintf(stderr,
			"planrt: rank %d: memory arena_high_water=%zu arena_planned=%zu state=%zu peak_rss=%zu stage=%d "
			"param=%zu grad=%zu optim=%zu master=%zu buffer=%zu metric=%zu offload=%zu disk=%lld%s\n",
			rank, arena_high_water(planrt_arena_snapshot(), stage->arena_bytes), stage->arena_bytes, state_bytes,
			planrt_peak_rss_bytes(), stage_index, kind_bytes[planrt_state_param], kind_bytes[planrt_state_grad],
			kind_bytes[planrt_state_optim], kind_bytes[planrt_state_master], kind_bytes[planrt_state_buffer],
			kind_bytes[planrt_state_metric], kind_bytes[planrt_state_offload], (long long)planrt_offload_bytes(),
			planrt_device_report());
	if (getenv("PLANRT_REPORT_TIMING"))
		fprintf(stderr, "planrt: rank %d: timing stage=%d steps=%lld step_s=%.6f busy_s=%.6f wait_s=%.6f update_s=%.6f\n",
			rank, stage_index, timed_steps, timed_s, timed_s - wait_s, wait_s, update_s);
	if (getenv("PLANRT_REPORT_COMM"))
		report_comm(rank, p);
	if (getenv("PLANRT_REPORT_ATTENTION")) /* the fused attention's work: equal on every rank of a balanced ring */
		fprintf(stderr,
			"planrt: rank %d: attention tiles forward=%lld backward=%lld scores forward=%lld backward=%lld "
			"seconds=%.6f stage=%d\n",
			rank, planrt_attention_tiles_[0], planrt_attention_tiles_[1], planrt_attention_scores_[0],
			planrt_attention_scores_[1], planrt_attention_s_, stage_index);
}

void planrt_straggle_(const char *setting, int rank, int world, uint64_t seed, int64_t step)
{
	sleep_s(straggler_delay(setting, rank, world, seed, step));
}

/* --trace: every rank's events joined into the file, each rank named by its mesh coordinates; 0, or
 * -1 on every rank when the file could not be written */
int planrt_trace_close_ranks_(const planrt_program_t *p)
{
	char name[256];
	int len = snprintf(name, sizeof name, "rank %d", planrt_world_rank_());
	for (int a = 0; a < p->naxes && len > 0 && (size_t)len < sizeof name; a++)
		len += snprintf(name + len, sizeof name - (size_t)len, "%s%s %d", a ? ", " : " (",
				p->axis_names && p->axis_names[a] ? p->axis_names[a] : "?", planrt_mesh_coord(a));
	if (p->naxes > 0 && len > 0 && (size_t)len < sizeof name)
		snprintf(name + len, sizeof name - (size_t)len, ")");
	return planrt_trace_close_(name);
}
