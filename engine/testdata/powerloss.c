// powerloss.c: a write-back layer for a valkey-server's append-only files, loaded with
// LD_PRELOAD by TestPowerLossSimulated. Bytes written to a file whose name ends in ".aof" stay
// in the server's own memory until it calls fsync or fdatasync on that file (or closes it): a
// SIGKILL then drops everything not yet synced, as a power loss drops what the kernel had not
// written to the disk. Everything else goes straight through.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAXFD 4096

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static char *pending[MAXFD];
static size_t pendingLen[MAXFD], pendingCap[MAXFD];

static ssize_t (*realWrite)(int, const void *, size_t);
static int (*realFsync)(int);
static int (*realFdatasync)(int);
static int (*realClose)(int);

static void init(void) {
	if (!realWrite) {
		realWrite = dlsym(RTLD_NEXT, "write");
		realFsync = dlsym(RTLD_NEXT, "fsync");
		realFdatasync = dlsym(RTLD_NEXT, "fdatasync");
		realClose = dlsym(RTLD_NEXT, "close");
	}
}

static int isAOF(int fd) {
	char link[64], path[4096];
	if (fd <= 2 || fd >= MAXFD) return 0;
	snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
	ssize_t n = readlink(link, path, sizeof path - 1);
	return n > 4 && memcmp(path + n - 4, ".aof", 4) == 0;
}

// flush hands fd's pending bytes to the kernel; under mu.
static int flush(int fd) {
	size_t done = 0;
	while (done < pendingLen[fd]) {
		ssize_t n = realWrite(fd, pending[fd] + done, pendingLen[fd] - done);
		if (n <= 0) return -1;
		done += (size_t)n;
	}
	pendingLen[fd] = 0;
	return 0;
}

ssize_t write(int fd, const void *buf, size_t len) {
	init();
	if (!isAOF(fd)) return realWrite(fd, buf, len);
	pthread_mutex_lock(&mu);
	if (pendingLen[fd] + len > pendingCap[fd]) {
		size_t cap = 2 * (pendingLen[fd] + len);
		char *grown = realloc(pending[fd], cap);
		if (!grown) {
			pthread_mutex_unlock(&mu);
			return -1;
		}
		pending[fd] = grown;
		pendingCap[fd] = cap;
	}
	memcpy(pending[fd] + pendingLen[fd], buf, len);
	pendingLen[fd] += len;
	pthread_mutex_unlock(&mu);
	return (ssize_t)len;
}

// synced hands fd's pending bytes to the kernel, then syncs them with sync.
static int synced(int fd, int (*sync)(int)) {
	if (fd < 0 || fd >= MAXFD) return sync(fd);
	pthread_mutex_lock(&mu);
	int err = flush(fd);
	pthread_mutex_unlock(&mu);
	return err ? err : sync(fd);
}

int fsync(int fd) {
	init();
	return synced(fd, realFsync);
}

int fdatasync(int fd) {
	init();
	return synced(fd, realFdatasync);
}

int close(int fd) {
	init();
	if (fd >= 0 && fd < MAXFD) {
		pthread_mutex_lock(&mu);
		flush(fd);
		pthread_mutex_unlock(&mu);
	}
	return realClose(fd);
}
