/*
 * A stand-in for the CUDA driver library (libcuda.so.1) for machines without a GPU, so that the
 * hardware check (hack/gpu_check.py) runs every step end to end and its PASS/FAIL logic is tested
 * (tests/devices/test_gpu_check.py). It implements only the driver-API calls the check's probe
 * makes, with the behaviour a real driver shows from the outside:
 *
 *   - cuInit fails with CUDA_ERROR_NO_DEVICE unless the device nodes a real cuInit opens are there:
 *     <dev>/nvidiactl, <dev>/nvidia-uvm and one <dev>/nvidia<minor> (<dev> is $STANDIN_DEV, else
 *     /dev, as inside a container);
 *   - one device, "Stand-in GPU", $STANDIN_TOTAL_MIB of memory (default 16384), 4 SMs;
 *   - memory is per process: allocations succeed until the total is used, then fail with
 *     CUDA_ERROR_OUT_OF_MEMORY;
 *   - cuModuleLoadData accepts PTX that defines an entry; a launch of it takes 5 ms ("the GPU's
 *     time"), synchronously.
 *
 * HAMi-core intercepts these calls; its stand-in (libvgpu.c), when preloaded, exports
 * standin_vgpu_* functions that this library looks up and defers to: its limits, its accounting
 * and its rate limiter. Without it nothing is limited, as with the real driver.
 *
 * Build: gcc -shared -fPIC -O2 -Wall -Werror -Wl,-soname,libcuda.so.1 -o libcuda.so.1 libcuda.c -ldl
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

enum {
    SUCCESS = 0,
    INVALID_VALUE = 1,
    OUT_OF_MEMORY = 2,
    NOT_INITIALIZED = 3,
    NO_DEVICE = 100,
    INVALID_DEVICE = 101,
    INVALID_IMAGE = 200,
    INVALID_CONTEXT = 201,
    NOT_FOUND = 500,
};

#define MIB (1024ULL * 1024ULL)
#define KERNEL_NS 5000000L
#define MAX_ALLOCATIONS 4096

static int initialized;
static int context_live;
static size_t used;
static struct {
    CUdeviceptr address;
    size_t size;
} allocations[MAX_ALLOCATIONS];
static CUdeviceptr next_address = 0x7f0000000000ULL;
static int module_token, function_token, context_token;

/* The hooks the HAMi-core stand-in exports (resolved at each use: it is preloaded or absent). */
typedef size_t (*limit_fn)(size_t physical);
typedef size_t (*used_fn)(void);
typedef int (*charge_fn)(long long bytes);
typedef void (*launched_fn)(long kernel_ns);

static void *hook(const char *name) { return dlsym(RTLD_DEFAULT, name); }

static size_t total_bytes(void) {
    const char *text = getenv("STANDIN_TOTAL_MIB");
    unsigned long mib = text ? strtoul(text, NULL, 10) : 16384;
    return (size_t)(mib ? mib : 16384) * MIB;
}

static int exists(const char *dev, const char *name) {
    char path[4096];
    struct stat st;
    snprintf(path, sizeof(path), "%s/%s", dev, name);
    return stat(path, &st) == 0;
}

static int has_gpu_node(const char *dev) {
    DIR *dir = opendir(dev);
    if (dir == NULL) return 0;
    int found = 0;
    for (struct dirent *entry; !found && (entry = readdir(dir)) != NULL;) {
        const char *rest = entry->d_name + strlen("nvidia");
        found = strncmp(entry->d_name, "nvidia", 6) == 0 && *rest >= '0' && *rest <= '9';
    }
    closedir(dir);
    return found;
}

CUresult cuInit(unsigned int flags) {
    const char *dev = getenv("STANDIN_DEV") ? getenv("STANDIN_DEV") : "/dev";
    if (flags != 0) return INVALID_VALUE;
    if (!exists(dev, "nvidiactl") || !exists(dev, "nvidia-uvm") || !has_gpu_node(dev)) {
        fprintf(stderr, "libcuda stand-in: %s lacks nvidiactl, nvidia-uvm or nvidia<N>\n", dev);
        return NO_DEVICE;
    }
    initialized = 1;
    return SUCCESS;
}

