/* explain.h: `planc explain`: the cost report (explain.c) and its schedule picture (svg.c), both
 * read off the lowered program that the targets print. */
#ifndef PLANC_EXPLAIN_H
#define PLANC_EXPLAIN_H

#include "target/target.h"

/* explain.c: the cost report, text or JSON, read off the lowered program: its state and arena
 * give the memory lines when planc build can run it, its kernels the communication. */
void explain(FILE *out, Graph *g, bool json, const Lowered *low);
/* svg.c: `planc explain --svg FILE`: each rank role's pipeline schedule (forward, backward, sends,
 * idle time) and memory over one step, from the same estimate as explain's step time, written to
 * out. False when out reports a write error. */
bool explain_svg(FILE *out, Graph *g, const Lowered *low);
bool explain_device(const char *name); /* the device the estimated step time assumes: h200, cpu */
const char *explain_device_name(void);  /* its description */
const char *explain_bytes(double b, char *buf, size_t n); /* "1.50 MiB", as the report prints sizes */
/* The estimate's costs in seconds for the programs of one rank role (RANKROLE_ANY, or an async
 * role): one micro-batch's forward and backward per stage and chunk (fc, bc: [stages * chunks]),
 * the longest transfer between stages, and each stage's update phase (update: [stages]). */
void explain_costs(const Graph *g, const Lowered *low, int role, double *fc, double *bc, double *xfer, double *update);

#endif
