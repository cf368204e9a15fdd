/* svg.c: `planc explain --svg FILE`, the plan's step as a picture.
 *
 * Two panels over one time axis, one row per rank role (pipeline stage, or async master and
 * workers):
 *   schedule   every action of the stage's schedule table as a box (forward blue, backward green,
 *              lighter for a second model chunk), labelled with its micro-batch; the idle time
 *              between them hatched (the bubble); each pipeline transfer as an arrow from the
 *              action that sends to the moment it arrives; the update phase (gradient sync,
 *              clipping, optimizer) after the last stage finishes;
 *   memory     what the rank's allocation holds live over the step, stacked: the persistent state
 *              (parameters, gradients, optimizer states, metrics), the receive inboxes, one
 *              activation slot per micro-batch between the start of its forward and the end of its
 *              backward, and the transient region while an action or the update runs; a dashed
 *              line at what the program allocates (explain's peak).
 * The times are the ones explain's estimated step time uses (explain_step_costs: each kernel's
 * roofline cost on the assumed device at the speed the step computes where ranks share cores,
 * transfers between stages, the schedule simulated by
 * pipeline_timeline), and the memory is the program's memory plan (memplan.c), so the picture and
 * the text report cannot disagree. Elements carry classes (forward, backward, idle, send, update,
 * state, inbox, slots, transient, allocated) for tests and for styling. The picture goes to the
 * stream the caller opened (main.c writes the file by planrt_outfile's rule). */
#include "explain/explain.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum {
	WIDTH = 1400,
	LEFT = 190,          /* row labels */
	RIGHT = 40,
	LANE = 26,           /* a schedule row */
	LANE_GAP = 8,
	MEM = 90,            /* a memory chart */
	MEM_GAP = 34,
	MAX_SENDS = 4000,    /* more arrows than this would hide the boxes */
	MAX_LABELS = 3000,   /* box labels, likewise */
};

typedef struct Row {
	const LProg *lp;
	const char *name;
	int stage;
	double *start, *end; /* per action of the stage's table */
	double makespan;     /* when the role's last stage finishes: its update starts */
	double update;       /* the update phase's length */
} Row;

typedef struct Svg {
	FILE *f;
	Graph *g;
	const Lowered *low;
	Row *rows;
	int nrows;
	int n;               /* actions per stage: 2 x micro-batches x chunks */
	double makespan;     /* the last action's end over every row */
	double total;        /* the time axis: every row's update done */
	double est_pipeline, est_step; /* explain's estimate (async: the workers') */
	double xfer;
	double px;           /* pixels per second */
} Svg;

static double xat(const Svg *S, double t)
{
	return LEFT + t * S->px;
}

static void text(FILE *f, double x, double y, const char *anchor, const char *cls, const char *fmt, ...)
	__attribute__((format(printf, 6, 7)));
static void text(FILE *f, double x, double y, const char *anchor, const char *cls, const char *fmt, ...)
{
	char buf[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" class=\"%s\">", x, y, anchor, cls);
	for (const char *c = buf; *c; c++) {
		switch (*c) {
		case '<': fputs("&lt;", f); break;
		case '>': fputs("&gt;", f); break;
		case '&': fputs("&amp;", f); break;
		case '"': fputs("&quot;", f); break;
		default: fputc(*c, f);
		}
	}
	fputs("</text>\n", f);
}

/* A time in the axis's unit. */
static double unit_scale(double total, const char **unit)
{
	if (total >= 1) {
		*unit = "s";
		return 1;
	}
	if (total >= 1e-3) {
		*unit = "ms";
		return 1e3;
	}
	*unit = "us";
	return 1e6;
}