CUresult cuGetErrorName(CUresult error, const char **text) {
    static const struct {
        CUresult code;
        const char *name;
    } names[] = {
        {SUCCESS, "CUDA_SUCCESS"},
        {INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE"},
        {OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY"},
        {NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED"},
        {NO_DEVICE, "CUDA_ERROR_NO_DEVICE"},
        {INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE"},
        {INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE"},
        {INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT"},
        {NOT_FOUND, "CUDA_ERROR_NOT_FOUND"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (names[i].code == error) {
            *text = names[i].name;
            return SUCCESS;
        }
    }
    *text = NULL;
    return INVALID_VALUE;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (!initialized) return NOT_INITIALIZED;
    if (ordinal != 0) return INVALID_DEVICE;
    *device = 0;
    return SUCCESS;
}

CUresult cuDeviceGetName(char *name, int length, CUdevice device) {
    if (!initialized) return NOT_INITIALIZED;
    if (device != 0 || length <= 0) return INVALID_VALUE;
    snprintf(name, (size_t)length, "Stand-in GPU");
    return SUCCESS;
}

CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice device) {
    if (!initialized) return NOT_INITIALIZED;
    if (device != 0) return INVALID_DEVICE;
    *value = attribute == 16 ? 4 : 1; /* CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT */
    return SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice device) {
    if (!initialized) return NOT_INITIALIZED;
    if (device != 0) return INVALID_DEVICE;
    limit_fn limit = (limit_fn)hook("standin_vgpu_limit");
    *bytes = limit ? limit(total_bytes()) : total_bytes();
    return SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(void **context, CUdevice device) {
    if (!initialized) return NOT_INITIALIZED;
    if (device != 0) return INVALID_DEVICE;
    if (!context_live) {
        charge_fn charge = (charge_fn)hook("standin_vgpu_context_created");
        if (charge) charge(0);
        context_live = 1;
    }
    *context = &context_token;
    return SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
    if (device != 0) return INVALID_DEVICE;
    return SUCCESS;
}

CUresult cuCtxSetCurrent(void *context) { return context == &context_token ? SUCCESS : INVALID_CONTEXT; }

CUresult cuCtxSynchronize(void) { return context_live ? SUCCESS : INVALID_CONTEXT; }

CUresult cuMemGetInfo_v2(size_t *free, size_t *total) {
    if (!context_live) return INVALID_CONTEXT;
    limit_fn limit = (limit_fn)hook("standin_vgpu_limit");
    used_fn shared_used = (used_fn)hook("standin_vgpu_used");
    size_t all = limit ? limit(total_bytes()) : total_bytes();
    size_t taken = shared_used ? shared_used() : used;
    *total = all;
    *free = taken < all ? all - taken : 0;
    return SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *address, size_t size) {
    if (!context_live) return INVALID_CONTEXT;
    if (size == 0) return INVALID_VALUE;
    charge_fn charge = (charge_fn)hook("standin_vgpu_charge");
    if (charge && !charge((long long)size)) return OUT_OF_MEMORY;
    int slot = -1;
    for (int i = 0; i < MAX_ALLOCATIONS && slot < 0; i++) {
        if (allocations[i].address == 0) slot = i;
    }
    if (used + size > total_bytes() || slot < 0) {
        if (charge) charge(-(long long)size);
        return OUT_OF_MEMORY;
    }
    used += size;
    allocations[slot].address = next_address;
    allocations[slot].size = size;
    *address = next_address;
    next_address += (size + 0xfffff) & ~(CUdeviceptr)0xfffff;
    return SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr address) {
    for (int i = 0; i < MAX_ALLOCATIONS; i++) {
        if (allocations[i].address == address && address != 0) {
            charge_fn charge = (charge_fn)hook("standin_vgpu_charge");
            if (charge) charge(-(long long)allocations[i].size);
            used -= allocations[i].size;
            allocations[i].address = 0;
            return SUCCESS;
        }
    }
    return INVALID_VALUE;
}

CUresult cuModuleLoadData(void **module, const void *image) {
    if (!context_live) return INVALID_CONTEXT;
    if (image == NULL || strstr((const char *)image, ".entry") == NULL) return INVALID_IMAGE;
    *module = &module_token;
    return SUCCESS;
}

CUresult cuModuleGetFunction(void **function, void *module, const char *name) {
    if (module != &module_token || name == NULL) return INVALID_VALUE;
    *function = &function_token;
    return SUCCESS;
}

CUresult cuModuleUnload(void *module) { return module == &module_token ? SUCCESS : INVALID_VALUE; }

CUresult cuLaunchKernel(void *function, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shared, void *stream, void **params, void **extra) {
    (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shared, (void)stream, (void)extra;
    if (!context_live) return INVALID_CONTEXT;
    if (function != &function_token || gx == 0 || params == NULL) return INVALID_VALUE;
    struct timespec kernel = {0, KERNEL_NS};
    nanosleep(&kernel, NULL);
    launched_fn launched = (launched_fn)hook("standin_vgpu_launched");
    if (launched) launched(KERNEL_NS);
    return SUCCESS;
}
