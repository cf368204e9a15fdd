/* cores.c: the pipeline's makespan on ranks that share cores (issue 20).
 *
 * On a GPU every rank has a device of its own, and a stage computes at the same rate whether the
 * other stages compute or wait. On a CPU launched with more ranks than cores, a rank's rate is its
 * share of the cores: `planc calibrate` measures the rates with all of a node's ranks busy, and
 * with 1 .. all of them busy (the device's busy table: the speedup over all busy). A pipeline with
 * few micro-batches runs one or two stages at a time while the others wait in a receive (which
 * yields the processor), so those stages compute up to twice as fast as the all-busy rate says.
 *
 * This simulates the schedule table as pipeline.c's simulate() does (the same dependencies and
 * transfer delay), but in time order: at each moment every running action advances at the
 * speedup for the number of ranks busy then (the busy stages times a stage's ranks in a node; the
 * stages taken as spread evenly over the nodes), and the next event is the earliest end of a
 * running action or arrival of a waiting one's input. An action's cost is its seconds at the
 * all-busy rate, so with every stage busy the result is simulate()'s. Events are 2 m v p, each
 * looking at every stage: explain uses it only for a device with a busy table. */
#include "explain/explain.h"

#include <math.h>
#include <stdlib.h>

typedef struct Sim {
	const Schedule *sc;
	int p, v, m, n, nvs;
	double *fdone, *bdone; /* by virtual stage and micro-batch: when its forward / backward ended, or -1 */
	int *next;             /* per stage: its next action in the table */
	double *left;          /* per stage: the running action's remaining all-busy seconds, or -1 (none) */
} Sim;

/* When stage s's next action may start (its input produced and, from another stage, sent), or -1
 * when its input is not produced yet. */
static double ready_at(const Sim *q, int s, double xfer)
{
	Action a = q->sc->table[s][q->next[s]];
	int vs = a.chunk * q->p + s;
	bool fwd = a.kind == ACT_FORWARD;
	double dep = fwd ? (vs == 0 ? 0 : q->fdone[(vs - 1) * q->m + a.micro])
			 : vs == q->nvs - 1 ? q->fdone[vs * q->m + a.micro] : q->bdone[(vs + 1) * q->m + a.micro];
	if (dep < 0)
		return -1;
	bool remote = fwd ? vs > 0 : vs < q->nvs - 1;
	return remote && q->p > 1 ? dep + xfer : dep;
}

static void finish(Sim *q, int s, double now)
{
	Action a = q->sc->table[s][q->next[s]];
	(a.kind == ACT_FORWARD ? q->fdone : q->bdone)[(a.chunk * q->p + s) * q->m + a.micro] = now;
	q->next[s]++;
	q->left[s] = -1;
}

/* Starts every stage whose next action is ready by `now` (one of no cost ends at once); returns
 * the earliest later arrival of a waiting stage's input (HUGE_VAL: none known). */
static double start_ready(Sim *q, const double *fc, const double *bc, double xfer, double now)
{
	double soonest = HUGE_VAL;
	for (int s = 0; s < q->p; s++)
		while (q->left[s] < 0 && q->next[s] < 2 * q->n) {
			double at = ready_at(q, s, xfer);
			if (at < 0)
				break;
			if (at > now) {
				soonest = at < soonest ? at : soonest;
				break;
			}
			Action a = q->sc->table[s][q->next[s]];
			double cost = (a.kind == ACT_FORWARD ? fc : bc)[s * q->v + a.chunk];
			if (cost > 0)
				q->left[s] = cost;
			else
				finish(q, s, now);
		}
	return soonest;
}

double explain_shared_makespan(const Graph *g, const double *fc, const double *bc, double xfer, const Device *d,
			       double stage_ranks)
{
	const Schedule *sc = g->sched;
	Sim q = {sc, sc->stages, sc->chunks, sc->micro, sc->micro * sc->chunks, sc->stages * sc->chunks, NULL, NULL, NULL, NULL};
	q.fdone = malloc(sizeof(double) * (size_t)(q.nvs * q.m));
	q.bdone = malloc(sizeof(double) * (size_t)(q.nvs * q.m));
	q.next = calloc((size_t)q.p, sizeof(int));
	q.left = malloc(sizeof(double) * (size_t)q.p);
	if (!q.fdone || !q.bdone || !q.next || !q.left)
		ICE("out of memory");
	for (int i = 0; i < q.nvs * q.m; i++)
		q.fdone[i] = q.bdone[i] = -1;
	for (int s = 0; s < q.p; s++)
		q.left[s] = -1;
	double now = 0;
	for (int remaining = 2 * q.n * q.p;;) {
		double arrival = start_ready(&q, fc, bc, xfer, now);
		int busy = 0;
		for (int s = 0; s < q.p; s++)
			busy += q.left[s] >= 0;
		remaining = 0;
		for (int s = 0; s < q.p; s++)
			remaining += 2 * q.n - q.next[s];
		if (remaining == 0)
			break;
		if (busy == 0 && arrival == HUGE_VAL)
			ICE("pipeline schedule deadlocks");
		double speed = device_busy_speedup(d, busy * stage_ranks), step = arrival - now;
		for (int s = 0; s < q.p; s++)
			if (q.left[s] >= 0 && q.left[s] / speed < step)
				step = q.left[s] / speed;
		now += step;
		for (int s = 0; s < q.p; s++)
			if (q.left[s] >= 0) {
				q.left[s] -= step * speed;
				if (q.left[s] <= 1e-12 * (now > 0 ? now : 1))
					finish(&q, s, now);
			}
	}
	free(q.fdone);
	free(q.bdone);
	free(q.next);
	free(q.left);
	return now;
}
