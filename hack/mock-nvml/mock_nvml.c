/*
 * A mock libnvidia-ml.so.1 for tests: exports the NVML symbols that dra_driver/devices/nvml.py and
 * dra_driver/devices/nvml_events.py reach through the real pynvml bindings, and those that the NVIDIA
 * Container Toolkit's `nvidia-ctk cdi generate` reaches through go-nvml (tests/nvidia_layouts.py),
 * answering from a JSON profile named by the environment variable MOCK_NVML_PROFILE (read at the
 * first nvmlInit).
 *
 * Build:  gcc -shared -fPIC -O1 -o DIR/libnvidia-ml.so.1 hack/mock-nvml/mock_nvml.c
 *         add -DMOCK_NVML_LEGACY to leave out calls that older drivers lack
 *         (nvmlDeviceGetNumaNodeId, nvmlDeviceGetArchitecture, nvmlDeviceGetMigMode,
 *         nvmlDeviceGetMaxMigDeviceCount, nvmlDeviceGetMigDeviceHandleByIndex,
 *         nvmlDeviceGetMemoryInfo_v2), so dlsym really fails and pynvml raises
 *         NVMLError_FunctionNotFound (go-nvlib then treats every GPU as not MIG-capable).
 * Use:    LD_LIBRARY_PATH=DIR MOCK_NVML_PROFILE=profile.json python -m dra_driver.cli discover --source nvml
 *
 * Initialisation is reference-counted like the real library: every nvmlInit adds one, every
 * nvmlShutdown takes one away, and once the count is back at zero every call (handles and event
 * sets obtained before included) answers NVML_ERROR_UNINITIALIZED until the next nvmlInit.
 *
 * Profile (see hack/mock-nvml/profiles/):
 *   { "driverVersion": "550.54.15", "cudaDriverVersion": 12040,
 *     "initError": 0,                                  optional: nvmlInit fails with this code
 *     "errors": {"nvmlDeviceGetBrand": 3},             optional: call -> code, for every device
 *     "devices": [ { "uuid": "GPU-...", "name": "NVIDIA H100 80GB HBM3", "memoryTotal": 85520809984,
 *                    "memoryReserved": 0,              optional: nvmlMemory_v2_t.reserved
 *                    "minor": 0, "brand": 14, "architecture": 9, "ccMajor": 9, "ccMinor": 0,
 *                    "busId": "00000000:18:00.0", "numaNode": 0,
 *                    "migMode": 0, "migPendingMode": 0, current and pending MIG mode (pending
 *                                                      defaults to current); a device without
 *                                                      migMode is not MIG-capable
 *                    "maxMigDevices": 7,               optional: MIG slots of a MIG-capable device
 *                                                      (default 7), all empty (NOT_FOUND)
 *                    "supportedEvents": 11,            optional: event mask (default XID|DBE|SBE)
 *                    "computeMode": 3,                 optional: nvmlComputeMode_t (default 0, DEFAULT)
 *                    "nvlinks": ["00000000:9A:00.0", null, 999, ...],  per link: remote bus id
 *                                                      (active), null (inactive) or an error code
 *                    "errors": {"nvmlDeviceGetNumaNodeId": 3} } ] }
 * A missing "numaNode" answers NOT_SUPPORTED; a missing "nvlinks" answers NOT_SUPPORTED for every
 * link, links past the end of the array INVALID_ARGUMENT.
 *
 * Events: nvmlEventSetWait reads lines from the file named by MOCK_NVML_EVENTS (a test appends to
 * it; a partial last line waits for its newline), one event per line, until timeoutms passes:
 *   <device index> xid <code>     an XID critical error on that device
 *   <device index> dbe            a double-bit ECC error
 *   <device index> sbe            a single-bit ECC error
 *   lost                          the wait fails with NVML_ERROR_GPU_IS_LOST
 *   error <code>                  the wait fails with that code
 * A device event is delivered only when the device registered that event type with the set being
 * waited on (as with the real library); other lines, blank ones and "# comments" are skipped.
 * These lines change a device's state instead (they end no wait; the state lasts for the process):
 *   <device index> fallen         the device falls off the bus: its calls answer GPU_IS_LOST
 *   <device index> remap-pending  an uncorrectable error awaits a reset: row remapping pending
 *                                 (nvmlDeviceGetRemappedRows, architecture >= 7, Ampere on) or pages
 *                                 pending retirement (nvmlDeviceGetRetiredPagesPendingStatus, older)
 *   <device index> reset          a GPU reset: both of the above are cleared
 *
 * The JSON reader below handles the subset the profiles use (objects, arrays, strings without
 * unicode escapes, integers, true/false/null).
 */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

