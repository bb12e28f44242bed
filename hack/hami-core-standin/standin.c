/*
 * A stand-in for HAMi-core's libvgpu.so, for machines without a GPU.
 *
 * HAMi-core enforces a share from inside the container: the dynamic loader preloads it (the CDI
 * spec mounts it at /usr/local/vgpu/libvgpu.so and an /etc/ld.so.preload naming that path), and it
 * reads its limits from the process's environment. Without a GPU nothing can be limited, but
 * everything the driver controls up to that point can be observed: this library, preloaded the
 * same way, writes down what HAMi-core would read, so a test can compare it with the claim.
 *
 * When loaded (a constructor, as HAMi-core initialises), it
 *   - creates the shared cache file CUDA_DEVICE_MEMORY_SHARED_CACHE names, mode 0666, as
 *     HAMi-core does (its first process creates the region every later one shares);
 *   - writes a record next to it, hami-core-standin.<pid>.env, atomically (temporary name, then
 *     rename), or to stderr when the variable is unset.
 * A record is "key=value" lines: "standin=1", pid, uid, hostname (the pod's name), exe, the path
 * the library was loaded from, the loader's /etc/ld.so.preload, then every variable HAMi-core
 * reads (CUDA_DEVICE_MEMORY_LIMIT*, CUDA_DEVICE_SM_LIMIT*, CUDA_DEVICE_MEMORY_SHARED_CACHE,
 * GPU_CORE_UTILIZATION_POLICY, CUDA_VISIBLE_DEVICES), CUDA_DEVICE_ORDER and LD_PRELOAD, in the
 * order of the environment. It never exits, never writes to stdout, and ignores every failure:
 * the process it is loaded into must run as it would without it.
 *
 * Build: gcc -shared -fPIC -O2 -Wall -Wextra -Werror -o libvgpu.so standin.c
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

extern char **environ;

static const char *const PREFIXES[] = {
    "CUDA_DEVICE_MEMORY_LIMIT",     /* and _<i> */
    "CUDA_DEVICE_SM_LIMIT",         /* and _<i> */
    "CUDA_DEVICE_MEMORY_SHARED_CACHE=",
    "CUDA_DEVICE_ORDER=",
    "GPU_CORE_UTILIZATION_POLICY=",
    "CUDA_VISIBLE_DEVICES=",
    "LD_PRELOAD=",
};

static int relevant(const char *entry) {
    for (size_t i = 0; i < sizeof(PREFIXES) / sizeof(PREFIXES[0]); i++) {
        const char *prefix = PREFIXES[i];
        size_t n = strlen(prefix);
        if (strncmp(entry, prefix, n) != 0) continue;
        /* a prefix without '=' is a family: the bare name or name_<i> */
        if (prefix[n - 1] == '=' || entry[n] == '=' || entry[n] == '_') return 1;
    }
    return 0;
}

/* One line of a file, newline removed, into buf ("" when unreadable). */
static void first_line(const char *path, char *buf, size_t size) {
    buf[0] = '\0';
    FILE *file = fopen(path, "r");
    if (file == NULL) return;
    if (fgets(buf, (int)size, file) == NULL) buf[0] = '\0';
    fclose(file);
    buf[strcspn(buf, "\n")] = '\0';
}

static void write_record(FILE *out) {
    char host[256] = "", exe[4096] = "", preload[4096];
    Dl_info info;
    const char *library = "";
    if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    exe[n > 0 ? n : 0] = '\0';
    if (dladdr((void *)write_record, &info) != 0 && info.dli_fname != NULL) library = info.dli_fname;
    first_line("/etc/ld.so.preload", preload, sizeof(preload));
    fprintf(out, "standin=1\npid=%ld\nuid=%ld\nhostname=%s\nexe=%s\nlibrary=%s\nld.so.preload=%s\n",
            (long)getpid(), (long)getuid(), host, exe, library, preload);
    for (char **entry = environ; entry != NULL && *entry != NULL; entry++) {
        if (relevant(*entry)) fprintf(out, "%s\n", *entry);
    }
}

__attribute__((constructor)) static void hami_core_standin(void) {
    const char *cache = getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");
    if (cache == NULL || cache[0] == '\0') {
        write_record(stderr);
        return;
    }
    int fd = open(cache, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd >= 0) {
        (void)fchmod(fd, 0666); /* whatever the umask: every process of the container opens it */
        close(fd);
    }
    const char *slash = strrchr(cache, '/');
    if (slash == NULL) return;
    char path[4096], tmp[4200];
    int len = snprintf(path, sizeof(path), "%.*s/hami-core-standin.%ld.env", (int)(slash - cache), cache,
                       (long)getpid());
    if (len < 0 || (size_t)len >= sizeof(path)) return;
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *out = fopen(tmp, "we");
    if (out == NULL) return;
    write_record(out);
    if (fclose(out) != 0 || rename(tmp, path) != 0) unlink(tmp);
}