/* A round tick step (1, 2 or 5 times a power of ten) giving about 8 ticks over total. */
static double tick_step(double total)
{
	double raw = total / 8, p = pow(10, floor(log10(raw))), m = raw / p;
	return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

static void time_axis(const Svg *S, double y)
{
	FILE *f = S->f;
	const char *unit;
	double scale = unit_scale(S->total, &unit), step = tick_step(S->total);
	fprintf(f, "<g class=\"axis\">\n<line x1=\"%d\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" class=\"axisline\"/>\n", LEFT, y,
		xat(S, S->total), y);
	for (int i = 0; i * step <= S->total * 1.0001; i++) {
		double t = i * step, x = xat(S, t);
		fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" class=\"axisline\"/>\n", x, y, x, y + 5);
		text(f, x, y + 17, "middle", "tick", "%.4g", t * scale);
	}
	text(f, LEFT - 10, y + 17, "end", "tick", "time (%s)", unit);
	fputs("</g>\n", f);
}

/* A legend: a swatch (a box, or a line when line) and a label per entry, wrapped at the right
 * edge; entries with a NULL class are left out. */
typedef struct LegendItem {
	const char *cls, *label;
	bool line;
} LegendItem;

static void legend(FILE *f, double y, const LegendItem *items, int n)
{
	fputs("<g class=\"legend\">\n", f);
	double x = LEFT;
	for (int i = 0; i < n; i++) {
		if (!items[i].cls)
			continue;
		double w = 40 + 6.3 * (double)strlen(items[i].label);
		if (x > LEFT && x + w > WIDTH - RIGHT) {
			x = LEFT;
			y += 20;
		}
		if (items[i].line)
			fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" class=\"%s\"/>\n", x, y - 4, x + 14,
				y - 4, items[i].cls);
		else
			fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"14\" height=\"14\" class=\"%s\"/>\n", x, y - 11,
				items[i].cls);
		text(f, x + 19, y, "start", "label", "%s", items[i].label);
		x += w;
	}
	fputs("</g>\n", f);
}

static void schedule_legend(const Svg *S, double y, bool sends_drawn, int nsends)
{
	bool chunks = S->g->sched && S->g->sched->chunks > 1;
	const LegendItem items[] = {
		{"forward", "forward of a micro-batch", false},
		{chunks ? "forward c1" : NULL, "forward, second model chunk", false},
		{"backward", "backward of a micro-batch", false},
		{chunks ? "backward c1" : NULL, "backward, second model chunk", false},
		{"idle", "idle (pipeline bubble)", false},
		{"update", "update: gradient sync, optimizer", false},
		{nsends > 0 ? "send" : NULL,
		 sends_drawn ? "transfer between stages (arrow: its arrival)"
			     : arena_printf(S->g->arena, "%d transfers between stages (too many to draw)", nsends),
		 true},
	};
	legend(S->f, y, items, (int)(sizeof items / sizeof items[0]));
}

/* ------------------------------------------------------------------ the schedule panel */

static bool action_remote(const Schedule *sc, int s, Action a, int *to)
{
	int p = sc->stages, nvs = p * sc->chunks, vs = a.chunk * p + s;
	if (a.kind == ACT_FORWARD && vs < nvs - 1) {
		*to = (vs + 1) % p;
		return true;
	}
	if (a.kind == ACT_BACKWARD && vs > 0) {
		*to = (vs - 1) % p;
		return true;
	}
	return false;
}

static int count_sends(const Svg *S)
{
	const Schedule *sc = S->g->sched;
	if (!sc || sc->stages <= 1)
		return 0;
	int n = 0, to;
	for (int r = 0; r < S->nrows; r++)
		for (int k = 0; k < S->n; k++)
			n += action_remote(sc, S->rows[r].stage, sc->table[S->rows[r].stage][k], &to);
	return n;
}

static double lane_y(double top, int r)
{
	return top + r * (LANE + LANE_GAP);
}

