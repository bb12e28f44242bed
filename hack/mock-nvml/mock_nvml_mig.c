/*
 * MIG for the mock NVML library: included by mock_nvml.c (not built on its own), left out of
 * -DMOCK_NVML_LEGACY builds (drivers that old have no MIG calls).
 *
 * A device in MIG mode ("migMode": 1) has the GPU-instance profiles of its "migProfiles" (written by
 * tests/devices/mock_profiles.py from dra_driver/devices/mig_profiles.py, NVML's numbers for the
 * card) and starts with the GPU and compute instances of "gpuInstances":
 *   "migProfiles": [ {"profile": 0, "id": 19, "name": "1g.10gb", "sliceCount": 1,
 *                     "instanceCount": 7, "multiprocessorCount": 16, "memorySizeMB": 9984,
 *                     "copyEngineCount": 1, "decoderCount": 1, "encoderCount": 0, "jpegCount": 0,
 *                     "ofaCount": 0, "placements": [0, 1, 2, 3, 4, 5, 6], "placementSize": 1}, ... ]
 *   "gpuInstances": [ {"profileId": 19, "start": 0,
 *                      "computeInstances": [ {"profileId": 0, "uuid": "MIG-..."} ]} ]
 * ("computeInstances" defaults to one compute instance covering the whole GPU instance; a compute
 * instance's "uuid" defaults to one derived from the parent's UUID and the two instance ids, the
 * same in every process).
 *
 * Instances are created and destroyed in-process through NVML's calls with NVML's error codes:
 * NOT_SUPPORTED while MIG is off, INVALID_ARGUMENT for a profile or placement the card does not
 * have, INSUFFICIENT_RESOURCES when the placement overlaps an instance (or the profile's
 * instanceCount is reached), IN_USE when a GPU instance that still has compute instances is
 * destroyed. The state lasts for the process (like the driver's, it survives nvmlShutdown/nvmlInit);
 * the JSON's instances are read at the first nvmlInit.
 *
 * With MOCK_NVML_MIG_STATE naming a file, the state outlives the process too, as the kernel
 * driver's does (what a plugin restarted between creating an instance and recording it must find):
 * every create and destroy rewrites the file (write to <file>.tmp, then rename), and the first
 * nvmlInit of a process reads the file instead of the JSON's "gpuInstances" when it exists. One
 * line per instance: "gi <gpu> <gi id> <profile id> <start>" and
 * "ci <gpu> <gi id> <ci id> <ci profile> <start> <size> <uuid>".
 *
 * GPU instance ids follow the driver's numbering by placement: a placement of 8 memory slices is
 * id 0, of 4 slices 1 + start/4, of 2 slices 3 + start/2, of 1 slice 7 + start, so an id names the
 * memory it covers, as on A100/H100 (ids 0..13; /proc/driver/nvidia-caps/mig-minors lists gi0..14).
 * Compute instance ids are the lowest free ones.
 *
 * MIG devices (one per compute instance, nvmlDeviceGetMigDeviceHandleByIndex in GPU instance then
 * compute instance id order) answer nvmlDeviceIsMigDeviceHandle, nvmlDeviceGetUUID ("MIG-..."),
 * nvmlDeviceGetName ("<card> MIG 1g.10gb"), nvmlDeviceGetMemoryInfo(_v2) (the instance's memory),
 * nvmlDeviceGetGpuInstanceId, nvmlDeviceGetComputeInstanceId, nvmlDeviceGetAttributes_v2 and
 * nvmlDeviceGetDeviceHandleFromMigDeviceHandle; nvmlDeviceGetHandleByUUID finds them by MIG UUID.
 */

#define NVML_ERROR_NO_PERMISSION 4
#define NVML_ERROR_IN_USE 19
#define NVML_ERROR_INSUFFICIENT_RESOURCES 23
#define MIG_GPUS 64      /* devices (by index) that may have MIG instances */
#define MIG_GIS 15       /* GPU instance ids 0..14, as in mig-minors */
#define MIG_CIS 8        /* compute instance ids 0..7 */
#define MIG_NAME 96      /* NVML_DEVICE_NAME_V2_BUFFER_SIZE */

typedef struct {
    unsigned int start, size;
} nvmlPlacement_t;

typedef struct {
    unsigned int id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount, copyEngineCount,
        decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
} nvmlGpuInstanceProfileInfo_t;

typedef struct {
    unsigned int version, id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount,
        copyEngineCount, decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
    char name[MIG_NAME];
    unsigned int capabilities; /* v3 only */
} nvmlGpuInstanceProfileInfo_v3_t;

typedef struct {
    unsigned int id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount,
        sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
} nvmlComputeInstanceProfileInfo_t;

typedef struct {
    unsigned int version, id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount,
        sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
    char name[MIG_NAME];
    unsigned int capabilities; /* v3 only */
} nvmlComputeInstanceProfileInfo_v3_t;

