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
 *
 * Volatile page cache (the durability audit's emulated OS crash):
 *   PGWAL_SHIM_VOLATILE_DIR      directory for undo logs; set = mode on
 *   PGWAL_SHIM_VOLATILE_MATCH    only regular files whose path contains this
 *                                (the node's data directory)
 * Before each write to such a file the shim appends what the write is about
 * to replace (offset, length, the file's size, the old bytes) to the file's
 * undo log, named by device, inode and inode generation, so that every
 * process writing the file shares one log.  fsync()/fdatasync() of the file,
 * from any process, empties its log: from then on those writes are durable.
 * sync()/syncfs() empty every log.  The lab's emulated power loss SIGKILLs
 * every server process and then applies the logs backwards (power.py):
 * what was written since the last sync of each file disappears, as in a page
 * cache that was never written back.  A writer holds an exclusive flock() on
 * the log from appending the entry until its write returned, and fsync holds
 * it across the real fsync, so no write can fall between a sync and the
 * emptying of the log.  Writes to files opened O_SYNC/O_DSYNC are durable
 * and not logged.  Metadata (creation, rename, unlink, truncation) is taken
 * as durable at once; a torn page is never emulated, a write is undone whole.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static long fsync_us, pwrite_us, pwrite_us_per_mb, delay_write;
static char match[256];
static char volatile_dir[1024];
static char volatile_match[1024];
static char hold_file[1024];
static long hold_max_ms;
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static ssize_t (*real_pwrite64)(int, const void *, size_t, off_t);
static ssize_t (*real_pwritev)(int, const struct iovec *, int, off_t);
static ssize_t (*real_pwritev64)(int, const struct iovec *, int, off_t);
static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_writev)(int, const struct iovec *, int);
static void (*real_sync)(void);
static int	(*real_syncfs)(int);

static long env_long(const char *name)
{
	const char *v = getenv(name);
	return v && *v ? atol(v) : 0;
}

__attribute__((constructor)) static void shim_init(void)
{
	const char *m = getenv("PGWAL_SHIM_MATCH");
	const char *vd = getenv("PGWAL_SHIM_VOLATILE_DIR");
	const char *vm = getenv("PGWAL_SHIM_VOLATILE_MATCH");
	const char *hf = getenv("PGWAL_SHIM_HOLD_FILE");

	fsync_us = env_long("PGWAL_SHIM_FSYNC_US");
	pwrite_us = env_long("PGWAL_SHIM_PWRITE_US");
	pwrite_us_per_mb = env_long("PGWAL_SHIM_PWRITE_US_PER_MB");
	delay_write = env_long("PGWAL_SHIM_WRITE");
	if (m)
		snprintf(match, sizeof(match), "%s", m);
	if (vd && *vd)
		snprintf(volatile_dir, sizeof(volatile_dir), "%s", vd);
	if (vm)
		snprintf(volatile_match, sizeof(volatile_match), "%s", vm);
	if (hf)
		snprintf(hold_file, sizeof(hold_file), "%s", hf);
	hold_max_ms = env_long("PGWAL_SHIM_HOLD_MAX_MS");
	if (hold_max_ms <= 0)
		hold_max_ms = 10000;
	real_sync = dlsym(RTLD_NEXT, "sync");
	real_syncfs = dlsym(RTLD_NEXT, "syncfs");
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


/*
 * Volatile page cache.  An undo log entry is a header followed by the bytes
 * the write replaces (those below the file's size when it was made).
 */
#define UNDO_MAGIC 0x554e444fU	/* "UNDO" */

typedef struct UndoHeader
{
	uint32_t	magic;
	uint32_t	pad;
	uint64_t	offset;			/* where the write went */
	uint64_t	length;			/* how many bytes it wrote */
	uint64_t	old_size;		/* the file's size before it */
	uint64_t	saved;			/* old bytes that follow: min(length, old_size - offset) */
} UndoHeader;

/* The emulation must not silently weaken: say so where the lab looks. */
static void
volatile_failed(const char *what, const char *detail)
{
	char		path[1100];
	char		msg[1400];
	int			fd,
				n;

	snprintf(path, sizeof(path), "%s/FAILED", volatile_dir);
	n = snprintf(msg, sizeof(msg), "pgwal_shim[%d]: %s %s: %s\n", (int) getpid(), what, detail,
				 strerror(errno));
	fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0600);
	if (fd >= 0)
	{
		if (real_write(fd, msg, n) < 0)
			n = 0;
		close(fd);
	}
	if (real_write(2, msg, n) < 0)
		n = 0;
}

static int
path_contains(int fd, const char *needle)
{
	char		link[64],
				target[4096];
	ssize_t		n;

	if (needle[0] == '\0')
		return 1;
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, target, sizeof(target) - 1);
	if (n < 0)
		return 0;
	target[n] = '\0';
	return strstr(target, needle) != NULL;
}

/* The undo log of fd's file, locked; -1 if the file is not volatile or has no log. */
static int
volatile_log(int fd, int create, struct stat *st)
{
	char		path[1200];
	long		gen = 0;
	int			logfd,
				flags;

	if (volatile_dir[0] == '\0')
		return -1;
	if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode))
		return -1;
	flags = fcntl(fd, F_GETFL);
	if (flags < 0 || (flags & (O_SYNC | O_DSYNC)) || !path_contains(fd, volatile_match))
		return -1;
	/* the generation tells a file from a later one that reuses its inode */
	if (ioctl(fd, FS_IOC_GETVERSION, &gen) != 0)
		gen = 0;
	snprintf(path, sizeof(path), "%s/%lx-%lx-%lx.undo", volatile_dir, (unsigned long) st->st_dev,
			 (unsigned long) st->st_ino, (unsigned long) (uint32_t) gen);
	logfd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC | (create ? O_CREAT : 0), 0600);
	if (logfd < 0 && create && errno == ENOENT && mkdir(volatile_dir, 0700) == 0)
		logfd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC | O_CREAT, 0600);
	if (logfd < 0)
	{
		if (create || errno != ENOENT)
			volatile_failed("cannot open undo log", path);
		return -1;
	}
	while (flock(logfd, LOCK_EX) != 0)
	{
		if (errno != EINTR)
		{
			volatile_failed("cannot lock undo log", path);
			close(logfd);
			return -1;
		}
	}
	return logfd;
}

