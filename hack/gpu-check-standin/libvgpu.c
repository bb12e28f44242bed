/*
 * A stand-in for HAMi-core's libvgpu.so that enforces, for the hardware check's tests, what the real
 * library enforces (see /work/shared/reference/hami-core-enforcement.md for the real one), on top
 * of the libcuda stand-in (libcuda.c), which defers to the standin_vgpu_* functions exported here.
 * Preloaded as HAMi-core is (LD_PRELOAD, or /etc/ld.so.preload inside a container), it reads the
 * variables HAMi-core reads:
 *
 *   - CUDA_DEVICE_MEMORY_LIMIT_0 (else CUDA_DEVICE_MEMORY_LIMIT): HAMi-core's units (last character
 *     g/m/k, strtoul base 0); the total that cuDeviceTotalMem_v2 and cuMemGetInfo_v2 report (0 when
 *     unset, as HAMi-core does), and the most the processes sharing the region may hold;
 *   - CUDA_DEVICE_SM_LIMIT_0 (else CUDA_DEVICE_SM_LIMIT): a percentage; between 1 and 99 each kernel
 *     is followed by a pause that keeps the device busy that share of the time;
 *   - CUDA_DEVICE_MEMORY_SHARED_CACHE (default /tmp/cudevshr.cache): a file every process of the
 *     share maps; the first process to create it fixes the limits, each process has a slot with its
 *     usage, and a process's usage counts against the limit of all of them.
 * Each process's CUDA context is charged to its slot (CONTEXT_MIB), as HAMi-core charges it.
 *
 * Faults for the tests, compiled in (-D...): FAULT_MEMORY_LIMIT (allocations are never refused),
 * FAULT_CORE_LIMIT (no pause after kernels), FAULT_SHARED_REGION (each process sees only its own
 * usage), FAULT_PID_NAMESPACE (as PID 1 of a PID namespace the host PID is not found: HAMi-core's
 * "SET_TASK_PID FAILED" and no cores limit).
 *
 * Build: gcc -shared -fPIC -O2 -Wall -Werror -o libvgpu.so libvgpu.c
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define MIB (1024ULL * 1024ULL)
#define CONTEXT_MIB 600ULL
#define SLOTS 64
#define MAGIC 19920718u

struct region {
    uint32_t magic;
    uint32_t sm_limit;
    uint64_t limit;
    struct {
        int32_t pid;
        uint64_t used;
    } slots[SLOTS];
};

static struct region *region;
static int region_fd = -1;
static int slot = -1;
static int task_pid_found = 1;

static uint64_t parse_limit(const char *name) {
    char indexed[128];
    snprintf(indexed, sizeof(indexed), "%s_0", name);
    const char *text = getenv(indexed);
    if (text == NULL || *text == '\0') text = getenv(name);
    if (text == NULL || *text == '\0') return 0;
    char *end;
    uint64_t value = strtoull(text, &end, 0);
    switch (text[strlen(text) - 1]) {
    case 'g': case 'G': return value << 30;
    case 'm': case 'M': return value << 20;
    case 'k': case 'K': return value << 10;
    default: return value;
    }
}

static void lock(void) { (void)flock(region_fd, LOCK_EX); }
static void unlock(void) { (void)flock(region_fd, LOCK_UN); }

__attribute__((constructor)) static void standin_vgpu_init(void) {
    const char *path = getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");
    if (path == NULL || *path == '\0') path = "/tmp/cudevshr.cache";
    region_fd = open(path, O_RDWR | O_CREAT, 0666);
    if (region_fd < 0 || ftruncate(region_fd, sizeof(struct region)) != 0) {
        fprintf(stderr, "libvgpu stand-in: cannot open the shared cache %s\n", path);
        exit(EXIT_FAILURE);
    }
    region = mmap(NULL, sizeof(struct region), PROT_READ | PROT_WRITE, MAP_SHARED, region_fd, 0);
    if (region == MAP_FAILED) exit(EXIT_FAILURE);
    lock();
    if (region->magic != MAGIC) { /* the first process fixes the limits */
        memset(region, 0, sizeof(*region));
        region->limit = parse_limit("CUDA_DEVICE_MEMORY_LIMIT");
        region->sm_limit = (uint32_t)parse_limit("CUDA_DEVICE_SM_LIMIT");
        region->magic = MAGIC;
    }
    int32_t pid = (int32_t)getpid();
    for (int i = 0; i < SLOTS && slot < 0; i++) {
        if (region->slots[i].pid == pid || region->slots[i].pid == 0) slot = i;
    }
    if (slot >= 0) region->slots[slot].pid = pid, region->slots[slot].used = 0;
    unlock();
#ifdef FAULT_PID_NAMESPACE
    if (pid == 1) {
        fprintf(stderr, "[HAMI-core ERROR]: SET_TASK_PID FAILED - using container PID for accounting\n");
        task_pid_found = 0;
    }
#endif
}

__attribute__((destructor)) static void standin_vgpu_exit(void) {
    if (region == NULL || slot < 0) return;
    lock();
    region->slots[slot].pid = 0;
    region->slots[slot].used = 0;
    unlock();
}

static uint64_t used_nolock(void) {
#ifdef FAULT_SHARED_REGION
    return slot >= 0 ? region->slots[slot].used : 0;
#else
    uint64_t sum = 0;
    for (int i = 0; i < SLOTS; i++) sum += region->slots[i].pid ? region->slots[i].used : 0;
    return sum;
#endif
}

size_t standin_vgpu_limit(size_t physical) {
    (void)physical; /* HAMi-core reports the limit, 0 when none is set */
    return (size_t)region->limit;
}

size_t standin_vgpu_used(void) {
    lock();
    uint64_t used = used_nolock();
    unlock();
    return (size_t)used;
}

/* Account ``bytes`` (negative: freed) to this process; 0 when the limit refuses the allocation. */
int standin_vgpu_charge(long long bytes) {
    if (slot < 0) return 0;
    lock();
    int allowed = 1;
#ifndef FAULT_MEMORY_LIMIT
    if (bytes > 0 && used_nolock() + (uint64_t)bytes > region->limit) allowed = 0;
#endif
    if (allowed) region->slots[slot].used += (uint64_t)bytes;
    unlock();
    return allowed;
}

int standin_vgpu_context_created(long long unused) {
    (void)unused;
    if (slot < 0) return 0;
    lock();
    region->slots[slot].used += CONTEXT_MIB * MIB;
    unlock();
    return 1;
}

void standin_vgpu_launched(long kernel_ns) {
    uint32_t sm = region->sm_limit;
#ifdef FAULT_CORE_LIMIT
    sm = 0;
#endif
    if (!task_pid_found || sm == 0 || sm >= 100) return;
    long long pause = (long long)kernel_ns * (100 - sm) / sm;
    struct timespec wait = {(time_t)(pause / 1000000000LL), (long)(pause % 1000000000LL)};
    nanosleep(&wait, NULL);
}