/* nvml.h's NVML_STRUCT_VERSION(Memory, 2): the struct size with the version in the top byte. */
#define NVML_MEMORY_V2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

#define EVENT_SINGLE_BIT_ECC 0x1ULL
#define EVENT_DOUBLE_BIT_ECC 0x2ULL
#define EVENT_XID_CRITICAL 0x8ULL
#define DEFAULT_SUPPORTED_EVENTS (EVENT_SINGLE_BIT_ECC | EVENT_DOUBLE_BIT_ECC | EVENT_XID_CRITICAL)

typedef struct {
    void *device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

/* ---------------------------------------------------------------- tiny JSON reader */
typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jtype;
typedef struct jval {
    jtype type;
    long long num;
    char *str;
    int n;              /* children */
    char **keys;        /* objects only */
    struct jval **items;
} jval;

static const char *jp;

static void skip_ws(void) { while (*jp && isspace((unsigned char)*jp)) jp++; }

static jval *jnew(jtype t) {
    jval *v = calloc(1, sizeof(jval));
    v->type = t;
    return v;
}

static char *parse_string(void) {
    if (*jp != '"') return NULL;
    jp++;
    size_t cap = 64, len = 0;
    char *out = malloc(cap);
    while (*jp && *jp != '"') {
        char c = *jp++;
        if (c == '\\' && *jp) {
            c = *jp++;
            if (c == 'n') c = '\n';
            else if (c == 't') c = '\t';
        }
        if (len + 2 > cap) out = realloc(out, cap *= 2);
        out[len++] = c;
    }
    if (*jp != '"') { free(out); return NULL; }
    jp++;
    out[len] = 0;
    return out;
}

static jval *parse_value(void);

static void push(jval *v, char *key, jval *item) {
    v->items = realloc(v->items, sizeof(jval *) * (v->n + 1));
    v->keys = realloc(v->keys, sizeof(char *) * (v->n + 1));
    v->items[v->n] = item;
    v->keys[v->n] = key;
    v->n++;
}

static jval *parse_value(void) {
    skip_ws();
    if (*jp == '{') {
        jval *v = jnew(J_OBJ);
        jp++;
        skip_ws();
        if (*jp == '}') { jp++; return v; }
        for (;;) {
            skip_ws();
            char *key = parse_string();
            if (!key) return NULL;
            skip_ws();
            if (*jp++ != ':') return NULL;
            jval *item = parse_value();
            if (!item) return NULL;
            push(v, key, item);
            skip_ws();
            if (*jp == ',') { jp++; continue; }
            if (*jp == '}') { jp++; return v; }
            return NULL;
        }
    }
    if (*jp == '[') {
        jval *v = jnew(J_ARR);
        jp++;
        skip_ws();
        if (*jp == ']') { jp++; return v; }
        for (;;) {
            jval *item = parse_value();
            if (!item) return NULL;
            push(v, NULL, item);
            skip_ws();
            if (*jp == ',') { jp++; continue; }
            if (*jp == ']') { jp++; return v; }
            return NULL;
        }
    }
    if (*jp == '"') {
        jval *v = jnew(J_STR);
        v->str = parse_string();
        return v->str ? v : NULL;
    }
    if (strncmp(jp, "true", 4) == 0) { jp += 4; jval *v = jnew(J_BOOL); v->num = 1; return v; }
    if (strncmp(jp, "false", 5) == 0) { jp += 5; return jnew(J_BOOL); }
    if (strncmp(jp, "null", 4) == 0) { jp += 4; return jnew(J_NULL); }
    if (*jp == '-' || isdigit((unsigned char)*jp)) {
        char *end;
        jval *v = jnew(J_NUM);
        v->num = strtoll(jp, &end, 10);
        jp = end;
        return v;
    }
    return NULL;
}

static jval *jget(const jval *obj, const char *key) {
    if (!obj || obj->type != J_OBJ) return NULL;
    for (int i = 0; i < obj->n; i++)
        if (strcmp(obj->keys[i], key) == 0) return obj->items[i];
    return NULL;
}

/* ---------------------------------------------------------------- state */
typedef struct {
    int index;
} mock_device;

typedef struct {
    unsigned long long registered[256]; /* event types per device index */
    FILE *events;                       /* MOCK_NVML_EVENTS, opened at the first wait */
} mock_event_set;

static jval *profile;
static jval *devices;
static int initialized; /* the init reference count */
static mock_device handles[256];
/* Device state the events file changes (see the header): fallen off the bus, a reset pending. */
static unsigned char fallen[256], reset_pending[256];

static nvmlReturn_t load_profile(void) {
    const char *path = getenv("MOCK_NVML_PROFILE");
    if (!path) return NVML_ERROR_DRIVER_NOT_LOADED;
    FILE *f = fopen(path, "rb");
    if (!f) return NVML_ERROR_DRIVER_NOT_LOADED;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = calloc(1, size + 1);
    if (fread(text, 1, size, f) != (size_t)size) { fclose(f); return NVML_ERROR_UNKNOWN; }
    fclose(f);
    jp = text;
    profile = parse_value();
    if (!profile || profile->type != J_OBJ) {
        fprintf(stderr, "mock-nvml: %s is not a JSON object\n", path);
        return NVML_ERROR_UNKNOWN;
    }
    devices = jget(profile, "devices");
    jval *init_error = jget(profile, "initError");
    if (init_error && init_error->num) return (nvmlReturn_t)init_error->num;
    return NVML_SUCCESS;
}

static jval *device_of(void *handle) {
    if (!initialized) return NULL;
    mock_device *d = handle;
    if (d < handles || d >= handles + 256 || !devices) return NULL;
    if (d->index >= devices->n) return NULL;
    return devices->items[d->index];
}

/* An error injected by the profile for this call (per device first, then global). */
static nvmlReturn_t injected(const jval *dev, const char *call) {
    jval *code = jget(jget(dev, "errors"), call);
    if (!code) code = jget(jget(profile, "errors"), call);
    return code ? (nvmlReturn_t)code->num : NVML_SUCCESS;
}

#define DEVICE_OR_RETURN(handle, call)                       \
    jval *dev = device_of(handle);                           \
    if (!initialized) return NVML_ERROR_UNINITIALIZED;       \
    if (!dev) return NVML_ERROR_INVALID_ARGUMENT;            \
    {                                                        \
        nvmlReturn_t e = injected(dev, call);                \
        if (e) return e;                                     \
    }                                                        \
    if (fallen[((mock_device *)handle)->index]) return NVML_ERROR_GPU_IS_LOST;

static nvmlReturn_t copy_string(const char *value, char *out, unsigned int length) {
    if (!value) return NVML_ERROR_NOT_SUPPORTED;
    if (strlen(value) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, value);
    return NVML_SUCCESS;
}

static nvmlReturn_t int_field(const jval *dev, const char *key, long long *out) {
    jval *v = jget(dev, key);
    if (!v || v->type != J_NUM) return NVML_ERROR_NOT_SUPPORTED;
    *out = v->num;
    return NVML_SUCCESS;
}

static const char *str_field(const jval *dev, const char *key) {
    jval *v = jget(dev, key);
    return v && v->type == J_STR ? v->str : NULL;
}

static void fill_pci(const char *bus_id, nvmlPciInfo_t *pci) {
    memset(pci, 0, sizeof(*pci));
    unsigned int domain = 0, bus = 0, device = 0, function = 0;
    sscanf(bus_id, "%x:%x:%x.%x", &domain, &bus, &device, &function);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = device;
    pci->pciDeviceId = 0x233010de;
    snprintf(pci->busId, sizeof(pci->busId), "%s", bus_id);
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04X:%02X:%02X.%X", domain, bus, device, function);
}

const char *nvmlErrorString(nvmlReturn_t result);

#ifndef MOCK_NVML_LEGACY
#include "mock_nvml_mig.c"
#endif

/* ---------------------------------------------------------------- exported NVML API */
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    if (initialized) { initialized++; return NVML_SUCCESS; }
    nvmlReturn_t ret = load_profile();
    if (ret == NVML_SUCCESS) {
        for (int i = 0; i < 256; i++) handles[i].index = i;
        initialized = 1;
#ifndef MOCK_NVML_LEGACY
        load_mig_instances();
#endif
    }
    return ret;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    initialized--;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 19: return "In use by another client";
    case 23: return "Insufficient resources";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t e = injected(NULL, "nvmlSystemGetDriverVersion");
    if (e) return e;
    return copy_string(str_field(profile, "driverVersion"), version, length);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cuda) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t e = injected(NULL, "nvmlSystemGetCudaDriverVersion");
    if (e) return e;
    long long v;
    if (int_field(profile, "cudaDriverVersion", &v)) return NVML_ERROR_NOT_SUPPORTED;
    *cuda = (int)v;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cuda) { return nvmlSystemGetCudaDriverVersion(cuda); }

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    *count = devices ? (unsigned int)devices->n : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **device) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!devices || index >= (unsigned int)devices->n || index >= 256) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t e = injected(devices->items[index], "nvmlDeviceGetHandleByIndex");
    if (e) return e;
    *device = &handles[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, void **device) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; devices && i < devices->n && i < 256; i++) {
        const char *candidate = str_field(devices->items[i], "uuid");
        if (candidate && strcmp(candidate, uuid) == 0) {
            nvmlReturn_t e = injected(devices->items[i], "nvmlDeviceGetHandleByUUID");
            if (e) return e;
            if (fallen[i]) return NVML_ERROR_GPU_IS_LOST;
            *device = &handles[i];
            return NVML_SUCCESS;
        }
    }
