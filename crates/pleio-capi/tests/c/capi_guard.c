/*
 * The SIGBUS guard inside a C host, built by scripts/capi_test.sh like
 * capi_test.c (ASan/UBSan, libpleio_capi.a).
 *
 *   capi_guard DIR
 *
 * DIR holds q.gguf and meta.txt (see capi_test.c). Each case runs in a
 * child process of its own (signal handlers are process-wide) on its own
 * copy of q.gguf, gathers with the "fault" strategy (rows copied out of the
 * mapping), cuts the file at the table's start and gathers the last row
 * again: that must fail with PLEIO_ERR_IO naming the file and the offset,
 * never kill the process. The cases:
 *   host-first  the host installs its own SIGBUS handler before pleio's:
 *               pleio's fault never reaches it, a SIGBUS sent with
 *               pthread_kill does;
 *   host-later  the host installs a handler after pleio's (one that exits
 *               42 if it ever runs): gathers still succeed and the cut is
 *               still an error (pleio reads the file instead);
 *   blocked     the gathering thread blocks SIGBUS (a fault then kills
 *               whatever the handler), and still has it blocked after.
 * Prints one line per failed check and "N passed, M failed" per case;
 * exits 1 on any failure.
 */
#define _GNU_SOURCE
#include "pleio.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int passed, failed;

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (cond) {                                                             \
            passed++;                                                           \
        } else {                                                                \
            failed++;                                                           \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);     \
            fprintf(stderr, __VA_ARGS__);                                       \
            fprintf(stderr, " (last error: %s)\n", pleio_last_error());         \
        }                                                                       \
    } while (0)

static char dir[4096], path[4200];
static int64_t rows, row_elems, offset;

/* Copies DIR/q.gguf to DIR/guard-CASE.gguf (this case's file to cut). */
static void copy_table(const char *name) {
    char src[4200];
    snprintf(src, sizeof src, "%s/q.gguf", dir);
    snprintf(path, sizeof path, "%s/guard-%s.gguf", dir, name);
    FILE *in = fopen(src, "rb"), *out = fopen(path, "wb");
    if (!in || !out) {
        fprintf(stderr, "cannot copy %s to %s\n", src, path);
        exit(2);
    }
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) {
        if (fwrite(buf, 1, n, out) != n) {
            exit(2);
        }
    }
    fclose(in);
    fclose(out);
}

static struct pleio_table *open_fault(void) {
    struct pleio_table *t = NULL;
    int rc = pleio_open_with(path, NULL, "fault", &t);
    CHECK(rc == PLEIO_OK && t, "open %s: %d", path, rc);
    return t;
}

/* Gathers rows 0 and rows-1: 0 or the status. */
static int gather_two(struct pleio_table *t, float *out) {
    int64_t ids[2] = {0, rows - 1};
    return pleio_gather(t, ids, 2, PLEIO_DTYPE_F32, out, 2 * (size_t)row_elems * sizeof(float),
                        NULL);
}

/* Cuts the file at the table's start; the gather must fail cleanly. */
static void cut_and_check(struct pleio_table *t) {
    CHECK(truncate(path, offset) == 0, "truncate %s", path);
    float *out = calloc(2 * (size_t)row_elems, sizeof(float));
    int rc = gather_two(t, out);
    CHECK(rc == PLEIO_ERR_IO, "gather past the cut: %d", rc);
    const char *e = pleio_last_error();
    CHECK(strstr(e, path) && strstr(e, "offset"), "error names the file and offset: %s", e);
    free(out);
}

static volatile sig_atomic_t host_signals;

static void host_counting(int sig, siginfo_t *info, void *ctx) {
    (void)sig;
    (void)info;
    (void)ctx;
    host_signals++;
}

static void host_dying(int sig, siginfo_t *info, void *ctx) {
    (void)sig;
    (void)info;
    (void)ctx;
    static const char msg[] = "the host's SIGBUS handler ran\n";
    if (write(2, msg, sizeof msg - 1) < 0) {
        _exit(43);
    }
    _exit(42);
}