static void schedule_panel(const Svg *S, double top, bool draw_sends)
{
	FILE *f = S->f;
	const Schedule *sc = S->g->sched;
	bool labels = S->nrows * S->n <= MAX_LABELS;
	fputs("<g class=\"schedule\">\n", f);
	for (int r = 0; r < S->nrows; r++) {
		const Row *row = &S->rows[r];
		double y = lane_y(top, r);
		fprintf(f, "<g class=\"lane\" data-stage=\"%d\" data-role=\"%d\">\n", row->stage, row->lp->role);
		text(f, LEFT - 10, y + LANE / 2.0 + 4, "end", "rowlabel", "%s", row->name);
		/* the idle time under everything, the actions over it */
		fprintf(f, "<rect x=\"%d\" y=\"%.1f\" width=\"%.1f\" height=\"%d\" class=\"idle\"/>\n", LEFT, y,
			xat(S, row->makespan) - LEFT, LANE);
		for (int k = 0; k < S->n; k++) {
			Action a = sc->table[row->stage][k];
			double x0 = xat(S, row->start[k]), x1 = xat(S, row->end[k]);
			fprintf(f, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%d\" class=\"%s%s\"><title>%s micro-batch %d%s: "
				   "%.4g to %.4g us</title></rect>\n",
				x0, y, x1 - x0 > 0.3 ? x1 - x0 : 0.3, LANE, a.kind == ACT_FORWARD ? "forward" : "backward",
				a.chunk ? " c1" : "", a.kind == ACT_FORWARD ? "forward of" : "backward of", a.micro,
				sc->chunks > 1 ? (a.chunk ? ", chunk 1" : ", chunk 0") : "", row->start[k] * 1e6, row->end[k] * 1e6);
			if (labels && x1 - x0 >= 16)
				text(f, (x0 + x1) / 2, y + LANE / 2.0 + 4, "middle", "boxlabel", "%c%d", a.kind == ACT_FORWARD ? 'F' : 'B',
				     a.micro);
		}
		double u0 = xat(S, row->makespan), u1 = xat(S, row->makespan + row->update);
		fprintf(f, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%d\" class=\"update\"><title>update: %.4g us</title></rect>\n",
			u0, y, u1 - u0 > 0.3 ? u1 - u0 : 0.3, LANE, row->update * 1e6);
		if (u1 - u0 >= 44)
			text(f, (u0 + u1) / 2, y + LANE / 2.0 + 4, "middle", "boxlabel", "update");
		fputs("</g>\n", f);
	}
	if (draw_sends) {
		fputs("<g class=\"sends\">\n", f);
		for (int r = 0; r < S->nrows; r++) {
			const Row *row = &S->rows[r];
			for (int k = 0; k < S->n; k++) {
				int to;
				Action a = sc->table[row->stage][k];
				if (!action_remote(sc, row->stage, a, &to))
					continue;
				int rt = -1; /* the row of the receiving stage (same role) */
				for (int q = 0; q < S->nrows; q++)
					if (S->rows[q].stage == to && S->rows[q].lp->role == row->lp->role)
						rt = q;
				if (rt < 0)
					continue;
				double y0 = lane_y(top, r) + (rt > r ? LANE : 0), y1 = lane_y(top, rt) + (rt > r ? 0 : LANE);
				fprintf(f, "<line x1=\"%.2f\" y1=\"%.1f\" x2=\"%.2f\" y2=\"%.1f\" class=\"send\"/>\n", xat(S, row->end[k]), y0,
					xat(S, row->end[k] + S->xfer), y1);
			}
		}
		fputs("</g>\n", f);
	}
	fputs("</g>\n", f);
}

/* ------------------------------------------------------------------ the memory panel */

typedef struct Event {
	double t;
	int slots, busy; /* changes at t */
} Event;

static int event_cmp(const void *pa, const void *pb)
{
	const Event *a = pa, *b = pb;
	return (a->t > b->t) - (a->t < b->t);
}

