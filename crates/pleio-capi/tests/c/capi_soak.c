/* A C client of the machine-wide shared cache, for scripts/shared_soak.py:
 * gathers random batches (1 to 2000 ids, repeats allowed) through a table
 * opened with strategy "shared" until SECONDS have passed, and checks each
 * against the same ids through a second handle opened with "pread", byte
 * for byte (raw rows). Exits 0 when every batch matched, 1 at the first
 * failure or difference (printing it).
 *
 *   capi_soak TABLE SECONDS SEED
 */
#define _POSIX_C_SOURCE 199309L
#include "pleio.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t next(uint64_t *s) {
    /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: capi_soak TABLE SECONDS SEED\n");
        return 2;
    }
    double seconds = atof(argv[2]);
    uint64_t seed = strtoull(argv[3], NULL, 10);
    pleio_table *sh = NULL, *ref = NULL;
    if (pleio_open_with(argv[1], NULL, "shared", &sh) != PLEIO_OK ||
        pleio_open_with(argv[1], NULL, "pread", &ref) != PLEIO_OK) {
        fprintf(stderr, "capi_soak: open %s: %s\n", argv[1], pleio_last_error());
        return 1;
    }
    pleio_info info;
    if (pleio_table_info(ref, &info) != PLEIO_OK) {
        fprintf(stderr, "capi_soak: info: %s\n", pleio_last_error());
        return 1;
    }
    const size_t max = 2000, rb = (size_t)info.row_bytes;
    int64_t *ids = malloc(max * sizeof *ids);
    unsigned char *a = malloc(max * rb), *b = malloc(max * rb);
    if (!ids || !a || !b) {
        return 1;
    }
    double end = now() + seconds;
    unsigned long batches = 0, rows = 0;
    while (now() < end) {
        size_t n = 1 + (size_t)(next(&seed) % max);
        /* half the ids from a hot eighth every client shares */
        for (size_t i = 0; i < n; i++) {
            uint64_t r = next(&seed);
            ids[i] = (int64_t)(r % ((i & 1) ? info.rows : (info.rows / 8 ? info.rows / 8 : 1)));
        }
        if (pleio_gather(sh, ids, n, PLEIO_DTYPE_RAW, a, n * rb, NULL) != PLEIO_OK) {
            fprintf(stderr, "capi_soak: shared gather of %zu rows: %s\n", n, pleio_last_error());
            return 1;
        }
        if (pleio_gather(ref, ids, n, PLEIO_DTYPE_RAW, b, n * rb, NULL) != PLEIO_OK) {
            fprintf(stderr, "capi_soak: pread gather of %zu rows: %s\n", n, pleio_last_error());
            return 1;
        }
        for (size_t i = 0; i < n; i++) {
            if (memcmp(a + i * rb, b + i * rb, rb) != 0) {
                fprintf(stderr, "capi_soak: row %lld (batch %lu, position %zu) differs from pread's\n",
                        (long long)ids[i], batches, i);
                return 1;
            }
        }
        batches++;
        rows += n;
    }
    pleio_close(sh);
    pleio_close(ref);
    free(ids);
    free(a);
    free(b);
    printf("capi_soak: %lu batches, %lu rows, all equal to pread's\n", batches, rows);
    return 0;
}