/* nvml.h's NVML_STRUCT_VERSION: the struct's size (without later fields) and the version on top. */
#define GI_PROFILE_INFO_V2 ((unsigned int)(offsetof(nvmlGpuInstanceProfileInfo_v3_t, capabilities) | (2u << 24)))
#define GI_PROFILE_INFO_V3 ((unsigned int)(sizeof(nvmlGpuInstanceProfileInfo_v3_t) | (3u << 24)))
#define CI_PROFILE_INFO_V2 ((unsigned int)(offsetof(nvmlComputeInstanceProfileInfo_v3_t, capabilities) | (2u << 24)))
#define CI_PROFILE_INFO_V3 ((unsigned int)(sizeof(nvmlComputeInstanceProfileInfo_v3_t) | (3u << 24)))

typedef struct {
    void *device;
    unsigned int id, profileId;
    nvmlPlacement_t placement;
} nvmlGpuInstanceInfo_t;

typedef struct {
    void *device, *gpuInstance;
    unsigned int id, profileId;
    nvmlPlacement_t placement;
} nvmlComputeInstanceInfo_t;

typedef struct {
    unsigned int multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount, sharedEncoderCount,
        sharedJpegCount, sharedOfaCount, gpuInstanceSliceCount, computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

typedef struct {
    int used;
    unsigned int profile_id; /* the CI profile id (= its NVML index) */
    unsigned int start, size;
    char uuid[MIG_NAME];
} mock_ci;

typedef struct {
    int used;
    unsigned int profile_id; /* the GPU instance profile id, e.g. 19 */
    unsigned int start;
    mock_ci cis[MIG_CIS];
} mock_gi;

static mock_gi gis[MIG_GPUS][MIG_GIS];
/* Opaque handles: a GPU instance is &gis[g][i], a compute instance &gis[g][i].cis[k], the MIG
 * device of that compute instance &mig_handles[g][i][k]. */
static char mig_handles[MIG_GPUS][MIG_GIS][MIG_CIS];
static int mig_loaded;

/* The compute instance slice counts of NVML_COMPUTE_INSTANCE_PROFILE_{1,2,3,4,7}_SLICE (ids 0..4). */
static const unsigned int ci_slices[] = {1, 2, 3, 4, 7};
#define CI_PROFILES 5

static int mig_enabled(const jval *dev) {
    long long mode = 0;
    return !int_field(dev, "migMode", &mode) && mode == 1;
}

static const jval *gi_profile_by_id(const jval *dev, unsigned int id) {
    jval *profiles = jget(dev, "migProfiles");
    for (int i = 0; profiles && profiles->type == J_ARR && i < profiles->n; i++) {
        long long v;
        if (!int_field(profiles->items[i], "id", &v) && (unsigned int)v == id) return profiles->items[i];
    }
    return NULL;
}

static const jval *gi_profile_by_index(const jval *dev, unsigned int index) {
    jval *profiles = jget(dev, "migProfiles");
    for (int i = 0; profiles && profiles->type == J_ARR && i < profiles->n; i++) {
        long long v;
        if (!int_field(profiles->items[i], "profile", &v) && (unsigned int)v == index) return profiles->items[i];
    }
    return NULL;
}

static unsigned int num(const jval *obj, const char *key) {
    long long v = 0;
    int_field(obj, key, &v);
    return (unsigned int)v;
}

static int valid_start(const jval *profile, unsigned int start) {
    jval *placements = jget(profile, "placements");
    for (int i = 0; placements && placements->type == J_ARR && i < placements->n; i++)
        if (placements->items[i]->type == J_NUM && (unsigned int)placements->items[i]->num == start) return 1;
    return 0;
}

/* The id the driver gives a GPU instance at this placement (see the header). */
static int gi_id_for(unsigned int start, unsigned int size) {
    switch (size) {
    case 8: return 0;
    case 4: return 1 + (int)start / 4;
    case 2: return 3 + (int)start / 2;
    case 1: return 7 + (int)start;
    default: return -1;
    }
}

/* NVML_SUCCESS when an instance of profile may be placed at start on device g, else why not. */
static nvmlReturn_t gi_fits(int g, const jval *dev, const jval *profile, unsigned int start) {
    unsigned int size = num(profile, "placementSize"), id = num(profile, "id"), same = 0;
    if (!valid_start(profile, start)) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < MIG_GIS; i++) {
        mock_gi *gi = &gis[g][i];
        if (!gi->used) continue;
        const jval *other = gi_profile_by_id(dev, gi->profile_id);
        unsigned int other_size = other ? num(other, "placementSize") : 8;
        if (start < gi->start + other_size && gi->start < start + size) return NVML_ERROR_INSUFFICIENT_RESOURCES;
        if (gi->profile_id == id) same++;
    }
    return same < num(profile, "instanceCount") ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_RESOURCES;
}