static void install(void (*h)(int, siginfo_t *, void *)) {
    struct sigaction a;
    memset(&a, 0, sizeof a);
    a.sa_sigaction = h;
    a.sa_flags = SA_SIGINFO;
    sigemptyset(&a.sa_mask);
    CHECK(sigaction(SIGBUS, &a, NULL) == 0, "sigaction");
}

static void case_host_first(void) {
    install(host_counting);
    struct pleio_table *t = open_fault();
    float *out = calloc(2 * (size_t)row_elems, sizeof(float));
    CHECK(gather_two(t, out) == PLEIO_OK, "gather");
    /* A signal sent to the thread goes to the host's handler, through pleio's. */
    CHECK(pthread_kill(pthread_self(), SIGBUS) == 0, "pthread_kill");
    CHECK(host_signals == 1, "host handler got the sent SIGBUS: %d", (int)host_signals);
    cut_and_check(t);
    CHECK(host_signals == 1, "pleio's own fault reached the host: %d", (int)host_signals);
    free(out);
    pleio_close(t);
}

static void case_host_later(void) {
    struct pleio_table *t = open_fault();
    float *want = calloc(2 * (size_t)row_elems, sizeof(float));
    float *got = calloc(2 * (size_t)row_elems, sizeof(float));
    CHECK(gather_two(t, want) == PLEIO_OK, "gather");
    install(host_dying);
    CHECK(gather_two(t, got) == PLEIO_OK, "gather with the host's handler in place");
    CHECK(memcmp(want, got, 2 * (size_t)row_elems * sizeof(float)) == 0, "same rows");
    cut_and_check(t);
    free(want);
    free(got);
    pleio_close(t);
}

static int sigbus_blocked(void) {
    sigset_t now;
    pthread_sigmask(SIG_BLOCK, NULL, &now);
    return sigismember(&now, SIGBUS) == 1;
}

static void *blocked_thread(void *arg) {
    (void)arg;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGBUS);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    struct pleio_table *t = open_fault();
    float *out = calloc(2 * (size_t)row_elems, sizeof(float));
    CHECK(gather_two(t, out) == PLEIO_OK, "gather");
    CHECK(sigbus_blocked(), "SIGBUS still blocked after a gather");
    cut_and_check(t);
    CHECK(sigbus_blocked(), "SIGBUS still blocked after a failed gather");
    free(out);
    pleio_close(t);
    return NULL;
}

static void case_blocked(void) {
    pthread_t th;
    CHECK(pthread_create(&th, NULL, blocked_thread, NULL) == 0, "pthread_create");
    pthread_join(th, NULL);
}

static const struct {
    const char *name;
    void (*run)(void);
} cases[] = {
    {"host-first", case_host_first},
    {"host-later", case_host_later},
    {"blocked", case_blocked},
};

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: capi_guard DIR\n");
        return 2;
    }
    snprintf(dir, sizeof dir, "%s", argv[1]);
    char meta[4200], type[64];
    long long r, e, rb, off;
    snprintf(meta, sizeof meta, "%s/meta.txt", dir);
    FILE *f = fopen(meta, "r");
    if (!f || fscanf(f, "%lld %lld %lld %63s %lld", &r, &e, &rb, type, &off) != 5) {
        fprintf(stderr, "cannot read %s\n", meta);
        return 2;
    }
    fclose(f);
    rows = r, row_elems = e, offset = off;
    int bad = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            copy_table(cases[i].name);
            cases[i].run();
            printf("capi_guard %s: %d passed, %d failed\n", cases[i].name, passed, failed);
            fflush(NULL);
            _exit(failed ? 1 : 0);
        }
        int status = 0;
        if (pid < 0 || waitpid(pid, &status, 0) != pid) {
            fprintf(stderr, "capi_guard %s: cannot run the case\n", cases[i].name);
            bad = 1;
        } else if (WIFSIGNALED(status)) {
            fprintf(stderr, "FAIL capi_guard %s: killed by signal %d\n", cases[i].name,
                    WTERMSIG(status));
            bad = 1;
        } else if (WEXITSTATUS(status) != 0) {
            fprintf(stderr, "FAIL capi_guard %s: exit %d\n", cases[i].name, WEXITSTATUS(status));
            bad = 1;
        }
    }
    return bad;
}
