/* planrt_save.h: --save, the trained weights in one safetensors file (save.c). Internal to planrt. */
#ifndef PLANRT_SAVE_H
#define PLANRT_SAVE_H

#include "planrt_program.h"

/* Every rank: runs stage->save into path (under the names of ctx->name_map when set: --map
 * map_path). Ends the job with the cause on failure, after removing what it wrote; the target is
 * then left as it was. */
void planrt_save_weights_(planrt_ctx_t *ctx, const planrt_stage_t *stage, const char *path, const char *map_path, int rank);

#endif