static mock_gi *gi_create(int g, const jval *dev, const jval *profile, unsigned int start, nvmlReturn_t *ret) {
    *ret = gi_fits(g, dev, profile, start);
    if (*ret) return NULL;
    int id = gi_id_for(start, num(profile, "placementSize"));
    if (id < 0 || id >= MIG_GIS || gis[g][id].used) {
        *ret = NVML_ERROR_INSUFFICIENT_RESOURCES;
        return NULL;
    }
    mock_gi *gi = &gis[g][id];
    memset(gi, 0, sizeof(*gi));
    gi->used = 1;
    gi->profile_id = num(profile, "id");
    gi->start = start;
    return gi;
}

/* A deterministic MIG UUID from the parent's UUID and the instance ids (FNV-1a, as uuid layout). */
static void derive_mig_uuid(const char *parent, int gi, int ci, char *out) {
    unsigned long long h1 = 1469598103934665603ULL, h2 = 1099511628211ULL * 31;
    char seed[160];
    snprintf(seed, sizeof seed, "%s/gi%d/ci%d", parent ? parent : "", gi, ci);
    for (const char *p = seed; *p; p++) {
        h1 = (h1 ^ (unsigned char)*p) * 1099511628211ULL;
        h2 = (h2 ^ (unsigned char)*p) * 1099511628211ULL + 7;
    }
    snprintf(out, MIG_NAME, "MIG-%08llx-%04llx-4%03llx-a%03llx-%012llx", h1 >> 32, (h1 >> 16) & 0xffff,
             h1 & 0xfff, h2 >> 52, h2 & 0xffffffffffffULL);
}

static unsigned int gi_slices(const jval *dev, const mock_gi *gi) {
    const jval *profile = gi_profile_by_id(dev, gi->profile_id);
    return profile ? num(profile, "sliceCount") : 0;
}

static mock_ci *ci_create(int g, int i, const jval *dev, unsigned int ci_profile, const char *uuid, nvmlReturn_t *ret) {
    mock_gi *gi = &gis[g][i];
    unsigned int slices = gi_slices(dev, gi);
    if (ci_profile >= CI_PROFILES || ci_slices[ci_profile] > slices) {
        *ret = NVML_ERROR_NOT_SUPPORTED;
        return NULL;
    }
    unsigned int size = ci_slices[ci_profile];
    /* First fit at multiples of the size, within the GPU instance's compute slices. */
    for (unsigned int start = 0; start + size <= slices; start += size) {
        int clash = 0;
        for (int k = 0; k < MIG_CIS; k++) {
            mock_ci *c = &gi->cis[k];
            if (c->used && start < c->start + c->size && c->start < start + size) clash = 1;
        }
        if (clash) continue;
        for (int k = 0; k < MIG_CIS; k++) {
            mock_ci *c = &gi->cis[k];
            if (c->used) continue;
            memset(c, 0, sizeof(*c));
            c->used = 1;
            c->profile_id = ci_profile;
            c->start = start;
            c->size = size;
            if (uuid) snprintf(c->uuid, sizeof c->uuid, "%s", uuid);
            else derive_mig_uuid(str_field(dev, "uuid"), i, k, c->uuid);
            *ret = NVML_SUCCESS;
            return c;
        }
    }
    *ret = NVML_ERROR_INSUFFICIENT_RESOURCES;
    return NULL;
}

/* MOCK_NVML_MIG_STATE: the instances written after each change, so another process finds them. */
static void save_mig_state(void) {
    const char *path = getenv("MOCK_NVML_MIG_STATE");
    if (!path || !*path) return;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        fprintf(stderr, "mock-nvml: cannot write MIG state %s\n", tmp);
        return;
    }
    for (int g = 0; g < MIG_GPUS; g++)
        for (int i = 0; i < MIG_GIS; i++) {
            const mock_gi *gi = &gis[g][i];
            if (!gi->used) continue;
            fprintf(f, "gi %d %d %u %u\n", g, i, gi->profile_id, gi->start);
            for (int k = 0; k < MIG_CIS; k++) {
                const mock_ci *ci = &gi->cis[k];
                if (ci->used)
                    fprintf(f, "ci %d %d %d %u %u %u %s\n", g, i, k, ci->profile_id, ci->start, ci->size, ci->uuid);
            }
        }
    fclose(f);
    if (rename(tmp, path) != 0) fprintf(stderr, "mock-nvml: cannot rename %s to %s\n", tmp, path);
}

/* 1 when MOCK_NVML_MIG_STATE names a file that was read (the JSON's instances are then not). */
static int load_mig_state(void) {
    const char *path = getenv("MOCK_NVML_MIG_STATE");
    if (!path || !*path) return 0;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[512], kind[4], uuid[MIG_NAME];
    int g, i, k;
    unsigned int profile_id, start, size;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "%3s", kind) != 1) continue;
        if (!strcmp(kind, "gi") && sscanf(line, "gi %d %d %u %u", &g, &i, &profile_id, &start) == 4 &&
            g >= 0 && g < MIG_GPUS && i >= 0 && i < MIG_GIS) {
            mock_gi *gi = &gis[g][i];
            memset(gi, 0, sizeof(*gi));
            gi->used = 1;
            gi->profile_id = profile_id;
            gi->start = start;
        } else if (!strcmp(kind, "ci") &&
                   sscanf(line, "ci %d %d %d %u %u %u %95s", &g, &i, &k, &profile_id, &start, &size, uuid) == 7 &&
                   g >= 0 && g < MIG_GPUS && i >= 0 && i < MIG_GIS && k >= 0 && k < MIG_CIS && gis[g][i].used) {
            mock_ci *ci = &gis[g][i].cis[k];
            ci->used = 1;
            ci->profile_id = profile_id;
            ci->start = start;
            ci->size = size;
            snprintf(ci->uuid, sizeof ci->uuid, "%s", uuid);
        } else {
            fprintf(stderr, "mock-nvml: %s: bad line ignored: %s", path, line);
        }
    }
    fclose(f);
    return 1;
}

