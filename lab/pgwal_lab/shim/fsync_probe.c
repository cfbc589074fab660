/*
 * fsync_probe.c - times pwrite() and fdatasync() on one file, for the lab's
 * proof that a disk latency profile is in effect.
 *
 * The lab runs it as the server user, with the same environment a node's
 * postmaster gets (LD_PRELOAD of the shim and its settings), on a file in the
 * node's own file system whose path contains the profile's match string.  If
 * the shim cannot be loaded by that user, the dynamic loader skips it without
 * an error; the times printed here then show no added latency, and the lab
 * refuses to measure.
 *
 * usage: fsync_probe FILE ROUNDS BYTES
 * prints: one JSON object with min and median microseconds per call
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_ROUNDS 1000

static double
now_us(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int
cmp_double(const void *a, const void *b)
{
	double		x = *(const double *) a,
				y = *(const double *) b;

	return (x > y) - (x < y);
}

int
main(int argc, char **argv)
{
	static double wr[MAX_ROUNDS],
				fs[MAX_ROUNDS];
	int			rounds,
				fd,
				i;
	size_t		bytes;
	char	   *buf;

	if (argc != 4 || (rounds = atoi(argv[2])) < 1 || rounds > MAX_ROUNDS ||
		(bytes = (size_t) atol(argv[3])) < 1)
	{
		fprintf(stderr, "usage: fsync_probe FILE ROUNDS(1-%d) BYTES\n", MAX_ROUNDS);
		return 2;
	}
	if ((buf = malloc(bytes)) == NULL)
		return 1;
	memset(buf, 'x', bytes);
	if ((fd = open(argv[1], O_WRONLY | O_CREAT, 0600)) < 0)
	{
		perror(argv[1]);
		return 1;
	}
	for (i = 0; i < rounds; i++)
	{
		double		t0 = now_us(),
					t1;

		if (pwrite(fd, buf, bytes, 0) != (ssize_t) bytes)
		{
			perror("pwrite");
			return 1;
		}
		t1 = now_us();
		if (fdatasync(fd) != 0)
		{
			perror("fdatasync");
			return 1;
		}
		wr[i] = t1 - t0;
		fs[i] = now_us() - t1;
	}
	close(fd);
	unlink(argv[1]);
	qsort(wr, rounds, sizeof(double), cmp_double);
	qsort(fs, rounds, sizeof(double), cmp_double);
	printf("{\"rounds\": %d, \"bytes\": %zu, \"pwrite_us_min\": %.1f, \"pwrite_us_median\": %.1f, "
		   "\"fdatasync_us_min\": %.1f, \"fdatasync_us_median\": %.1f}\n",
		   rounds, bytes, wr[0], wr[rounds / 2], fs[0], fs[rounds / 2]);
	return 0;
}
