/* planrt_offload.h: offloaded optimizer state (offload.c). Under `offload optimizer -> disk`
 * (ZeRO-Infinity's NVMe offload) a rank's optimizer state lives in one file, record after record
 * (each optimizer call's moments and master weights); the step reads a record into host memory
 * before its update and writes it back after, asynchronously on an I/O thread, the next record's
 * read overlapping this one's update. planc plans the records, the slots and the order (state.c);
 * these are the kernels it calls. */
#ifndef PLANRT_OFFLOAD_H
#define PLANRT_OFFLOAD_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Creates this rank's state file of bytes (all zeros: the moments' initial value) in
 * $PLANRT_OFFLOAD_DIR (default $TMPDIR, else /tmp); it is unlinked at once, so it disappears when
 * the process ends however it ends. */
void planrt_offload_open(int64_t bytes);
/* bytes at offset of the file into dst (from src): with slot >= 0 started on the I/O thread and
 * completed by planrt_offload_wait(slot) (operations run in the order they are started); slot < 0
 * done before returning. */
void planrt_offload_read(void *dst, int64_t offset, int64_t bytes, int slot);
void planrt_offload_write(const void *src, int64_t offset, int64_t bytes, int slot);
void planrt_offload_wait(int slot); /* the slot's operation done (none started: returns) */
int64_t planrt_offload_bytes(void); /* the state file's size (0: none opened) */
/* Whether [p, p + bytes) lies in the destination of the latest synchronous read (slot < 0), whose
 * bytes the file still holds as read: then *fd and *offset are where (the checkpoint writes those
 * pieces from the file, planrt_ckpt_write's PLANRT_CKPT_COPY). */
int planrt_offload_source_(const void *p, size_t bytes, int *fd, int64_t *offset);
/* An offload copy between host and device memory: the CPU target's is memcpy (the CUDA target's
 * planrt_cu_copy runs on the copy stream). */
void planrt_copy(void *dst, const void *src, int64_t bytes);

#ifdef __cplusplus
}
#endif
#endif
