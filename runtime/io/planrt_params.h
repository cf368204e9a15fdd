/* planrt_params.h: the running program's parameter table, for the io files that read and write
 * parameters (params.c, save.c, checkpoint.c). Internal to planrt. */
#ifndef PLANRT_PARAMS_H
#define PLANRT_PARAMS_H

#include "planrt_namemap.h"
#include "planrt_program.h"

enum { PLANRT_PARAM_MAX_DIMS = 8 };
/* this rank's block of p: its offsets in the global tensor (offs[rank]); returns its elements */
int64_t planrt_param_block_(const planrt_param_t *p, int64_t *offs);
/* whether this rank writes its piece of p (replicas on an axis that neither splits p, nor is the
 * pipeline, nor holds ZeRO shards of it on shard_axis do not) */
int planrt_param_writes_(const planrt_program_t *prog, const planrt_param_t *p, int shard_axis);

#endif