/* One stacked layer: the band between lower[] and upper[] over the breakpoints t[0..n]. */
static void band(const Svg *S, const char *cls, const double *t, const double *lower, const double *upper, int n,
		 double y0, double scale, const char *title)
{
	FILE *f = S->f;
	fprintf(f, "<path class=\"%s\" d=\"M%.2f %.2f", cls, xat(S, t[0]), y0 - lower[0] * scale);
	for (int i = 0; i < n; i++) /* upper edge left to right, as steps */
		fprintf(f, " L%.2f %.2f L%.2f %.2f", xat(S, t[i]), y0 - upper[i] * scale, xat(S, t[i + 1]), y0 - upper[i] * scale);
	for (int i = n - 1; i >= 0; i--)
		fprintf(f, " L%.2f %.2f L%.2f %.2f", xat(S, t[i + 1]), y0 - lower[i] * scale, xat(S, t[i]), y0 - lower[i] * scale);
	fprintf(f, " Z\"><title>%s</title></path>\n", title);
}

static void memory_chart(const Svg *S, const Row *row, double top)
{
	FILE *f = S->f;
	const LProg *p = row->lp;
	bool unified = p->nslots == 1 && p->ninbox == 0; /* one micro-batch at a time: slot and transient share */
	double state = 0;
	for (int k = 0; k < SC_COUNT; k++)
		state += (double)p->state_bytes[k];
	double inbox = unified ? 0 : (double)p->ninbox * (double)p->inbox_bytes;
	double slot = unified ? 0 : (double)p->slot_bytes;
	double work = unified ? (double)p->arena_bytes : (double)p->transient_bytes;
	double allocated = state + (double)p->arena_bytes;
	/* events: a slot is taken when its forward starts and freed when its backward ends; the
	 * transient region is live while an action or the update runs */
	int ne = 0;
	Event *ev = malloc(sizeof(Event) * (size_t)(4 * S->n + 4));
	if (!ev)
		ICE("out of memory");
	const Schedule *sc = S->g->sched;
	for (int k = 0; k < S->n; k++) {
		Action a = sc->table[row->stage][k];
		ev[ne++] = (Event){row->start[k], a.kind == ACT_FORWARD, 1};
		ev[ne++] = (Event){row->end[k], -(a.kind == ACT_BACKWARD), -1};
	}
	ev[ne++] = (Event){row->makespan, 0, 1};
	ev[ne++] = (Event){row->makespan + row->update, 0, -1};
	qsort(ev, (size_t)ne, sizeof(Event), event_cmp);
	double *t = malloc(sizeof(double) * (size_t)(ne + 2));
	double *v[5];
	for (int i = 0; i < 5; i++)
		v[i] = malloc(sizeof(double) * (size_t)(ne + 2));
	if (!t || !v[0] || !v[1] || !v[2] || !v[3] || !v[4])
		ICE("out of memory");
	/* intervals [t[i], t[i+1]) with cumulative layers v[0] = 0, state, + inbox, + slots, + work */
	int n = 0, slots = 0, busy = 0;
	double now = 0, peak = 0;
	for (int i = 0; i <= ne; i++) {
		double next = i < ne ? ev[i].t : S->total;
		if (next > now) {
			t[n] = now;
			v[0][n] = 0;
			v[1][n] = state;
			v[2][n] = state + inbox;
			v[3][n] = v[2][n] + slots * slot;
			v[4][n] = v[3][n] + (busy > 0 ? work : 0);
			if (v[4][n] > peak)
				peak = v[4][n];
			n++;
			now = next;
		}
		if (i < ne) {
			slots += ev[i].slots;
			busy += ev[i].busy;
		}
	}
	t[n] = S->total;
	double top_bytes = allocated > peak ? allocated : peak;
	double scale = top_bytes > 0 ? (MEM - 8) / top_bytes : 0, y0 = top + MEM;
	char b1[32], b2[32], b3[32], title[160];
	fprintf(f, "<g class=\"memory\" data-stage=\"%d\" data-role=\"%d\">\n", row->stage, p->role);
	text(f, LEFT - 10, top + 14, "end", "rowlabel", "%s", row->name);
	text(f, LEFT - 10, top + 30, "end", "small", "allocated %s", explain_bytes(allocated, b1, sizeof b1));
	text(f, LEFT - 10, top + 44, "end", "small", "live peak %s", explain_bytes(peak, b1, sizeof b1));
	fprintf(f, "<rect x=\"%d\" y=\"%.1f\" width=\"%.1f\" height=\"%d\" class=\"chart\"/>\n", LEFT, top, xat(S, S->total) - LEFT, MEM);
	snprintf(title, sizeof title, "state %s: parameters, gradients, optimizer states, metrics", explain_bytes(state, b1, sizeof b1));
	band(S, "state", t, v[0], v[1], n, y0, scale, title);
	if (inbox > 0) {
		snprintf(title, sizeof title, "%d receive inbox%s of %s", p->ninbox, p->ninbox == 1 ? "" : "es",
			 explain_bytes((double)p->inbox_bytes, b1, sizeof b1));
		band(S, "inbox", t, v[1], v[2], n, y0, scale, title);
	}
	if (slot > 0) {
		snprintf(title, sizeof title, "activation slots in use, %s each (%d allocated)", explain_bytes(slot, b1, sizeof b1),
			 p->nslots);
		band(S, "slots", t, v[2], v[3], n, y0, scale, title);
	}
	snprintf(title, sizeof title, unified ? "the arena while an action runs: %s (activations and working memory)"
					      : "transient region while an action or the update runs: %s",
		 explain_bytes(work, b1, sizeof b1));
	band(S, "transient", t, v[3], v[4], n, y0, scale, title);
	double ya = y0 - allocated * scale;
	fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" class=\"allocated\"/>\n", LEFT, ya, xat(S, S->total), ya);
	text(f, xat(S, S->total) - 4, ya - 4, "end", "small", "allocated %s", explain_bytes(allocated, b2, sizeof b2));
	text(f, LEFT + 4, y0 - 4, "start", "small", "state %s%s%s", explain_bytes(state, b3, sizeof b3),
	     slot > 0 ? arena_printf(S->g->arena, ", %d slot%s of %s", p->nslots, p->nslots == 1 ? "" : "s",
				     explain_bytes(slot, b1, sizeof b1))
		      : "",
	     inbox > 0 ? ", inboxes" : "");
	fputs("</g>\n", f);
	free(ev);
	free(t);
	for (int i = 0; i < 5; i++)
		free(v[i]);
}

