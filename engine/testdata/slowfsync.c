// slowfsync.c: a slow disk for a valkey-server's append-only files, loaded with LD_PRELOAD by
// TestCrashOnSlowDiskLosesOnlyHeldBackAdmissions. Every fsync or fdatasync of a file whose name
// ends in ".aof" sleeps SLOWFSYNC_MS milliseconds (environment; 1000 when unset) before it
// syncs, as on a disk busy with other writes. Writes go straight to the kernel: a SIGKILL loses
// only what the server itself had not written yet.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int isAOF(int fd) {
	char link[64], path[4096];
	if (fd <= 2) return 0;
	snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
	ssize_t n = readlink(link, path, sizeof path - 1);
	return n > 4 && memcmp(path + n - 4, ".aof", 4) == 0;
}

// lag sleeps SLOWFSYNC_MS milliseconds when fd is an append-only file.
static void lag(int fd) {
	if (!isAOF(fd)) return;
	const char *env = getenv("SLOWFSYNC_MS");
	long ms = env ? atol(env) : 1000;
	struct timespec d = {ms / 1000, (ms % 1000) * 1000000L};
	nanosleep(&d, NULL);
}

int fsync(int fd) {
	static int (*real)(int);
	if (!real) real = dlsym(RTLD_NEXT, "fsync");
	lag(fd);
	return real(fd);
}

int fdatasync(int fd) {
	static int (*real)(int);
	if (!real) real = dlsym(RTLD_NEXT, "fdatasync");
	lag(fd);
	return real(fd);
}
