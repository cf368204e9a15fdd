/* planrt_outfile.h: how planc and planrt write an output file (core/outfile.c), the one rule
 * every writer follows: --save, --trace, checkpoints and their manifests, safetensors files,
 * `planc explain --svg`, `planc build -o`, `planc fmt -w`.
 *
 *   - a target that does not exist, or is a regular file: the bytes go to a temporary file beside
 *     it (PATH.tmp.ID), which is fsynced and renamed over the target, so a reader sees the old
 *     file or the new one, never half of one, and a failed write leaves the old one;
 *   - a character device (/dev/null, a terminal): written in place, never renamed over, never
 *     truncated or re-created (a device node is not the program's to replace);
 *   - anything else that exists is refused before any work, with the cause: a directory, a FIFO,
 *     a socket, a block device, and a symbolic link (renaming over a link replaces the link and
 *     never writes what it points to; pass the link's target instead).
 *
 * The temporary file being written is remembered, so that a signal that ends the process removes
 * it (planrt_outfile_remove_pending, which planrt_main and planc install as signal cleanup). */
#ifndef PLANRT_OUTFILE_H
#define PLANRT_OUTFILE_H

#include <stddef.h>
#include <stdio.h>

typedef struct planrt_outfile {
	char path[4096]; /* the target */
	char tmp[4160];  /* where the bytes go: PATH.tmp.ID, or the target itself when in_place */
	int in_place;    /* a character device */
	int fd;          /* -1: not open */
	FILE *fp;        /* planrt_outfile_stream's stream over fd, or NULL */
} planrt_outfile_t;

/* What path is as an output file (what names it in messages: "--save", "-o"): 0 when it may be
 * written, or -1 with a one-line cause and the fix in why. Nothing is created. */
int planrt_outfile_check(const char *what, const char *path, char *why, size_t n);
/* Checks path and opens where its bytes go: the temporary file PATH.tmp.ID (created, exclusive;
 * id: usually the pid, or the pid of the rank that names a file all ranks write) or the device.
 * 0, or -1 with the cause in why (errno kept). */
int planrt_outfile_open(planrt_outfile_t *f, const char *what, const char *path, long id, char *why, size_t n);
/* Another process's planrt_outfile_open(path, id): opens the same temporary file (or device) for
 * writing, without creating it. 0 or -1 with why. */
int planrt_outfile_join(planrt_outfile_t *f, const char *path, long id, char *why, size_t n);
/* A stdio stream over the open file (owned by f: commit or discard closes it); NULL with why. */
FILE *planrt_outfile_stream(planrt_outfile_t *f, char *why, size_t n);
/* Flushes, fsyncs and closes; then renames the temporary file over the target (checked again:
 * it must still be absent or a regular file) and fsyncs the directory. A device is only closed.
 * 0, or -1 with the cause in why, the temporary file removed and the target as it was. */
int planrt_outfile_commit(planrt_outfile_t *f, char *why, size_t n);
/* Closes without committing (a join's writer, or a failed write). */
void planrt_outfile_close(planrt_outfile_t *f);
/* Closes and removes the temporary file (never a device, never the target). */
void planrt_outfile_discard(planrt_outfile_t *f);

/* The temporary file a signal should remove (NULL: none); planrt_outfile_open sets it, commit
 * and discard clear it. planrt_outfile_remove_pending is async-signal-safe (one unlink).
 * planrt_outfile_stop removes it too, and from then on open, join and commit block until the
 * process ends: a stop signal's cleanup for a process whose other threads run on a moment (no
 * output is begun or committed after it). */
void planrt_outfile_pending(const char *tmp);
void planrt_outfile_remove_pending(void);
void planrt_outfile_stop(void);
/* At start: removes target's temporary files (PATH.tmp.PID[...]) whose process no longer lives
 * on this host (a killed save), with a note on stderr for each. */
void planrt_outfile_remove_stale(const char *target);

#endif