static void memory_legend(FILE *f, double y)
{
	static const LegendItem items[] = {
		{"state", "state: parameters, gradients, optimizer, metrics", false},
		{"inbox", "receive inboxes", false},
		{"slots", "activation slots of micro-batches in flight", false},
		{"transient", "transient working memory", false},
		{"allocated", "what the program allocates", true},
	};
	legend(f, y, items, (int)(sizeof items / sizeof items[0]));
}

/* ------------------------------------------------------------------ the picture */

static const char style[] =
	"<style>\n"
	"text { font-family: 'DejaVu Sans', Arial, sans-serif; fill: #222; }\n"
	".title { font-size: 17px; font-weight: bold; }\n"
	".subtitle, .label, .tick { font-size: 12px; }\n"
	".small { font-size: 11px; fill: #444; }\n"
	".heading { font-size: 14px; font-weight: bold; }\n"
	".rowlabel { font-size: 12px; font-weight: bold; }\n"
	".boxlabel { font-size: 10px; fill: #fff; pointer-events: none; }\n"
	".forward { fill: #4c78a8; stroke: #fff; stroke-width: 0.5; }\n"
	".forward.c1 { fill: #8fb3d9; }\n"
	".backward { fill: #54a24b; stroke: #fff; stroke-width: 0.5; }\n"
	".backward.c1 { fill: #98d38f; }\n"
	".idle { fill: url(#hatch); stroke: #bbb; stroke-width: 0.5; }\n"
	".update { fill: #f58518; stroke: #fff; stroke-width: 0.5; }\n"
	".send { stroke: #333; stroke-width: 0.8; marker-end: url(#arrow); }\n"
	".axisline { stroke: #444; stroke-width: 1; }\n"
	".chart { fill: #fafafa; stroke: #ccc; }\n"
	".state { fill: #a0a0a0; }\n"
	".inbox { fill: #72b7b2; }\n"
	".slots { fill: #4c78a8; fill-opacity: 0.75; }\n"
	".transient { fill: #eeca3b; }\n"
	".allocated { stroke: #d62728; stroke-width: 1.2; stroke-dasharray: 5 3; }\n"
	"</style>\n"
	"<defs>\n"
	"<pattern id=\"hatch\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" patternTransform=\"rotate(45)\">"
	"<rect width=\"6\" height=\"6\" fill=\"#eeeeee\"/><line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#c8c8c8\" "
	"stroke-width=\"2\"/></pattern>\n"
	"<marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" markerWidth=\"5\" markerHeight=\"5\" "
	"orient=\"auto-start-reverse\"><path d=\"M0 0 L10 5 L0 10 z\" fill=\"#333\"/></marker>\n"
	"</defs>\n";