#ifndef MOCK_NVML_LEGACY
    if (mig_by_uuid(uuid, device)) return NVML_SUCCESS;
#endif
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetIndex(void *handle, unsigned int *index) {
    DEVICE_OR_RETURN(handle, "nvmlDeviceGetIndex");
    *index = (unsigned int)((mock_device *)handle)->index;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(void *handle, char *uuid, unsigned int length) {
#ifndef MOCK_NVML_LEGACY
    nvmlReturn_t mig_ret;
    if (mig_uuid(handle, uuid, length, &mig_ret)) return mig_ret;
#endif
    DEVICE_OR_RETURN(handle, "nvmlDeviceGetUUID");
    return copy_string(str_field(dev, "uuid"), uuid, length);
}

nvmlReturn_t nvmlDeviceGetName(void *handle, char *name, unsigned int length) {
#ifndef MOCK_NVML_LEGACY
    nvmlReturn_t mig_ret;
    if (mig_name_of(handle, name, length, &mig_ret)) return mig_ret;
#endif
    DEVICE_OR_RETURN(handle, "nvmlDeviceGetName");
    return copy_string(str_field(dev, "name"), name, length);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(void *handle, nvmlMemory_t *memory) {
#ifndef MOCK_NVML_LEGACY
    unsigned long long mig_bytes;
    if (memory && mig_memory_bytes(handle, &mig_bytes)) {
        memory->total = memory->free = mig_bytes;
        memory->used = 0;
        return NVML_SUCCESS;
    }
#endif
    DEVICE_OR_RETURN(handle, "nvmlDeviceGetMemoryInfo");
    long long total;
    if (int_field(dev, "memoryTotal", &total)) return NVML_ERROR_NOT_SUPPORTED;
    long long reserved = 0;
    int_field(dev, "memoryReserved", &reserved);
    memory->total = (unsigned long long)total;
    memory->used = (unsigned long long)reserved; /* v1 counts the driver's reservation as used */
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMinorNumber(void *handle, unsigned int *minor) {
    DEVICE_OR_RETURN(handle, "nvmlDeviceGetMinorNumber");
    long long v;
    if (int_field(dev, "minor", &v)) return NVML_ERROR_NOT_SUPPORTED;
    *minor = (unsigned int)v;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetBrand(void *handle, int *brand) {
    DEVICE_OR_RETURN(handle, "nvmlDeviceGetBrand");
    long long v;
    if (int_field(dev, "brand", &v)) return NVML_ERROR_NOT_SUPPORTED;
    *brand = (int)v;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(void *handle, int *major, int *minor) {
    DEVICE_OR_RETURN(handle, "nvmlDeviceGetCudaComputeCapability");
    long long a, b;
    if (int_field(dev, "ccMajor", &a) || int_field(dev, "ccMinor", &b)) return NVML_ERROR_NOT_SUPPORTED;
    *major = (int)a;
    *minor = (int)b;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(void *handle, nvmlPciInfo_t *pci) {
    DEVICE_OR_RETURN(handle, "nvmlDeviceGetPciInfo");
    const char *bus_id = str_field(dev, "busId");
    if (!bus_id) return NVML_ERROR_NOT_SUPPORTED;
    fill_pci(bus_id, pci);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(void *handle, unsigned int link, int *active) {
    DEVICE_OR_RETURN(handle, "nvmlDeviceGetNvLinkState");
    jval *links = jget(dev, "nvlinks");
    if (!links || links->type != J_ARR) return NVML_ERROR_NOT_SUPPORTED;
    if (link >= (unsigned int)links->n) return NVML_ERROR_INVALID_ARGUMENT;
    if (links->items[link]->type == J_NUM) return (nvmlReturn_t)links->items[link]->num;
    *active = links->items[link]->type == J_STR;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(void *handle, unsigned int link, nvmlPciInfo_t *pci) {
    DEVICE_OR_RETURN(handle, "nvmlDeviceGetNvLinkRemotePciInfo");
    jval *links = jget(dev, "nvlinks");
    if (!links || links->type != J_ARR) return NVML_ERROR_NOT_SUPPORTED;
    if (link >= (unsigned int)links->n || links->items[link]->type != J_STR) return NVML_ERROR_INVALID_ARGUMENT;
    fill_pci(links->items[link]->str, pci);
    return NVML_SUCCESS;
}

#ifndef MOCK_NVML_LEGACY
/* Calls newer drivers have; a legacy build leaves them out so that dlsym fails. */
nvmlReturn_t nvmlDeviceGetNumaNodeId(void *handle, int *node) {
    DEVICE_OR_RETURN(handle, "nvmlDeviceGetNumaNodeId");
    long long v;
    if (int_field(dev, "numaNode", &v)) return NVML_ERROR_NOT_SUPPORTED;
    *node = (int)v;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetArchitecture(void *handle, unsigned int *arch) {
    DEVICE_OR_RETURN(handle, "nvmlDeviceGetArchitecture");
    long long v;
    if (int_field(dev, "architecture", &v)) return NVML_ERROR_NOT_SUPPORTED;
    *arch = (unsigned int)v;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(void *handle, unsigned int *current, unsigned int *pending) {
    DEVICE_OR_RETURN(handle, "nvmlDeviceGetMigMode");
    long long v;
    if (int_field(dev, "migMode", &v)) return NVML_ERROR_NOT_SUPPORTED;
    long long pending_mode = v;
    int_field(dev, "migPendingMode", &pending_mode);
    *current = (unsigned int)v;
    *pending = (unsigned int)pending_mode;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(void *handle, nvmlMemory_v2_t *memory) {
    unsigned long long mig_bytes;
    if (memory && mig_memory_bytes(handle, &mig_bytes)) {
        if (memory->version != NVML_MEMORY_V2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        memory->total = memory->free = mig_bytes;
        memory->reserved = memory->used = 0;
        return NVML_SUCCESS;
    }
    DEVICE_OR_RETURN(handle, "nvmlDeviceGetMemoryInfo_v2");
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != NVML_MEMORY_V2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    long long total, reserved = 0;
    if (int_field(dev, "memoryTotal", &total)) return NVML_ERROR_NOT_SUPPORTED;
    int_field(dev, "memoryReserved", &reserved);
    memory->total = (unsigned long long)total;
    memory->reserved = (unsigned long long)reserved;
    memory->used = 0;
    memory->free = memory->total - memory->reserved;
    return NVML_SUCCESS;
}
#endif

nvmlReturn_t nvmlDeviceGetComputeMode(void *handle, int *mode) {
    DEVICE_OR_RETURN(handle, "nvmlDeviceGetComputeMode");
    if (!mode) return NVML_ERROR_INVALID_ARGUMENT;
    long long value = 0; /* NVML_COMPUTEMODE_DEFAULT */
    int_field(dev, "computeMode", &value);
    *mode = (int)value;
    return NVML_SUCCESS;
}

/* Row remapping replaced page retirement with Ampere (architecture 7): each call answers on its own
 * generation only, NOT_SUPPORTED on the other, as the real library does. */
static int remaps_rows(const jval *dev) {
    long long arch = 0;
    int_field(dev, "architecture", &arch);
    return arch >= 7;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(void *handle, unsigned int *corrRows, unsigned int *uncRows,
                                       unsigned int *isPending, unsigned int *failureOccurred) {
    DEVICE_OR_RETURN(handle, "nvmlDeviceGetRemappedRows");
    if (!corrRows || !uncRows || !isPending || !failureOccurred) return NVML_ERROR_INVALID_ARGUMENT;
    if (!remaps_rows(dev)) return NVML_ERROR_NOT_SUPPORTED;
    int index = ((mock_device *)handle)->index;
    *corrRows = 0;
    *uncRows = reset_pending[index] ? 1 : 0;
    *isPending = reset_pending[index];
    *failureOccurred = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(void *handle, int *isPending) {
    DEVICE_OR_RETURN(handle, "nvmlDeviceGetRetiredPagesPendingStatus");
    if (!isPending) return NVML_ERROR_INVALID_ARGUMENT;
    if (remaps_rows(dev)) return NVML_ERROR_NOT_SUPPORTED;
    *isPending = reset_pending[((mock_device *)handle)->index];
    return NVML_SUCCESS;
}

/* ---------------------------------------------------------------- events */
nvmlReturn_t nvmlEventSetCreate(mock_event_set **set) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t e = injected(NULL, "nvmlEventSetCreate");
    if (e) return e;
    *set = calloc(1, sizeof(mock_event_set));
    return *set ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}

nvmlReturn_t nvmlEventSetFree(mock_event_set *set) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    if (set->events) fclose(set->events);
    free(set);
    return NVML_SUCCESS;
}

static unsigned long long supported_events(const jval *dev) {
    long long v;
    return int_field(dev, "supportedEvents", &v) ? DEFAULT_SUPPORTED_EVENTS : (unsigned long long)v;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(void *handle, unsigned long long *types) {
    DEVICE_OR_RETURN(handle, "nvmlDeviceGetSupportedEventTypes");
    if (!types) return NVML_ERROR_INVALID_ARGUMENT;
    *types = supported_events(dev);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(void *handle, unsigned long long types, mock_event_set *set) {
    DEVICE_OR_RETURN(handle, "nvmlDeviceRegisterEvents");
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    if (types & ~supported_events(dev)) return NVML_ERROR_NOT_SUPPORTED;
    set->registered[((mock_device *)handle)->index] |= types;
    return NVML_SUCCESS;
}

/* The next complete line of the events file into line; 0 when there is none (yet). */
static int next_event_line(mock_event_set *set, char *line, int size) {
    if (!set->events) {
        const char *path = getenv("MOCK_NVML_EVENTS");
        if (!path || !(set->events = fopen(path, "r"))) return 0;
    }
    long start = ftell(set->events);
    if (!fgets(line, size, set->events)) {
        clearerr(set->events);
        return 0;
    }
    size_t len = strlen(line);
    if (len == 0 || line[len - 1] != '\n') { /* the writer is mid-line: read it whole later */
        fseek(set->events, start, SEEK_SET);
        clearerr(set->events);
        return 0;
    }
    return 1;
}

/* 1 and *ret when the line ends the wait (an event, or an error), 0 to skip it. */
static int event_from_line(mock_event_set *set, const char *line, nvmlEventData_t *data, nvmlReturn_t *ret) {
    long long code;
    if (strncmp(line, "lost", 4) == 0) {
        *ret = NVML_ERROR_GPU_IS_LOST;
        return 1;
    }
    if (sscanf(line, "error %lld", &code) == 1) {
        *ret = (nvmlReturn_t)code;
        return 1;
    }
    int index;
    char kind[16];
    unsigned long long value = 0;
    if (sscanf(line, "%d %15s %llu", &index, kind, &value) < 2) return 0;
    if (index < 0 || index >= 256 || !devices || index >= devices->n) return 0;
    if (strcmp(kind, "fallen") == 0) fallen[index] = 1;
    if (strcmp(kind, "remap-pending") == 0) reset_pending[index] = 1;
    if (strcmp(kind, "reset") == 0) fallen[index] = reset_pending[index] = 0;
    unsigned long long type = strcmp(kind, "xid") == 0   ? EVENT_XID_CRITICAL
                              : strcmp(kind, "dbe") == 0 ? EVENT_DOUBLE_BIT_ECC
                              : strcmp(kind, "sbe") == 0 ? EVENT_SINGLE_BIT_ECC
                                                         : 0;
    if (!type || !(set->registered[index] & type)) return 0;
    memset(data, 0, sizeof(*data));
    data->device = &handles[index];
    data->eventType = type;
    data->eventData = type == EVENT_XID_CRITICAL ? value : 0;
    data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFFu; /* the whole GPU, not a MIG slice */
    *ret = NVML_SUCCESS;
    return 1;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000.0 + ts.tv_nsec / 1e6;
}

nvmlReturn_t nvmlEventSetWait_v2(mock_event_set *set, nvmlEventData_t *data, unsigned int timeoutms) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!set || !data) return NVML_ERROR_INVALID_ARGUMENT;
    double deadline = now_ms() + timeoutms;
    for (;;) {
        char line[256];
        nvmlReturn_t ret;
        while (next_event_line(set, line, sizeof line))
            if (event_from_line(set, line, data, &ret)) return ret;
        if (now_ms() >= deadline) return NVML_ERROR_TIMEOUT;
        struct timespec pause = {0, 5 * 1000 * 1000}; /* poll the file every 5 ms */
        nanosleep(&pause, NULL);
        if (!initialized) return NVML_ERROR_UNINITIALIZED;
    }
}