/* The profile's instances, once per process: a later nvmlInit finds the state the calls left. */
static void load_mig_instances(void) {
    if (mig_loaded) return;
    mig_loaded = 1;
    if (load_mig_state()) return;
    for (int g = 0; devices && g < devices->n && g < MIG_GPUS; g++) {
        const jval *dev = devices->items[g];
        jval *list = jget(dev, "gpuInstances");
        if (!list || list->type != J_ARR) continue;
        if (!mig_enabled(dev)) {
            fprintf(stderr, "mock-nvml: device %d has gpuInstances but MIG mode off; ignored\n", g);
            continue;
        }
        for (int n = 0; n < list->n; n++) {
            const jval *entry = list->items[n];
            const jval *profile = gi_profile_by_id(dev, num(entry, "profileId"));
            nvmlReturn_t ret = NVML_ERROR_INVALID_ARGUMENT;
            mock_gi *gi = profile ? gi_create(g, dev, profile, num(entry, "start"), &ret) : NULL;
            if (!gi) {
                fprintf(stderr, "mock-nvml: device %d gpuInstances[%d]: %s\n", g, n, nvmlErrorString(ret));
                continue;
            }
            int i = (int)(gi - gis[g]);
            jval *cis = jget(entry, "computeInstances");
            if (!cis || cis->type != J_ARR) {
                unsigned int whole = 0;
                while (whole + 1 < CI_PROFILES && ci_slices[whole] < gi_slices(dev, gi)) whole++;
                ci_create(g, i, dev, whole, NULL, &ret);
                continue;
            }
            for (int k = 0; k < cis->n; k++) {
                if (!ci_create(g, i, dev, num(cis->items[k], "profileId"), str_field(cis->items[k], "uuid"), &ret))
                    fprintf(stderr, "mock-nvml: device %d gpuInstances[%d].computeInstances[%d]: %s\n", g, n, k,
                            nvmlErrorString(ret));
            }
        }
    }
    save_mig_state();
}

/* Handle -> indexes: 1 and g/i(/k) when the handle is a live instance of that kind. */
static int gi_of(const void *handle, int *g, int *i) {
    const mock_gi *gi = handle;
    if (!initialized || gi < &gis[0][0] || gi >= &gis[0][0] + MIG_GPUS * MIG_GIS) return 0;
    long offset = gi - &gis[0][0];
    if ((const char *)handle != (const char *)&gis[0][0] + offset * (long)sizeof(mock_gi)) return 0;
    *g = (int)(offset / MIG_GIS);
    *i = (int)(offset % MIG_GIS);
    return gis[*g][*i].used && devices && *g < devices->n;
}

static int ci_of(const void *handle, int *g, int *i, int *k) {
    for (int gg = 0; gg < MIG_GPUS; gg++)
        for (int ii = 0; ii < MIG_GIS; ii++) {
            if (!gis[gg][ii].used) continue;
            for (int kk = 0; kk < MIG_CIS; kk++)
                if (handle == &gis[gg][ii].cis[kk] && gis[gg][ii].cis[kk].used) {
                    *g = gg, *i = ii, *k = kk;
                    return initialized != 0;
                }
        }
    return 0;
}

static int mig_device_of(const void *handle, int *g, int *i, int *k) {
    const char *p = handle;
    if (!initialized || p < &mig_handles[0][0][0] || p >= &mig_handles[0][0][0] + sizeof mig_handles) return 0;
    long offset = p - &mig_handles[0][0][0];
    *g = (int)(offset / (MIG_GIS * MIG_CIS));
    *i = (int)(offset / MIG_CIS % MIG_GIS);
    *k = (int)(offset % MIG_CIS);
    return gis[*g][*i].used && gis[*g][*i].cis[*k].used && devices && *g < devices->n;
}

#define MIG_DEVICE_OR_RETURN(handle)                                                   \
    int g, i, k;                                                                       \
    if (!initialized) return NVML_ERROR_UNINITIALIZED;                                 \
    if (!mig_device_of(handle, &g, &i, &k)) return NVML_ERROR_INVALID_ARGUMENT;        \
    const jval *dev = devices->items[g];                                               \
    mock_gi *gi = &gis[g][i];                                                          \
    mock_ci *ci = &gi->cis[k];                                                         \
    const jval *gprofile = gi_profile_by_id(dev, gi->profile_id);                      \
    (void)ci;                                                                          \
    (void)dev;                                                                         \
    (void)gprofile;                                                                    \
    if (fallen[g]) return NVML_ERROR_GPU_IS_LOST;

