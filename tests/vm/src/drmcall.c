// SPDX-License-Identifier: Apache-2.0
/*
 * drmcall: make a known number of DRM ioctls, fast, with no runtime dependencies (built static,
 * so it runs in a bare container image and in tight benchmark loops).
 *
 *   drmcall [--rate CALLS_PER_SEC] DEVICE NR SIZE COUNT [DEVICE NR SIZE COUNT]...
 *
 * Each step opens DEVICE and issues DRM_IOWR(NR, SIZE) COUNT times. The driver may reject the
 * call: it has still passed drm_ioctl's entry, which is what KubeNPU counts. With --rate, calls
 * are paced in batches to about that rate. One JSON line per step reports what was done.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#define DRM_IOWR_CMD(nr, size) _IOC(_IOC_READ | _IOC_WRITE, 'd', (nr), (size))
#define BATCH 1000

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

static int run_step(const char *path, unsigned nr, unsigned size, long count, double rate)
{
    static unsigned char buf[4096];
    int fd = open(path, O_RDWR);
    if (fd < 0) {
        perror(path);
        return 1;
    }
    unsigned long cmd = DRM_IOWR_CMD(nr, size);
    double start = now();
    for (long i = 0; i < count; i++) {
        memset(buf, 0, size);
        ioctl(fd, cmd, buf);
        if (rate > 0 && (i + 1) % BATCH == 0)
            pace(start, i + 1, rate);
    }
    double elapsed = now() - start;
    close(fd);
    printf("{\"device\": \"%s\", \"nr\": %u, \"calls\": %ld, \"seconds\": %.6f}\n", path, nr, count,
           elapsed);
    return 0;
}

int main(int argc, char **argv)
{
    double rate = 0;
    int i = 1;
    if (argc > 2 && strcmp(argv[1], "--rate") == 0) {
        rate = atof(argv[2]);
        i = 3;
    }
    if (argc - i < 4 || (argc - i) % 4 != 0) {
        fprintf(stderr, "usage: %s [--rate N] DEVICE NR SIZE COUNT [DEVICE NR SIZE COUNT]...\n",
                argv[0]);
        return 2;
    }
    for (; i < argc; i += 4) {
        unsigned size = strtoul(argv[i + 2], NULL, 0);
        if (size > 4096) {
            fprintf(stderr, "size %u too large\n", size);
            return 2;
        }
        if (run_step(argv[i], strtoul(argv[i + 1], NULL, 0), size, atol(argv[i + 3]), rate))
            return 1;
    }
    return 0;
}
