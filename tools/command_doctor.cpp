// tessera doctor: whether this machine is ready to run tessera: the Vulkan loader, drivers and
// devices (each device's memory, limits and the kernel variants it gets), the slide formats
// (each proven by a small file written and read back), free space where --out points, and with
// --model/--encoder whether the weights load and the extraction plan fits. Exit 0 only when
// everything asked is ready, 1 naming each problem and its fix.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/progress.h"
#include "common/units.h"
#include "common/version.h"
#include "compute/inference.h"
#include "compute/kernel_variants.h"
#include "compute/vit.h"
#include "compute/vk/context.h"
#include "compute/vk/kernels.h"
#include "compute/vk/loader_report.h"
#include "data/format_checks.h"
#include "jobs/extract_inputs.h"
#include "jobs/extract_plan.h"
#include "tools/commands.h"
#include "tools/flag_checks.h"

namespace tessera::cli {

namespace {

namespace fs = std::filesystem;

const char* const kLoaderHint =
    "install a Vulkan driver (Debian: mesa-vulkan-drivers gives lavapipe, which runs on any CPU; a GPU's own driver "
    "for a GPU); `VK_LOADER_DEBUG=all tessera doctor` shows every file and library the Vulkan loader tried";

enum class Mark { ok, fail, note };

// Each finding as a readable line (ok / FAIL / -- and indented details) on a terminal, else as
// one JSON line; the problems are kept for the summary and the exit code.
class Findings {
 public:
  Findings() : human_(Progress::human(STDOUT_FILENO)) {}

  void add(const std::string& check, Mark mark, const std::string& line, nlohmann::json fields = nlohmann::json::object(),
           const std::vector<std::string>& details = {}, const std::string& fix = "") {
    if (mark == Mark::fail) problems_.push_back({{"check", check}, {"problem", line}, {"fix", fix}});
    if (human_) {
      std::printf("%-5s %s\n", mark == Mark::ok ? "ok" : mark == Mark::fail ? "FAIL" : "--", line.c_str());
      for (const std::string& detail : details) std::printf("        %s\n", detail.c_str());
      if (!fix.empty()) std::printf("      fix: %s\n", fix.c_str());
    } else {
      fields["check"] = check;
      fields["status"] = mark == Mark::ok ? "ok" : mark == Mark::fail ? "fail" : "not available";
      fields["message"] = line;
      if (!fix.empty()) fields["fix"] = fix;
      std::printf("%s\n", fields.dump().c_str());
    }
    std::fflush(stdout);  // the format checks take seconds: show what is known
  }

  // The last line; false where something asked is not ready.
  bool summarise() {
    if (human_) {
      if (problems_.empty()) {
        std::printf("ready: everything asked is ready\n");
      } else {
        std::printf("NOT READY: %zu problem%s\n", problems_.size(), problems_.size() == 1 ? "" : "s");
        for (auto& problem : problems_) std::printf("  - %s\n", problem["problem"].get<std::string>().c_str());
      }
    } else {
      std::printf("%s\n", nlohmann::json{{"check", "summary"}, {"ready", problems_.empty()}, {"problems", problems_}}
                              .dump()
                              .c_str());
    }
    return problems_.empty();
  }

  size_t problems() const { return problems_.size(); }