static int
write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len > 0)
	{
		ssize_t		n = real_write(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		p += n;
		len -= n;
	}
	return 0;
}

/* Read len bytes at off of fd's file, also when fd was opened write-only. */
static int
read_old(int fd, char *buf, size_t len, off_t off)
{
	char		link[64];
	int			rfd = -1,
				rc = -1;
	size_t		done = 0;

	if (pread(fd, buf, 0, off) < 0 && errno == EBADF)
	{
		snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
		rfd = open(link, O_RDONLY | O_CLOEXEC);
		if (rfd < 0)
			return -1;
	}
	while (done < len)
	{
		ssize_t		n = pread(rfd >= 0 ? rfd : fd, buf + done, len - done, off + done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			goto out;
		done += n;
	}
	rc = 0;
out:
	if (rfd >= 0)
		close(rfd);
	return rc;
}

/*
 * Before a write of len bytes at off (at_cursor: at the fd's file position)
 * to a volatile file: log the bytes it replaces.  Returns the locked log,
 * to be passed to volatile_end() once the write returned, or -1.
 */
static int
volatile_begin(int fd, off_t off, size_t len, int at_cursor)
{
	struct stat st;
	UndoHeader	h;
	char	   *old = NULL;
	int			logfd,
				saved_errno = errno;

	if (volatile_dir[0] == '\0' || len == 0)
		return -1;
	logfd = volatile_log(fd, 1, &st);
	if (logfd < 0)
	{
		errno = saved_errno;
		return -1;
	}
	if (fstat(fd, &st) != 0)	/* the size under the lock */
		goto fail;
	if (at_cursor)
	{
		off = (fcntl(fd, F_GETFL) & O_APPEND) ? st.st_size : lseek(fd, 0, SEEK_CUR);
		if (off < 0)
			goto fail;
	}
	memset(&h, 0, sizeof(h));
	h.magic = UNDO_MAGIC;
	h.offset = off;
	h.length = len;
	h.old_size = st.st_size;
	h.saved = off < st.st_size ? ((uint64_t) (st.st_size - off) < len ? (uint64_t) (st.st_size - off) : len) : 0;
	if (h.saved > 0)
	{
		old = malloc(h.saved);
		if (old == NULL || read_old(fd, old, h.saved, off) != 0)
			goto fail;
	}
	if (write_all(logfd, &h, sizeof(h)) != 0 || (h.saved > 0 && write_all(logfd, old, h.saved) != 0))
		goto fail;
	free(old);
	errno = saved_errno;
	return logfd;

fail:
	volatile_failed("cannot record a write", "");
	free(old);
	close(logfd);
	errno = saved_errno;
	return -1;
}

static void
volatile_end(int logfd)
{
	int			saved_errno = errno;

	if (logfd >= 0)
		close(logfd);			/* drops the flock */
	errno = saved_errno;
}

/* Around a successful fsync/fdatasync of a volatile file: its log empties. */
static void
volatile_synced(int logfd, int ok)
{
	int			saved_errno = errno;

	if (logfd < 0)
		return;
	if (ok && ftruncate(logfd, 0) != 0)
		volatile_failed("cannot empty undo log", "");
	close(logfd);
	errno = saved_errno;
}

/* After sync()/syncfs(): every log empties. */
static void
volatile_sync_all(void)
{
	DIR		   *d;
	struct dirent *e;
	int			saved_errno = errno;

	if (volatile_dir[0] == '\0' || (d = opendir(volatile_dir)) == NULL)
		return;
	while ((e = readdir(d)) != NULL)
	{
		char		path[1400];
		int			fd;
		size_t		n = strlen(e->d_name);

		if (n < 6 || strcmp(e->d_name + n - 5, ".undo") != 0)
			continue;
		snprintf(path, sizeof(path), "%s/%s", volatile_dir, e->d_name);
		fd = open(path, O_WRONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		if (flock(fd, LOCK_EX) == 0 && ftruncate(fd, 0) != 0)
			volatile_failed("cannot empty undo log", path);
		close(fd);
	}
	closedir(d);
	errno = saved_errno;
}

static size_t
iov_length(const struct iovec *iov, int iovcnt)
{
	size_t		n = 0;

	for (int i = 0; i < iovcnt; i++)
		n += iov[i].iov_len;
	return n;
}

static int fd_matches(int fd)
{
	return path_contains(fd, match);
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

/* Wait while the hold file exists (see the header), at most hold_max_ms. */
static void hold_sync(int fd)
{
	struct timespec pause = {0, 200000};
	struct timespec start,
				now;
	int			saved = errno;

	if (!hold_file[0] || access(hold_file, F_OK) != 0 || !fd_matches(fd))
	{
		errno = saved;
		return;
	}
	clock_gettime(CLOCK_MONOTONIC, &start);
	do
	{
		nanosleep(&pause, NULL);
		clock_gettime(CLOCK_MONOTONIC, &now);
	} while (access(hold_file, F_OK) == 0 &&
			 (now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000 < hold_max_ms);
	errno = saved;
}

int fsync(int fd)
{
	struct stat st;
	int l;

	hold_sync(fd);
	l = volatile_log(fd, 0, &st);
	int r = real_fsync(fd);

	volatile_synced(l, r == 0);

	if (fsync_us > 0 && fd_matches(fd))
		delay_us(fsync_us);
	return r;
}

int fdatasync(int fd)
{
	struct stat st;
	int l;

	hold_sync(fd);
	l = volatile_log(fd, 0, &st);
	int r = real_fdatasync(fd);

	volatile_synced(l, r == 0);

	if (fsync_us > 0 && fd_matches(fd))
		delay_us(fsync_us);
	return r;
}

ssize_t pwrite(int fd, const void *buf, size_t count, off_t offset)
{
	int l = volatile_begin(fd, offset, count, 0);
	ssize_t r = real_pwrite(fd, buf, count, offset);

	volatile_end(l);

	after_write(fd, r);
	return r;
}

ssize_t pwrite64(int fd, const void *buf, size_t count, off_t offset)
{
	int l = volatile_begin(fd, offset, count, 0);
	ssize_t r = (real_pwrite64 ? real_pwrite64 : real_pwrite)(fd, buf, count, offset);

	volatile_end(l);

	after_write(fd, r);
	return r;
}

ssize_t pwritev(int fd, const struct iovec *iov, int iovcnt, off_t offset)
{
	int l = volatile_begin(fd, offset, iov_length(iov, iovcnt), 0);
	ssize_t r = real_pwritev(fd, iov, iovcnt, offset);

	volatile_end(l);

	after_write(fd, r);
	return r;
}

ssize_t pwritev64(int fd, const struct iovec *iov, int iovcnt, off_t offset)
{
	int l = volatile_begin(fd, offset, iov_length(iov, iovcnt), 0);
	ssize_t r = (real_pwritev64 ? real_pwritev64 : real_pwritev)(fd, iov, iovcnt, offset);

	volatile_end(l);

	after_write(fd, r);
	return r;
}

ssize_t write(int fd, const void *buf, size_t count)
{
	ssize_t r;

	if (!real_write)			/* called before the constructor ran */
		real_write = dlsym(RTLD_NEXT, "write");
	if (volatile_dir[0] != '\0')
	{
		int l = volatile_begin(fd, 0, count, 1);

		r = real_write(fd, buf, count);
		volatile_end(l);
	}
	else
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
	if (volatile_dir[0] != '\0')
	{
		int l = volatile_begin(fd, 0, iov_length(iov, iovcnt), 1);

		r = real_writev(fd, iov, iovcnt);
		volatile_end(l);
	}
	else
		r = real_writev(fd, iov, iovcnt);

	if (delay_write)
		after_write(fd, r);
	return r;
}

void sync(void)
{
	real_sync();
	volatile_sync_all();
}

int syncfs(int fd)
{
	int r = real_syncfs(fd);

	if (r == 0)
		volatile_sync_all();
	return r;
}
