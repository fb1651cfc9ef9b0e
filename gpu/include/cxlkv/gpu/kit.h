// cxlkv/gpu/kit.h — what the GPU kit measures on a given machine (docs/gpu.md "The GPU kit").
//
// The kit (gpu_benchmark, run by scripts/gpu-steps) answers three questions a user deploying
// a CXL tier asks first:
//   1. How fast does a GPU read from the tier?  Copy/<dir>/<source>/<chunk>: H2D and D2H of a
//      batch in chunks of 64 KiB - 1 GiB from cudaHostAlloc memory (the reference), a
//      registered memfd arena, the same arena on a NUMA node other than the GPU's, and
//      pageable memory; Gather/..: the copy engine against the gather kernel;
//      Streams/<source>/<n>: n concurrent loads, one stream each (do they add up?).
//   2. How long until the tier is ready?  Register/<mode>/<GiB>: seconds per GiB to register
//      8, 64 and 256 GiB as shipped (prefault threads, chunks ramping from 1 GiB), with one
//      call after a parallel prefault, and with one call alone;
//      RegisterUnderTraffic/<GiB>: the p50 of small copies while a registration runs.
//   3. Is a block the GPU wrote safe to publish?  WriteBack/<blocks>: blocks copied D2H into
//      arena blocks, persisted, and read back through a second mapping of the pool file.
//
// PlanKit sizes every case to the device's free memory, the host's available memory and NUMA
// nodes and the run's time budget, and gives every case it will not run the reason. It is
// plain C++ (no CUDA), so the dry run in scripts/check plans an assumed device machine on a
// machine without one (gpu_benchmark --kit_plan --kit_machine=...). KitSummary turns the
// measured records into the labelled lines the run prints, KitJson into its JSON record.
//
// Thread-safety: functions are pure except ReadHostMachine, which reads /proc and /sys.
#ifndef CXLKV_GPU_KIT_H_
#define CXLKV_GPU_KIT_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace cxlkv::gpu {

struct KitMachine {
  std::string device_name;                 // empty: unknown
  std::uint64_t device_free_bytes = 0;     // 0: no usable device
  std::uint64_t host_available_bytes = 0;  // /proc/meminfo MemAvailable
  unsigned host_cpus = 0;
  int gpu_numa_node = -1;  // the node the GPU's PCIe root is on; -1: unknown or one node
  // NUMA nodes that have memory, with their free bytes.
  std::vector<std::pair<int, std::uint64_t>> numa_nodes;
};

// The host half of a KitMachine, read from /proc/meminfo, /sys/devices/system/node and the
// CPU count; the device fields stay empty (gpu_benchmark fills them from CUDA).
KitMachine ReadHostMachine();
// The NUMA node of a PCI device ("0000:17:00.0", as cudaDeviceGetPCIBusId writes it), from
// /sys/bus/pci/devices/<id>/numa_node; -1 when the kernel does not say.
int NumaNodeOfPciDevice(absl::string_view bus_id);

// An assumed machine for the dry run: comma-separated key=value, sizes in GiB:
//   device_free_gib=139,host_gib=120,cpus=16,gpu_node=0,nodes=0:60/1:60,name=H200
// device_free_gib and host_gib are required; nodes (node:free_gib, '/'-separated) defaults to
// one node holding host_gib. kInvalidArgument names the key and the accepted form.
absl::StatusOr<KitMachine> ParseKitMachine(absl::string_view spec);

enum class KitGroup { kCopy, kGather, kStreams, kWriteBack, kRegister, kRegisterUnderTraffic };
const char* KitGroupName(KitGroup g);

struct KitCase {
  KitGroup group = KitGroup::kCopy;
  std::string name;  // the benchmark's name, e.g. "Copy/h2d/arena/2097152"
  // Copy, Streams: hostalloc | arena | remote | pageable. Gather: kernel|memcpy/contiguous|
  // separate. Register: chunked | prefault+one-call | one-call.
  std::string source;
  bool h2d = true;
  // Copy: chunk; Gather: piece; Streams: bytes of one load; Register*: region; WriteBack:
  // block.
  std::uint64_t bytes = 0;
  std::uint32_t count = 0;  // Streams: concurrent loads; WriteBack, GatherBlocks: blocks
  double est_s = 0;         // the planner's estimate of the case's run time
  std::string skipped;      // empty: the case runs; otherwise why it does not
};

struct KitOptions {
  double budget_s = 200;  // the benchmark step's time; cases past it are skipped, saying so
};

struct KitPlan {
  KitMachine machine;
  double budget_s = 0;
  std::uint64_t copy_batch_bytes = 0;  // bytes one copy iteration moves (0: no copy cases)
  int remote_node = -1;                // the node of the "remote" source; -1: none
  std::vector<KitCase> cases;          // in the order they run
  double planned_s() const;            // the estimates of the cases that run, summed
  const KitCase* Find(absl::string_view name) const;
};

KitPlan PlanKit(const KitMachine& machine, const KitOptions& options = {});
// One line for the machine and one per case: "run" with its estimate or "skipped" with why.
std::vector<std::string> FormatKitPlan(const KitPlan& plan);

// What one case measured: named values (bytes_per_second, s_per_GiB, p50_us, ...) and, when it
// failed, the error.
struct KitRecord {
  std::map<std::string, double> values;
  std::string error;
};
using KitRecords = std::map<std::string, KitRecord>;  // by case name

// The labelled lines of a finished run, one per question and size ("kit: copy h2d 2 MiB:
// arena 51.2 GB/s = 97.1 % of cudaHostAlloc ..."), each against the goal docs/gpu.md states,
// then a line per case skipped or planned without a result.
std::vector<std::string> KitSummary(const KitPlan& plan, const KitRecords& records);
// The run as one JSON object: machine, budget, plan (every case with its status), records
// and the summary lines.
std::string KitJson(const KitPlan& plan, const KitRecords& records);

}  // namespace cxlkv::gpu

#endif  // CXLKV_GPU_KIT_H_