 private:
  bool human_;
  nlohmann::json problems_ = nlohmann::json::array();
};

void check_drivers(Findings& findings) {
  const std::string replaced = vk::driver_override();
  auto manifests = vk::driver_manifests();
  for (const vk::DriverManifest& manifest : manifests) {
    nlohmann::json fields = {{"manifest", manifest.path}, {"library", manifest.library},
                             {"api_version", manifest.api_version}};
    if (manifest.readable)
      findings.add("driver", Mark::ok,
                   "driver " + manifest.path + ": " + manifest.library +
                       (manifest.api_version.empty() ? "" : " (Vulkan " + manifest.api_version + ")"),
                   fields);
    else if (!replaced.empty())  // named by the user: it should be there
      findings.add("driver", Mark::fail, "driver " + manifest.path + " (from " + replaced + "): " + manifest.problem,
                   fields, {}, "point " + replaced + " at a driver's .json manifest, or unset it");
    else
      findings.add("driver", Mark::note, "driver " + manifest.path + ": " + manifest.problem, fields);
  }
  if (manifests.empty())
    findings.add("driver", Mark::fail,
                 replaced.empty() ? "no Vulkan driver manifest (ICD) in the Vulkan loader's folders"
                                  : "no Vulkan driver manifest (ICD) where " + replaced + " points",
                 {{"override", replaced}}, {}, kLoaderHint);
}

nlohmann::json memory_json(const vk::DeviceInfo& device, const vk::DeviceLimits& limits) {
  nlohmann::json heaps = nlohmann::json::array(), types = nlohmann::json::array();
  for (auto& heap : device.heaps) heaps.push_back({{"bytes", heap.size}, {"device_local", heap.device_local}});
  for (auto& type : limits.memory_types)
    types.push_back({{"heap", type.heap}, {"device_local", type.device_local}, {"host_visible", type.host_visible},
                     {"host_coherent", type.host_coherent}, {"host_cached", type.host_cached}});
  return {{"heaps", heaps}, {"types", types}};
}

std::vector<std::string> memory_lines(const vk::DeviceInfo& device, const vk::DeviceLimits& limits) {
  std::vector<std::string> lines;
  for (size_t h = 0; h < device.heaps.size(); ++h)
    lines.push_back("heap " + std::to_string(h) + ": " + format_bytes(device.heaps[h].size) +
                    (device.heaps[h].device_local ? " device-local" : " host"));
  for (size_t t = 0; t < limits.memory_types.size(); ++t) {
    const vk::MemoryTypeInfo& type = limits.memory_types[t];
    std::string flags;
    for (auto [set, name] : {std::pair{type.device_local, "device-local"}, {type.host_visible, "host-visible"},
                             {type.host_coherent, "host-coherent"}, {type.host_cached, "host-cached"}})
      if (set) flags += std::string(" ") + name;
    if (type.host_visible && !type.host_coherent) flags += " (non-coherent: flushed and invalidated by tessera)";
    lines.push_back("memory type " + std::to_string(t) + " (heap " + std::to_string(type.heap) + "):" +
                    (flags.empty() ? " no flags" : flags));
  }
  return lines;
}

std::string variants_line(const nlohmann::json& variants) {
  const nlohmann::json& gemm = variants["gemm"];
  std::string line = "kernels: gemm " + gemm["kind"].get<std::string>() + ", workgroup " + gemm["workgroup"].dump() +
                     ", " + gemm["outputs_per_invocation"][0].dump() + "x" + gemm["outputs_per_invocation"][1].dump() +
                     " outputs each";
  if (gemm.contains("block"))
    line += ", block " + gemm["block"][0].dump() + "x" + gemm["block"][1].dump() + " depth " + gemm["depth"].dump();
  line += "; reductions " + variants["reductions"]["kind"].get<std::string>() + "; layer norm workgroup " +
          variants["layer_norm"]["workgroup"].dump() + "; cooperative matrix " +
          (variants["cooperative_matrix"]["used"].get<bool>() ? "used" : "not used");
  return line;
}

// The devices and what each gets; false where there is none.
bool check_devices(Findings& findings) {
  std::vector<vk::DeviceInfo> devices;
  try {
    devices = vk::list_devices();
  } catch (const Error& e) {
    findings.add("devices", Mark::fail, std::string("no Vulkan device: ") + e.what(), {}, {}, kLoaderHint);
    return false;
  }
  if (devices.empty()) {
    findings.add("devices", Mark::fail, "no Vulkan device found", {}, {}, kLoaderHint);
    return false;
  }
  const std::vector<vk::DeviceLimits> limits = vk::device_limits();
  size_t chosen = 0;  // as vk::Context chooses without --device: the first discrete GPU, else the first
  for (size_t i = 0; i < devices.size(); ++i)
    if (devices[i].type == "discrete-gpu") {
      chosen = i;
      break;
    }
  for (size_t i = 0; i < devices.size(); ++i) {
    const vk::DeviceInfo& device = devices[i];
    const vk::DeviceLimits& limit = limits.at(i);
    const nlohmann::json variants = kernel_variants(vk::tile_target_of(device));
    nlohmann::json fields = {
        {"index", device.index},
        {"name", device.name},
        {"type", device.type},
        {"driver", device.driver},
        {"api", vk::version_text(device.api_version)},
        {"default", i == chosen},
        {"memory", memory_json(device, limit)},
        {"limits",
         {{"max_storage_buffer_range", limit.max_storage_buffer_range},
          {"max_texel_buffer_elements", limit.max_texel_buffer_elements},
          {"largest_buffer", device.largest_buffer},
          {"non_coherent_atom_size", limit.non_coherent_atom_size},
          {"max_push_constants_size", limit.max_push_constants_size},
          {"max_compute_shared_memory", device.max_shared_memory},
          {"max_workgroup_invocations", device.max_workgroup_invocations},
          {"subgroup_size", device.subgroup_size},
          {"subgroup_arithmetic", device.subgroup_arithmetic},
          {"fp16_arithmetic", device.fp16_arithmetic},
          {"fp16_storage", device.fp16_storage},
          {"cooperative_matrix", device.cooperative_matrix}}},
        {"kernel_variants", variants}};
    std::vector<std::string> details = memory_lines(device, limit);
    details.push_back("limits: largest buffer " + format_bytes(device.largest_buffer) + " (maxStorageBufferRange " +
                      format_bytes(limit.max_storage_buffer_range) + "), shared memory " +
                      format_bytes(device.max_shared_memory) + ", workgroup " +
                      std::to_string(device.max_workgroup_invocations) + " invocations, nonCoherentAtomSize " +
                      std::to_string(limit.non_coherent_atom_size));
    details.push_back("subgroup size " + std::to_string(device.subgroup_size) +
                      (device.subgroup_arithmetic ? " with arithmetic" : " without arithmetic") + ", fp16 arithmetic " +
                      (device.fp16_arithmetic ? "yes" : "no") + ", fp16 storage " +
                      (device.fp16_storage ? "yes" : "no") + ", cooperative matrix " +
                      (device.cooperative_matrix ? "offered" : "not offered"));
    details.push_back(variants_line(variants));
    const std::string line = "device " + std::to_string(device.index) + ": " + device.name + " (" + device.type +
                             ", Vulkan " + vk::version_text(device.api_version) + ", " + device.driver + ")" +
                             (i == chosen ? ", the default" : "");
    if (device.api_version < VK_API_VERSION_1_2)
      findings.add("device", Mark::fail, line + ": Vulkan 1.2 is needed", fields, details,
                   "update the device's driver (Mesa 22 or later for lavapipe)");
    else
      findings.add("device", Mark::ok, line, fields, details);
  }
  return true;
}

void check_formats(Findings& findings) {
  std::string pattern = (fs::temp_directory_path() / "tessera-doctor-XXXXXX").string();
  if (!mkdtemp(pattern.data())) {
    findings.add("format", Mark::fail, "cannot make a scratch folder in " + fs::temp_directory_path().string(), {}, {},
                 "set TMPDIR to a writable folder");
    return;
  }
  const fs::path scratch = pattern;
  std::vector<data::FormatCheck> checks;
  try {
    checks = data::check_slide_formats(scratch.string());
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(scratch, ignored);
    throw;
  }
  std::error_code ignored;
  fs::remove_all(scratch, ignored);
  for (const data::FormatCheck& check : checks) {
    nlohmann::json fields = {{"format", check.format}, {"reader", check.reader}, {"how", check.how},
                             {"available", check.available}, {"required", check.required}};
    if (!check.problem.empty()) fields["problem"] = check.problem;
    const std::string line = check.format + " (" + check.reader + ")";
    if (check.available)
      findings.add("format", Mark::ok, line, fields, {check.how});
    else if (!check.required)
      findings.add("format", Mark::note, line + ": " + check.problem, fields);
    else
      findings.add("format", Mark::fail, line + ": " + check.problem, fields, {check.how},
                   "reinstall tessera's libraries (bash tools/install-deps.sh, or the Debian package's dependencies)");
  }
}

// Where --out points: the folder that holds it (made where missing, as tile and extract do),
// writable, and its free space.
void check_out(Findings& findings, const std::string& out) {
  fs::path existing = fs::absolute(out);
  std::error_code error;
  while (!fs::exists(existing, error) && existing.has_parent_path() && existing != existing.parent_path())
    existing = existing.parent_path();
  nlohmann::json fields = {{"out", out}, {"existing", existing.string()}, {"exists", existing == fs::absolute(out)}};
  if (!fs::is_directory(existing, error)) {
    findings.add("out", Mark::fail, "--out " + out + ": " + existing.string() + " is not a folder", fields, {},
                 "give --out a path in a folder (the one named is under a file)");
    return;
  }
  if (access(existing.c_str(), W_OK) != 0) {
    findings.add("out", Mark::fail, "--out " + out + ": " + existing.string() + " is not writable", fields, {},
                 "give --out a folder you can write to");
    return;
  }
  const fs::space_info space = fs::space(existing, error);
  if (error) {
    findings.add("out", Mark::fail, "--out " + out + ": cannot read the free space of " + existing.string() + ": " +
                                        error.message(),
                 fields, {}, "give --out a folder on a mounted file system");
    return;
  }
  fields["free_bytes"] = space.available;
  fields["capacity_bytes"] = space.capacity;
  const std::string where = fields["exists"].get<bool>() ? "" : " (missing: made in " + existing.string() + ")";
  findings.add("out", Mark::ok,
               "--out " + out + where + ": " + format_bytes(space.available) + " free of " +
                   format_bytes(space.capacity),
               fields);
}

std::string fix_for(const Error& e, const std::string& encoder) {
  switch (e.code()) {
    case ExitCode::bad_input:
      return "give the weights of " + encoder + " as published (.safetensors with timm's names), or a checkpoint "
             "converted by tools/torch_to_tessera.py; re-download a truncated file";
    case ExitCode::out_of_device_memory:
      return "lower --batch, use a device with more memory (see the devices above), or --precision fp16";
    case ExitCode::bad_usage:
      return "give --encoder a known encoder or a ViT JSON, and --model its weights (.safetensors, or a checkpoint "
             "converted by tools/torch_to_tessera.py); the message says which of the two is wrong";
    default:
      return "the message says what failed; `tessera extract` would stop there too";
  }
}

// Where the plan at `planned` tiles does not fit: the largest of it halved that does, by the same plans.
std::string fitting_batch_advice(vk::Context& context, const ExtractOptions& options,
                                 const std::vector<ExtractModel>& models, int planned) {
  for (int batch = planned / 2; batch >= 1; batch /= 2) {
    ExtractOptions smaller = options;
    smaller.batch = batch;
    std::vector<MemoryPlan> plans;
    if (device_extraction_plans(context, smaller, models, plans)["fits"].get<bool>())
      return "lower --batch: --batch " + std::to_string(batch) + " fits (or --precision fp16, or a device with more "
             "memory)";
  }
  return "even one tile does not fit: a device with more memory (see the devices above), or --precision fp16";
}

// The weights as extract loads them, then the plan on the device extract would take.
void check_model(Findings& findings, ExtractOptions options, bool have_device) {
  const std::string& encoder = options.encoders.front();
  const std::string subject = "--model " + options.models.front() + " --encoder " + encoder;
  std::vector<ExtractModel> models;
  try {
    models = resolve_extract_models(options);
    read_extract_weights(models);
    InferenceOptions one_tile = extraction_inference(options, models.front());
    one_tile.inputs[0].shape[0] = 1;  // the weights against the graph: the batch is the plan's business
    WeightsCheck weights = check_weights(models.front().resolved, one_tile);
    const int64_t features = weights.output.empty() ? 0 : weights.output.back();
    findings.add("weights", Mark::ok,
                 subject + ": " + std::to_string(weights.tensors) + " tensors, " + std::to_string(weights.values) +
                     " values, every name and shape as the model needs and every value finite" +
                     (options.fp16_weights ? " and within fp16's range (--weights fp16)" : "") + "; " +
                     std::to_string(features) + " features a tile",
                 {{"model", options.models.front()}, {"encoder", encoder}, {"tensors", weights.tensors},
                  {"values", weights.values}, {"features", features},
                  {"weights", options.fp16_weights ? "fp16" : "fp32"}});
  } catch (const Error& e) {
    findings.add("weights", Mark::fail, subject + ": " + e.what(),
                 {{"model", options.models.front()}, {"encoder", encoder}, {"exit_code", static_cast<int>(e.code())}},
                 {}, fix_for(e, encoder));
    return;
  }
  if (!have_device) return;  // reported above
  try {
    vk::Context context(extraction_context(options, options.device));
    std::vector<MemoryPlan> plans;
    nlohmann::json plan = device_extraction_plans(context, options, models, plans);
    const std::string needs = "needs " + plan["plan"]["readable"].get<std::string>() + " at batch " +
                              plan["batch"].dump() + " of " + context.info().name + "'s budget of " +
                              format_bytes(plan["budget_bytes"].get<uint64_t>());
    plan["batch_requested"] = options.batch;
    if (plan["fits"].get<bool>())
      findings.add("plan", Mark::ok, "extraction plan of " + encoder + " " + needs, plan);
    else
      findings.add("plan", Mark::fail, "extraction plan of " + encoder + " " + needs + ": it does not fit", plan, {},
                   fitting_batch_advice(context, options, models, plan["batch"].get<int>()));
  } catch (const Error& e) {
    findings.add("plan", Mark::fail, "extraction plan of " + encoder + ": " + e.what(),
                 {{"exit_code", static_cast<int>(e.code())}}, {}, fix_for(e, encoder));
  }
}

}  // namespace

void add_doctor_command(CLI::App& app) {
  auto* command = app.add_subcommand(
      "doctor", "Check that this machine is ready: Vulkan loader, drivers and devices (memory, limits, kernel "
                "variants), slide formats, free space at --out, and with --model/--encoder the weights and the plan; "
                "exit 0 only when everything asked is ready");
  auto options = std::make_shared<ExtractOptions>();
  auto out = std::make_shared<std::string>();
  auto precision = std::make_shared<std::string>("fp32");
  auto memory_limit = std::make_shared<std::string>();
  command->add_option("--out", *out, "Where a run will write: its folder's free space (made where missing)");
  command->add_option("--model", options->models, "Weights of --encoder (.safetensors or a converted checkpoint)");
  command->add_option("--encoder", options->encoders,
                      "Patch encoder of --model (a ViT preset: " + vit_preset_list() +
                          "; TRIDENT's name in brackets; or a ViT model JSON): its weights loaded as extract does and "
                          "its plan checked against the device");
  command->add_option("--batch", options->batch,
                      "Tiles per dispatch of the plan, as extract's --batch (default: the batch extract would choose)");
  command->add_option("--precision", *precision, "fp32 or fp16, as extract's --precision")
      ->check(CLI::IsMember({"fp32", "fp16"}))
      ->capture_default_str();
  auto weights = std::make_shared<std::string>();
  add_weights_flag(*command, *weights);
  auto stream_weights = std::make_shared<std::string>();
  add_stream_weights_flag(*command, *stream_weights);
  command->add_option("--device", options->device, "Vulkan device index of the plan (default: the default device)");
  command->add_option("--device-memory-limit", *memory_limit, "Device memory budget of the plan, e.g. 2GiB");
  command->callback([command, options, out, precision, memory_limit, weights, stream_weights] {
    if (options->models.size() != options->encoders.size() || options->models.size() > 1)
      throw UsageError("--model and --encoder go together, one of each (the weights and the encoder they are of)");
    if (options->models.empty())
      for (const char* flag : {"--batch", "--precision", "--weights", "--stream-weights", "--device", "--device-memory-limit"})
        if (command->count(flag)) throw UsageError(std::string(flag) + " is for the plan of --model/--encoder");
    if (command->count("--batch") && options->batch < 1) throw UsageError("--batch: give at least 1 tile");
    if (!memory_limit->empty()) options->memory_budget = parse_bytes(*memory_limit, "--device-memory-limit");
    options->fp16 = *precision == "fp16";
    options->fp16_weights = fp16_weights(*weights, options->fp16);
    options->stream_weights = weight_streaming(*stream_weights);
    options->out = out->empty() ? "." : *out;

    Findings findings;
    findings.add("tessera", Mark::ok, std::string("tessera ") + version() + " (commit " + commit() + ")",
                 {{"version", version()}, {"commit", commit()}});
    findings.add("loader", Mark::ok, "Vulkan loader " + vk::loader_version(), {{"version", vk::loader_version()}});
    check_drivers(findings);
    const bool have_device = check_devices(findings);
    check_formats(findings);
    if (!out->empty()) check_out(findings, *out);
    if (!options->models.empty()) check_model(findings, *options, have_device);
    const size_t problems = findings.problems();
    if (!findings.summarise())
      throw Error(ExitCode::runtime_error, "doctor: " + std::to_string(problems) + " problem" +
                                               (problems == 1 ? "" : "s") + " (each above, with its fix)");
  });
}

}  // namespace tessera::cli
