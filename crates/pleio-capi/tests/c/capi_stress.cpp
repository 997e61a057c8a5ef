// Concurrency stress of the C ABI for a fixed time, built by
// scripts/capi_test.sh (C++17, -fsanitize=address,undefined, linked to
// libpleio_capi.so).
//
//   capi_stress DIR SECONDS
//
// DIR as for capi_threads.cpp (meta.txt, all.f32, q.gguf), plus big.gguf
// (a larger table for part 2). Two parts:
//
// 1. Churn, for SECONDS: six threads each open their own table (strategies
//    in turn: auto, pool, uring, fault, pread, uring-direct), gather and
//    prefetch/wait random batches checked row by row against all.f32, and
//    close it (pleio_close or pleio_close_timeout); two more gather from
//    one shared handle the whole time. Every call must succeed exactly;
//    AddressSanitizer checks the handles' memory, and the handle slots
//    are reused (the slot table stays at the handles open at once).
// 2. fork(): for each of uring-direct, uring, pool and auto, a table used
//    (gather and prefetch/wait of 3000 sparse rows of big.gguf) before the
//    fork, then used by two children and the parent at once, every batch
//    equal to the rows a pread table gathered; each child must exit 0. alarm()
//    turns a hang into a failure (SIGALRM) in the parent and the children.
//
// Prints "N passed, M failed"; exits 1 on any failure.
#include "pleio.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

std::atomic<int> passed{0}, failed{0};

void check(bool ok, const std::string &what) {
    if (ok) {
        ++passed;
    } else {
        ++failed;
        std::fprintf(stderr, "FAIL: %s (last error: %s)\n", what.c_str(), pleio_last_error());
    }
}

std::vector<char> slurp(const std::string &path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) {
        std::fprintf(stderr, "cannot open %s\n", path.c_str());
        std::exit(2);
    }
    return std::vector<char>(std::istreambuf_iterator<char>(f), {});
}

struct Fixture {
    std::string path;
    std::vector<float> all;  // every row, f32
    uint64_t rows = 0, row_elems = 0;
};

const char *const STRATEGIES[] = {"auto", "pool", "uring", "fault", "pread", "uring-direct"};

// One batch gathered (or prefetched and waited for) from `t` and checked;
// returns the status of the first failing call, or -1 when rows differ.
int one_batch(pleio_table *t, const Fixture &fx, std::mt19937_64 &rng, bool prefetch) {
    std::uniform_int_distribution<uint64_t> pick(0, fx.rows - 1);
    std::uniform_int_distribution<int> size(1, 600);
    const int n = size(rng);
    std::vector<int64_t> ids(n);
    for (auto &id : ids) id = static_cast<int64_t>(pick(rng));
    std::vector<float> out(n * fx.row_elems);
    int rc;
    if (prefetch) {
        pleio_batch *p = nullptr;
        rc = pleio_prefetch(t, ids.data(), n, &p);
        if (rc == PLEIO_OK) rc = pleio_wait(p, out.data(), out.size() * 4, nullptr);
    } else {
        rc = pleio_gather(t, ids.data(), n, PLEIO_DTYPE_F32, out.data(), out.size() * 4, nullptr);
    }
    if (rc != PLEIO_OK) return rc;
    for (int i = 0; i < n; i++)
        if (std::memcmp(out.data() + i * fx.row_elems, fx.all.data() + ids[i] * fx.row_elems, fx.row_elems * 4))
            return -1;
    return PLEIO_OK;
}

void churn(const Fixture &fx, double seconds) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    pleio_table *shared = nullptr;
    check(pleio_open(fx.path.c_str(), nullptr, &shared) == PLEIO_OK, "open the shared handle");
    std::atomic<long> cycles{0}, batches{0};
    std::vector<std::thread> threads;
    for (unsigned k = 0; k < 6; k++)
        threads.emplace_back([&, k] {
            std::mt19937_64 rng(100 + k);
            for (unsigned r = 0; std::chrono::steady_clock::now() < end; r++) {
                pleio_table *t = nullptr;
                const char *s = STRATEGIES[(k + r) % 6];
                int rc = pleio_open_with(fx.path.c_str(), nullptr, s, &t);
                for (int b = 0; rc == PLEIO_OK && b < 3; b++) rc = one_batch(t, fx, rng, b == 1);
                if (rc != PLEIO_OK) {
                    check(false, std::string("churn with ") + s + ": status " + std::to_string(rc));
                    pleio_close(t);
                    return;
                }
                if (r % 2) {
                    pleio_close(t);
                } else if (pleio_close_timeout(t, 60000) != PLEIO_OK) {
                    check(false, "pleio_close_timeout of an idle handle");
                    return;
                }
                ++cycles;
            }
        });
    for (unsigned k = 0; k < 2; k++)
        threads.emplace_back([&, k] {
            std::mt19937_64 rng(200 + k);
            while (std::chrono::steady_clock::now() < end) {
                int rc = one_batch(shared, fx, rng, k == 1);
                if (rc != PLEIO_OK) {
                    check(false, "shared handle: status " + std::to_string(rc));
                    return;
                }
                ++batches;
            }
        });
    for (auto &th : threads) th.join();
    check(cycles > 0 && batches > 0, "churn ran (" + std::to_string(cycles.load()) + " open/close cycles, " +
                                         std::to_string(batches.load()) + " shared batches)");
    check(pleio_close_timeout(shared, 60000) == PLEIO_OK, "close the shared handle");
}

