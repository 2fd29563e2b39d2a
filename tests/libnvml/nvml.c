/*
 * libnvidia-ml.so.1 for tests: the NVML calls kit's GPU collector makes, at the C ABI,
 * so the unmodified nvidia-ml-py binding (ctypes) runs on it. NVML is the one thing a
 * test may fake: there is no GPU on the machines the suite runs on.
 *
 * Its GPUs come from a state file that tests rewrite while it runs (re-read on every
 * call): $FAKE_NVML_STATE, "{node}" in it replaced by $SLURMD_NODENAME (or
 * "host"). One setting per line, '#' comments:
 *
 *   driver ok | missing | uninitialized      every call fails as without a driver
 *   gpu MINOR key=value ...                  a GPU (in line order = NVML's index):
 *       name= uuid= bus= util= memutil= total= used= (bytes) power= (mW) temp= (C)
 *       sm= mem= (MHz) reasons= (bitmask) sbe= dbe= remap_corr= remap_unc=
 *       remap_pending= remap_fail= procs=PID:BYTES,PID:BYTES   ('_' in name: a space)
 *   fail MINOR FUNCTION CODE                 FUNCTION returns CODE (NVML's number) for that GPU
 *   lost MINOR                               every call on that GPU: NVML_ERROR_GPU_IS_LOST
 *   xid MINOR VALUE SEQ                      an Xid event (each SEQ delivered once per event set)
 *
 * $FAKE_NVML_VISIBLE (minors, comma-separated), when set, is what this process may
 * see, as a job's device cgroup lets NVML see only the job's GPUs.
 *
 * Structs and return codes follow nvml.h (as nvidia-ml-py declares them).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

typedef int nvmlReturn_t;
enum {
	NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2,
	NVML_ERROR_NOT_SUPPORTED = 3, NVML_ERROR_NOT_FOUND = 6, NVML_ERROR_INSUFFICIENT_SIZE = 7,
	NVML_ERROR_DRIVER_NOT_LOADED = 9, NVML_ERROR_TIMEOUT = 10, NVML_ERROR_GPU_IS_LOST = 15,
	NVML_ERROR_UNKNOWN = 999,
};

#define MAX_GPUS 16
#define MAX_PROCS 16
#define MAX_FAILS 64
#define MAX_XIDS 64

typedef struct {
	int minor, lost;
	char name[96], uuid[96], bus[32];
	unsigned util, memutil, power, temp, sm, mem;
	unsigned long long total, used, reasons, sbe, dbe;
	unsigned remap[4];
	int nprocs;
	unsigned pids[MAX_PROCS];
	unsigned long long pmem[MAX_PROCS];
} gpu_t;

typedef struct { int minor; char fn[96]; int code; } fail_t;
typedef struct { int minor; unsigned long long value; long seq; } xid_t;

typedef struct {
	char driver[32];
	int ngpus, nfails, nxids;
	gpu_t gpus[MAX_GPUS];
	fail_t fails[MAX_FAILS];
	xid_t xids[MAX_XIDS];
} state_t;

/* A device handle is a pointer to one of these; it names the GPU by its minor. */
struct nvmlDevice_st { int minor, valid; };
static struct nvmlDevice_st handles[MAX_GPUS];
static int initialized;

typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
	char busIdLegacy[16];
	unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
	char busId[32];
} nvmlPciInfo_t;
typedef struct {
	unsigned int pid;
	unsigned long long usedGpuMemory;
	unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct {
	nvmlDevice_t device;
	unsigned long long eventType, eventData;
	unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;
struct nvmlEventSet_st { unsigned long long types[MAX_GPUS]; long delivered[MAX_GPUS]; };
typedef struct nvmlEventSet_st *nvmlEventSet_t;

static void state_path(char *out, size_t n)
{
	const char *tmpl = getenv("FAKE_NVML_STATE");
	const char *node = getenv("SLURMD_NODENAME");
	const char *at;
	if (!tmpl) { out[0] = '\0'; return; }
	if (!node || !*node) node = "host";
	at = strstr(tmpl, "{node}");
	if (at)
		snprintf(out, n, "%.*s%s%s", (int)(at - tmpl), tmpl, node, at + 6);
	else
		snprintf(out, n, "%s", tmpl);
}

static int visible(int minor)
{
	const char *v = getenv("FAKE_NVML_VISIBLE");
	char buf[256], *tok, *save = NULL;
	if (!v) return 1;
	snprintf(buf, sizeof buf, "%s", v);
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
		if (atoi(tok) == minor) return 1;
	return 0;
}

static void parse_gpu(gpu_t *g, char *rest)
{
	char *tok, *save = NULL;
	for (tok = strtok_r(rest, " \t\n", &save); tok; tok = strtok_r(NULL, " \t\n", &save)) {
		char *eq = strchr(tok, '=');
		char *v, *p;
		if (!eq) continue;
		*eq = '\0';
		v = eq + 1;
#define NUM(key, field) else if (!strcmp(tok, key)) g->field = strtoull(v, NULL, 0)
		if (!strcmp(tok, "name")) {
			snprintf(g->name, sizeof g->name, "%s", v);
			for (p = g->name; *p; p++) if (*p == '_') *p = ' ';
		}
		else if (!strcmp(tok, "uuid")) snprintf(g->uuid, sizeof g->uuid, "%s", v);
		else if (!strcmp(tok, "bus")) snprintf(g->bus, sizeof g->bus, "%s", v);
		NUM("util", util); NUM("memutil", memutil); NUM("total", total); NUM("used", used);
		NUM("power", power); NUM("temp", temp); NUM("sm", sm); NUM("mem", mem);
		NUM("reasons", reasons); NUM("sbe", sbe); NUM("dbe", dbe);
		NUM("remap_corr", remap[0]); NUM("remap_unc", remap[1]); NUM("remap_pending", remap[2]);
		NUM("remap_fail", remap[3]);
		else if (!strcmp(tok, "procs")) {
			char *item, *s2 = NULL;
			g->nprocs = 0;
			for (item = strtok_r(v, ",", &s2); item && g->nprocs < MAX_PROCS; item = strtok_r(NULL, ",", &s2)) {
				char *colon = strchr(item, ':');
				g->pids[g->nprocs] = (unsigned)strtoul(item, NULL, 10);
				g->pmem[g->nprocs] = colon ? strtoull(colon + 1, NULL, 10) : 0;
				g->nprocs++;
			}
		}
#undef NUM
	}
}

static int parse(state_t *st, FILE *f);

/* The state now (read again only when the file was replaced or changed: tests rename a
 * new one into place); 0, or the NVML error every call returns (no driver). */
static int load(state_t *st)
{
	static state_t cached;
	static struct stat seen;
	static int have, cached_rc;
	static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;  /* the poller and the event thread */
	char path[4096];
	struct stat now;
	FILE *f;
	int rc;
	state_path(path, sizeof path);
	if (!path[0] || stat(path, &now))
		return NVML_ERROR_DRIVER_NOT_LOADED;
	pthread_mutex_lock(&lock);
	if (!have || now.st_ino != seen.st_ino || now.st_dev != seen.st_dev || now.st_size != seen.st_size ||
	    now.st_mtim.tv_sec != seen.st_mtim.tv_sec || now.st_mtim.tv_nsec != seen.st_mtim.tv_nsec) {
		if (!(f = fopen(path, "re"))) {
			pthread_mutex_unlock(&lock);
			return NVML_ERROR_DRIVER_NOT_LOADED;
		}
		cached_rc = parse(&cached, f);
		fclose(f);
		seen = now;
		have = 1;
	}
	*st = cached;
	rc = cached_rc;
	pthread_mutex_unlock(&lock);
	return rc;
}

static int parse(state_t *st, FILE *f)
{
	char line[4096];
	memset(st, 0, sizeof *st);
	strcpy(st->driver, "ok");
	while (fgets(line, sizeof line, f)) {
		char kind[16];
		int minor, n = 0;
		if (line[0] == '#' || sscanf(line, "%15s%n", kind, &n) != 1) continue;
		if (!strcmp(kind, "driver")) {
			sscanf(line + n, "%31s", st->driver);
		} else if (!strcmp(kind, "gpu") && st->ngpus < MAX_GPUS) {
			gpu_t *g = &st->gpus[st->ngpus];
			int m = 0;
			if (sscanf(line + n, "%d%n", &minor, &m) != 1) continue;
			g->minor = minor;
			parse_gpu(g, line + n + m);
			if (visible(minor)) st->ngpus++;
			else memset(g, 0, sizeof *g);
		} else if (!strcmp(kind, "fail") && st->nfails < MAX_FAILS) {
			fail_t *fl = &st->fails[st->nfails];
			if (sscanf(line + n, "%d %95s %d", &fl->minor, fl->fn, &fl->code) == 3) st->nfails++;
		} else if (!strcmp(kind, "lost")) {
			if (sscanf(line + n, "%d", &minor) == 1)
				for (int i = 0; i < st->ngpus; i++) if (st->gpus[i].minor == minor) st->gpus[i].lost = 1;
		} else if (!strcmp(kind, "xid") && st->nxids < MAX_XIDS) {
			xid_t *x = &st->xids[st->nxids];
			if (sscanf(line + n, "%d %llu %ld", &x->minor, &x->value, &x->seq) == 3) st->nxids++;
		}
	}
	if (!strcmp(st->driver, "missing")) return NVML_ERROR_DRIVER_NOT_LOADED;
	if (!strcmp(st->driver, "uninitialized")) return NVML_ERROR_UNINITIALIZED;
	return 0;
}

/* The GPU behind a handle, for FUNCTION: NULL with *rc set when it fails. */
static gpu_t *device(state_t *st, nvmlDevice_t h, const char *fn, int *rc)
{
	int i;
	if (!initialized) { *rc = NVML_ERROR_UNINITIALIZED; return NULL; }
	if ((*rc = load(st))) return NULL;
	if (!h || !h->valid) { *rc = NVML_ERROR_INVALID_ARGUMENT; return NULL; }
	for (i = 0; i < st->ngpus; i++) {
		gpu_t *g = &st->gpus[i];
		if (g->minor != h->minor) continue;
		if (g->lost) { *rc = NVML_ERROR_GPU_IS_LOST; return NULL; }
		for (int k = 0; k < st->nfails; k++)
			if (st->fails[k].minor == g->minor && !strcmp(st->fails[k].fn, fn)) {
				*rc = st->fails[k].code;
				return NULL;
			}
		return g;
	}
	*rc = NVML_ERROR_GPU_IS_LOST;  /* the GPU fell off the bus */
	return NULL;
}

#define DEVICE(fn) state_t st; int rc; gpu_t *g = device(&st, h, fn, &rc); if (!g) return rc

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
	state_t st;
	int rc;
	(void)flags;
	if ((rc = load(&st))) return rc;
	initialized++;
	return NVML_SUCCESS;
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void)
{
	if (!initialized) return NVML_ERROR_UNINITIALIZED;
	initialized--;
	return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t r)
{
	switch (r) {
	case NVML_SUCCESS: return "Success";
	case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
	case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
	case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
	case NVML_ERROR_NOT_FOUND: return "Not Found";
	case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
	case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
	case NVML_ERROR_TIMEOUT: return "Timeout";
	case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
	default: return "Unknown Error";
	}
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
	state_t st;
	int rc;
	if (!initialized) return NVML_ERROR_UNINITIALIZED;
	if ((rc = load(&st))) return rc;
	if (length < 16) return NVML_ERROR_INSUFFICIENT_SIZE;
	snprintf(version, length, "kit-fake-nvml");
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
	state_t st;
	int rc;
	if (!initialized) return NVML_ERROR_UNINITIALIZED;
	if ((rc = load(&st))) return rc;
	if (!count) return NVML_ERROR_INVALID_ARGUMENT;
	*count = (unsigned)st.ngpus;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *out)
{
	state_t st;
	int rc;
	if (!initialized) return NVML_ERROR_UNINITIALIZED;
	if ((rc = load(&st))) return rc;
	if (!out || index >= (unsigned)st.ngpus) return NVML_ERROR_INVALID_ARGUMENT;
	handles[index].minor = st.gpus[index].minor;
	handles[index].valid = 1;
	*out = &handles[index];
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t h, unsigned int *minor)
{
	DEVICE("nvmlDeviceGetMinorNumber");
	*minor = (unsigned)g->minor;
	return NVML_SUCCESS;
}

static nvmlReturn_t copy_text(const char *text, char *out, unsigned int length)
{
	if (strlen(text) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
	strcpy(out, text);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t h, char *uuid, unsigned int length)
{
	DEVICE("nvmlDeviceGetUUID");
	return copy_text(g->uuid, uuid, length);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t h, char *name, unsigned int length)
{
	DEVICE("nvmlDeviceGetName");
	return copy_text(g->name, name, length);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t h, nvmlPciInfo_t *pci)
{
	unsigned dom = 0, bus = 0, dev = 0;
	DEVICE("nvmlDeviceGetPciInfo_v3");
	memset(pci, 0, sizeof *pci);
	sscanf(g->bus, "%x:%x:%x", &dom, &bus, &dev);
	pci->domain = dom; pci->bus = bus; pci->device = dev; pci->pciDeviceId = 0x233010de;
	snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04x:%02x:%02x.0", dom, bus, dev);
	snprintf(pci->busId, sizeof pci->busId, "%s", g->bus);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t h, nvmlUtilization_t *u)
{
	DEVICE("nvmlDeviceGetUtilizationRates");
	u->gpu = g->util;
	u->memory = g->memutil;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t h, nvmlMemory_t *m)
{
	DEVICE("nvmlDeviceGetMemoryInfo");
	m->total = g->total;
	m->used = g->used;
	m->free = g->total > g->used ? g->total - g->used : 0;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t h, unsigned int *mw)
{
	DEVICE("nvmlDeviceGetPowerUsage");
	*mw = g->power;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t h, int sensor, unsigned int *t)
{
	DEVICE("nvmlDeviceGetTemperature");
	if (sensor != 0) return NVML_ERROR_INVALID_ARGUMENT;
	*t = g->temp;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t h, int type, unsigned int *clock)
{
	DEVICE("nvmlDeviceGetClockInfo");
	if (type == 1) *clock = g->sm;
	else if (type == 2) *clock = g->mem;
	else return NVML_ERROR_NOT_SUPPORTED;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t h, unsigned long long *reasons)
{
	DEVICE("nvmlDeviceGetCurrentClocksEventReasons");
	*reasons = g->reasons;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t h, unsigned long long *reasons)
{
	DEVICE("nvmlDeviceGetCurrentClocksThrottleReasons");
	*reasons = g->reasons;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t h, int errorType, int counterType, unsigned long long *count)
{
	DEVICE("nvmlDeviceGetTotalEccErrors");
	if (counterType != 0 && counterType != 1) return NVML_ERROR_INVALID_ARGUMENT;
	*count = errorType == 0 ? g->sbe : g->dbe;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t h, unsigned int *corr, unsigned int *unc, unsigned int *pending,
				       unsigned int *failure)
{
	DEVICE("nvmlDeviceGetRemappedRows");
	*corr = g->remap[0]; *unc = g->remap[1]; *pending = g->remap[2]; *failure = g->remap[3];
	return NVML_SUCCESS;
}

static nvmlReturn_t processes(gpu_t *g, unsigned int *count, nvmlProcessInfo_t *infos)
{
	unsigned n = (unsigned)g->nprocs;
	if (!count) return NVML_ERROR_INVALID_ARGUMENT;
	if (!infos || *count < n) {  /* NVML: the size asked for; SUCCESS when there are none */
		*count = n;
		return n ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
	}
	for (unsigned i = 0; i < n; i++) {
		infos[i].pid = g->pids[i];
		infos[i].usedGpuMemory = g->pmem[i];
		infos[i].gpuInstanceId = infos[i].computeInstanceId = 0xFFFFFFFFu;
	}
	*count = n;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t h, unsigned int *count, nvmlProcessInfo_t *infos)
{
	DEVICE("nvmlDeviceGetComputeRunningProcesses");
	return processes(g, count, infos);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t h, unsigned int *count, nvmlProcessInfo_t *infos)
{
	return nvmlDeviceGetComputeRunningProcesses_v3(h, count, infos);
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
	if (!initialized) return NVML_ERROR_UNINITIALIZED;
	*set = calloc(1, sizeof **set);
	if (!*set) return NVML_ERROR_UNKNOWN;
	for (int i = 0; i < MAX_GPUS; i++) (*set)->delivered[i] = -1;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t h, unsigned long long types, nvmlEventSet_t set)
{
	DEVICE("nvmlDeviceRegisterEvents");
	if (!set || g->minor < 0 || g->minor >= MAX_GPUS) return NVML_ERROR_INVALID_ARGUMENT;
	set->types[g->minor] |= types;
	/* Events from before the registration are not delivered. */
	for (int i = 0; i < st.nxids; i++)
		if (st.xids[i].minor == g->minor && st.xids[i].seq > set->delivered[g->minor])
			set->delivered[g->minor] = st.xids[i].seq;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
	struct timespec nap = {0, 20 * 1000 * 1000};
	unsigned waited = 0;
	if (!initialized) return NVML_ERROR_UNINITIALIZED;
	if (!set || !data) return NVML_ERROR_INVALID_ARGUMENT;
	for (;;) {
		state_t st;
		int rc = load(&st);
		if (rc) return rc;
		for (int i = 0; i < st.nxids; i++) {
			xid_t *x = &st.xids[i];
			if (x->minor < 0 || x->minor >= MAX_GPUS || !(set->types[x->minor] & 8ULL)) continue;
			if (x->seq <= set->delivered[x->minor]) continue;
			set->delivered[x->minor] = x->seq;
			for (int k = 0; k < MAX_GPUS; k++)
				if (handles[k].valid && handles[k].minor == x->minor) data->device = &handles[k];
			data->eventType = 8ULL;  /* nvmlEventTypeXidCriticalError */
			data->eventData = x->value;
			data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFFu;
			return NVML_SUCCESS;
		}
		if (waited >= timeoutms) return NVML_ERROR_TIMEOUT;
		nanosleep(&nap, NULL);
		waited += 20;
	}
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
	free(set);
	return NVML_SUCCESS;
}
