// SPDX-License-Identifier: Apache-2.0
/*
 * openclose: open and close a device node COUNT times in a tight loop, for the access guard's
 * cost row (bench/bench_guest.py guard()): the open is what the guard's file_open program sees.
 * drmcall opens a node once per step, so it cannot time opens.
 *
 *   openclose [--cgroup DIR] DEVICE COUNT
 *
 * --cgroup DIR moves the process into that cgroup v2 directory first. One JSON line reports the
 * calls, the seconds of the loop and the opens that failed, by errno ("errnos": {"1": 5}).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_ERRNO 4096

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int enter_cgroup(const char *dir)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/cgroup.procs", dir);
    FILE *f = fopen(path, "w");
    if (!f || fprintf(f, "%d\n", getpid()) < 0 || fclose(f) != 0) {
        perror(path);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    static long errs[MAX_ERRNO];
    int i = 1;
    if (argc > 2 && strcmp(argv[1], "--cgroup") == 0) {
        if (enter_cgroup(argv[2]))
            return 1;
        i = 3;
    }
    if (argc != i + 2) {
        fprintf(stderr, "usage: openclose [--cgroup DIR] DEVICE COUNT\n");
        return 2;
    }
    const char *path = argv[i];
    long count = atol(argv[i + 1]);
    double start = now();
    for (long n = 0; n < count; n++) {
        int fd = open(path, O_RDWR);
        if (fd >= 0)
            close(fd);
        else if (errno > 0 && errno < MAX_ERRNO)
            errs[errno]++;
    }
    double elapsed = now() - start;
    printf("{\"device\": \"%s\", \"calls\": %ld, \"seconds\": %.6f, \"errnos\": {", path, count,
           elapsed);
    const char *sep = "";
    for (int e = 1; e < MAX_ERRNO; e++)
        if (errs[e]) {
            printf("%s\"%d\": %ld", sep, e, errs[e]);
            sep = ", ";
        }
    printf("}}\n");
    return 0;
}
