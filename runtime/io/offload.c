/* offload.c: the state file of `offload optimizer -> disk` and its I/O thread.
 *
 * One file per rank, made at init and unlinked at once (it disappears with the process); pread and
 * pwrite at the offsets planc planned. Asynchronous operations go to one I/O thread through a FIFO
 * queue, so they run in the order the program started them: a record written back and read again
 * later is read after the write. Each operation has a slot (planc gives the step's reads and
 * writes their own); planrt_offload_wait(slot) waits for the slot's latest operation. A failed
 * read or write is reported by the wait, on the calling thread (the I/O thread never ends the
 * process itself). */
#define _GNU_SOURCE
#define PLANRT_INTERNAL
#include "planrt.h"
#include "planrt_offload.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { MAX_SLOTS = 64, QUEUE = 256 };

typedef struct op {
	int write, slot;
	void *buf;
	int64_t offset, bytes;
} op_t;

static int fd = -1;
static int64_t file_bytes;
static pthread_t thread;
static int thread_started;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static op_t queue[QUEUE];
static int qhead, qlen;
static int pending[MAX_SLOTS];  /* operations started on the slot and not yet done */
static char failed[MAX_SLOTS][256];

static void check_range(const char *what, int64_t offset, int64_t bytes)
{
	if (fd < 0)
		planrt_fatal("internal error: %s before planrt_offload_open", what);
	if (offset < 0 || bytes < 0 || offset + bytes > file_bytes)
		planrt_fatal("internal error: %s of %lld bytes at %lld outside the %lld-byte state file", what, (long long)bytes,
			     (long long)offset, (long long)file_bytes);
}

/* the whole transfer (pread / pwrite may move less than asked); "" or the cause */
static void transfer(const op_t *o, char *err, size_t n)
{
	int64_t done = 0;
	err[0] = 0;
	while (done < o->bytes) {
		ssize_t r = o->write ? pwrite(fd, (const char *)o->buf + done, (size_t)(o->bytes - done), o->offset + done)
				     : pread(fd, (char *)o->buf + done, (size_t)(o->bytes - done), o->offset + done);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			snprintf(err, n, "%s %lld bytes at %lld of the optimizer state file: %s", o->write ? "writing" : "reading",
				 (long long)o->bytes, (long long)o->offset, r < 0 ? strerror(errno) : "unexpected end of file");
			return;
		}
		done += r;
	}
}

static void *io_main(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&lock);
	for (;;) {
		while (!qlen)
			pthread_cond_wait(&changed, &lock);
		op_t o = queue[qhead];
		pthread_mutex_unlock(&lock);
		char err[256];
		transfer(&o, err, sizeof err);
		pthread_mutex_lock(&lock);
		qhead = (qhead + 1) % QUEUE;
		qlen--;
		if (err[0] && !failed[o.slot][0])
			snprintf(failed[o.slot], sizeof failed[o.slot], "%s", err);
		pending[o.slot]--;
		pthread_cond_broadcast(&changed);
	}
	return NULL;
}

void planrt_offload_open(int64_t bytes)
{
	if (fd >= 0)
		planrt_fatal("internal error: the optimizer state file is open already");
	const char *dir = getenv("PLANRT_OFFLOAD_DIR");
	if (!dir || !*dir)
		dir = getenv("TMPDIR");
	if (!dir || !*dir)
		dir = "/tmp";
	char path[4096];
	for (int k = 0; fd < 0 && k < 100; k++) {
		snprintf(path, sizeof path, "%s/planrt-optimizer-%ld-%d.bin", dir, (long)getpid(), k);
		fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		if (fd < 0 && errno != EEXIST)
			break;
	}
	if (fd < 0)
		planrt_fatal("cannot create the optimizer state file in '%s': %s; set PLANRT_OFFLOAD_DIR to a writable "
			     "directory with %lld bytes free",
			     dir, strerror(errno), (long long)bytes);
	unlink(path);
	if (ftruncate(fd, bytes) != 0)
		planrt_fatal("cannot size the optimizer state file in '%s' to %lld bytes: %s", dir, (long long)bytes,
			     strerror(errno));
	file_bytes = bytes;
	if (pthread_create(&thread, NULL, io_main, NULL) != 0)
		planrt_fatal("cannot start the optimizer state's I/O thread");
	pthread_detach(thread);
	thread_started = 1;
}

/* the latest synchronous read (planrt_offload_source_), forgotten at any write */
static const unsigned char *read_dst;
static int64_t read_offset, read_bytes;

static void start(int write, void *buf, int64_t offset, int64_t bytes, int slot)
{
	op_t o = {write, slot, buf, offset, bytes};
	read_dst = NULL;
	if (slot < 0) {
		char err[256];
		transfer(&o, err, sizeof err);
		if (err[0])
			planrt_fatal("%s; check the disk under PLANRT_OFFLOAD_DIR", err);
		if (!write) {
			read_dst = buf;
			read_offset = offset;
			read_bytes = bytes;
		}
		return;
	}
	if (slot >= MAX_SLOTS)
		planrt_fatal("internal error: offload slot %d (at most %d)", slot, MAX_SLOTS);
	pthread_mutex_lock(&lock);
	while (qlen == QUEUE)
		pthread_cond_wait(&changed, &lock);
	queue[(qhead + qlen) % QUEUE] = o;
	qlen++;
	pending[slot]++;
	pthread_cond_broadcast(&changed);
	pthread_mutex_unlock(&lock);
}

void planrt_offload_read(void *dst, int64_t offset, int64_t bytes, int slot)
{
	check_range("planrt_offload_read", offset, bytes);
	start(0, dst, offset, bytes, slot);
}

void planrt_offload_write(const void *src, int64_t offset, int64_t bytes, int slot)
{
	check_range("planrt_offload_write", offset, bytes);
	start(1, (void *)src, offset, bytes, slot);
}

void planrt_offload_wait(int slot)
{
	if (slot < 0 || slot >= MAX_SLOTS || !thread_started)
		return;
	pthread_mutex_lock(&lock);
	while (pending[slot])
		pthread_cond_wait(&changed, &lock);
	char err[256];
	snprintf(err, sizeof err, "%s", failed[slot]);
	pthread_mutex_unlock(&lock);
	if (err[0])
		planrt_fatal("%s; check the disk under PLANRT_OFFLOAD_DIR", err);
}

int planrt_offload_source_(const void *p, size_t bytes, int *fdp, int64_t *offset)
{
	const unsigned char *q = p;
	if (fd < 0 || !read_dst || q < read_dst || (int64_t)bytes > read_bytes || q - read_dst > read_bytes - (int64_t)bytes)
		return 0;
	*fdp = fd;
	*offset = read_offset + (q - read_dst);
	return 1;
}

int64_t planrt_offload_bytes(void)
{
	return fd >= 0 ? file_bytes : 0;
}

void planrt_copy(void *dst, const void *src, int64_t bytes)
{
	if (bytes > 0)
		memcpy(dst, src, (size_t)bytes);
}
