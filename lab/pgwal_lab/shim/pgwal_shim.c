/*
 * pgwal_shim.c - LD_PRELOAD latency shim for the pgwal lab.
 *
 * Adds a fixed latency after fsync()/fdatasync() and, optionally, after
 * pwrite()/pwritev() (fixed per call plus a per-megabyte part), to emulate
 * slower storage on top of the lab's fast tmpfs-backed loop devices.
 *
 * Environment (read once, at load time):
 *   PGWAL_SHIM_FSYNC_US          extra microseconds after fsync/fdatasync (0 = off)
 *   PGWAL_SHIM_PWRITE_US         extra microseconds after each pwrite/pwritev (0 = off)
 *   PGWAL_SHIM_PWRITE_US_PER_MB  extra microseconds per MiB written by pwrite/pwritev
 *   PGWAL_SHIM_MATCH             only delay fds whose /proc/self/fd/N target contains
 *                                this substring (e.g. "pg_wal"); empty = every fd
 *   PGWAL_SHIM_WRITE             "1": treat write()/writev() like pwrite() (for
 *                                programs such as pg_receivewal that write with
 *                                write(2); off by default so that servers'
 *                                pipe and log writes pay nothing)
 *
 * The delay is an absolute-deadline clock_nanosleep with the thread's timer
 * slack lowered to 1 ns, which keeps the overshoot small (tens of us).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static long fsync_us, pwrite_us, pwrite_us_per_mb, delay_write;
static char match[256];
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static ssize_t (*real_pwrite64)(int, const void *, size_t, off_t);
static ssize_t (*real_pwritev)(int, const struct iovec *, int, off_t);
static ssize_t (*real_pwritev64)(int, const struct iovec *, int, off_t);
static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_writev)(int, const struct iovec *, int);

static long env_long(const char *name)
{
	const char *v = getenv(name);
	return v && *v ? atol(v) : 0;
}

__attribute__((constructor)) static void shim_init(void)
{
	const char *m = getenv("PGWAL_SHIM_MATCH");

	fsync_us = env_long("PGWAL_SHIM_FSYNC_US");
	pwrite_us = env_long("PGWAL_SHIM_PWRITE_US");
	pwrite_us_per_mb = env_long("PGWAL_SHIM_PWRITE_US_PER_MB");
	delay_write = env_long("PGWAL_SHIM_WRITE");
	if (m)
		snprintf(match, sizeof(match), "%s", m);
	real_fsync = dlsym(RTLD_NEXT, "fsync");
	real_fdatasync = dlsym(RTLD_NEXT, "fdatasync");
	real_pwrite = dlsym(RTLD_NEXT, "pwrite");
	real_pwrite64 = dlsym(RTLD_NEXT, "pwrite64");
	real_pwritev = dlsym(RTLD_NEXT, "pwritev");
	real_write = dlsym(RTLD_NEXT, "write");
	real_writev = dlsym(RTLD_NEXT, "writev");
	real_pwritev64 = dlsym(RTLD_NEXT, "pwritev64");
	if (fsync_us > 0 || pwrite_us > 0 || pwrite_us_per_mb > 0)
		prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
}

static int fd_matches(int fd)
{
	char link[64], target[4096];
	ssize_t n;

	if (match[0] == '\0')
		return 1;
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, target, sizeof(target) - 1);
	if (n < 0)
		return 0;
	target[n] = '\0';
	return strstr(target, match) != NULL;
}

static void delay_us(long us)
{
	struct timespec t;
	int saved = errno;

	if (us <= 0)
		return;
	clock_gettime(CLOCK_MONOTONIC, &t);
	t.tv_sec += us / 1000000;
	t.tv_nsec += (us % 1000000) * 1000;
	if (t.tv_nsec >= 1000000000L)
	{
		t.tv_sec++;
		t.tv_nsec -= 1000000000L;
	}
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL) == EINTR)
		;
	errno = saved;
}

static void after_write(int fd, ssize_t written)
{
	long us;

	if (written <= 0 || (pwrite_us <= 0 && pwrite_us_per_mb <= 0) || !fd_matches(fd))
		return;
	us = pwrite_us + (long) ((double) written * pwrite_us_per_mb / 1048576.0);
	delay_us(us);
}

int fsync(int fd)
{
	int r = real_fsync(fd);

	if (fsync_us > 0 && fd_matches(fd))
		delay_us(fsync_us);
	return r;
}

int fdatasync(int fd)
{
	int r = real_fdatasync(fd);

	if (fsync_us > 0 && fd_matches(fd))
		delay_us(fsync_us);
	return r;
}

ssize_t pwrite(int fd, const void *buf, size_t count, off_t offset)
{
	ssize_t r = real_pwrite(fd, buf, count, offset);

	after_write(fd, r);
	return r;
}

ssize_t pwrite64(int fd, const void *buf, size_t count, off_t offset)
{
	ssize_t r = (real_pwrite64 ? real_pwrite64 : real_pwrite)(fd, buf, count, offset);

	after_write(fd, r);
	return r;
}

ssize_t pwritev(int fd, const struct iovec *iov, int iovcnt, off_t offset)
{
	ssize_t r = real_pwritev(fd, iov, iovcnt, offset);

	after_write(fd, r);
	return r;
}

ssize_t pwritev64(int fd, const struct iovec *iov, int iovcnt, off_t offset)
{
	ssize_t r = (real_pwritev64 ? real_pwritev64 : real_pwritev)(fd, iov, iovcnt, offset);

	after_write(fd, r);
	return r;
}

ssize_t write(int fd, const void *buf, size_t count)
{
	ssize_t r;

	if (!real_write)			/* called before the constructor ran */
		real_write = dlsym(RTLD_NEXT, "write");
	r = real_write(fd, buf, count);

	if (delay_write)
		after_write(fd, r);
	return r;
}

ssize_t writev(int fd, const struct iovec *iov, int iovcnt)
{
	ssize_t r;

	if (!real_writev)
		real_writev = dlsym(RTLD_NEXT, "writev");
	r = real_writev(fd, iov, iovcnt);

	if (delay_write)
		after_write(fd, r);
	return r;
}