static void write_svg(Svg *S)
{
	FILE *f = S->f;
	const PlanSpec *ps = S->g->ps;
	const Schedule *sc = S->g->sched;
	int nsends = count_sends(S);
	bool draw_sends = nsends > 0 && nsends <= MAX_SENDS;
	double sched_top = 152, sched_h = S->nrows * (LANE + LANE_GAP);
	double mem_top = sched_top + sched_h + 128, mem_h = S->nrows * (MEM + MEM_GAP);
	double height = mem_top + mem_h + 16;
	fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
	fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%.0f\" viewBox=\"0 0 %d %.0f\">\n", WIDTH,
		height, WIDTH, height);
	fputs(style, f);
	fprintf(f, "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%.0f\" fill=\"#ffffff\"/>\n", WIDTH, height);
	char mesh[256] = "";
	size_t used = 0;
	for (int a = 0; a < ps->naxes && used < sizeof mesh; a++)
		used += (size_t)snprintf(mesh + used, sizeof mesh - used, "%s%s = %d", a ? " x " : "", ps->axes[a].name,
					 ps->axes[a].size);
	const char *unit;
	double scale = unit_scale(S->total, &unit);
	fprintf(f, "<title>plan %s for %s: one step</title>\n", ps->plan->name, ps->model->name);
	text(f, 20, 28, "start", "title", "plan %s for %s: %d rank%s (%s)", ps->plan->name, ps->model->name, ps->world,
	     ps->world == 1 ? "" : "s", ps->naxes ? mesh : "no mesh");
	text(f, 20, 48, "start", "subtitle", "one training step: %d micro-batch%s%s, estimated %.4g %s (%.4g %s of micro-batches, "
					   "update %.4g %s)",
	     ps->micro_batches, ps->micro_batches == 1 ? "" : "es",
	     S->g->nstages > 1 ? arena_printf(S->g->arena, ", %d pipeline stages (%s%s)", S->g->nstages,
					      ps->schedule == SCHED_GPIPE ? "gpipe" : ps->schedule == SCHED_INTERLEAVED ? "interleaved" : "1f1b",
					      sc && sc->chunks > 1 ? arena_printf(S->g->arena, ", %d chunks", sc->chunks) : "")
			       : "",
	     S->est_step * scale, unit, S->est_pipeline * scale, unit, (S->est_step - S->est_pipeline) * scale, unit);
	text(f, 20, 66, "start", "small", "times: each kernel's roofline cost on %s", explain_device_name());
	text(f, 20, sched_top - 54, "start", "heading", "Schedule per rank role");
	schedule_legend(S, sched_top - 32, draw_sends, nsends);
	schedule_panel(S, sched_top, draw_sends);
	time_axis(S, sched_top + sched_h + 2);
	text(f, 20, mem_top - 62, "start", "heading", "Memory per rank over the step");
	memory_legend(f, mem_top - 40);
	for (int r = 0; r < S->nrows; r++)
		memory_chart(S, &S->rows[r], mem_top + r * (MEM + MEM_GAP));
	time_axis(S, mem_top + mem_h - MEM_GAP + 4);
	fputs("</svg>\n", f);
}

