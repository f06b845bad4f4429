// SPDX-License-Identifier: Apache-2.0
/*
 * drmcall: make a known number of ioctls on device nodes, fast, with no runtime dependencies
 * (built static, so it runs in a bare container image and in tight benchmark loops). It is the
 * one workload generator of the VM tests and the benchmark.
 *
 *   drmcall [--hold] [--rate CALLS_PER_SEC] [--cgroup DIR] [--wait-signal] [--raw] DEVICE NR SIZE COUNT ...
 *
 * Arguments are read in order. A step `DEVICE NR SIZE COUNT` opens DEVICE and issues
 * DRM_IOWR(NR, SIZE) COUNT times; with --raw before it, NR is a whole ioctl request issued as is
 * (e.g. 0x5401, TCGETS: not a DRM ioctl at all), with a zeroed SIZE-byte argument. The driver may
 * reject a call: it has still passed drm_ioctl's entry, which is what KubeNPU counts.
 * --cgroup DIR moves the process into that cgroup v2 directory before the steps that follow (so
 * one process can make calls from many cgroups); --rate paces the steps that follow, in batches,
 * to about that many calls per second. One JSON line per step reports what was done.
 * --hold keeps the fd of every step open (each one DRM client, for fdinfo) and, after the last
 * step, sleeps until killed. --wait-signal prints {"waiting": true} and waits for SIGUSR1 before
 * the steps that follow, so a test starts several processes' calls at one moment (SIGUSR1 is
 * blocked from the start: one sent before the wait is not lost).
 * Each report counts the calls that failed, by errno ("errnos": {"22": 5}): what the kernel's
 * error counts per {cgroup, device, kind} must show.
 */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#define DRM_IOWR_CMD(nr, size) _IOC(_IOC_READ | _IOC_WRITE, 'd', (nr), (size))
#define BATCH 1000
#define MAX_SIZE 4096
#define MAX_ERRNO 4096

static int hold; /* --hold: keep every step's fd open, then sleep until killed */
static long errs[MAX_ERRNO]; /* the step's failed calls, by errno */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void pace(double start, long done, double rate)
{
    double due = start + done / rate;
    double wait = due - now();
    if (wait > 0) {
        struct timespec ts = {(time_t)wait, (long)((wait - (time_t)wait) * 1e9)};
        nanosleep(&ts, NULL);
    }
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

/* One call; a failure is counted by errno. */
static void call(int fd, unsigned long cmd, void *buf)
{
    if (ioctl(fd, cmd, buf) < 0 && errno > 0 && errno < MAX_ERRNO)
        errs[errno]++;
}

static void print_report(const char *path, unsigned long cmd, long count, double elapsed)
{
    printf("{\"device\": \"%s\", \"cmd\": %lu, \"calls\": %ld, \"seconds\": %.6f, \"errnos\": {",
           path, cmd, count, elapsed);
    const char *sep = "";
    for (int e = 0; e < MAX_ERRNO; e++) {
        if (errs[e]) {
            printf("%s\"%d\": %ld", sep, e, errs[e]);
            sep = ", ";
        }
    }
    printf("}}\n");
}

static int run_step(const char *path, unsigned long cmd, unsigned size, long count, double rate)
{
    static unsigned char buf[MAX_SIZE];
    int fd = open(path, O_RDWR);
    if (fd < 0) {
        perror(path);
        return 1;
    }
    memset(errs, 0, sizeof(errs));
    double start = now();
    for (long i = 0; i < count; i++) {
        memset(buf, 0, size);
        call(fd, cmd, buf);
        if (rate > 0 && (i + 1) % BATCH == 0)
            pace(start, i + 1, rate);
    }
    double elapsed = now() - start;
    if (!hold)
        close(fd);
    print_report(path, cmd, count, elapsed);
    return 0;
}

static int usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s [--hold] [--rate N] [--cgroup DIR] [--wait-signal] [--raw] DEVICE NR SIZE "
            "COUNT ...\n",
            argv0);
    return 2;
}

static void wait_signal(const sigset_t *usr1)
{
    int sig;
    printf("{\"waiting\": true}\n");
    fflush(stdout);
    sigwait(usr1, &sig);
}

int main(int argc, char **argv)
{
    double rate = 0;
    int steps = 0;
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    sigprocmask(SIG_BLOCK, &usr1, NULL);
    for (int i = 1; i < argc;) {
        if (strcmp(argv[i], "--wait-signal") == 0) {
            wait_signal(&usr1);
            i++;
            continue;
        }
        if (strcmp(argv[i], "--hold") == 0) {
            hold = 1;
            i++;
            continue;
        }
        if (strcmp(argv[i], "--rate") == 0 && i + 1 < argc) {
            rate = atof(argv[i + 1]);
            i += 2;
            continue;
        }
        if (strcmp(argv[i], "--cgroup") == 0 && i + 1 < argc) {
            if (enter_cgroup(argv[i + 1]))
                return 1;
            i += 2;
            continue;
        }
        int raw = strcmp(argv[i], "--raw") == 0;
        i += raw;
        if (argc - i < 4)
            return usage(argv[0]);
        unsigned long request = strtoul(argv[i + 1], NULL, 0);
        unsigned size = strtoul(argv[i + 2], NULL, 0);
        if (size > MAX_SIZE) {
            fprintf(stderr, "size %u too large\n", size);
            return 2;
        }
        unsigned long cmd = raw ? request : DRM_IOWR_CMD(request, size);
        if (run_step(argv[i], cmd, size, atol(argv[i + 3]), rate))
            return 1;
        steps++;
        i += 4;
    }
    if (!steps)
        return usage(argv[0]);
    fflush(stdout);
    while (hold)
        pause();
    return 0;
}