// A table used before fork(), and its rows as the parent gathered them.
struct Forked {
    std::vector<int64_t> ids;
    std::vector<float> want;
};

// Gathers and prefetches `f.ids` a few times; 0 when every one was exact.
int use(pleio_table *t, const Forked &f) {
    std::vector<float> out(f.want.size());
    for (int b = 0; b < 6; b++) {
        int rc;
        if (b % 2) {
            pleio_batch *p = nullptr;
            rc = pleio_prefetch(t, f.ids.data(), f.ids.size(), &p);
            if (rc == PLEIO_OK) rc = pleio_wait(p, out.data(), out.size() * 4, nullptr);
        } else {
            rc = pleio_gather(t, f.ids.data(), f.ids.size(), PLEIO_DTYPE_F32, out.data(), out.size() * 4, nullptr);
        }
        if (rc != PLEIO_OK || out != f.want) return 1;
    }
    return 0;
}

// `big`: a table large enough that the sparse ids make many separate reads
// (the pool's threads and the ring are used, not an inline read).
void forks(const std::string &big) {
    Forked f;
    pleio_table *ref = nullptr;
    check(pleio_open_with(big.c_str(), nullptr, "pread", &ref) == PLEIO_OK, "open the reference");
    pleio_info info;
    check(pleio_table_info(ref, &info) == PLEIO_OK, "info");
    for (uint64_t i = 0; i < 3000; i++) f.ids.push_back(static_cast<int64_t>((i * 67) % info.rows));
    f.want.resize(f.ids.size() * info.row_elems);
    check(pleio_gather(ref, f.ids.data(), f.ids.size(), PLEIO_DTYPE_F32, f.want.data(), f.want.size() * 4,
                       nullptr) == PLEIO_OK,
          "reference gather");
    pleio_close(ref);
    for (const char *s : {"uring-direct", "uring", "pool", "auto"}) {
        pleio_table *t = nullptr;
        check(pleio_open_with(big.c_str(), nullptr, s, &t) == PLEIO_OK, std::string("open ") + s);
        check(use(t, f) == 0, std::string(s) + ": before the fork");
        std::vector<pid_t> kids;
        for (unsigned c = 0; c < 2; c++) {
            std::fflush(nullptr);
            pid_t pid = fork();
            if (pid == 0) {
                alarm(60);  // a hang ends the child by SIGALRM: a failure
                _exit(use(t, f));
            }
            check(pid > 0, "fork");
            if (pid > 0) kids.push_back(pid);
        }
        alarm(120);  // the parent too
        check(use(t, f) == 0, std::string(s) + ": the parent after the fork");
        for (pid_t pid : kids) {
            int status = 0;
            waitpid(pid, &status, 0);
            check(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  std::string(s) + ": a child after the fork (status " + std::to_string(status) + ")");
        }
        alarm(0);
        pleio_close(t);
    }
}

}  // namespace

int main(int argc, char **argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: %s DIR SECONDS\n", argv[0]);
        return 2;
    }
    const std::string dir = argv[1];
    Fixture fx;
    fx.path = dir + "/q.gguf";
    {
        std::ifstream meta(dir + "/meta.txt");
        std::string type_name;
        uint64_t row_bytes = 0, offset = 0;
        meta >> fx.rows >> fx.row_elems >> row_bytes >> type_name >> offset;
        if (!meta) {
            std::fprintf(stderr, "cannot read meta.txt\n");
            return 2;
        }
    }
    {
        std::vector<char> all = slurp(dir + "/all.f32");
        fx.all.resize(all.size() / sizeof(float));
        std::memcpy(fx.all.data(), all.data(), all.size());
    }
    check(fx.all.size() == fx.rows * fx.row_elems, "all.f32 holds every row");
    churn(fx, std::atof(argv[2]));
    forks(dir + "/big.gguf");
    std::printf("capi_stress: %d passed, %d failed\n", passed.load(), failed.load());
    return failed ? 1 : 0;
}