/* The MIG device's name, as nvidia-smi shows it: "<card> MIG 1g.10gb" or "... MIG 1c.3g.40gb". */
static void mig_name(const jval *dev, const mock_gi *gi, const mock_ci *ci, char *out, size_t size) {
    const jval *profile = gi_profile_by_id(dev, gi->profile_id);
    const char *name = profile ? str_field(profile, "name") : "?";
    if (ci->size == num(profile, "sliceCount"))
        snprintf(out, size, "%s MIG %s", str_field(dev, "name"), name);
    else
        snprintf(out, size, "%s MIG %uc.%s", str_field(dev, "name"), ci->size, name);
}

/* Hooks the whole-device calls use when handed a MIG device (they return 1 and set *ret). */
static int mig_uuid(void *handle, char *uuid, unsigned int length, nvmlReturn_t *ret) {
    int g, i, k;
    if (!mig_device_of(handle, &g, &i, &k)) return 0;
    *ret = fallen[g] ? NVML_ERROR_GPU_IS_LOST : copy_string(gis[g][i].cis[k].uuid, uuid, length);
    return 1;
}

static int mig_name_of(void *handle, char *name, unsigned int length, nvmlReturn_t *ret) {
    int g, i, k;
    if (!mig_device_of(handle, &g, &i, &k)) return 0;
    char text[256];
    mig_name(devices->items[g], &gis[g][i], &gis[g][i].cis[k], text, sizeof text);
    *ret = fallen[g] ? NVML_ERROR_GPU_IS_LOST : copy_string(text, name, length);
    return 1;
}

static int mig_memory_bytes(void *handle, unsigned long long *bytes) {
    int g, i, k;
    if (!mig_device_of(handle, &g, &i, &k)) return 0;
    const jval *profile = gi_profile_by_id(devices->items[g], gis[g][i].profile_id);
    *bytes = (unsigned long long)num(profile, "memorySizeMB") << 20;
    return 1;
}

static int mig_by_uuid(const char *uuid, void **device) {
    for (int g = 0; devices && g < devices->n && g < MIG_GPUS; g++)
        for (int i = 0; i < MIG_GIS; i++)
            for (int k = 0; gis[g][i].used && k < MIG_CIS; k++)
                if (gis[g][i].cis[k].used && strcmp(gis[g][i].cis[k].uuid, uuid) == 0) {
                    *device = &mig_handles[g][i][k];
                    return 1;
                }
    return 0;
}

#define MIG_PARENT_OR_RETURN(handle, call)                                   \
    DEVICE_OR_RETURN(handle, call);                                          \
    int g = ((mock_device *)handle)->index;                                  \
    if (g >= MIG_GPUS) return NVML_ERROR_NOT_SUPPORTED;                      \
    {                                                                        \
        long long mode;                                                      \
        if (int_field(dev, "migMode", &mode)) return NVML_ERROR_NOT_SUPPORTED; \
    }

