/* A STAND-IN for libnvidia-ml (no GPU on the CPU machines): the NVML C functions the daemon's
   NvmlSource reaches through the real pynvml, with nvml.h's signatures, struct layouts and
   return codes, over cards a test scripts with the standin_* calls. Built by
   tests/daemon/test_daemon_nvml_standin.py; pynvml's library handle is pointed at it. */
#include <stdio.h>
#include <string.h>

enum { SUCCESS = 0, UNINITIALIZED = 1, INVALID_ARGUMENT = 2, NOT_SUPPORTED = 3,
       INSUFFICIENT_SIZE = 7, GPU_IS_LOST = 15 };
enum { MAX_CARDS = 4, MAX_PROCS = 8 };

typedef struct { unsigned long long total, free, used; } nvmlMemory_t; /* version 1 */
typedef struct {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t; /* what _v3 fills (pynvml's c_nvmlProcessInfo_v3_t) */

struct card {
  char uuid[96], name[96];
  unsigned long long total, free;
  int lost, graphics_unsupported, nprocs[2];
  nvmlProcessInfo_t procs[2][MAX_PROCS]; /* [0] compute, [1] graphics */
};
static struct card cards[MAX_CARDS];
static int ncards, initialised, meminfo_calls;

void standin_reset(int n) {
  memset(cards, 0, sizeof cards);
  ncards = n;
  initialised = meminfo_calls = 0;
}
void standin_set_card(int i, const char *uuid, const char *name, unsigned long long total,
                      unsigned long long free) {
  snprintf(cards[i].uuid, sizeof cards[i].uuid, "%s", uuid);
  snprintf(cards[i].name, sizeof cards[i].name, "%s", name);
  cards[i].total = total;
  cards[i].free = free;
}
void standin_set_lost(int i, int lost) { cards[i].lost = lost; }
void standin_set_graphics_unsupported(int i) { cards[i].graphics_unsupported = 1; }
void standin_add_process(int i, int graphics, unsigned int pid, unsigned long long used) {
  nvmlProcessInfo_t *p = &cards[i].procs[graphics][cards[i].nprocs[graphics]++];
  p->pid = pid;
  p->usedGpuMemory = used; /* ~0ULL: NVML_VALUE_NOT_AVAILABLE */
  p->gpuInstanceId = p->computeInstanceId = 0xFFFFFFFF;
}
int standin_meminfo_calls(void) { return meminfo_calls; }
int standin_initialised(void) { return initialised; }

static int device(const void *handle, struct card **out) {
  const struct card *c = handle;
  if (!initialised) return UNINITIALIZED;
  if (c < cards || c >= cards + ncards) return INVALID_ARGUMENT;
  if (c->lost) return GPU_IS_LOST;
  *out = (struct card *)c;
  return SUCCESS;
}

int nvmlInitWithFlags(unsigned int flags) { (void)flags; initialised++; return SUCCESS; }
int nvmlShutdown(void) { if (!initialised) return UNINITIALIZED; initialised--; return SUCCESS; }
const char *nvmlErrorString(int result) {
  switch (result) {
    case SUCCESS: return "Success";
    case UNINITIALIZED: return "Uninitialized";
    case INVALID_ARGUMENT: return "Invalid Argument";
    case NOT_SUPPORTED: return "Not Supported";
    case INSUFFICIENT_SIZE: return "Insufficient Size";
    case GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
  }
}
int nvmlDeviceGetCount_v2(unsigned int *count) {
  if (!initialised) return UNINITIALIZED;
  *count = (unsigned int)ncards;
  return SUCCESS;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **handle) {
  struct card *c;
  int rc = index < (unsigned int)ncards ? device(&cards[index], &c) : INVALID_ARGUMENT;
  if (rc == SUCCESS) *handle = c;
  return rc;
}
int nvmlDeviceGetUUID(void *handle, char *uuid, unsigned int length) {
  struct card *c;
  int rc = device(handle, &c);
  if (rc == SUCCESS) snprintf(uuid, length, "%s", c->uuid);
  return rc;
}
int nvmlDeviceGetName(void *handle, char *name, unsigned int length) {
  struct card *c;
  int rc = device(handle, &c);
  if (rc == SUCCESS) snprintf(name, length, "%s", c->name);
  return rc;
}
int nvmlDeviceGetMemoryInfo(void *handle, nvmlMemory_t *memory) {
  struct card *c;
  int rc = device(handle, &c);
  if (rc != SUCCESS) return rc;
  meminfo_calls++;
  memory->total = c->total;
  memory->free = c->free;
  memory->used = c->total - c->free;
  return SUCCESS;
}
static int processes(void *handle, int graphics, unsigned int *count, nvmlProcessInfo_t *infos) {
  struct card *c;
  int rc = device(handle, &c);
  if (rc != SUCCESS) return rc;
  if (graphics && c->graphics_unsupported) return NOT_SUPPORTED;
  int n = c->nprocs[graphics];
  if (*count < (unsigned int)n) { *count = (unsigned int)n; return INSUFFICIENT_SIZE; }
  if (n) memcpy(infos, c->procs[graphics], (size_t)n * sizeof *infos);
  *count = (unsigned int)n;
  return SUCCESS;
}
int nvmlDeviceGetComputeRunningProcesses_v3(void *h, unsigned int *count, nvmlProcessInfo_t *p) {
  return processes(h, 0, count, p);
}
int nvmlDeviceGetGraphicsRunningProcesses_v3(void *h, unsigned int *count, nvmlProcessInfo_t *p) {
  return processes(h, 1, count, p);
}