bool explain_svg(FILE *out, Graph *g, const Lowered *low)
{
	const Schedule *sc = g->sched;
	if (!sc || !low)
		ICE("explain --svg without a schedule or a lowered program");
	Svg S = {.g = g, .low = low};
	int p = g->nstages, v = sc->chunks > 0 ? sc->chunks : 1;
	S.n = 2 * sc->micro * v;
	S.rows = calloc((size_t)low->nprogs, sizeof(Row));
	double *fc = malloc(sizeof(double) * (size_t)(p * v)), *bc = malloc(sizeof(double) * (size_t)(p * v));
	double *upd = malloc(sizeof(double) * (size_t)p), *end = malloc(sizeof(double) * (size_t)p * (size_t)S.n);
	double *start = malloc(sizeof(double) * (size_t)p * (size_t)S.n), *speed_buf = malloc(sizeof(double) * (size_t)(p + 1));
	if (!S.rows || !fc || !bc || !upd || !end || !start || !speed_buf)
		ICE("out of memory");
	/* each role's programs simulated with their own costs; rows in stage order, master first */
	static const int roles[] = {RANKROLE_ANY, RANKROLE_MASTER, RANKROLE_WORKER};
	for (int ri = 0; ri < 3; ri++) {
		if ((low->nroles > 1) != (roles[ri] != RANKROLE_ANY))
			continue;
		pipeline_timeline(g, fc, bc, S.xfer, explain_step_costs(g, low, roles[ri], fc, bc, &S.xfer, upd, speed_buf),
				  start, end);
		double makespan = 0, update = 0;
		for (int i = 0; i < p * S.n; i++)
			makespan = end[i] > makespan ? end[i] : makespan;
		for (int s = 0; s < p; s++)
			update = upd[s] > update ? upd[s] : update;
		if (roles[ri] == (low->nroles > 1 ? RANKROLE_WORKER : RANKROLE_ANY)) { /* the role explain estimates */
			S.est_pipeline = makespan;
			S.est_step = makespan + update;
		}
		for (int s = 0; s < p; s++) {
			Row *row = &S.rows[S.nrows++];
			row->lp = lowered_prog(low, s, roles[ri]);
			row->stage = s;
			row->update = upd[s];
			row->makespan = makespan;
			row->name = roles[ri] == RANKROLE_MASTER ? "master"
				    : roles[ri] == RANKROLE_WORKER ? "workers"
				    : p > 1 ? arena_printf(g->arena, "stage %d", s) : "every rank";
			row->start = arena_alloc(g->arena, sizeof(double) * (size_t)S.n);
			row->end = arena_alloc(g->arena, sizeof(double) * (size_t)S.n);
			for (int k = 0; k < S.n; k++) {
				row->start[k] = start[s * S.n + k];
				row->end[k] = end[s * S.n + k];
				if (row->end[k] > S.makespan)
					S.makespan = row->end[k];
			}
		}
	}
	for (int r = 0; r < S.nrows; r++)
		if (S.rows[r].makespan + S.rows[r].update > S.total)
			S.total = S.rows[r].makespan + S.rows[r].update;
	if (!(S.total > 0))
		S.total = 1e-9; /* an empty program: keep the axis finite */
	S.px = (WIDTH - LEFT - RIGHT) / S.total;
	free(fc);
	free(bc);
	free(upd);
	free(end);
	free(start);
	free(speed_buf);
	S.f = out;
	write_svg(&S);
	free(S.rows);
	return !ferror(out);
}