/* ---------------------------------------------------------------- exported MIG API */
static nvmlReturn_t fill_gi_profile(const jval *dev, unsigned int index, nvmlGpuInstanceProfileInfo_v3_t *out, int with_name) {
    if (index >= 0x12) return NVML_ERROR_INVALID_ARGUMENT; /* NVML_GPU_INSTANCE_PROFILE_COUNT */
    if (!mig_enabled(dev)) return NVML_ERROR_NOT_SUPPORTED;
    const jval *profile = gi_profile_by_index(dev, index);
    if (!profile) return NVML_ERROR_NOT_SUPPORTED;
    out->id = num(profile, "id");
    out->isP2pSupported = 0;
    out->sliceCount = num(profile, "sliceCount");
    out->instanceCount = num(profile, "instanceCount");
    out->multiprocessorCount = num(profile, "multiprocessorCount");
    out->copyEngineCount = num(profile, "copyEngineCount");
    out->decoderCount = num(profile, "decoderCount");
    out->encoderCount = num(profile, "encoderCount");
    out->jpegCount = num(profile, "jpegCount");
    out->ofaCount = num(profile, "ofaCount");
    out->memorySizeMB = num(profile, "memorySizeMB");
    if (with_name) snprintf(out->name, sizeof out->name, "MIG %s", str_field(profile, "name"));
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(void *handle, unsigned int profile, nvmlGpuInstanceProfileInfo_t *info) {
    MIG_PARENT_OR_RETURN(handle, "nvmlDeviceGetGpuInstanceProfileInfo");
    (void)g;
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlGpuInstanceProfileInfo_v3_t full;
    memset(&full, 0, sizeof full);
    nvmlReturn_t ret = fill_gi_profile(dev, profile, &full, 0);
    if (ret) return ret;
    memcpy(info, &full.id, offsetof(nvmlGpuInstanceProfileInfo_t, memorySizeMB));
    info->memorySizeMB = full.memorySizeMB;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(void *handle, unsigned int profile, nvmlGpuInstanceProfileInfo_v3_t *info) {
    MIG_PARENT_OR_RETURN(handle, "nvmlDeviceGetGpuInstanceProfileInfoV");
    (void)g;
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int version = info->version;
    if (version != GI_PROFILE_INFO_V2 && version != GI_PROFILE_INFO_V3) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlGpuInstanceProfileInfo_v3_t full;
    memset(&full, 0, sizeof full);
    nvmlReturn_t ret = fill_gi_profile(dev, profile, &full, 1);
    if (ret) return ret;
    full.version = version;
    memcpy(info, &full, version == GI_PROFILE_INFO_V3 ? sizeof full : offsetof(nvmlGpuInstanceProfileInfo_v3_t, capabilities));
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(void *handle, unsigned int profileId,
                                                          nvmlPlacement_t *placements, unsigned int *count) {
    MIG_PARENT_OR_RETURN(handle, "nvmlDeviceGetGpuInstancePossiblePlacements_v2");
    (void)g;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    const jval *profile = gi_profile_by_id(dev, profileId);
    if (!profile) return NVML_ERROR_INVALID_ARGUMENT;
    jval *list = jget(profile, "placements");
    unsigned int n = list && list->type == J_ARR ? (unsigned int)list->n : 0;
    if (!placements) {
        *count = n;
        return NVML_SUCCESS;
    }
    if (*count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int p = 0; p < n; p++) {
        placements[p].start = (unsigned int)list->items[p]->num;
        placements[p].size = num(profile, "placementSize");
    }
    *count = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(void *handle, unsigned int profileId, unsigned int *count) {
    MIG_PARENT_OR_RETURN(handle, "nvmlDeviceGetGpuInstanceRemainingCapacity");
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (!mig_enabled(dev)) return NVML_ERROR_NOT_SUPPORTED;
    const jval *profile = gi_profile_by_id(dev, profileId);
    if (!profile) return NVML_ERROR_INVALID_ARGUMENT;
    /* Greedy over the placements in order, as NVML counts what could still be created. */
    mock_gi saved[MIG_GIS];
    memcpy(saved, gis[g], sizeof saved);
    unsigned int n = 0;
    nvmlReturn_t ret;
    jval *list = jget(profile, "placements");
    for (int p = 0; list && p < list->n; p++)
        if (gi_create(g, dev, profile, (unsigned int)list->items[p]->num, &ret)) n++;
    memcpy(gis[g], saved, sizeof saved);
    *count = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(void *handle, unsigned int profileId,
                                                      const nvmlPlacement_t *placement, void **gpuInstance) {
    MIG_PARENT_OR_RETURN(handle, "nvmlDeviceCreateGpuInstanceWithPlacement");
    if (!placement || !gpuInstance) return NVML_ERROR_INVALID_ARGUMENT;
    if (!mig_enabled(dev)) return NVML_ERROR_NOT_SUPPORTED;
    const jval *profile = gi_profile_by_id(dev, profileId);
    if (!profile || placement->size != num(profile, "placementSize")) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t ret;
    mock_gi *gi = gi_create(g, dev, profile, placement->start, &ret);
    if (gi) {
        *gpuInstance = gi;
        save_mig_state();
    }
    return ret;
}

nvmlReturn_t nvmlDeviceCreateGpuInstance(void *handle, unsigned int profileId, void **gpuInstance) {
    MIG_PARENT_OR_RETURN(handle, "nvmlDeviceCreateGpuInstance");
    if (!gpuInstance) return NVML_ERROR_INVALID_ARGUMENT;
    if (!mig_enabled(dev)) return NVML_ERROR_NOT_SUPPORTED;
    const jval *profile = gi_profile_by_id(dev, profileId);
    if (!profile) return NVML_ERROR_INVALID_ARGUMENT;
    jval *list = jget(profile, "placements");
    nvmlReturn_t ret = NVML_ERROR_INSUFFICIENT_RESOURCES;
    for (int p = 0; list && p < list->n; p++) {
        mock_gi *gi = gi_create(g, dev, profile, (unsigned int)list->items[p]->num, &ret);
        if (gi) {
            *gpuInstance = gi;
            save_mig_state();
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_INSUFFICIENT_RESOURCES;
}

nvmlReturn_t nvmlGpuInstanceDestroy(void *gpuInstance) {
    int g, i;
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!gi_of(gpuInstance, &g, &i)) return NVML_ERROR_INVALID_ARGUMENT;
    for (int k = 0; k < MIG_CIS; k++)
        if (gis[g][i].cis[k].used) return NVML_ERROR_IN_USE;
    gis[g][i].used = 0;
    save_mig_state();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstances(void *handle, unsigned int profileId, void **gpuInstances, unsigned int *count) {
    MIG_PARENT_OR_RETURN(handle, "nvmlDeviceGetGpuInstances");
    if (!gpuInstances || !count) return NVML_ERROR_INVALID_ARGUMENT;
    if (!mig_enabled(dev)) return NVML_ERROR_NOT_SUPPORTED;
    if (!gi_profile_by_id(dev, profileId)) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int n = 0;
    for (int i = 0; i < MIG_GIS; i++)
        if (gis[g][i].used && gis[g][i].profile_id == profileId) gpuInstances[n++] = &gis[g][i];
    *count = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceById(void *handle, unsigned int id, void **gpuInstance) {
    MIG_PARENT_OR_RETURN(handle, "nvmlDeviceGetGpuInstanceById");
    if (!gpuInstance) return NVML_ERROR_INVALID_ARGUMENT;
    if (!mig_enabled(dev)) return NVML_ERROR_NOT_SUPPORTED;
    if (id >= MIG_GIS) return NVML_ERROR_INVALID_ARGUMENT;
    if (!gis[g][id].used) return NVML_ERROR_NOT_FOUND;
    *gpuInstance = &gis[g][id];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceGetInfo(void *gpuInstance, nvmlGpuInstanceInfo_t *info) {
    int g, i;
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!info || !gi_of(gpuInstance, &g, &i)) return NVML_ERROR_INVALID_ARGUMENT;
    const jval *profile = gi_profile_by_id(devices->items[g], gis[g][i].profile_id);
    info->device = &handles[g];
    info->id = (unsigned int)i;
    info->profileId = gis[g][i].profile_id;
    info->placement.start = gis[g][i].start;
    info->placement.size = num(profile, "placementSize");
    return NVML_SUCCESS;
}

static nvmlReturn_t fill_ci_profile(int g, int i, unsigned int index, unsigned int engine,
                                    nvmlComputeInstanceProfileInfo_v3_t *out, int with_name) {
    if (index >= 9 || engine >= 1) return NVML_ERROR_INVALID_ARGUMENT; /* *_PROFILE_COUNT */
    const jval *dev = devices->items[g];
    const jval *gprofile = gi_profile_by_id(dev, gis[g][i].profile_id);
    unsigned int slices = num(gprofile, "sliceCount");
    if (index >= CI_PROFILES || ci_slices[index] > slices) return NVML_ERROR_NOT_SUPPORTED;
    unsigned int size = ci_slices[index];
    out->id = index;
    out->sliceCount = size;
    out->instanceCount = slices / size;
    out->multiprocessorCount = num(gprofile, "multiprocessorCount") * size / slices;
    out->sharedCopyEngineCount = num(gprofile, "copyEngineCount");
    out->sharedDecoderCount = num(gprofile, "decoderCount");
    out->sharedEncoderCount = num(gprofile, "encoderCount");
    out->sharedJpegCount = num(gprofile, "jpegCount");
    out->sharedOfaCount = num(gprofile, "ofaCount");
    if (with_name) {
        if (size == slices) snprintf(out->name, sizeof out->name, "MIG %s", str_field(gprofile, "name"));
        else snprintf(out->name, sizeof out->name, "MIG %uc.%s", size, str_field(gprofile, "name"));
    }
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(void *gpuInstance, unsigned int profile, unsigned int engine,
                                                          nvmlComputeInstanceProfileInfo_t *info) {
    int g, i;
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!info || !gi_of(gpuInstance, &g, &i)) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlComputeInstanceProfileInfo_v3_t full;
    memset(&full, 0, sizeof full);
    nvmlReturn_t ret = fill_ci_profile(g, i, profile, engine, &full, 0);
    if (ret) return ret;
    memcpy(info, &full.id, sizeof *info);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(void *gpuInstance, unsigned int profile, unsigned int engine,
                                                           nvmlComputeInstanceProfileInfo_v3_t *info) {
    int g, i;
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!info || !gi_of(gpuInstance, &g, &i)) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int version = info->version;
    if (version != CI_PROFILE_INFO_V2 && version != CI_PROFILE_INFO_V3) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlComputeInstanceProfileInfo_v3_t full;
    memset(&full, 0, sizeof full);
    nvmlReturn_t ret = fill_ci_profile(g, i, profile, engine, &full, 1);
    if (ret) return ret;
    full.version = version;
    memcpy(info, &full, version == CI_PROFILE_INFO_V3 ? sizeof full : offsetof(nvmlComputeInstanceProfileInfo_v3_t, capabilities));
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(void *gpuInstance, unsigned int profileId, void **computeInstance) {
    int g, i;
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!computeInstance || !gi_of(gpuInstance, &g, &i)) return NVML_ERROR_INVALID_ARGUMENT;
    if (profileId >= 9) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t ret;
    mock_ci *ci = ci_create(g, i, devices->items[g], profileId, NULL, &ret);
    if (ci) {
        *computeInstance = ci;
        save_mig_state();
    }
    return ret;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstances(void *gpuInstance, unsigned int profileId, void **computeInstances,
                                                unsigned int *count) {
    int g, i;
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!computeInstances || !count || !gi_of(gpuInstance, &g, &i) || profileId >= 9) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int n = 0;
    for (int k = 0; k < MIG_CIS; k++)
        if (gis[g][i].cis[k].used && gis[g][i].cis[k].profile_id == profileId) computeInstances[n++] = &gis[g][i].cis[k];
    *count = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(void *gpuInstance, unsigned int id, void **computeInstance) {
    int g, i;
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!computeInstance || !gi_of(gpuInstance, &g, &i) || id >= MIG_CIS) return NVML_ERROR_INVALID_ARGUMENT;
    if (!gis[g][i].cis[id].used) return NVML_ERROR_NOT_FOUND;
    *computeInstance = &gis[g][i].cis[id];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlComputeInstanceGetInfo_v2(void *computeInstance, nvmlComputeInstanceInfo_t *info) {
    int g, i, k;
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!info || !ci_of(computeInstance, &g, &i, &k)) return NVML_ERROR_INVALID_ARGUMENT;
    mock_ci *ci = &gis[g][i].cis[k];
    info->device = &handles[g];
    info->gpuInstance = &gis[g][i];
    info->id = (unsigned int)k;
    info->profileId = ci->profile_id;
    info->placement.start = ci->start;
    info->placement.size = ci->size;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlComputeInstanceDestroy(void *computeInstance) {
    int g, i, k;
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!ci_of(computeInstance, &g, &i, &k)) return NVML_ERROR_INVALID_ARGUMENT;
    gis[g][i].cis[k].used = 0;
    save_mig_state();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(void *handle, unsigned int *isMig) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!isMig) return NVML_ERROR_INVALID_ARGUMENT;
    int g, i, k;
    if (mig_device_of(handle, &g, &i, &k)) {
        *isMig = 1;
        return NVML_SUCCESS;
    }
    if (!device_of(handle)) return NVML_ERROR_INVALID_ARGUMENT;
    *isMig = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(void *handle, unsigned int *id) {
    MIG_DEVICE_OR_RETURN(handle);
    if (!id) return NVML_ERROR_INVALID_ARGUMENT;
    *id = (unsigned int)i;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(void *handle, unsigned int *id) {
    MIG_DEVICE_OR_RETURN(handle);
    if (!id) return NVML_ERROR_INVALID_ARGUMENT;
    *id = (unsigned int)k;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(void *handle, void **device) {
    MIG_DEVICE_OR_RETURN(handle);
    if (!device) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &handles[g];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetAttributes_v2(void *handle, nvmlDeviceAttributes_t *attributes) {
    MIG_DEVICE_OR_RETURN(handle);
    if (!attributes) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int slices = num(gprofile, "sliceCount");
    memset(attributes, 0, sizeof *attributes);
    attributes->multiprocessorCount = slices ? num(gprofile, "multiprocessorCount") * ci->size / slices : 0;
    attributes->sharedCopyEngineCount = num(gprofile, "copyEngineCount");
    attributes->sharedDecoderCount = num(gprofile, "decoderCount");
    attributes->sharedEncoderCount = num(gprofile, "encoderCount");
    attributes->sharedJpegCount = num(gprofile, "jpegCount");
    attributes->sharedOfaCount = num(gprofile, "ofaCount");
    attributes->gpuInstanceSliceCount = slices;
    attributes->computeInstanceSliceCount = ci->size;
    attributes->memorySizeMB = num(gprofile, "memorySizeMB");
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(void *handle, unsigned int *count) {
    DEVICE_OR_RETURN(handle, "nvmlDeviceGetMaxMigDeviceCount");
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    long long mode, max = 7;
    if (int_field(dev, "migMode", &mode)) return NVML_ERROR_NOT_SUPPORTED;
    int_field(dev, "maxMigDevices", &max);
    *count = (unsigned int)max;
    return NVML_SUCCESS;
}

/* The index-th MIG device (compute instance) in GPU instance id, then compute instance id, order;
 * NOT_FOUND for an empty slot, as the real library answers. */
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(void *handle, unsigned int index, void **mig) {
    DEVICE_OR_RETURN(handle, "nvmlDeviceGetMigDeviceHandleByIndex");
    if (!mig) return NVML_ERROR_INVALID_ARGUMENT;
    long long mode, max = 7;
    if (int_field(dev, "migMode", &mode)) return NVML_ERROR_NOT_SUPPORTED;
    int_field(dev, "maxMigDevices", &max);
    if (index >= (unsigned long long)max) return NVML_ERROR_INVALID_ARGUMENT;
    int g = ((mock_device *)handle)->index;
    unsigned int n = 0;
    for (int i = 0; g < MIG_GPUS && i < MIG_GIS; i++)
        for (int k = 0; gis[g][i].used && k < MIG_CIS; k++)
            if (gis[g][i].cis[k].used && n++ == index) {
                *mig = &mig_handles[g][i][k];
                return NVML_SUCCESS;
            }
    return NVML_ERROR_NOT_FOUND;
}
